//! `outbox_enqueue(topic text, payload jsonb, delay interval, dedupe_key text) RETURNS outbox`

use super::{function_info_v1, interval_text, sign_of, SpiCall};
use crate::errors::{invalid_argument, null_argument};
use crate::topic;
use crate::worker::registry;
use pgrx::fcinfo::{pg_arg_is_null, pg_getarg, pg_getarg_datum_raw};
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;
use std::cmp::Ordering;

/// dedupe_key's limit, in characters.
const MAX_DEDUPE_KEY_CHARS: usize = 255;

function_info_v1!(pg_finfo_outbox_enqueue_c);

#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn outbox_enqueue_c(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        topic::require_valid("outbox_enqueue", "topic", pg_getarg::<&str>(fcinfo, 0));
        if pg_arg_is_null(fcinfo, 1) {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                "outbox_enqueue: payload must not be NULL",
                "Use '{}'::jsonb for an empty payload."
            );
        }
        let Some(delay) = pg_getarg::<Interval>(fcinfo, 2) else { null_argument("outbox_enqueue", "delay") };
        if sign_of(&delay) == Ordering::Less {
            let shown = interval_text(pg_getarg_datum_raw(fcinfo, 2));
            invalid_argument("outbox_enqueue", "delay", &format!("must not be negative, got {shown}"));
        }
        let dedupe_key = pg_getarg::<&str>(fcinfo, 3);
        if let Some(key) = dedupe_key {
            if key.is_empty() {
                invalid_argument("outbox_enqueue", "dedupe_key", "must not be empty (pass NULL for no key)");
            }
            if key.chars().count() > MAX_DEDUPE_KEY_CHARS {
                ereport!(
                    ERROR,
                    PgSqlErrorCode::ERRCODE_STRING_DATA_RIGHT_TRUNCATION,
                    format!("outbox_enqueue: dedupe_key is longer than {MAX_DEDUPE_KEY_CHARS} characters")
                );
            }
        }

        // When this transaction commits, an idle delivery worker starts at once.
        registry::wake_worker_at_commit();

        let [topic, payload, delay, key] = [0, 1, 2, 3].map(|n| Some(pg_getarg_datum_raw(fcinfo, n)));
        let spi = SpiCall::connect("outbox_enqueue", fcinfo);
        let inserted = |plan, arguments: &[Option<pg_sys::Datum>]| {
            if spi.run(plan, arguments) == 1 { spi.value(0, 1) } else { None }
        };
        let message = if dedupe_key.is_none() {
            inserted(spi.plans.enqueue, &[topic, payload, delay])
        } else {
            // A concurrent producer with the same key makes the INSERT wait for its
            // transaction: if it commits, ours does nothing and the SELECT (a new snapshot)
            // sees its row; if it rolls back, ours inserts. The loop covers a row deleted
            // between the two statements.
            loop {
                if let Some(message) = inserted(spi.plans.enqueue_once_per_key, &[topic, payload, delay, key])
                    .or_else(|| inserted(spi.plans.find_by_dedupe_key, &[key]))
                {
                    break Some(message);
                }
            }
        };
        let Some(message) = message else {
            error!("outbox_enqueue: the insert returned no row");
        };
        // Copied into the caller's memory before SPI_finish frees ours.
        let result = pg_sys::SPI_datumTransfer(message, false, -1);
        spi.finish();
        result
    }
}

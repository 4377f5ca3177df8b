//! Fail: an attempt failed. The message goes back to PENDING after the backoff (or after the
//! caller's `retry_in`), or, out of attempts, becomes DEAD with its last error: policy.rs
//! decides, this module records it. Returns the new status, or NULL when the caller no longer
//! holds the message (it completed or failed already, or its lease ran out and it was
//! re-claimed), in which case nothing changes.

use crate::error::{or_raise, raise, OutboxError};
use crate::fmgr::{null_result, required, sql_function};
use crate::policy::{AfterFailure, MAX_ERROR_CHARS};
use crate::spi::{schema_of_function, Spi, Statement};
use crate::{interval, ordering, settings};
use pgrx::datum::IntoDatum;
use pgrx::pg_sys::BuiltinOid::*;
use std::cmp::Ordering;

static LOCK: Statement = Statement::new(include_str!("lock.sql"), &[INT8OID, UUIDOID]);
static RETRY: Statement = Statement::new(include_str!("retry.sql"), &[INT8OID, INT4OID, INTERVALOID, TEXTOID, INT4OID]);
static DEAD_LETTER: Statement = Statement::new(include_str!("dead_letter.sql"), &[INT8OID, INT4OID, TEXTOID, INT4OID]);

// outbox_fail(id bigint, error text, lease_token uuid, retry_in interval) RETURNS text
sql_function!(outbox_fail_c, pg_finfo_outbox_fail_c, |args| {
    const FUNCTION: &str = "outbox_fail";
    crate::error::require_writable(FUNCTION);
    let id = required(args.get::<i64>(0), FUNCTION, "id");
    if args.is_null(1) {
        raise(OutboxError::null(FUNCTION, "error").with_hint("Say what went wrong."));
    }
    // Judged and waited as a delay is: by where it takes the clock.
    let retry_in = args.interval(3).map(|wait| {
        or_raise(interval::validate_reach(FUNCTION, "retry_in", &wait));
        if interval::moves_clock(&wait) == Ordering::Less {
            let shown = interval::shown(&wait);
            raise(OutboxError::invalid(FUNCTION, "retry_in", format!("must not be negative, got {shown}")))
        }
        interval::clock_move(&wait)
    });

    let schema = schema_of_function(args.fcinfo());
    let mut spi = Spi::connect();
    let held = spi.execute(&LOCK, schema, &[id.into_datum(), args.datum(2)]);
    if held.is_empty() {
        spi.finish();
        return null_result(args.fcinfo());
    }
    let (attempts, counted_by_the_claim): (i32, bool) = (held.get(0, 1).expect("attempts"), held.get(0, 2).expect("lease"));
    // A claim with a lease counted this attempt already; a claim without one (lease => NULL),
    // or a failure recorded without any claim, is counted here.
    let attempts = if counted_by_the_claim { attempts } else { attempts.saturating_add(1) };
    let status = match settings::retry_policy().after_failure(attempts, retry_in, fastrand::f64()) {
        AfterFailure::RetryIn(wait) => {
            let wait = interval::from_duration(wait).into_datum();
            spi.execute(&RETRY, schema, &[id.into_datum(), attempts.into_datum(), wait, args.datum(1), MAX_ERROR_CHARS.into_datum()]);
            "PENDING"
        }
        AfterFailure::Dead => {
            let arguments = [id.into_datum(), attempts.into_datum(), args.datum(1), MAX_ERROR_CHARS.into_datum()];
            let key = spi.execute(&DEAD_LETTER, schema, &arguments).datum(0, 1);
            ordering::release_message_keys(&mut spi, schema, key);
            "DEAD"
        }
    };
    spi.finish();
    status.into_datum().unwrap()
});

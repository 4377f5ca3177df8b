//! `outbox_claim(batch_size integer, topics text[], lease interval) RETURNS SETOF outbox`
//!
//! Three kept statements: lock the ready rows (FOR UPDATE SKIP LOCKED), dead-letter those out
//! of attempts (only when there are any, which is rare), and, with a lease, record the
//! delivery on the rest. Rows come back oldest-ready first, in the order they were locked.

use super::{function_info_v1, interval_text, sign_of, SpiCall};
use crate::errors::{invalid_argument, null_argument};
use crate::{settings, topic};
use pgrx::fcinfo::{pg_getarg, pg_getarg_datum_raw};
use pgrx::prelude::*;
use std::cmp::Ordering;
use std::collections::HashMap;

/// The largest batch one call may claim (and so the largest `outbox.worker_batch_size`).
pub(crate) const MAX_BATCH_SIZE: i32 = 10_000;

function_info_v1!(pg_finfo_outbox_claim_c);

#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn outbox_claim_c(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let Some(batch_size) = pg_getarg::<i32>(fcinfo, 0) else { null_argument("outbox_claim", "batch_size") };
        if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
            invalid_argument(
                "outbox_claim",
                "batch_size",
                &format!("must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}"),
            );
        }
        let topics = pg_getarg::<Array<&str>>(fcinfo, 1);
        for wanted in topics.iter().flat_map(|topics| topics.iter()) {
            topic::require_valid("outbox_claim", "topics", wanted);
        }
        let lease = pg_getarg::<Interval>(fcinfo, 2);
        if lease.as_ref().is_some_and(|lease| sign_of(lease) != Ordering::Greater) {
            let shown = interval_text(pg_getarg_datum_raw(fcinfo, 2));
            invalid_argument("outbox_claim", "lease", &format!("must be positive, got {shown}"));
        }
        let max_attempts = settings::max_attempts();
        // One reading of the clock for the whole claim: readiness is judged by it (not by the
        // start of the caller's transaction).
        let claimed_at = pg_sys::Datum::from(pg_sys::GetCurrentTimestamp());

        // The result: a tuplestore the caller reads after we return.
        pg_sys::InitMaterializedSRF(fcinfo, 0);
        let result = (*((*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo)).setResult;

        let spi = SpiCall::connect("outbox_claim", fcinfo);
        let topics = topics.is_some().then(|| pg_getarg_datum_raw(fcinfo, 1));
        let locked = spi.run(spi.plans.claim_lock, &[Some(claimed_at), topics, batch_size.into_datum()]);
        // (message, id, attempts) of each locked row, oldest-ready first.
        let rows: Vec<(pg_sys::Datum, i64, i32)> = (0..locked)
            .map(|row| {
                let message = spi.value(row, 1).expect("a whole row is never NULL");
                let id = i64::from_datum(spi.value(row, 2).unwrap(), false).unwrap();
                let attempts = i32::from_datum(spi.value(row, 3).unwrap(), false).unwrap();
                (message, id, attempts)
            })
            .collect();

        let (exhausted, live): (Vec<_>, Vec<_>) = rows.into_iter().partition(|&(_, _, attempts)| attempts >= max_attempts);
        if !exhausted.is_empty() {
            let ids: Vec<i64> = exhausted.iter().map(|&(_, id, _)| id).collect();
            spi.run(spi.plans.claim_dead_letter, &[ids.into_datum(), Some(claimed_at), max_attempts.into_datum()]);
        }

        if lease.is_none() {
            // No lease: the rows stay locked until the caller's transaction ends, and nothing
            // is written. The caller completes or fails them in that transaction (outbox_fail
            // counts the attempt); if it rolls back or dies, they are as if never claimed.
            for &(message, _, _) in &live {
                put_row(result, message);
            }
        } else if !live.is_empty() {
            let ids: Vec<i64> = live.iter().map(|&(_, id, _)| id).collect();
            let leased = spi.run(
                spi.plans.claim_lease,
                &[ids.into_datum(), Some(claimed_at), Some(pg_getarg_datum_raw(fcinfo, 2))],
            );
            let by_id: HashMap<i64, pg_sys::Datum> = (0..leased)
                .map(|row| {
                    let id = i64::from_datum(spi.value(row, 2).unwrap(), false).unwrap();
                    (id, spi.value(row, 1).expect("a whole row is never NULL"))
                })
                .collect();
            for message in live.iter().filter_map(|(_, id, _)| by_id.get(id)) {
                put_row(result, *message);
            }
        }
        spi.finish();
        pg_sys::Datum::from(0)
    }
}

/// Appends a whole-row `outbox` datum to the function's result (the tuplestore copies it).
unsafe fn put_row(result: *mut pg_sys::Tuplestorestate, message: pg_sys::Datum) {
    unsafe {
        // Inside the SPI tuple the row may be stored with a short header: expand it first.
        let header = pg_sys::pg_detoast_datum(message.cast_mut_ptr()) as pg_sys::HeapTupleHeader;
        let mut tuple = pg_sys::HeapTupleData {
            t_len: pgrx::varlena::varsize_any(header as *const pg_sys::varlena) as u32,
            t_data: header,
            ..Default::default()
        };
        pg_sys::tuplestore_puttuple(result, &mut tuple);
    }
}

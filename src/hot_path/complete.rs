//! `outbox_complete(id bigint, lease_token uuid) RETURNS boolean` and its batch form
//! `outbox_complete(ids bigint[], lease_tokens uuid[]) RETURNS integer`: one statement serves
//! both.

use super::{function_info_v1, SpiCall};
use crate::errors::{invalid_argument, null_argument};
use pgrx::fcinfo::{pg_arg_is_null, pg_getarg, pg_getarg_datum_raw};
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;

function_info_v1!(pg_finfo_outbox_complete_c);

#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn outbox_complete_c(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let Some(id) = pg_getarg::<i64>(fcinfo, 0) else { null_argument("outbox_complete", "id") };
        let token = pg_getarg::<pgrx::datum::Uuid>(fcinfo, 1);
        let ids = vec![id].into_datum();
        let tokens = token.map(|t| vec![t]).into_datum();
        let completed = complete(fcinfo, ids, tokens);
        (completed == 1).into_datum().unwrap()
    }
}

function_info_v1!(pg_finfo_outbox_complete_batch_c);

#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn outbox_complete_batch_c(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let Some(ids) = pg_getarg::<Array<i64>>(fcinfo, 0) else { null_argument("outbox_complete", "ids") };
        if ids.contains_nulls() {
            ereport!(ERROR, PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, "outbox_complete: ids must not contain NULL");
        }
        let tokens = pg_getarg::<Array<pgrx::datum::Uuid>>(fcinfo, 1);
        if let Some(tokens) = &tokens {
            if tokens.len() != ids.len() {
                invalid_argument(
                    "outbox_complete",
                    "lease_tokens",
                    &format!("has {} elements but ids has {}", tokens.len(), ids.len()),
                );
            }
        }
        let ids = Some(pg_getarg_datum_raw(fcinfo, 0));
        let tokens = (!pg_arg_is_null(fcinfo, 1)).then(|| pg_getarg_datum_raw(fcinfo, 1));
        let completed = complete(fcinfo, ids, tokens);
        (completed as i32).into_datum().unwrap()
    }
}

/// Marks the PENDING messages among `ids` DONE (each only while `tokens`' element, if any,
/// still holds it); returns how many.
unsafe fn complete(fcinfo: pg_sys::FunctionCallInfo, ids: Option<pg_sys::Datum>, tokens: Option<pg_sys::Datum>) -> usize {
    unsafe {
        let spi = SpiCall::connect("outbox_complete", fcinfo);
        let completed = match tokens {
            Some(_) => spi.run(spi.plans.complete, &[ids, tokens]),
            None => spi.run(spi.plans.complete_any_holder, &[ids]),
        };
        spi.finish();
        completed
    }
}

//! Errors raised from Rust carry a deliberate SQLSTATE and name the function and argument,
//! so a caller can tell bad input (22xxx) from a server fault (XX000).

use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;

/// Refuse a NULL argument: SQLSTATE 22004 (null_value_not_allowed).
pub fn null_argument(function: &str, argument: &str) -> ! {
    ereport!(ERROR, PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, format!("{function}: {argument} must not be NULL"));
}

/// Refuse an argument value: SQLSTATE 22023 (invalid_parameter_value).
pub fn invalid_argument(function: &str, argument: &str, why: &str) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("{function}: {argument} {why}")
    );
}

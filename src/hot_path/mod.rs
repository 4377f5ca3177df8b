//! The hot path: `outbox_enqueue`, `outbox_claim` and `outbox_complete` as C-language
//! functions.
//!
//! They run in every producer's and consumer's transaction, so they do as little as they can
//! per call: arguments are checked in Rust, statements are planned once per session and kept
//! (`SPI_keepplan`), and they declare no `SET search_path` (that clause alone saves and
//! restores the setting on every call). Instead the statements in `sql/hot_path/` name every
//! schema, function and operator in full, so whatever a caller puts on its search_path cannot
//! stand in for them, even when a kept plan is re-planned under that search_path. The
//! functions are declared in `sql/api.sql` (SECURITY DEFINER, like the rest of the API).
//! They replaced PL/pgSQL versions that were measurably slower (bench/README.md has the figures).

mod claim;
mod complete;
mod enqueue;

pub(crate) use claim::MAX_BATCH_SIZE;

use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::{CStr, CString};

/// `Pg_finfo_record` for a C function PostgreSQL calls by symbol (PG_FUNCTION_INFO_V1).
macro_rules! function_info_v1 {
    ($finfo:ident) => {
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pgrx::pg_sys::Pg_finfo_record {
            const V1_API: pgrx::pg_sys::Pg_finfo_record = pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1_API
        }
    };
}
pub(crate) use function_info_v1;

/// The session's kept plans, for the schema the extension lives in.
#[derive(Clone, Copy)]
struct Plans {
    schema: pg_sys::Oid,
    enqueue: pg_sys::SPIPlanPtr,
    enqueue_once_per_key: pg_sys::SPIPlanPtr,
    find_by_dedupe_key: pg_sys::SPIPlanPtr,
    claim_lock: pg_sys::SPIPlanPtr,
    claim_dead_letter: pg_sys::SPIPlanPtr,
    claim_lease: pg_sys::SPIPlanPtr,
    complete: pg_sys::SPIPlanPtr,
    complete_any_holder: pg_sys::SPIPlanPtr,
}

thread_local! {
    // A backend runs one thread: this is per session.
    static PLANS: RefCell<Option<Plans>> = const { RefCell::new(None) };
}

/// A connection to SPI for the duration of one call; `finish` before returning. (On an error
/// PostgreSQL's transaction or subtransaction abort cleans it up.)
struct SpiCall {
    plans: Plans,
}

impl SpiCall {
    /// Connects, and finds (or prepares, on the session's first call) the kept plans for the
    /// schema of the function being called: the extension's.
    unsafe fn connect(function: &str, fcinfo: pg_sys::FunctionCallInfo) -> SpiCall {
        unsafe {
            let schema = pg_sys::get_func_namespace((*(*fcinfo).flinfo).fn_oid);
            if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
                error!("{function}: SPI_connect failed");
            }
            SpiCall { plans: session_plans(schema) }
        }
    }

    /// Runs a kept plan; returns how many rows it returned or changed.
    unsafe fn run(&self, plan: pg_sys::SPIPlanPtr, arguments: &[Option<pg_sys::Datum>]) -> usize {
        let values: Vec<pg_sys::Datum> = arguments.iter().map(|a| a.unwrap_or(pg_sys::Datum::from(0))).collect();
        let nulls: Vec<std::ffi::c_char> =
            arguments.iter().map(|a| if a.is_some() { b' ' } else { b'n' } as std::ffi::c_char).collect();
        unsafe {
            let result = pg_sys::SPI_execute_plan(plan, values.as_ptr() as *mut _, nulls.as_ptr(), false, 0);
            if result < 0 {
                error!("outbox_ext: SPI_execute_plan failed with {result}");
            }
            pg_sys::SPI_processed as usize
        }
    }

    /// Column `column` (from 1) of row `row` of the last statement's result.
    unsafe fn value(&self, row: usize, column: i32) -> Option<pg_sys::Datum> {
        unsafe {
            let table = pg_sys::SPI_tuptable;
            let mut is_null = false;
            let value = pg_sys::SPI_getbinval(*(*table).vals.add(row), (*table).tupdesc, column, &mut is_null);
            (!is_null).then_some(value)
        }
    }

    unsafe fn finish(self) {
        unsafe { pg_sys::SPI_finish() };
    }
}

/// The kept plans for `schema`, prepared on first use in this session (and again should the
/// extension have moved to another schema since).
unsafe fn session_plans(schema: pg_sys::Oid) -> Plans {
    PLANS.with_borrow_mut(|plans| {
        if let Some(kept) = plans.as_ref().filter(|p| p.schema == schema) {
            return *kept;
        }
        let schema_name = unsafe {
            let name = pg_sys::get_namespace_name(schema);
            CStr::from_ptr(pg_sys::quote_identifier(name)).to_string_lossy().into_owned()
        };
        use pg_sys::BuiltinOid::*;
        let keep = |query: &str, types: &[pg_sys::BuiltinOid]| unsafe { keep_plan(query, &schema_name, types) };
        let fresh = Plans {
            schema,
            enqueue: keep(include_str!("../../sql/hot_path/enqueue.sql"), &[TEXTOID, JSONBOID, INTERVALOID]),
            enqueue_once_per_key: keep(
                include_str!("../../sql/hot_path/enqueue_once_per_key.sql"),
                &[TEXTOID, JSONBOID, INTERVALOID, TEXTOID],
            ),
            find_by_dedupe_key: keep(include_str!("../../sql/hot_path/find_by_dedupe_key.sql"), &[TEXTOID]),
            claim_lock: keep(include_str!("../../sql/hot_path/claim_lock.sql"), &[TIMESTAMPTZOID, TEXTARRAYOID, INT4OID]),
            claim_dead_letter: keep(
                include_str!("../../sql/hot_path/claim_dead_letter.sql"),
                &[INT8ARRAYOID, TIMESTAMPTZOID, INT4OID],
            ),
            claim_lease: keep(include_str!("../../sql/hot_path/claim_lease.sql"), &[INT8ARRAYOID, TIMESTAMPTZOID, INTERVALOID]),
            complete: keep(include_str!("../../sql/hot_path/complete.sql"), &[INT8ARRAYOID, UUIDARRAYOID]),
            complete_any_holder: keep(include_str!("../../sql/hot_path/complete_any_holder.sql"), &[INT8ARRAYOID]),
        };
        *plans = Some(fresh);
        fresh
    })
}

unsafe fn keep_plan(query: &str, schema_name: &str, argument_types: &[pg_sys::BuiltinOid]) -> pg_sys::SPIPlanPtr {
    let query = CString::new(query.replace("@extschema@", schema_name)).expect("no NUL in the queries");
    let mut types: Vec<pg_sys::Oid> = argument_types.iter().map(|t| t.value()).collect();
    unsafe {
        // Always the generic plan: PostgreSQL would otherwise plan every call afresh whenever a
        // plan for the actual values looks cheaper (LIMIT 1 does), which is the cost we keep
        // plans to avoid. Each statement has one sensible plan (tests/integration/
        // test_claim_plan.py checks the claim's).
        let options = pg_sys::CURSOR_OPT_GENERIC_PLAN as i32;
        let plan = pg_sys::SPI_prepare_cursor(query.as_ptr(), types.len() as i32, types.as_mut_ptr(), options);
        if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
            let code = pg_sys::SPI_result;
            error!("outbox_ext: preparing a statement failed (SPI result {code})");
        }
        plan
    }
}

/// Interval `value` compared with zero the way `interval < interval '0'` does (a month counts
/// 30 days).
fn sign_of(value: &Interval) -> std::cmp::Ordering {
    let days = i128::from(value.months()) * 30 + i128::from(value.days());
    (days * 86_400_000_000 + i128::from(value.micros())).cmp(&0)
}

/// An interval argument as PostgreSQL shows it, for error messages.
unsafe fn interval_text(interval: pg_sys::Datum) -> String {
    unsafe {
        let shown = pgrx::direct_function_call::<pg_sys::Datum>(pg_sys::interval_out, &[Some(interval)])
            .expect("interval_out returns text");
        CStr::from_ptr(shown.cast_mut_ptr()).to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;
    use std::cmp::Ordering::*;

    #[test]
    fn intervals_compare_with_zero_like_postgres() {
        // (Mixed signs, such as '1 mon -31 days', are checked against PostgreSQL in
        // tests/integration/test_bad_input.py: pgrx cannot build them.)
        let sign = |months, days, micros| sign_of(&Interval::new(months, days, micros).unwrap());
        assert_eq!(sign(0, 0, 0), Equal);
        assert_eq!(sign(0, 0, -1), Less);
        assert_eq!(sign(0, 0, 1), Greater);
        assert_eq!(sign(0, -1, 0), Less);
        assert_eq!(sign(-1, 0, 0), Less);
        assert_eq!(sign(1, 0, 0), Greater);
    }
}

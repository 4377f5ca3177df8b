//! The one way the extension runs SQL: statements from the `.sql` files beside each module,
//! planned once per session (and per schema the extension lives in) and kept.
//!
//! Every statement names every schema, function and operator in full (`@extschema@.outbox`,
//! `OPERATOR(pg_catalog.=)`), so whatever is on the caller's search_path cannot stand in for
//! them, even when PostgreSQL plans a kept statement again under that search_path.
//!
//! Use: `let mut spi = Spi::connect(); let rows = spi.execute(&STATEMENT, schema, &args);`
//! read `rows`, then `spi.finish()`. On an ERROR, PostgreSQL's (sub)transaction abort
//! disconnects SPI itself.

use crate::error::{raise, OutboxError};
use pgrx::datum::FromDatum;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

/// A statement of the extension: its text (with `@extschema@` for the extension's schema, and
/// `@day@` for the day slot of a history table when run by [`Spi::execute_in_day`]) and the types
/// of its parameters `$1, $2, …`.
pub struct Statement {
    pub sql: &'static str,
    pub parameter_types: &'static [pg_sys::BuiltinOid],
}

impl Statement {
    pub const fn new(sql: &'static str, parameter_types: &'static [pg_sys::BuiltinOid]) -> Self {
        Statement { sql, parameter_types }
    }
}

thread_local! {
    // A backend runs one thread that calls into PostgreSQL: this is per session. Keyed by the
    // statement's address, the schema's oid and the day slot it was made for (if any).
    static KEPT_PLANS: RefCell<HashMap<PlanKey, KeptPlan>> = RefCell::new(HashMap::new());
}

type PlanKey = (usize, pg_sys::Oid, Option<u8>);

fn plan_key(statement: &'static Statement, schema: pg_sys::Oid, day: Option<u8>) -> PlanKey {
    (statement as *const Statement as usize, schema, day)
}

/// A kept plan is made again after this long. PostgreSQL plans it again by itself when what
/// it names changes, but not when its tables grow: a plan made while the outbox (or the
/// deliveries) were empty would otherwise walk a whole table or index for the rest of the
/// session once they hold millions of rows. Planning again costs well under a millisecond.
const PLAN_LIFETIME: std::time::Duration = std::time::Duration::from_secs(5);
/// ... and sooner, after a run that took this long, when the plan is at least
/// [`SLOW_PLAN_MIN_AGE`] old: a burst of rows is not served by the plan of an empty table for
/// the rest of [`PLAN_LIFETIME`].
const SLOW_RUN: std::time::Duration = std::time::Duration::from_millis(2);
const SLOW_PLAN_MIN_AGE: std::time::Duration = std::time::Duration::from_millis(500);

/// A plan PostgreSQL keeps for the session (`SPI_keepplan`), until [`PLAN_LIFETIME`] passes.
#[derive(Clone, Copy)]
struct KeptPlan {
    plan: pg_sys::SPIPlanPtr,
    made: std::time::Instant,
}

impl KeptPlan {
    fn for_statement(statement: &'static Statement, schema: pg_sys::Oid, day: Option<u8>) -> KeptPlan {
        let key = plan_key(statement, schema, day);
        match KEPT_PLANS.with_borrow(|plans| plans.get(&key).copied()) {
            Some(kept) if kept.made.elapsed() < PLAN_LIFETIME => return kept,
            // SAFETY: a plan this session kept and no longer uses (no statement is running).
            Some(old) => unsafe {
                pg_sys::SPI_freeplan(old.plan);
            },
            None => {}
        }
        let kept = KeptPlan::prepare(statement, schema, day);
        KEPT_PLANS.with_borrow_mut(|plans| plans.insert(key, kept));
        kept
    }

    /// Plans `statement` again at its next run.
    fn retire(statement: &'static Statement, schema: pg_sys::Oid, day: Option<u8>) {
        let key = plan_key(statement, schema, day);
        KEPT_PLANS.with_borrow_mut(|plans| {
            if let Some(kept) = plans.get_mut(&key) {
                kept.made -= PLAN_LIFETIME;
            }
        });
    }

    fn prepare(statement: &Statement, schema: pg_sys::Oid, day: Option<u8>) -> KeptPlan {
        let mut sql = if statement.sql.contains("@extschema@") {
            statement.sql.replace("@extschema@", &quoted_schema_name(schema))
        } else {
            statement.sql.to_string()
        };
        if let Some(day) = day {
            sql = sql.replace("@day@", &day.to_string());
        }
        let sql = CString::new(sql).expect("no NUL in the extension's statements");
        let mut types: Vec<pg_sys::Oid> = statement.parameter_types.iter().map(|t| t.value()).collect();
        // SAFETY: called while connected to SPI (from Spi::execute); the query and the types
        // array outlive the call, which copies what it keeps.
        unsafe {
            // Always the generic plan: PostgreSQL would otherwise plan every call afresh
            // whenever a plan for the actual values looks cheaper (LIMIT 1 does), which is the
            // cost kept plans avoid. Each statement has one sensible plan.
            let options = pg_sys::CURSOR_OPT_GENERIC_PLAN as i32;
            let plan = pg_sys::SPI_prepare_cursor(sql.as_ptr(), types.len() as i32, types.as_mut_ptr(), options);
            if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                let code = pg_sys::SPI_result;
                raise(OutboxError::Internal(format!("preparing a statement failed (SPI result {code})")));
            }
            KeptPlan { plan, made: std::time::Instant::now() }
        }
    }
}

fn quoted_schema_name(schema: pg_sys::Oid) -> String {
    // SAFETY: get_namespace_name returns a palloc'd name or NULL for an unknown oid;
    // quote_identifier returns its argument or a palloc'd quoted copy.
    unsafe {
        let name = pg_sys::get_namespace_name(schema);
        if name.is_null() {
            raise(OutboxError::Internal(format!("schema {} does not exist", schema.to_u32())));
        }
        CStr::from_ptr(pg_sys::quote_identifier(name)).to_string_lossy().into_owned()
    }
}

/// The schema of the function being called: the extension's. Also makes sure the database's
/// extension is the version of this library (see [`require_matching_version`]).
pub fn schema_of_function(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Oid {
    require_matching_version();
    // SAFETY: fcinfo and its flinfo are valid for the call.
    unsafe { pg_sys::get_func_namespace((*(*fcinfo).flinfo).fn_oid) }
}

static EXTENSION_VERSION: Statement = Statement::new(include_str!("extension_version.sql"), &[]);

thread_local! {
    static VERSION_MATCHES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The version of outbox_ext installed in this database, if any.
fn installed_version() -> Option<String> {
    let mut spi = Spi::connect();
    let installed = spi.execute(&EXTENSION_VERSION, pg_sys::InvalidOid, &[]).get_text(0, 1);
    spi.finish();
    installed
}

/// Whether this database's extension is the version of this library. Checked once per session
/// when it matches, on every call while it does not.
pub fn version_matches() -> bool {
    if !VERSION_MATCHES.get() && installed_version().as_deref() == Some(env!("CARGO_PKG_VERSION")) {
        VERSION_MATCHES.set(true);
    }
    VERSION_MATCHES.get()
}

/// The library's statements are written for its own version of the schema. After a new
/// library is installed, a database still on the old version gets a clear error from the API
/// (until `ALTER EXTENSION outbox_ext UPDATE`), never a statement run against tables it does
/// not fit.
pub fn require_matching_version() {
    if !version_matches() {
        let installed = installed_version().unwrap_or_else(|| "none".into());
        raise(OutboxError::WrongVersion { installed, library: env!("CARGO_PKG_VERSION").into() });
    }
}

/// A connection to SPI: `finish` it before returning.
pub struct Spi {
    _connected: (),
}

impl Spi {
    pub fn connect() -> Spi {
        // SAFETY: SPI_connect may be called in any function running in a transaction.
        if unsafe { pg_sys::SPI_connect() } != pg_sys::SPI_OK_CONNECT as i32 {
            raise(OutboxError::Internal("SPI_connect failed".into()));
        }
        Spi { _connected: () }
    }

    /// Runs `statement` (in the extension's `schema`) with `arguments` (`None`: NULL); the
    /// returned rows are those it returned (or how many it changed, for `len`).
    pub fn execute(&mut self, statement: &'static Statement, schema: pg_sys::Oid, arguments: &[Option<pg_sys::Datum>]) -> Rows<'_> {
        self.run(statement, schema, None, arguments, false)
    }

    /// Runs `statement` as [`Spi::execute`] does, with `@day@` in its text standing for `day`,
    /// the slot of a history table (crate::history): a plan is kept for each slot it runs in.
    pub fn execute_in_day(
        &mut self,
        statement: &'static Statement,
        schema: pg_sys::Oid,
        day: u8,
        arguments: &[Option<pg_sys::Datum>],
    ) -> Rows<'_> {
        self.run(statement, schema, Some(day), arguments, false)
    }

    /// Runs `statement` as [`Spi::execute`] does, but over every row committed before it starts
    /// (and this transaction's own changes), also under REPEATABLE READ and SERIALIZABLE, whose
    /// statements otherwise see the transaction's first snapshot: PostgreSQL's foreign-key
    /// checks read the same way.
    pub fn execute_seeing_latest_commits(
        &mut self,
        statement: &'static Statement,
        schema: pg_sys::Oid,
        arguments: &[Option<pg_sys::Datum>],
    ) -> Rows<'_> {
        self.run(statement, schema, None, arguments, true)
    }

    fn run(
        &mut self,
        statement: &'static Statement,
        schema: pg_sys::Oid,
        day: Option<u8>,
        arguments: &[Option<pg_sys::Datum>],
        latest_commits: bool,
    ) -> Rows<'_> {
        assert_eq!(arguments.len(), statement.parameter_types.len(), "arguments for {}", statement.sql);
        let plan = KeptPlan::for_statement(statement, schema, day);
        let started = std::time::Instant::now();
        let values: Vec<pg_sys::Datum> = arguments.iter().map(|a| a.unwrap_or(pg_sys::Datum::from(0))).collect();
        let nulls: Vec<std::ffi::c_char> = arguments.iter().map(|a| if a.is_some() { b' ' } else { b'n' } as std::ffi::c_char).collect();
        // SAFETY: connected; the plan is kept; values and nulls match the plan's parameters;
        // GetLatestSnapshot returns a snapshot valid until the next one is taken, and
        // SPI_execute_snapshot registers it for the statement's run.
        unsafe {
            let (values, nulls) = (values.as_ptr() as *mut _, nulls.as_ptr());
            let result = if latest_commits {
                let latest = pg_sys::GetLatestSnapshot();
                pg_sys::SPI_execute_snapshot(plan.plan, values, nulls, latest, std::ptr::null_mut(), false, true, 0)
            } else {
                pg_sys::SPI_execute_plan(plan.plan, values, nulls, false, 0)
            };
            if result < 0 {
                raise(OutboxError::Internal(format!("running a statement failed (SPI result {result})")));
            }
            if started.elapsed() > SLOW_RUN && plan.made.elapsed() > SLOW_PLAN_MIN_AGE {
                KeptPlan::retire(statement, schema, day);
            }
            Rows { count: pg_sys::SPI_processed as usize, _spi: self }
        }
    }

    pub fn finish(self) {
        // SAFETY: we are connected (Spi exists only between connect and finish).
        unsafe { pg_sys::SPI_finish() };
    }
}

/// The result of the last statement; valid until the next one (it borrows the connection).
pub struct Rows<'a> {
    count: usize,
    _spi: &'a mut Spi,
}

impl Rows<'_> {
    /// Rows returned, or changed by a statement without RETURNING.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Column `column` (from 1) of row `row`, `None` when NULL.
    pub fn datum(&self, row: usize, column: i32) -> Option<pg_sys::Datum> {
        assert!(row < self.count, "row {row} of {}", self.count);
        // SAFETY: SPI_tuptable holds the last statement's `count` rows (we borrow the
        // connection, so no statement ran since).
        unsafe {
            let table = pg_sys::SPI_tuptable;
            let mut is_null = false;
            let value = pg_sys::SPI_getbinval(*(*table).vals.add(row), (*table).tupdesc, column, &mut is_null);
            (!is_null).then_some(value)
        }
    }

    /// A column converted by pgrx (numbers, booleans, uuids, timestamps, arrays of them).
    pub fn get<T: FromDatum>(&self, row: usize, column: i32) -> Option<T> {
        // SAFETY: the caller names the column's SQL type by T.
        self.datum(row, column).and_then(|datum| unsafe { T::from_polymorphic_datum(datum, false, pg_sys::InvalidOid) })
    }

    /// A text column as UTF-8 (converted from the database's encoding).
    pub fn get_text(&self, row: usize, column: i32) -> Option<String> {
        if row >= self.count {
            return None;
        }
        // pgrx reads a text's bytes as it reads a bytea's (both are varlenas).
        self.get::<&[u8]>(row, column).map(crate::text::from_server)
    }

    /// A text[] column as UTF-8 strings (NULL elements, and a NULL array, as nothing).
    pub fn get_text_array(&self, row: usize, column: i32) -> Vec<String> {
        let Some(datum) = self.datum(row, column) else { return Vec::new() };
        // SAFETY: the column is text[].
        unsafe { crate::array::text_elements(datum) }.0.into_iter().flatten().collect()
    }

    /// A column copied into the memory context that was current before SPI_connect, so it
    /// outlives `finish` (a function's result).
    pub fn datum_for_caller(&self, row: usize, column: i32) -> Option<pg_sys::Datum> {
        // SAFETY: SPI_datumTransfer copies a (possibly composite) datum to the upper context.
        self.datum(row, column).map(|datum| unsafe { pg_sys::SPI_datumTransfer(datum, false, -1) })
    }
}

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
use crate::text::ServerText;
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

/// The oid of the table `outbox` in the extension's `schema` (InvalidOid when it is not there).
pub fn outbox_relation(schema: pg_sys::Oid) -> pg_sys::Oid {
    relation(schema, c"outbox")
}

/// The oid of the relation `name` in the extension's `schema` (InvalidOid when it is not there).
pub fn relation(schema: pg_sys::Oid, name: &std::ffi::CStr) -> pg_sys::Oid {
    // SAFETY: a catalog lookup by name in a namespace, in a transaction.
    unsafe { pg_sys::get_relname_relid(name.as_ptr(), schema) }
}

static EXTENSION_VERSION: Statement = Statement::new(include_str!("extension_version.sql"), &[]);

thread_local! {
    /// `outbox`'s oid once this database's extension was found to be the library's version, in
    /// a state no rollback can undo (see [`forget_the_version_when_it_may_change`]).
    static VERSION_MATCHED_FOR: std::cell::Cell<Option<pg_sys::Oid>> = const { std::cell::Cell::new(None) };
    static FORGETTING_REGISTERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The version of outbox_ext installed in this database, if any, and its schema.
fn installed_version() -> Option<(String, pg_sys::Oid)> {
    let mut spi = Spi::connect();
    let rows = spi.execute(&EXTENSION_VERSION, pg_sys::InvalidOid, &[]);
    let installed = rows.get_text(0, 1).zip(rows.get::<pg_sys::Oid>(0, 2));
    spi.finish();
    installed
}

/// Whether this database's extension is the version of this library. Checked once per session
/// when it matches (until it may have changed), on every call while it does not.
pub fn version_matches() -> bool {
    if VERSION_MATCHED_FOR.get().is_none() {
        if let Some((version, schema)) = installed_version() {
            if version == env!("CARGO_PKG_VERSION") {
                forget_the_version_when_it_may_change();
                VERSION_MATCHED_FOR.set(Some(outbox_relation(schema)));
            }
        }
    }
    VERSION_MATCHED_FOR.get().is_some()
}

/// What was found stays true until a transaction or savepoint rolls back (it may have been an
/// `ALTER EXTENSION … UPDATE` whose result this session used) or `outbox` is invalidated (the
/// extension dropped, perhaps created again at another version, by any session).
fn forget_the_version_when_it_may_change() {
    if FORGETTING_REGISTERED.replace(true) {
        return;
    }
    unsafe extern "C-unwind" fn at_abort(event: pg_sys::XactEvent::Type, _: *mut std::ffi::c_void) {
        if event == pg_sys::XactEvent::XACT_EVENT_ABORT || event == pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT {
            VERSION_MATCHED_FOR.set(None);
        }
    }
    unsafe extern "C-unwind" fn at_savepoint_abort(
        event: pg_sys::SubXactEvent::Type,
        _: pg_sys::SubTransactionId,
        _: pg_sys::SubTransactionId,
        _: *mut std::ffi::c_void,
    ) {
        if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
            VERSION_MATCHED_FOR.set(None);
        }
    }
    unsafe extern "C-unwind" fn at_invalidation(_: pg_sys::Datum, relation: pg_sys::Oid) {
        if relation == pg_sys::InvalidOid || Some(relation) == VERSION_MATCHED_FOR.get() {
            VERSION_MATCHED_FOR.set(None);
        }
    }
    // SAFETY: registers callbacks for the rest of the session, once; they only reset a
    // thread-local of this (the main) thread.
    unsafe {
        pg_sys::RegisterXactCallback(Some(at_abort), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(at_savepoint_abort), std::ptr::null_mut());
        pg_sys::CacheRegisterRelcacheCallback(Some(at_invalidation), pg_sys::Datum::from(0));
    }
}

/// The library's statements are written for its own version of the schema. After a new
/// library is installed, a database still on the old version gets a clear error from the API
/// (until `ALTER EXTENSION outbox_ext UPDATE`), never a statement run against tables it does
/// not fit.
pub fn require_matching_version() {
    if !version_matches() {
        let installed = installed_version().map_or_else(|| "none".into(), |(version, _)| version);
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

    /// Runs `statement` as [`Spi::execute`] does, planned (and planned again) with sequential
    /// scans off: for a statement that must look rows up by their keys whatever the planner
    /// believes of the tables. Before their first ANALYZE (a restore, a pg_upgrade), or empty
    /// when planned (`ONLY outbox` counts no page then), it would scan one table once per row
    /// of the other.
    pub fn execute_by_index(
        &mut self,
        statement: &'static Statement,
        schema: pg_sys::Oid,
        arguments: &[Option<pg_sys::Datum>],
    ) -> Rows<'_> {
        // SAFETY: a GUC nest level, as a function's SET clause makes one: the setting holds
        // until AtEOXact_GUC pops the level (or the transaction's abort does, on an ERROR).
        let level = unsafe {
            let level = pg_sys::NewGUCNestLevel();
            pg_sys::set_config_option(
                c"enable_seqscan".as_ptr(),
                c"off".as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
            level
        };
        let rows = self.run(statement, schema, None, arguments, false);
        // SAFETY: pops the level made above.
        unsafe { pg_sys::AtEOXact_GUC(true, level) };
        rows
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

    /// A text column's bytes as the database holds them ([`ServerText`]: an ordering key).
    pub fn get_server_text(&self, row: usize, column: i32) -> Option<ServerText> {
        // SAFETY: the column is text.
        self.datum(row, column).map(|datum| unsafe { ServerText::from_datum(datum) })
    }

    /// A text[] column's elements (without NULLs) as the database holds them.
    pub fn get_server_text_array(&self, row: usize, column: i32) -> Vec<ServerText> {
        let Some(datum) = self.datum(row, column) else { return Vec::new() };
        // SAFETY: the column is text[], whose elements are text values.
        unsafe {
            let (elements, _) = crate::array::varlena_elements(datum, pg_sys::TEXTOID);
            elements.into_iter().flatten().map(|element| ServerText::from_datum(element)).collect()
        }
    }

    /// A column copied into the memory context that was current before SPI_connect, so it
    /// outlives `finish` (a function's result).
    pub fn datum_for_caller(&self, row: usize, column: i32) -> Option<pg_sys::Datum> {
        // SAFETY: SPI_datumTransfer copies a (possibly composite) datum to the upper context.
        self.datum(row, column).map(|datum| unsafe { pg_sys::SPI_datumTransfer(datum, false, -1) })
    }
}

/// Where a placeholder sits in a statement's or a script's text, when not in plain code.
#[cfg(test)]
#[derive(Debug, PartialEq)]
enum Context {
    Literal,
    QuotedIdentifier,
    DollarQuoted,
    Comment,
}

/// Each place (byte offset) where `placeholder` sits outside plain code in `sql`, and in what.
/// The schema's name replaces `@extschema@` quoted as an identifier: safe in code only. In a
/// literal or a comment, a schema renamed to a name with a quote or a line break (which its
/// owner may do) would end it and run the rest of the name as SQL. With `bodies_are_code`,
/// dollar-quoted bodies (of functions, in an install script) are read as code.
#[cfg(test)]
fn placeholders_outside_code(sql: &str, placeholder: &str, bodies_are_code: bool) -> Vec<(usize, Context)> {
    #[derive(PartialEq)]
    enum In {
        Code,
        Literal { backslash_escapes: bool },
        QuotedIdentifier,
        LineComment,
        BlockComment(u32),
        DollarQuoted(String),
    }
    let bytes = sql.as_bytes();
    let (mut state, mut at, mut found) = (In::Code, 0, Vec::new());
    while at < bytes.len() {
        let rest = &sql[at..];
        if rest.starts_with(placeholder) {
            match state {
                In::Code => {}
                In::Literal { .. } => found.push((at, Context::Literal)),
                In::QuotedIdentifier => found.push((at, Context::QuotedIdentifier)),
                In::LineComment | In::BlockComment(_) => found.push((at, Context::Comment)),
                In::DollarQuoted(_) => found.push((at, Context::DollarQuoted)),
            }
        }
        let mut step = 1;
        state = match state {
            In::Code if rest.starts_with("--") => In::LineComment,
            In::Code if rest.starts_with("/*") => In::BlockComment(1),
            In::Code if rest.starts_with('\'') => {
                let escape_string = at > 0 && bytes[at - 1].eq_ignore_ascii_case(&b'e');
                In::Literal { backslash_escapes: escape_string }
            }
            In::Code if rest.starts_with('"') => In::QuotedIdentifier,
            In::Code if rest.starts_with('$') && (at == 0 || !bytes[at - 1].is_ascii_alphanumeric()) => {
                match rest[1..].find('$').map(|end| &rest[..end + 2]) {
                    Some(tag) if tag[1..tag.len() - 1].chars().all(|c| c.is_alphanumeric() || c == '_') => {
                        step = tag.len();
                        if bodies_are_code {
                            In::Code
                        } else {
                            In::DollarQuoted(tag.to_string())
                        }
                    }
                    _ => In::Code, // a parameter ($1)
                }
            }
            In::Literal { backslash_escapes: true } if rest.starts_with('\\') => {
                step = 2;
                In::Literal { backslash_escapes: true }
            }
            In::Literal { .. } if rest.starts_with("''") => {
                step = 2;
                state
            }
            In::Literal { .. } if rest.starts_with('\'') => In::Code,
            In::QuotedIdentifier if rest.starts_with("\"\"") => {
                step = 2;
                In::QuotedIdentifier
            }
            In::QuotedIdentifier if rest.starts_with('"') => In::Code,
            In::LineComment if rest.starts_with('\n') => In::Code,
            In::BlockComment(depth) if rest.starts_with("/*") => {
                step = 2;
                In::BlockComment(depth + 1)
            }
            In::BlockComment(depth) if rest.starts_with("*/") => {
                step = 2;
                if depth == 1 {
                    In::Code
                } else {
                    In::BlockComment(depth - 1)
                }
            }
            In::DollarQuoted(tag) if rest.starts_with(tag.as_str()) => {
                step = tag.len();
                In::Code
            }
            other => other,
        };
        at += step;
        while !sql.is_char_boundary(at) {
            at += 1;
        }
    }
    found
}

#[cfg(test)]
mod unit_tests {
    use super::{placeholders_outside_code, Context};
    use std::path::{Path, PathBuf};

    #[test]
    fn finds_the_placeholder_in_literals_identifiers_bodies_and_comments() {
        for (sql, context) in [
            ("SELECT '@extschema@.outbox'::regclass", Context::Literal),
            ("SELECT E'it\\'s @extschema@'", Context::Literal),
            ("SELECT 'it''s @extschema@'", Context::Literal),
            ("SELECT \"@extschema@\"", Context::QuotedIdentifier),
            ("SELECT 1 -- see @extschema@.outbox", Context::Comment),
            ("SELECT 1 /* a /* nested */ @extschema@ */", Context::Comment),
            ("DO $body$ SELECT @extschema@.outbox $body$", Context::DollarQuoted),
            ("SELECT $$@extschema@$$", Context::DollarQuoted),
        ] {
            assert_eq!(placeholders_outside_code(sql, "@extschema@", false), [(sql.find('@').unwrap(), context)], "{sql}");
        }
        for sql in [
            "SELECT o.id FROM @extschema@.outbox o WHERE o.topic = $1 AND o.note = 'it''s'",
            "SELECT 1 -- a comment\nFROM @extschema@.outbox /* another */ WHERE x = $2",
            "SELECT '--' || @extschema@.f($1)",
        ] {
            assert_eq!(placeholders_outside_code(sql, "@extschema@", false), [], "{sql}");
        }
        // A function body in an install script is code, with its own comments.
        let body = "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 FROM @extschema@.t -- @extschema@\n $$;";
        assert_eq!(placeholders_outside_code(body, "@extschema@", true), [(body.rfind("@extschema@").unwrap(), Context::Comment)]);
    }

    fn sql_files(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a readable directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                sql_files(&path, found);
            } else if path.extension().is_some_and(|e| e == "sql") {
                found.push(path);
            }
        }
    }

    /// Every statement the extension plans at run time (the `.sql` files under src/) names its
    /// schema in code only: see placeholders_outside_code.
    #[test]
    fn statements_name_the_schema_in_code_only() {
        let mut files = Vec::new();
        sql_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
        assert!(files.len() > 40, "found only {} statement files", files.len());
        for file in files {
            let sql = std::fs::read_to_string(&file).expect("a statement file");
            for placeholder in ["@extschema@", "@day@"] {
                let outside = placeholders_outside_code(&sql, placeholder, false);
                assert!(outside.is_empty(), "{}: {placeholder} outside code: {outside:?}", file.display());
            }
        }
    }

    /// The sources of the install and update scripts never name the schema in a comment.
    /// PostgreSQL substitutes it in their text at CREATE and ALTER EXTENSION … UPDATE, run by a
    /// superuser; it refuses names with quotes (literals are safe there) but not with a line
    /// break, which would end the comment. (The released scripts are frozen: 0.5.15 and
    /// earlier have one such comment, in the header of operations.sql.)
    #[test]
    fn install_scripts_name_the_schema_in_no_comment() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql");
        let mut files: Vec<PathBuf> = ["schema", "helpers", "api", "subscriptions", "operations", "privileges"]
            .iter()
            .map(|name| root.join(format!("{name}.sql")))
            .collect();
        sql_files(&root.join("upgrades"), &mut files);
        for file in files {
            let sql = std::fs::read_to_string(&file).expect("a script");
            let in_comments: Vec<usize> = placeholders_outside_code(&sql, "@extschema@", true)
                .into_iter()
                .filter(|(_, context)| *context == Context::Comment)
                .map(|(at, _)| at)
                .collect();
            assert!(in_comments.is_empty(), "{}: @extschema@ in a comment at byte {in_comments:?}", file.display());
        }
    }
}

//! The worker's database session: connected as the role `outbox_worker` (never a superuser),
//! settings of its own whatever the database or the role says, short transactions whose
//! errors are caught (logged and retried by the loop, never the end of the worker), and the
//! extension found through the catalogs.

use crate::compat;
use crate::spi::{Spi, Statement};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::PgTryBuilder;
use std::ffi::{CStr, CString};
use std::panic::AssertUnwindSafe;

/// The role the worker connects as (sql/privileges.sql creates it and grants it what it needs).
pub const WORKER_ROLE: &str = "outbox_worker";

/// Settings the worker imposes on its own session, over whatever `ALTER DATABASE … SET` or
/// `ALTER ROLE … SET` put there. The search_path first of all: until it is set, nothing runs.
const SESSION_SETTINGS: [(&str, &str); 10] = [
    ("search_path", "pg_catalog, pg_temp"),
    // Its transactions need nothing stronger, and a serializable default would make them fail
    // with 40001 beside SQL consumers.
    ("default_transaction_isolation", "read committed"),
    ("default_transaction_read_only", "off"),
    // Every wait has a bound: a table locked by a long ALTER makes a step fail (logged and
    // retried), it does not hang the worker.
    ("lock_timeout", "10s"),
    ("statement_timeout", "60s"),
    ("idle_in_transaction_session_timeout", "0"),
    // Each step's commit (the outcomes of its answers, in one transaction) waits for the local
    // WAL flush: an outcome lost in a crash would mean the request is made again. Not for
    // standbys: a failover loses at most the last outcomes, which only means redeliveries.
    ("synchronous_commit", "local"),
    ("application_name", "outbox_ext delivery worker"),
    // Its statements are small and run thousands of times a second: compiling them would cost
    // more than it saves.
    ("jit", "off"),
    // Its statements take the oldest rows in index order, a few at a time. Before the tables
    // are analyzed after a burst, the planner would read every ready row into a bitmap and
    // sort them to take the first hundred.
    ("enable_bitmapscan", "off"),
];

/// Connects to the database as `outbox_worker`, both by oid (a name may be bytes of another
/// encoding, which a name read as UTF-8 would miss), and sets the session up.
pub fn connect(to: super::registry::Connection) {
    let settings: Vec<(CString, CString)> = SESSION_SETTINGS
        .iter()
        .map(|(name, value)| (CString::new(*name).expect("no NUL"), CString::new(*value).expect("no NUL")))
        .collect();
    // SAFETY: called once, at the start of a background worker with database access.
    unsafe {
        pg_sys::BackgroundWorkerInitializeConnectionByOid(
            pg_sys::Oid::from(to.database_oid),
            pg_sys::Oid::from(to.role_oid),
            compat::BGWORKER_CONNECT_FLAGS,
        )
    };
    for (name, value) in &settings {
        set(name, value);
    }
}

/// Sets `name` to `value` for the rest of the worker's session.
fn set(name: &CStr, value: &CStr) {
    // SAFETY: a plain GUC assignment at the session level.
    unsafe { pg_sys::SetConfigOption(name.as_ptr(), value.as_ptr(), pg_sys::GucContext::PGC_USERSET, pg_sys::GucSource::PGC_S_SESSION) };
}

/// For the worker's last transaction when it leaves at once: a statement waits for it to
/// leave, so it waits for no lock, and briefly for anything.
pub fn wait_briefly() {
    set(c"lock_timeout", c"50ms");
    set(c"statement_timeout", c"1s");
}

/// An ERROR caught in one of the worker's transactions.
#[derive(Debug, Clone)]
pub struct Failure {
    pub sqlstate: String,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (SQLSTATE {})", self.message, self.sqlstate)
    }
}

fn failure(caught: CaughtError) -> Failure {
    let (code, message) = match &caught {
        CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) => (report.sql_error_code(), report.message().to_string()),
        CaughtError::RustPanic { ereport, .. } => (ereport.sql_error_code(), ereport.message().to_string()),
    };
    Failure { sqlstate: sqlstate_text(code as i32), message }
}

/// An error code's five characters: PostgreSQL packs each in six bits, first character lowest
/// (MAKE_SQLSTATE / unpack_sql_state).
fn sqlstate_text(code: i32) -> String {
    (0..5).map(|i| char::from(b'0' + ((code >> (6 * i)) & 0x3F) as u8)).collect()
}

/// Runs `body` in a transaction of its own and commits it. An ERROR anywhere, the commit
/// included, rolls the transaction back and comes back as `Err`: the worker logs it and tries
/// again later instead of exiting.
pub fn transaction<R>(body: impl FnOnce() -> R) -> Result<R, Failure> {
    // SAFETY: the worker runs no other transaction; these are the calls a background worker
    // makes to run one (as pgrx's BackgroundWorker::transaction and worker_spi do).
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    PgTryBuilder::new(AssertUnwindSafe(|| {
        let result = body();
        // SAFETY: ends the transaction started above, then does what a backend does when it
        // goes idle: reports what the transaction wrote to the shared statistics (at most once
        // a second; a background worker must do it itself). Autovacuum decides by them: without
        // this, the worker's churn of the delivery tables never reached it.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
            pg_sys::pgstat_report_stat(false);
        }
        Ok(result)
    }))
    .catch_others(|caught| {
        // SAFETY: the transaction failed; abort it (this also pops snapshots and disconnects
        // SPI) so that the next one starts clean.
        unsafe { pg_sys::AbortCurrentTransaction() };
        Err(failure(caught))
    })
    .execute()
}

static EXTENSION_SCHEMA: Statement = Statement::new(include_str!("extension_schema.sql"), &[]);
static DATABASE_SETTINGS: Statement = Statement::new(include_str!("database_settings.sql"), &[]);

/// The `outbox.*` settings of `ALTER DATABASE … SET` and `ALTER ROLE outbox_worker SET`, read
/// again (in a transaction) at a reload: PostgreSQL applies them only when a session starts,
/// and a reload re-reads only the server's files. One reset since keeps its value until the
/// worker starts again.
pub fn apply_database_settings() {
    let mut spi = Spi::connect();
    spi.execute(&DATABASE_SETTINGS, pg_sys::InvalidOid, &[]);
    spi.finish();
}

/// The schema outbox_ext is installed in, if it is installed (in a transaction). Found through
/// the catalogs, with the session's search_path already pinned to pg_catalog.
pub fn extension_schema() -> Option<pg_sys::Oid> {
    let mut spi = Spi::connect();
    let rows = spi.execute(&EXTENSION_SCHEMA, pg_sys::InvalidOid, &[]);
    let schema = if rows.is_empty() { None } else { rows.get::<pg_sys::Oid>(0, 1) };
    spi.finish();
    schema
}

#[cfg(test)]
mod unit_tests {
    use super::sqlstate_text;
    use pgrx::PgSqlErrorCode;

    #[test]
    fn sqlstates_unpack_as_postgresql_spells_them() {
        assert_eq!(sqlstate_text(PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE as i32), "55P03");
        assert_eq!(sqlstate_text(PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE as i32), "40001");
        assert_eq!(sqlstate_text(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE as i32), "22023");
        assert_eq!(sqlstate_text(0), "00000");
    }
}

//! Safe access to the few facts of this PostgreSQL process that the extension reads in many
//! places: the clock, the process's database and pid, and its signal flags. Each is sound to
//! read at any time in a backend or background worker (they are set before any of our code
//! runs), so the `unsafe` lives here once instead of at every caller.

use pgrx::pg_sys;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds between the Unix and the PostgreSQL epochs (2000-01-01).
const POSTGRES_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// The current time (microseconds since the PostgreSQL epoch), as `clock_timestamp()` reads it.
pub fn now() -> pg_sys::TimestampTz {
    pgrx::datum::clock_timestamp().into_inner()
}

/// A PostgreSQL timestamp as a system time (one before 1970 as the Unix epoch).
pub fn to_system_time(timestamp: pg_sys::TimestampTz) -> SystemTime {
    let since_unix = timestamp.saturating_add(POSTGRES_EPOCH_OFFSET_MICROS);
    UNIX_EPOCH + Duration::from_micros(u64::try_from(since_unix).unwrap_or(0))
}

/// A system time as a PostgreSQL timestamp (one before 1970 as the Unix epoch).
pub fn from_system_time(time: SystemTime) -> pg_sys::TimestampTz {
    let since_unix = time.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    since_unix.saturating_sub(POSTGRES_EPOCH_OFFSET_MICROS)
}

/// The database this process is connected to (InvalidOid before it connects).
pub fn database_id() -> pg_sys::Oid {
    // SAFETY: a process global, written once when the process connects.
    unsafe { pg_sys::MyDatabaseId }
}

/// The name of database `oid`; None for a database that is gone.
pub fn database_name(oid: pg_sys::Oid) -> Option<String> {
    // SAFETY: get_database_name returns a palloc'd NUL-terminated name in the server's
    // encoding, or NULL for an unknown oid.
    unsafe {
        let name = pg_sys::get_database_name(oid);
        (!name.is_null()).then(|| crate::text::from_server(std::ffi::CStr::from_ptr(name).to_bytes()))
    }
}

/// This process's pid, as PostgreSQL knows it.
pub fn process_id() -> i32 {
    std::process::id() as i32 // what PostgreSQL knows as MyProcPid
}

/// Whether SIGTERM asked this background process to stop.
pub fn shutdown_requested() -> bool {
    // SAFETY: a flag the SIGTERM handler sets; read as volatile since a signal may set it.
    unsafe { (&raw const pg_sys::ShutdownRequestPending).read_volatile() != 0 }
}

/// Applies a reload (after SIGHUP) in this process: the settings are read again.
pub fn reload_configuration() {
    // SAFETY: what a backend does at its next command after SIGHUP; we are between statements.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn timestamps_convert_both_ways_around_the_postgres_epoch() {
        let postgres_epoch = UNIX_EPOCH + Duration::from_secs(946_684_800);
        assert_eq!(to_system_time(0), postgres_epoch);
        assert_eq!(from_system_time(postgres_epoch), 0);
        let later = postgres_epoch + Duration::from_micros(123_456_789);
        assert_eq!(from_system_time(later), 123_456_789);
        assert_eq!(to_system_time(from_system_time(later)), later);
    }
}

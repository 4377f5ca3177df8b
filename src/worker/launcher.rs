//! The launcher: one background process for the whole server (preloading the library is all it
//! takes) that gives every database with outbox_ext its delivery worker.
//!
//! - At server start it does not know which databases have the extension, so it starts a worker
//!   in each connectable database (not a template) that `outbox.worker_databases` allows; a
//!   worker that finds no extension says so and exits at once.
//! - `CREATE EXTENSION outbox_ext` (and `ALTER EXTENSION … UPDATE`) announce the database at
//!   commit: its worker starts within moments, no restart.
//! - `DROP EXTENSION` ends the worker (it notices within its poll interval); `DROP DATABASE`
//!   pauses it first (`hooks.rs`), so the drop is not held up.
//! - At most `outbox.max_workers` run at once; a database beyond the cap is named in a WARNING
//!   and shown by `outbox_worker_status()`. One that nothing announced (after a restart, or a
//!   copy made by `CREATE DATABASE … TEMPLATE`) is first checked for the extension by a short
//!   process of its own, outside the cap, one at a time.
//! - A worker that dies is started again after a pause that grows while it keeps dying (no
//!   crash loop, no log spam); never while its predecessor is still there.

use super::registry::{self, ExitReason, WaitReason};
use super::session::WORKER_ROLE;
use crate::settings;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, DynamicBackgroundWorker, SignalWakeFlags};
use pgrx::pg_sys;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::time::{Duration, Instant};

/// A worker that died is started again after this, doubling while it keeps dying ...
const FIRST_RESTART_WAIT: Duration = Duration::from_secs(1);
/// ... up to this.
const MAX_RESTART_WAIT: Duration = Duration::from_secs(60);
/// A worker that ran this long before dying is not "dying quickly".
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// The launcher looks at the databases at least this often.
const ROUND_INTERVAL: Duration = Duration::from_secs(1);

/// Registers the launcher (while preloading).
pub fn register() {
    BackgroundWorkerBuilder::new("outbox_ext launcher")
        .set_type("outbox_ext launcher")
        .set_library("outbox_ext")
        .set_function("outbox_launcher_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HasExtension {
    Unknown,
    Yes,
    No,
}

/// A database and what the launcher knows of it.
struct Database {
    name: String,
    has_extension: HasExtension,
    worker: Option<Running>,
    next_start: Instant,
    restart_wait: Duration,
    warned_waiting: bool,
    /// Its last worker ended without saying why: it waits to start again (shown as such).
    last_worker_failed: bool,
}

struct Running {
    slot: usize,
    /// A check for the extension, not a delivery worker.
    checking: bool,
    handle: DynamicBackgroundWorker,
    started: Instant,
}

/// A row of pg_database.
struct Listed {
    oid: u32,
    name: String,
    connectable: bool,
}

#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn outbox_launcher_main(_argument: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the launcher reads only the shared catalogs (pg_database, pg_authid).
    BackgroundWorker::connect_worker_to_spi(None, None);
    registry::attach_launcher();
    let mut databases: BTreeMap<u32, Database> = BTreeMap::new();
    let mut named_but_missing: BTreeSet<String> = BTreeSet::new();
    while !crate::backend::shutdown_requested() {
        if BackgroundWorker::sighup_received() {
            crate::backend::reload_configuration();
        }
        round(&mut databases, &mut named_but_missing);
        // Woken early by an announcement, or by the postmaster when a worker starts or stops.
        super::sleep::wait(None, ROUND_INTERVAL);
    }
    // Workers stop by themselves: the postmaster sends them SIGTERM too. Exit code 1: at a
    // shutdown nothing is started again anyway, and after an operator's pg_terminate_backend
    // the postmaster starts the launcher again after its restart time, where 0 unregistered it
    // for good (no worker started or restarted until the server's restart: stop 56's probe).
    // SAFETY: ends the process the normal way.
    unsafe { pg_sys::proc_exit(1) };
}

fn round(databases: &mut BTreeMap<u32, Database>, named_but_missing: &mut BTreeSet<String>) {
    let resumes_before = registry::resumes();
    let (listed, worker_role) = read_catalogs();
    let wanted_names = settings::worker_databases();

    // Databases that came and went.
    let present: BTreeSet<u32> = listed.iter().map(|d| d.oid).collect();
    databases.retain(|oid, database| present.contains(oid) || database.worker.is_some());
    for entry in &listed {
        let database = databases.entry(entry.oid).or_insert_with(|| Database {
            name: entry.name.clone(),
            has_extension: HasExtension::Unknown,
            worker: None,
            next_start: Instant::now(),
            restart_wait: FIRST_RESTART_WAIT,
            warned_waiting: false,
            last_worker_failed: false,
        });
        database.name.clone_from(&entry.name); // (ALTER DATABASE … RENAME)
    }
    if let Some(names) = &wanted_names {
        for name in names {
            if !listed.iter().any(|d| &d.name == name) && named_but_missing.insert(name.clone()) {
                pgrx::log!(
                    "outbox_ext: outbox.worker_databases names \"{name}\", which does not exist (yet); it gets a worker once it does"
                );
            }
        }
        named_but_missing.retain(|name| !listed.iter().any(|d| &d.name == name));
    }

    // What CREATE / ALTER EXTENSION announced.
    let (announced, overflow) = registry::take_announced();
    for oid in announced {
        if let Some(database) = databases.get_mut(&oid) {
            database.has_extension = HasExtension::Yes;
            database.next_start = database.next_start.min(Instant::now());
        }
    }
    if overflow {
        for database in databases.values_mut().filter(|d| d.has_extension == HasExtension::No) {
            database.has_extension = HasExtension::Unknown;
        }
    }

    // Workers that ended.
    for database in databases.values_mut() {
        let Some(running) = &database.worker else { continue };
        if running.handle.pid().is_ok() || matches!(running.handle.pid(), Err(pgrx::bgworkers::BackgroundWorkerStatus::NotYetStarted)) {
            continue;
        }
        let running = database.worker.take().expect("checked");
        let reason = registry::release_slot(running.slot);
        database.last_worker_failed = reason == ExitReason::Unknown;
        match reason {
            ExitReason::NoExtension => database.has_extension = HasExtension::No,
            ExitReason::Stopped => database.next_start = Instant::now(),
            ExitReason::LeftWhenAsked => {
                // DROP EXTENSION asks so too: whether the database still has the extension
                // takes a look before it is said to wait for a worker (stop 57's probe).
                database.has_extension = HasExtension::Unknown;
                database.next_start = Instant::now();
            }
            ExitReason::HasExtension => {
                database.has_extension = HasExtension::Yes;
                database.next_start = Instant::now();
            }
            ExitReason::Unknown => {
                // It died (or could not connect): wait before the next one, longer each time.
                if running.started.elapsed() >= HEALTHY_RUN {
                    database.restart_wait = FIRST_RESTART_WAIT;
                }
                database.next_start = Instant::now() + database.restart_wait;
                database.restart_wait = (database.restart_wait * 2).min(MAX_RESTART_WAIT);
            }
        }
    }

    // Who should have a worker.
    let connectable: BTreeSet<u32> = listed.iter().filter(|d| d.connectable).map(|d| d.oid).collect();
    let allowed = |database: &Database| wanted_names.as_ref().is_none_or(|names| names.iter().any(|n| n == &database.name));
    let mut running = databases.values().filter(|d| d.worker.as_ref().is_some_and(|w| !w.checking)).count();
    let mut checking = databases.values().any(|d| d.worker.as_ref().is_some_and(|w| w.checking));
    let max_workers = settings::max_workers();
    let mut waiting = Vec::new();
    for (&oid, database) in databases.iter_mut() {
        let wanted = worker_role.is_some()
            && connectable.contains(&oid)
            && allowed(database)
            && database.has_extension != HasExtension::No
            && !registry::is_paused(oid);
        if !wanted {
            if let Some(worker) = &database.worker {
                if allowed(database) {
                    registry::ask_to_leave(worker.slot);
                } else {
                    // Left out of outbox.worker_databases: its answers are recorded first, as
                    // at a shutdown (leaving at once sent them again: stop 56's probe).
                    registry::ask_to_drain(worker.slot);
                }
            }
            continue;
        }
        if database.worker.is_some() {
            continue;
        }
        if Instant::now() < database.next_start {
            if database.last_worker_failed && database.has_extension == HasExtension::Yes {
                waiting.push((oid, WaitReason::LastWorkerFailed));
            }
            continue;
        }
        if registry::resumes() != resumes_before {
            // A database was let back after what was read above: it may be one a DROP has just
            // ended (its worker would fail to connect). resume() woke the launcher: the next
            // round reads the databases again.
            continue;
        }
        let reason = if running >= max_workers {
            if database.has_extension == HasExtension::Unknown {
                // Whether it waits at all (it may have no extension) takes a look inside.
                if !checking {
                    database.worker = start_worker(oid, worker_role, &database.name, Purpose::Check);
                    checking = database.worker.is_some();
                }
                continue;
            }
            Some(WaitReason::MaxWorkers)
        } else {
            match start_worker(oid, worker_role, &database.name, Purpose::Deliver) {
                Some(worker) => {
                    database.worker = Some(worker);
                    database.warned_waiting = false;
                    running += 1;
                    None
                }
                None => Some(WaitReason::NoBackgroundWorkerSlot),
            }
        };
        // Databases known to have the extension wait visibly; unknown ones are looked at when
        // there is room, but for want of a background worker slot: then there is no room to
        // look either (after a restart every database is unknown: one that got no slot was
        // shown nowhere and named in no WARNING, stop 58's probe of crashes).
        let shown = match (reason, database.has_extension) {
            (Some(reason), HasExtension::Yes) | (Some(reason @ WaitReason::NoBackgroundWorkerSlot), HasExtension::Unknown) => Some(reason),
            _ => None,
        };
        if let Some(reason) = shown {
            waiting.push((oid, reason));
            if !database.warned_waiting {
                let why = match reason {
                    WaitReason::MaxWorkers => format!("outbox.max_workers ({max_workers}) workers are running"),
                    WaitReason::NoBackgroundWorkerSlot => "no background worker slot is free (raise max_worker_processes)".into(),
                    WaitReason::LastWorkerFailed => "its last worker failed; it starts again after a pause".into(),
                };
                let whether = if database.has_extension == HasExtension::Yes { "" } else { " (if it has outbox_ext)" };
                pgrx::warning!("outbox_ext: database \"{}\" has no delivery worker{whether}: {why}", database.name);
                database.warned_waiting = true;
            }
        }
    }
    registry::set_waiting(&waiting);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Deliver,
    /// Only find out whether the database has the extension (see [`outbox_database_check_main`]).
    Check,
}

/// Starts a worker (or a check) of `database_oid`, to connect as `role_oid`: both by oid, so a
/// name that is not UTF-8 (its bytes in another encoding) or one just renamed cannot miss.
fn start_worker(database_oid: u32, role_oid: Option<u32>, name: &str, purpose: Purpose) -> Option<Running> {
    let checking = purpose == Purpose::Check;
    let slot = registry::reserve_slot(database_oid, role_oid?, checking)?;
    let launcher_pid = crate::backend::process_id();
    let (title, kind, function) = match purpose {
        Purpose::Deliver => (format!("outbox_ext delivery worker for {name}"), "outbox_ext delivery worker", "outbox_worker_main"),
        Purpose::Check => (format!("outbox_ext check of {name}"), "outbox_ext database check", "outbox_database_check_main"),
    };
    let loaded = BackgroundWorkerBuilder::new(&title)
        .set_type(kind)
        .set_library("outbox_ext")
        .set_function(function)
        .set_argument(Some(pg_sys::Datum::from(slot)))
        .set_extra(name)
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(None)
        .set_notify_pid(launcher_pid)
        .load_dynamic();
    match loaded {
        Ok(handle) => Some(Running { slot, checking, handle, started: Instant::now() }),
        Err(_) => {
            registry::release_slot(slot);
            None
        }
    }
}

/// The entry point of a check: a short-lived background worker that connects to a database the
/// launcher knows nothing of while every delivery worker is taken, and reports whether it has
/// outbox_ext (its argument is its registry slot, which names the database).
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn outbox_database_check_main(argument: pg_sys::Datum) {
    let slot = argument.value();
    super::session::connect(registry::attach(slot));
    let reason = match super::session::transaction(super::session::extension_schema) {
        Ok(Some(_)) => ExitReason::HasExtension,
        Ok(None) => ExitReason::NoExtension,
        Err(_) => ExitReason::Unknown, // looked at again after a pause, as a worker that died
    };
    registry::update(slot, |s| s.exit_reason = reason);
    // SAFETY: ends the process the normal way.
    unsafe { pg_sys::proc_exit(0) };
}

/// The databases (oid, name, whether one may connect and it is not a template) and the oid of
/// the worker's role if it exists, read from the shared catalogs in a transaction.
fn read_catalogs() -> (Vec<Listed>, Option<u32>) {
    let mut listed = Vec::new();
    let mut worker_role = None;
    // SAFETY: a background worker's transaction around heap scans of two shared catalogs, as
    // the autovacuum and logical replication launchers do.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());

        let relation = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as i32);
        let scan = pg_sys::table_beginscan_catalog(relation, 0, std::ptr::null_mut());
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let row = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
            listed.push(Listed {
                oid: row.oid.to_u32(),
                name: CStr::from_ptr(row.datname.data.as_ptr()).to_string_lossy().into_owned(),
                connectable: row.datallowconn && !row.datistemplate,
            });
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(relation, pg_sys::AccessShareLock as i32);

        let relation = pg_sys::table_open(pg_sys::AuthIdRelationId, pg_sys::AccessShareLock as i32);
        let scan = pg_sys::table_beginscan_catalog(relation, 0, std::ptr::null_mut());
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let row = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_authid>(tuple);
            if CStr::from_ptr(row.rolname.data.as_ptr()).to_bytes() == WORKER_ROLE.as_bytes() {
                worker_role = Some(row.oid.to_u32());
            }
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(relation, pg_sys::AccessShareLock as i32);

        pg_sys::PopActiveSnapshot();
        pg_sys::CommitTransactionCommand();
    }
    (listed, worker_role)
}

//! The workers' shared-memory registry: where each delivery worker's latch is (so a committing
//! producer can wake it) and what it has been doing (for `outbox_worker_status()`).
//!
//! It exists only when the library is preloaded; without it, waking is a no-op and the status
//! function returns no rows.

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};
use std::sync::atomic::{AtomicBool, Ordering};

/// At most this many workers (databases) are started.
pub const MAX_WORKERS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum WorkerState {
    #[default]
    Starting,
    /// The database has no `outbox_ext` extension (yet).
    WaitingForExtension,
    /// `outbox.worker_enabled` is off.
    Disabled,
    Idle,
    Delivering,
}

impl WorkerState {
    fn label(self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::WaitingForExtension => "waiting for CREATE EXTENSION outbox_ext",
            WorkerState::Disabled => "disabled (outbox.worker_enabled = off)",
            WorkerState::Idle => "idle",
            WorkerState::Delivering => "delivering",
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Slot {
    pub database_oid: u32,
    pub pid: i32,
    /// The worker's `MyLatch`: PGPROC latches live in shared memory at the same address in
    /// every process of the cluster.
    latch: usize,
    pub started_at: pg_sys::TimestampTz,
    pub last_poll_at: pg_sys::TimestampTz,
    pub in_flight: i32,
    pub delivered: i64,
    pub failed: i64,
    pub state: WorkerState,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Registry {
    slots: [Slot; MAX_WORKERS],
}

unsafe impl PGRXSharedMemory for Registry {}

static REGISTRY: PgLwLock<Registry> = unsafe { PgLwLock::new(c"outbox_ext_worker_registry") };
/// Set in the postmaster while preloading; inherited by every process it forks.
static IN_SHARED_MEMORY: AtomicBool = AtomicBool::new(false);

/// Requests the registry's shared memory. Only while preloading.
pub fn init() {
    pg_shmem_init!(REGISTRY);
    IN_SHARED_MEMORY.store(true, Ordering::Relaxed);
}

/// Claims `slot` for the calling worker until it exits, however it exits.
pub fn attach(slot: usize) {
    let mut registry = REGISTRY.exclusive();
    registry.slots[slot] = Slot {
        database_oid: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        pid: unsafe { pg_sys::MyProcPid },
        latch: unsafe { pg_sys::MyLatch } as usize,
        started_at: unsafe { pg_sys::GetCurrentTimestamp() },
        ..Slot::default()
    };
    drop(registry);
    unsafe { pg_sys::before_shmem_exit(Some(detach_on_exit), pg_sys::Datum::from(slot)) };
}

/// Frees the worker's slot on the way out (a clean stop, or an ERROR that ends the worker), so
/// the status shows no ghost and no producer sets a latch that is no longer the worker's.
#[pg_guard]
unsafe extern "C-unwind" fn detach_on_exit(_code: std::ffi::c_int, slot: pg_sys::Datum) {
    REGISTRY.exclusive().slots[slot.value()] = Slot::default();
}

/// Updates the calling worker's slot.
pub fn update(slot: usize, change: impl FnOnce(&mut Slot)) {
    change(&mut REGISTRY.exclusive().slots[slot]);
}

/// Sets the latch of every worker serving `database_oid`.
fn wake_workers_of(database_oid: u32) {
    let registry = REGISTRY.share();
    for slot in registry.slots.iter().filter(|s| s.pid != 0 && s.database_oid == database_oid) {
        unsafe { pg_sys::SetLatch(slot.latch as *mut pg_sys::Latch) };
    }
}

/// Whether this transaction has enqueued something a worker should hear about at commit.
static WAKE_AT_COMMIT: AtomicBool = AtomicBool::new(false);
static CALLBACK_REGISTERED: AtomicBool = AtomicBool::new(false);

#[pg_guard]
unsafe extern "C-unwind" fn on_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        // The commit is visible to other sessions by now: the woken worker will see the rows.
        pg_sys::XactEvent::XACT_EVENT_COMMIT => {
            if WAKE_AT_COMMIT.swap(false, Ordering::Relaxed) {
                wake_workers_of(unsafe { pg_sys::MyDatabaseId }.to_u32());
            }
        }
        pg_sys::XactEvent::XACT_EVENT_ABORT
        | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
        | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT => WAKE_AT_COMMIT.store(false, Ordering::Relaxed),
        _ => {}
    }
}

/// Called by `outbox_enqueue`: when this transaction commits, wake the database's delivery
/// worker(s) so an idle worker does not wait for its next poll.
#[pg_extern(volatile, parallel_unsafe)]
fn outbox_wake_worker_at_commit() {
    wake_worker_at_commit();
}

/// The body of `outbox_wake_worker_at_commit`, for callers in Rust.
pub fn wake_worker_at_commit() {
    if !IN_SHARED_MEMORY.load(Ordering::Relaxed) {
        return; // not preloaded: there is no worker to wake
    }
    if !CALLBACK_REGISTERED.swap(true, Ordering::Relaxed) {
        unsafe { pg_sys::RegisterXactCallback(Some(on_transaction_end), std::ptr::null_mut()) };
    }
    WAKE_AT_COMMIT.store(true, Ordering::Relaxed);
}

fn timestamp(value: pg_sys::TimestampTz) -> Option<TimestampWithTimeZone> {
    if value == 0 {
        None
    } else {
        TimestampWithTimeZone::try_from(value).ok()
    }
}

/// What each delivery worker is doing: one row per running worker.
#[pg_extern(volatile, parallel_unsafe)]
fn outbox_worker_status() -> TableIterator<
    'static,
    (
        name!(database, Option<String>),
        name!(pid, i32),
        name!(state, String),
        name!(started_at, Option<TimestampWithTimeZone>),
        name!(last_poll_at, Option<TimestampWithTimeZone>),
        name!(in_flight, i32),
        name!(delivered, i64),
        name!(failed, i64),
    ),
> {
    if !IN_SHARED_MEMORY.load(Ordering::Relaxed) {
        return TableIterator::new(Vec::new());
    }
    let slots: Vec<Slot> = REGISTRY.share().slots.iter().filter(|s| s.pid != 0).copied().collect();
    let rows: Vec<_> = slots
        .into_iter()
        .map(|slot| {
            let name = unsafe { pg_sys::get_database_name(pg_sys::Oid::from(slot.database_oid)) };
            let database = (!name.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned());
            (
                database,
                slot.pid,
                slot.state.label().to_string(),
                timestamp(slot.started_at),
                timestamp(slot.last_poll_at),
                slot.in_flight,
                slot.delivered,
                slot.failed,
            )
        })
        .collect();
    TableIterator::new(rows)
}

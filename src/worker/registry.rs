//! The delivery workers' shared memory: one slot per running worker (its database, its latch so
//! a committing producer can wake it, what it is doing for `outbox_worker_status()`), the
//! launcher's latch and the databases it was told about or could not serve.
//!
//! It exists only when the library is preloaded; without it, waking is a no-op and the status
//! function returns no rows.

use super::topic_filter::TopicFilter;
use crate::backend::{now, process_id};
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Slots for workers: `outbox.max_workers` may be set up to this.
pub const SLOTS: usize = 64;
/// Databases the launcher can report as waiting for a worker.
const WAITING: usize = 64;
/// Databases announced by CREATE / ALTER EXTENSION, not yet seen by the launcher.
const ANNOUNCED: usize = 64;
/// Databases whose worker must stay away for a while (DROP DATABASE and the like).
const PAUSED: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum WorkerState {
    #[default]
    Starting,
    /// `outbox.worker_enabled` is off.
    Disabled,
    Idle,
    Delivering,
    /// SIGTERM, DROP EXTENSION: finishing what is in flight.
    Draining,
    /// The database's extension is older than the library.
    WaitingForUpdate,
    /// Its last step failed (a lock held past lock_timeout, say): tried again after a pause.
    Retrying,
}

impl WorkerState {
    pub fn label(self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::Disabled => "disabled (outbox.worker_enabled = off)",
            WorkerState::Idle => "idle",
            WorkerState::Delivering => "delivering",
            WorkerState::Draining => "stopping: finishing the requests in flight",
            WorkerState::WaitingForUpdate => "waiting for ALTER EXTENSION outbox_ext UPDATE",
            WorkerState::Retrying => "retrying: its last step failed (see the server log)",
        }
    }
}

/// Why a worker ended, for the launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum ExitReason {
    /// It did not say (it crashed, or never got to run).
    #[default]
    Unknown,
    /// The database has no outbox_ext (never had, or DROP EXTENSION).
    NoExtension,
    /// Asked to stop (SIGTERM, or to drain: left out of outbox.worker_databases).
    Stopped,
    /// A check (not a delivery worker) found outbox_ext in the database.
    HasExtension,
    /// Asked to leave at once: by a statement that pauses the database (DROP EXTENSION among
    /// them), or by the launcher. Whether the database still has the extension is not known.
    LeftWhenAsked,
}

/// Why a database has no worker although it should.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum WaitReason {
    #[default]
    MaxWorkers,
    NoBackgroundWorkerSlot,
    /// Its last worker ended without saying why (it could not connect, or failed): the next
    /// starts after a pause.
    LastWorkerFailed,
}

impl WaitReason {
    /// The `state` outbox_worker_status() shows.
    pub fn label(self) -> &'static str {
        match self {
            WaitReason::MaxWorkers => "waiting: outbox.max_workers workers are running",
            WaitReason::NoBackgroundWorkerSlot => "waiting: no background worker slot (max_worker_processes)",
            WaitReason::LastWorkerFailed => "waiting: its last worker failed, to start again (see the server log: it may not connect)",
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Slot {
    pub database_oid: u32,
    /// The role the worker connects as (`outbox_worker`'s oid when the launcher started it).
    role_oid: u32,
    pub pid: i32,
    /// The worker's `MyLatch`: PGPROC latches live in shared memory at the same address in
    /// every process of the cluster.
    latch: usize,
    pub started_at: pg_sys::TimestampTz,
    pub last_poll_at: pg_sys::TimestampTz,
    pub in_flight: i32,
    pub delivered: i64,
    pub failed: i64,
    /// The worker's compactions of the hot tables (outbox_compact that did something).
    pub compactions: i64,
    pub last_compaction_at: pg_sys::TimestampTz,
    pub state: WorkerState,
    /// Set by another process: leave at once, abandoning what is in flight.
    pub leave_now: bool,
    /// Set by the launcher: leave once what is in flight has its answer, as at SIGTERM (its
    /// database left outbox.worker_databases).
    pub drain: bool,
    /// Set by the worker as it exits; read (and reset) by the launcher.
    pub exit_reason: ExitReason,
    /// Not a delivery worker: the launcher's short check for outbox_ext in the database, made
    /// while every worker is taken (outside outbox.max_workers; not shown by the status).
    pub checking: bool,
    /// The topics the worker delivers: a producer's commit of other topics does not wake it.
    topics: TopicFilter,
    /// Set with the latch by an operator's function (a subscription changed, a redelivery):
    /// read the subscriptions again.
    reload_requested: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Waiting {
    database_oid: u32,
    reason: WaitReason,
}

#[derive(Debug, Clone, Copy, Default)]
struct Paused {
    database_oid: u32,
    until: pg_sys::TimestampTz,
}

#[derive(Debug, Clone, Copy)]
pub struct Registry {
    launcher_latch: usize,
    slots: [Slot; SLOTS],
    waiting: [Waiting; WAITING],
    waiting_count: usize,
    announced: [u32; ANNOUNCED],
    announced_count: usize,
    /// More databases were announced than fit: the launcher looks at all of them again.
    announced_overflow: bool,
    paused: [Paused; PAUSED],
    /// How many times a database was let back (see [`resume`]).
    resumed: u64,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            launcher_latch: 0,
            slots: [Slot::default(); SLOTS],
            waiting: [Waiting::default(); WAITING],
            waiting_count: 0,
            announced: [0; ANNOUNCED],
            announced_count: 0,
            announced_overflow: false,
            paused: [Paused::default(); PAUSED],
            resumed: 0,
        }
    }
}

// SAFETY: the registry is plain data (no pointers into process memory; latches are shared
// memory addresses valid in every process of the cluster).
unsafe impl PGRXSharedMemory for Registry {}

// SAFETY: the name is unique to this extension.
static REGISTRY: PgLwLock<Registry> = unsafe { PgLwLock::new(c"outbox_ext_worker_registry") };
/// Set in the postmaster while preloading; inherited by every process it forks.
static IN_SHARED_MEMORY: AtomicBool = AtomicBool::new(false);

/// Requests the registry's shared memory. Only while preloading.
pub fn init() {
    pg_shmem_init!(REGISTRY);
    IN_SHARED_MEMORY.store(true, Ordering::Relaxed);
}

pub fn available() -> bool {
    IN_SHARED_MEMORY.load(Ordering::Relaxed)
}

fn my_latch() -> usize {
    // SAFETY: MyLatch is set for every process attached to shared memory.
    unsafe { pg_sys::MyLatch as usize }
}

fn set_latch(latch: usize) {
    if latch != 0 {
        // SAFETY: a PGPROC latch in shared memory (see Slot::latch).
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}

// ---- the launcher ----------------------------------------------------------------------

/// The launcher registers its latch, to be woken by announcements and by workers' exits.
pub fn attach_launcher() {
    REGISTRY.exclusive().launcher_latch = my_latch();
}

/// Databases announced since the last call (and whether some were lost to overflow).
pub fn take_announced() -> (Vec<u32>, bool) {
    let mut registry = REGISTRY.exclusive();
    let taken = registry.announced[..registry.announced_count].to_vec();
    let overflow = registry.announced_overflow;
    registry.announced_count = 0;
    registry.announced_overflow = false;
    (taken, overflow)
}

/// Publishes the databases that should have a worker but have none, and why.
pub fn set_waiting(databases: &[(u32, WaitReason)]) {
    let mut registry = REGISTRY.exclusive();
    let count = databases.len().min(WAITING);
    for (entry, &(database_oid, reason)) in registry.waiting.iter_mut().zip(databases) {
        *entry = Waiting { database_oid, reason };
    }
    registry.waiting_count = count;
}

/// Claims a free slot for a new worker (or a check) of `database_oid`; `None` when all are taken.
pub fn reserve_slot(database_oid: u32, role_oid: u32, checking: bool) -> Option<usize> {
    let mut registry = REGISTRY.exclusive();
    let free = registry.slots.iter().position(|s| s.database_oid == 0)?;
    registry.slots[free] = Slot { database_oid, role_oid, checking, ..Slot::default() };
    Some(free)
}

/// Frees a slot whose worker has ended; returns why it ended.
pub fn release_slot(slot: usize) -> ExitReason {
    let mut registry = REGISTRY.exclusive();
    let reason = registry.slots[slot].exit_reason;
    registry.slots[slot] = Slot::default();
    reason
}

/// Asks the worker in `slot` to leave at once.
pub fn ask_to_leave(slot: usize) {
    let mut registry = REGISTRY.exclusive();
    registry.slots[slot].leave_now = true;
    set_latch(registry.slots[slot].latch);
}

/// Asks the worker in `slot` to leave once its requests in flight have their answers.
pub fn ask_to_drain(slot: usize) {
    let mut registry = REGISTRY.exclusive();
    registry.slots[slot].drain = true;
    set_latch(registry.slots[slot].latch);
}

/// Whether `database_oid`'s worker must stay away now.
pub fn is_paused(database_oid: u32) -> bool {
    let registry = REGISTRY.share();
    let now = now();
    registry.paused.iter().any(|p| p.database_oid == database_oid && p.until > now)
}

// ---- a worker --------------------------------------------------------------------------

/// Whom a worker connects to, and as whom, by oid.
#[derive(Debug, Clone, Copy)]
pub struct Connection {
    pub database_oid: u32,
    pub role_oid: u32,
}

/// The calling worker takes `slot` (reserved for it by the launcher) until it exits, however
/// it exits; the slot says whom it connects to.
pub fn attach(slot: usize) -> Connection {
    let mut registry = REGISTRY.exclusive();
    let entry = &mut registry.slots[slot];
    entry.pid = process_id();
    entry.latch = my_latch();
    entry.started_at = now();
    entry.exit_reason = ExitReason::Unknown;
    let connection = Connection { database_oid: entry.database_oid, role_oid: entry.role_oid };
    drop(registry);
    // SAFETY: registers a callback with an integer argument; it runs in this process.
    unsafe { pg_sys::before_shmem_exit(Some(detach_on_exit), pg_sys::Datum::from(slot)) };
    connection
}

/// Clears the worker's presence on the way out (a clean stop, or an ERROR that ends it), so
/// that no producer sets a latch that is no longer the worker's; the database and the exit
/// reason stay for the launcher, which frees the slot.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn detach_on_exit(_code: std::ffi::c_int, slot: pg_sys::Datum) {
    let mut registry = REGISTRY.exclusive();
    let entry = &mut registry.slots[slot.value()];
    entry.pid = 0;
    entry.latch = 0;
    entry.in_flight = 0;
    let launcher = registry.launcher_latch;
    drop(registry);
    set_latch(launcher);
}

/// Updates the calling worker's slot.
pub fn update(slot: usize, change: impl FnOnce(&mut Slot)) {
    change(&mut REGISTRY.exclusive().slots[slot]);
}

/// The worker in `slot` delivers these topics (from the subscriptions it has just read).
pub fn publish_topics(slot: usize, topics: TopicFilter) {
    REGISTRY.exclusive().slots[slot].topics = topics;
}

/// Whether an operator's function asked the worker in `slot` to read the subscriptions again
/// since it last asked (and forgets the request).
pub fn take_reload_request(slot: usize) -> bool {
    std::mem::take(&mut REGISTRY.exclusive().slots[slot].reload_requested)
}

/// Whether another process asked the worker in `slot` to leave at once.
pub fn must_leave_now(slot: usize) -> bool {
    REGISTRY.share().slots[slot].leave_now
}

/// Whether the launcher asked the worker in `slot` to leave after its requests in flight.
pub fn must_drain(slot: usize) -> bool {
    REGISTRY.share().slots[slot].drain
}

// ---- wake-ups ----------------------------------------------------------------------------

/// The topics this transaction enqueued whose worker it owes a wake-up at commit (none: no
/// wake-up owed), and whether it changed something the worker reads (it may also ask the
/// launcher for a worker).
static WAKE_FOR_TOPICS: AtomicU64 = AtomicU64::new(0);
static ANNOUNCE_AT_COMMIT: AtomicBool = AtomicBool::new(false);
static CALLBACK_REGISTERED: AtomicBool = AtomicBool::new(false);

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        // The commit is visible to other sessions by now: the woken worker will see the rows.
        pg_sys::XactEvent::XACT_EVENT_COMMIT => {
            let announce = ANNOUNCE_AT_COMMIT.swap(false, Ordering::Relaxed);
            let topics = TopicFilter::from_bits(WAKE_FOR_TOPICS.swap(0, Ordering::Relaxed));
            if topics != TopicFilter::NONE {
                wake_workers_of(crate::backend::database_id().to_u32(), topics, announce);
            }
        }
        // A prepared transaction's wake-ups are dropped (COMMIT PREPARED, in any session, wakes
        // nothing: the worker sees its messages at its next poll), not left for the session's
        // next commit.
        pg_sys::XactEvent::XACT_EVENT_PREPARE
        | pg_sys::XactEvent::XACT_EVENT_ABORT
        | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
        | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT => {
            WAKE_FOR_TOPICS.store(0, Ordering::Relaxed);
            ANNOUNCE_AT_COMMIT.store(false, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// Sets the latch of `database_oid`'s worker if it delivers one of `topics`; with `announce`
/// (an operator's change), whatever it delivers, asking it to read the subscriptions again.
/// Without a worker, and with `announce`, tells the launcher about the database (it starts a
/// worker if the database has the extension).
fn wake_workers_of(database_oid: u32, topics: TopicFilter, announce: bool) {
    let running = |slot: &Slot| slot.pid != 0 && slot.database_oid == database_oid;
    if !announce {
        // (A producer's commit: a shared lock, many commit at once.)
        let registry = REGISTRY.share();
        registry.slots.iter().filter(|s| running(s) && s.topics.overlaps(topics)).for_each(|s| set_latch(s.latch));
        return;
    }
    let mut registry = REGISTRY.exclusive();
    let mut any_running = false;
    for slot in registry.slots.iter_mut().filter(|s| running(s)) {
        slot.reload_requested = true;
        set_latch(slot.latch);
        any_running = true;
    }
    if any_running {
        return;
    }
    let count = registry.announced_count;
    if !registry.announced[..count].contains(&database_oid) {
        if count < ANNOUNCED {
            registry.announced[count] = database_oid;
            registry.announced_count += 1;
        } else {
            registry.announced_overflow = true;
        }
    }
    set_latch(registry.launcher_latch);
}

/// When this transaction commits, wake the database's delivery worker if it delivers `topic`
/// (a producer's enqueue).
pub fn wake_worker_at_commit(topic: &str) {
    at_commit(TopicFilter::of(topic), false);
}

/// When this transaction commits, wake the database's delivery worker and have it read the
/// subscriptions again, or have the launcher start one (CREATE EXTENSION, ALTER EXTENSION
/// UPDATE, a subscription changed, a redelivery).
pub fn wake_or_start_worker_at_commit() {
    at_commit(TopicFilter::ALL, true);
}

fn at_commit(topics: TopicFilter, announce: bool) {
    if !available() {
        return; // not preloaded: there is no worker to wake
    }
    if !CALLBACK_REGISTERED.swap(true, Ordering::Relaxed) {
        // SAFETY: registers a transaction callback for the rest of the session.
        unsafe { pg_sys::RegisterXactCallback(Some(on_transaction_end), std::ptr::null_mut()) };
    }
    WAKE_FOR_TOPICS.fetch_or(topics.bits(), Ordering::Relaxed);
    if announce {
        ANNOUNCE_AT_COMMIT.store(true, Ordering::Relaxed);
    }
}

// ---- pausing a database's worker (DROP DATABASE and the like) -------------------------------

/// Keeps `database_oid`'s worker away for up to `seconds` (until [`resume`]), asks a running one
/// to leave at once, and waits (up to 5 s) until it has.
pub fn pause(database_oid: u32, seconds: i64) {
    let mut registry = REGISTRY.exclusive();
    let until = now() + seconds * 1_000_000;
    let index = registry
        .paused
        .iter()
        .position(|p| p.database_oid == database_oid)
        .or_else(|| registry.paused.iter().position(|p| p.until < now()));
    if let Some(index) = index {
        registry.paused[index] = Paused { database_oid, until };
    }
    let running: Vec<usize> =
        (0..SLOTS).filter(|&i| registry.slots[i].database_oid == database_oid && registry.slots[i].pid != 0).collect();
    for &slot in &running {
        registry.slots[slot].leave_now = true;
        set_latch(registry.slots[slot].latch);
    }
    drop(registry);
    for _ in 0..500 {
        if !REGISTRY.share().slots.iter().any(|s| s.database_oid == database_oid && s.pid != 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        // A cancelled DROP DATABASE stops waiting.
        pg_sys::check_for_interrupts!();
    }
}

/// Lets `database_oid` have a worker again.
pub fn resume(database_oid: u32) {
    let mut registry = REGISTRY.exclusive();
    for paused in registry.paused.iter_mut().filter(|p| p.database_oid == database_oid) {
        *paused = Paused::default();
    }
    registry.resumed += 1;
    set_latch(registry.launcher_latch);
}

/// How many times a database was let back so far: a launcher that read the databases before
/// the last one was may have read a name that a RENAME or DROP has just ended.
pub fn resumes() -> u64 {
    REGISTRY.share().resumed
}

// ---- what outbox_worker_status() shows --------------------------------------------------------

/// A row of `outbox_worker_status()`.
pub struct StatusRow {
    pub database_oid: u32,
    pub pid: Option<i32>,
    pub state: String,
    pub started_at: Option<pg_sys::TimestampTz>,
    pub last_poll_at: Option<pg_sys::TimestampTz>,
    pub in_flight: i32,
    pub delivered: i64,
    pub failed: i64,
    pub compactions: i64,
    pub last_compaction_at: Option<pg_sys::TimestampTz>,
}

pub fn status() -> Vec<StatusRow> {
    if !available() {
        return Vec::new();
    }
    let registry = REGISTRY.share();
    let nonzero = |t: pg_sys::TimestampTz| (t != 0).then_some(t);
    let running = registry.slots.iter().filter(|s| s.pid != 0 && !s.checking).map(|s| StatusRow {
        database_oid: s.database_oid,
        pid: Some(s.pid),
        state: s.state.label().to_string(),
        started_at: nonzero(s.started_at),
        last_poll_at: nonzero(s.last_poll_at),
        in_flight: s.in_flight,
        delivered: s.delivered,
        failed: s.failed,
        compactions: s.compactions,
        last_compaction_at: nonzero(s.last_compaction_at),
    });
    let waiting = registry.waiting[..registry.waiting_count].iter().map(|w| StatusRow {
        database_oid: w.database_oid,
        pid: None,
        state: w.reason.label().to_string(),
        started_at: None,
        last_poll_at: None,
        in_flight: 0,
        delivered: 0,
        failed: 0,
        compactions: 0,
        last_compaction_at: None,
    });
    running.chain(waiting).collect()
}

//! The delivery worker: a background worker per database that POSTs messages to the endpoints
//! subscribed to their topic.
//!
//! One round, repeated:
//! 1. a short transaction claims a batch of messages of subscribed topics, with a lease, and
//!    commits (through `outbox_claim`, the same function every consumer uses);
//! 2. outside any transaction, helper threads deliver them over HTTP, at most
//!    `outbox.max_in_flight` at once; they never call into Postgres;
//! 3. the main thread records each message's outcome as it arrives, in a transaction of its
//!    own (`outbox_complete` / `outbox_fail`), so one poisoned message never rolls back its
//!    neighbours' success.
//!
//! A crash anywhere leaves claimed messages leased; when the lease runs out they are claimed
//! again: at least once, never lost.

pub mod registry;

pub use registry::wake_worker_at_commit as wake_at_commit;

use crate::delivery::{self, Endpoint, Message, Outcome};
use crate::settings::{self, WorkerSettings};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::datum::Interval;
use pgrx::prelude::*;
use pgrx::spi::OwnedPreparedStatement;
use registry::WorkerState;
use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How often, at most, the worker looks for pending messages nobody subscribes to ...
const UNSUBSCRIBED_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// ... and how often, at most, it warns about the same topic.
const UNSUBSCRIBED_WARNING_INTERVAL: Duration = Duration::from_secs(60);
/// How often the worker purges DONE messages older than `outbox.retention` ...
const PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// ... in transactions of at most this many rows ...
const PURGE_BATCH_ROWS: i32 = 10_000;
/// ... and at most this many of them per pass, so deliveries are not held up for long.
const PURGE_BATCHES_PER_PASS: usize = 30;
/// Added to twice a batch's worst-case delivery time to make its lease.
const LEASE_MARGIN: Duration = Duration::from_secs(5);

const FIND_EXTENSION_SCHEMA: &str = include_str!("../../sql/worker/find_extension_schema.sql");
const LOAD_SUBSCRIPTIONS: &str = include_str!("../../sql/worker/load_subscriptions.sql");
const CLAIM: &str = include_str!("../../sql/worker/claim.sql");
const UNSUBSCRIBED_TOPICS: &str = include_str!("../../sql/worker/unsubscribed_topics.sql");
/// Every wait has a bound: a table locked by a long ALTER makes a round fail (logged), and the
/// worker is started again after its restart time instead of hanging. The worker's commits do
/// not wait for the WAL flush: losing the last outcomes in a server crash only means those
/// messages are delivered again (at least once), never lost, and it lets one worker record
/// thousands of outcomes a second.
const SESSION_SETTINGS: &str = "SELECT pg_catalog.set_config('lock_timeout', '10s', false), \
     pg_catalog.set_config('statement_timeout', '60s', false), \
     pg_catalog.set_config('synchronous_commit', 'off', false)";
const PURGE: &str = "SELECT outbox_purge($1, false, $2)";
const COMPLETE_BATCH: &str = "SELECT outbox_complete_batch($1::bigint[], $2::uuid[])";
const FAIL: &str = "SELECT outbox_fail($1, $2, $3::uuid, $4)";

/// The statements of every round, prepared once and kept for the worker's life instead of
/// being parsed and planned on each call. PostgreSQL plans them again by itself when what they
/// name changes (the extension dropped and created again, or moved: the search_path is part
/// of a kept plan).
struct Statements {
    claim: OwnedPreparedStatement,
    complete_batch: OwnedPreparedStatement,
    fail: OwnedPreparedStatement,
}

impl Statements {
    /// In a transaction, with the search_path set to the extension's schema.
    fn prepare() -> Statements {
        use pg_sys::BuiltinOid::*;
        Spi::connect(|client| {
            let keep = |query: &str, types: &[pg_sys::BuiltinOid]| {
                let types: Vec<PgOid> = types.iter().map(|&t| PgOid::BuiltIn(t)).collect();
                client.prepare_mut(query, &types).expect("preparing the worker's statements").keep()
            };
            Statements {
                claim: keep(CLAIM, &[INT4OID, TEXTARRAYOID, INTERVALOID]),
                complete_batch: keep(COMPLETE_BATCH, &[INT8ARRAYOID, TEXTARRAYOID]),
                fail: keep(FAIL, &[INT8OID, TEXTOID, TEXTOID, INTERVALOID]),
            }
        })
    }
}

/// Registers one worker per database of `outbox.worker_databases`. Called while preloading.
pub fn register_background_workers() {
    let databases = settings::worker_databases();
    if databases.len() > registry::MAX_WORKERS {
        warning!(
            "outbox_ext: outbox.worker_databases names {} databases; only the first {} get a delivery worker",
            databases.len(),
            registry::MAX_WORKERS
        );
    }
    for (slot, database) in databases.iter().take(registry::MAX_WORKERS).enumerate() {
        BackgroundWorkerBuilder::new(&format!("outbox_ext delivery worker for {database}"))
            .set_type("outbox_ext delivery worker")
            .set_library("outbox_ext")
            .set_function("outbox_worker_main")
            .set_argument((slot as i32).into_datum())
            .set_extra(database)
            .enable_spi_access()
            .set_start_time(BgWorkerStartTime::RecoveryFinished)
            .set_restart_time(Some(Duration::from_secs(5)))
            .load();
    }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn outbox_worker_main(argument: pg_sys::Datum) {
    let slot = argument.value() as usize;
    let database = BackgroundWorker::get_extra().to_owned();
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    unsafe { pg_sys::pgstat_report_appname(c"outbox_ext delivery worker".as_ptr()) };
    registry::attach(slot);
    log!("outbox_ext: delivery worker started for database \"{database}\"");

    BackgroundWorker::transaction(|| {
        Spi::run(SESSION_SETTINGS).expect("setting up the worker's session");
    });

    let mut worker = Worker::new(slot, database);
    worker.run();

    log!("outbox_ext: delivery worker for database \"{}\" stopped", worker.database);
    // Exit code 1 asks the postmaster to start us again after the restart time, unless it is
    // shutting down: a worker stopped with pg_terminate_backend comes back.
    unsafe { pg_sys::proc_exit(1) };
}

fn shutdown_requested() -> bool {
    unsafe { (&raw const pg_sys::ShutdownRequestPending).read_volatile() != 0 }
}

/// A claimed message and where it goes.
struct Claimed {
    id: i64,
    lease_token: String,
    message: Message,
    endpoints: Vec<usize>,
}

enum Round {
    /// The database has no outbox_ext (yet).
    NoExtension,
    /// Nothing to deliver now.
    Nothing,
    Delivered { claimed: usize, batch_size: usize },
}

struct Worker {
    slot: usize,
    database: String,
    /// The schema the search_path is set to (the extension's), once found.
    schema: Option<String>,
    agent: ureq::Agent,
    agent_pool: usize,
    said_waiting_for_extension: bool,
    last_unsubscribed_check: Option<Instant>,
    warned_about_topic: HashMap<String, Instant>,
    last_purge: Option<Instant>,
    /// Prepared at the first claim.
    statements: Option<Statements>,
}

impl Worker {
    fn new(slot: usize, database: String) -> Self {
        let pool = settings::worker_settings().max_in_flight;
        Worker {
            slot,
            database,
            schema: None,
            agent: delivery::new_agent(pool),
            agent_pool: pool,
            said_waiting_for_extension: false,
            last_unsubscribed_check: None,
            warned_about_topic: HashMap::new(),
            last_purge: None,
            statements: None,
        }
    }

    fn run(&mut self) {
        while !shutdown_requested() {
            if BackgroundWorker::sighup_received() {
                unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            }
            let settings = settings::worker_settings();
            if settings.max_in_flight != self.agent_pool {
                self.agent = delivery::new_agent(settings.max_in_flight);
                self.agent_pool = settings.max_in_flight;
            }
            registry::update(self.slot, |s| s.last_poll_at = unsafe { pg_sys::GetCurrentTimestamp() });

            let more_waiting = if settings.enabled {
                match self.round(&settings) {
                    Round::NoExtension => {
                        self.set_state(WorkerState::WaitingForExtension);
                        false
                    }
                    Round::Nothing => {
                        self.set_state(WorkerState::Idle);
                        false
                    }
                    Round::Delivered { claimed, batch_size } => {
                        let full = claimed == batch_size;
                        if !full {
                            self.set_state(WorkerState::Idle);
                        }
                        full
                    }
                }
            } else {
                self.set_state(WorkerState::Disabled);
                false
            };
            if settings.enabled {
                self.purge_if_due(&settings);
            }
            if shutdown_requested() {
                break;
            }
            // A full batch suggests more is ready: go again at once. Otherwise sleep until the
            // poll interval passes or a committing producer sets our latch.
            if !more_waiting && !BackgroundWorker::wait_latch(Some(settings.poll_interval)) {
                break;
            }
        }
    }

    fn set_state(&self, state: WorkerState) {
        registry::update(self.slot, |s| s.state = state);
    }

    /// One claim-deliver-record round.
    fn round(&mut self, settings: &WorkerSettings) -> Round {
        let claim = BackgroundWorker::transaction(AssertUnwindSafe(|| self.claim(settings)));
        let Some((endpoints, batch)) = claim else {
            return Round::NoExtension;
        };
        if batch.is_empty() {
            return Round::Nothing;
        }
        self.set_state(WorkerState::Delivering);
        let claimed = batch.len();
        self.deliver(settings, &endpoints, batch);
        Round::Delivered { claimed, batch_size: settings.batch_size as usize }
    }

    /// In a transaction: find the extension, read the subscriptions, claim a batch of their
    /// topics. `None` when the extension is not installed in this database.
    fn claim(&mut self, settings: &WorkerSettings) -> Option<(Vec<Endpoint>, Vec<Claimed>)> {
        let Some(schema) = Spi::get_one::<String>(FIND_EXTENSION_SCHEMA).expect("looking up the extension") else {
            if !self.said_waiting_for_extension {
                log!(
                    "outbox_ext: database \"{}\" has no outbox_ext extension; the delivery worker waits for CREATE EXTENSION outbox_ext",
                    self.database
                );
                self.said_waiting_for_extension = true;
            }
            self.schema = None;
            return None;
        };
        self.said_waiting_for_extension = false;
        if self.schema.as_deref() != Some(schema.as_str()) {
            // Session-wide: the worker's calls resolve to the extension's functions.
            Spi::run_with_args(
                "SELECT pg_catalog.set_config('search_path', pg_catalog.quote_ident($1) || ', pg_catalog', false)",
                &[schema.clone().into()],
            )
            .expect("setting the search_path");
            self.schema = Some(schema);
        }

        let (endpoints, endpoints_by_topic) = load_endpoints(settings);
        let topics: Vec<String> = endpoints_by_topic.keys().cloned().collect();
        self.warn_about_unsubscribed_topics(&topics);
        if topics.is_empty() {
            return Some((endpoints, Vec::new()));
        }

        let lease = lease_for(settings, &endpoints, &endpoints_by_topic);
        let claim = &self.statements.get_or_insert_with(Statements::prepare).claim;
        let batch = Spi::connect_mut(|client| {
            let rows = client
                .update(
                    claim,
                    None,
                    &[settings.batch_size.into(), topics.clone().into(), lease.into()],
                )
                .expect("claiming messages");
            rows.map(|row| {
                let topic: String = row.get(3).unwrap().unwrap();
                Claimed {
                    id: row.get(1).unwrap().unwrap(),
                    lease_token: row.get(6).unwrap().unwrap(),
                    endpoints: endpoints_by_topic.get(&topic).cloned().unwrap_or_default(),
                    message: Message {
                        public_id: row.get(2).unwrap().unwrap(),
                        topic,
                        payload: row.get(4).unwrap().unwrap(),
                        attempt: row.get(5).unwrap().unwrap(),
                    },
                }
            })
            .collect()
        });
        Some((endpoints, batch))
    }

    /// Deletes DONE messages older than `outbox.retention`, at most once a minute (or once per
    /// retention, when it is shorter), in short
    /// transactions of bounded size.
    fn purge_if_due(&mut self, settings: &WorkerSettings) {
        let Some(retention) = settings.retention else { return };
        // Purging more often than the retention would find nothing new.
        let interval = PURGE_INTERVAL.min(retention.max(Duration::from_secs(1)));
        if self.schema.is_none() || self.last_purge.is_some_and(|at| at.elapsed() < interval) {
            return;
        }
        self.last_purge = Some(Instant::now());
        let older_than = Interval::from_micros(retention.as_micros() as i64);
        let mut purged_total = 0;
        for _ in 0..PURGE_BATCHES_PER_PASS {
            let purged = BackgroundWorker::transaction(|| {
                Spi::get_one_with_args::<i64>(PURGE, &[older_than.into(), PURGE_BATCH_ROWS.into()])
                    .expect("purging DONE messages")
                    .unwrap_or(0)
            });
            purged_total += purged;
            if purged < i64::from(PURGE_BATCH_ROWS) || shutdown_requested() {
                break;
            }
        }
        if purged_total > 0 {
            log!("outbox_ext: purged {purged_total} DONE message(s) older than outbox.retention");
        }
    }

    /// Logs the topics that have pending messages but no subscription, each at most once a
    /// minute: they stay pending (a producer deployed ahead of its consumer is not data loss).
    fn warn_about_unsubscribed_topics(&mut self, subscribed: &[String]) {
        if self.last_unsubscribed_check.is_some_and(|at| at.elapsed() < UNSUBSCRIBED_CHECK_INTERVAL) {
            return;
        }
        self.last_unsubscribed_check = Some(Instant::now());
        let orphans: Vec<(String, i64)> = Spi::connect(|client| {
            client
                .select(UNSUBSCRIBED_TOPICS, None, &[subscribed.to_vec().into()])
                .expect("looking for unsubscribed topics")
                .map(|row| (row.get(1).unwrap().unwrap(), row.get(2).unwrap().unwrap()))
                .collect()
        });
        let known = if subscribed.is_empty() { "none".to_string() } else { subscribed.join(", ") };
        self.warned_about_topic.retain(|_, at| at.elapsed() < UNSUBSCRIBED_WARNING_INTERVAL);
        for (topic, pending) in orphans {
            if self.warned_about_topic.contains_key(&topic) {
                continue;
            }
            warning!(
                "outbox_ext: no subscription for topic \"{topic}\": {pending} message(s) left pending (topics with subscriptions: {known})"
            );
            self.warned_about_topic.insert(topic, Instant::now());
        }
    }

    /// Delivers the batch on helper threads and records each message's outcome as soon as all
    /// its endpoints have answered.
    fn deliver(&self, settings: &WorkerSettings, endpoints: &[Endpoint], batch: Vec<Claimed>) {
        let jobs: Vec<(usize, usize)> = batch
            .iter()
            .enumerate()
            .flat_map(|(m, claimed)| claimed.endpoints.iter().map(move |&e| (m, e)))
            .collect();
        let mut answers: Vec<Vec<(String, Outcome)>> = vec![Vec::new(); batch.len()];
        let mut unanswered: Vec<usize> = batch.iter().map(|c| c.endpoints.len()).collect();
        // Messages whose subscriptions vanished between reading them and claiming: retry later.
        let mut orphans = Vec::new();
        for (m, claimed) in batch.iter().enumerate().filter(|(_, c)| c.endpoints.is_empty()) {
            orphans.push((claimed, Outcome::Failed { error: "no subscription left for its topic".into(), retry_after: None }));
            unanswered[m] = usize::MAX;
        }
        if !orphans.is_empty() {
            self.record_all(&orphans);
        }

        let threads = settings.max_in_flight.min(jobs.len());
        let next_job = AtomicUsize::new(0);
        let in_flight = AtomicUsize::new(0);
        let (sender, receiver) = mpsc::channel::<(usize, Outcome)>();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                let sender = sender.clone();
                let (jobs, next_job, in_flight, batch, agent) = (&jobs, &next_job, &in_flight, &batch, &self.agent);
                scope.spawn(move || {
                    block_signals_in_this_thread();
                    loop {
                        let j = next_job.fetch_add(1, Ordering::Relaxed);
                        let Some(&(m, e)) = jobs.get(j) else { break };
                        in_flight.fetch_add(1, Ordering::Relaxed);
                        let outcome = delivery::deliver(agent, &endpoints[e], &batch[m].message);
                        in_flight.fetch_sub(1, Ordering::Relaxed);
                        if sender.send((j, outcome)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(sender);

            // Main thread: the only one that talks to Postgres. It records outcomes as soon as
            // they arrive, together with whatever else has arrived meanwhile: one transaction
            // for one answer when the receiver is slow, one for many when it is fast.
            let mut finished: Vec<(usize, Outcome)> = Vec::new();
            let mut take = |(j, outcome): (usize, Outcome), finished: &mut Vec<(usize, Outcome)>| {
                let (m, e) = jobs[j];
                answers[m].push((endpoints[e].url.clone(), outcome));
                unanswered[m] -= 1;
                if unanswered[m] == 0 {
                    finished.push((m, delivery::combine(&answers[m])));
                }
            };
            for answer in receiver.iter() {
                take(answer, &mut finished);
                while let Ok(answer) = receiver.try_recv() {
                    take(answer, &mut finished);
                }
                if !finished.is_empty() {
                    let outcomes: Vec<(&Claimed, Outcome)> =
                        finished.drain(..).map(|(m, outcome)| (&batch[m], outcome)).collect();
                    self.record_all(&outcomes);
                }
                let now_in_flight = in_flight.load(Ordering::Relaxed) as i32;
                registry::update(self.slot, |s| s.in_flight = now_in_flight);
            }
        });
        registry::update(self.slot, |s| s.in_flight = 0);
    }

    /// Records the outcomes of several messages in one transaction: the deliveries with one
    /// batch `outbox_complete`, each failure with `outbox_fail`.
    fn record_all(&self, outcomes: &[(&Claimed, Outcome)]) {
        let (delivered, failed): (Vec<_>, Vec<_>) =
            outcomes.iter().partition(|(_, outcome)| matches!(outcome, Outcome::Delivered));
        let statements = self.statements.as_ref().expect("prepared by the claim");
        let no_longer_held = BackgroundWorker::transaction(AssertUnwindSafe(|| {
            let mut no_longer_held = 0;
            if !delivered.is_empty() {
                let ids: Vec<i64> = delivered.iter().map(|(claimed, _)| claimed.id).collect();
                let tokens: Vec<String> = delivered.iter().map(|(claimed, _)| claimed.lease_token.clone()).collect();
                let arguments = [ids.into(), tokens.into()];
                let completed = Spi::connect_mut(|client| {
                    client.update(&statements.complete_batch, Some(1), &arguments)?.first().get_one::<i32>()
                })
                .expect("recording deliveries")
                .unwrap_or(0);
                no_longer_held += delivered.len() - completed as usize;
            }
            for (claimed, outcome) in &failed {
                let Outcome::Failed { error, retry_after } = outcome else { continue };
                let retry_in = retry_after.map(|d| Interval::from_micros(d.as_micros() as i64));
                let arguments =
                    [claimed.id.into(), error.clone().into(), claimed.lease_token.clone().into(), retry_in.into()];
                let recorded = Spi::connect_mut(|client| {
                    client.update(&statements.fail, Some(1), &arguments)?.first().get_one::<String>()
                })
                .expect("recording a failed delivery");
                no_longer_held += usize::from(recorded.is_none());
            }
            no_longer_held
        }));
        registry::update(self.slot, |s| {
            s.delivered += delivered.len() as i64;
            s.failed += failed.len() as i64;
        });
        if no_longer_held > 0 {
            log!(
                "outbox_ext: {no_longer_held} message(s) were no longer held when their outcome arrived (the lease ran out); they will be delivered again"
            );
        }
    }
}

/// Enabled subscriptions, and for each topic the indexes of its endpoints.
fn load_endpoints(settings: &WorkerSettings) -> (Vec<Endpoint>, BTreeMap<String, Vec<usize>>) {
    let mut endpoints = Vec::new();
    let mut by_topic: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    Spi::connect(|client| {
        let rows = client.select(LOAD_SUBSCRIPTIONS, None, &[]).expect("reading subscriptions");
        for row in rows {
            let topic: String = row.get(1).unwrap().unwrap();
            let url: String = row.get(2).unwrap().unwrap();
            let secret: Option<String> = row.get(3).unwrap();
            let headers: Vec<String> = row.get(4).unwrap().unwrap_or_default();
            let timeout_ms: Option<i64> = row.get(5).unwrap();
            // Secrets were checked when subscribed; one changed behind our back is skipped
            // (and the topic's messages wait) rather than sent unsigned.
            let signing_key = match secret.as_deref().map(delivery::decode_secret) {
                None => None,
                Some(Ok(key)) => Some(key),
                Some(Err(why)) => {
                    warning!("outbox_ext: subscription of \"{topic}\" to {url} skipped: its secret {why}");
                    continue;
                }
            };
            by_topic.entry(topic).or_default().push(endpoints.len());
            endpoints.push(Endpoint {
                url,
                signing_key,
                headers: headers.chunks(2).map(|pair| (pair[0].clone(), pair[1].clone())).collect(),
                timeout: timeout_ms.map(|ms| Duration::from_millis(ms as u64)).unwrap_or(settings.http_timeout),
            });
        }
    });
    (endpoints, by_topic)
}

/// A lease comfortably longer than the whole batch can take in the worst case (every request
/// running into its timeout), so a slow batch is not claimed twice; and short enough that a
/// crashed worker's messages come back soon.
fn lease_for(settings: &WorkerSettings, endpoints: &[Endpoint], by_topic: &BTreeMap<String, Vec<usize>>) -> Interval {
    let widest_fan_out = by_topic.values().map(Vec::len).max().unwrap_or(1);
    let slowest = endpoints.iter().map(|e| e.timeout).max().unwrap_or(settings.http_timeout);
    let requests = settings.batch_size as usize * widest_fan_out;
    let rounds = requests.div_ceil(settings.max_in_flight.max(1)) as u32;
    let lease = slowest * rounds * 2 + LEASE_MARGIN;
    Interval::from_micros(lease.as_micros() as i64)
}

/// Helper threads must never run a Postgres signal handler: those belong to the main thread.
fn block_signals_in_this_thread() {
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

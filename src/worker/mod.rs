//! The delivery worker: one background process per database with outbox_ext, started by the
//! launcher (`launcher.rs`), that POSTs each message to the endpoints subscribed to its topic.
//!
//! Its loop is the essay's, one step per file:
//!
//! 1. **claim** (`claim.rs`): in a short transaction, make the deliveries of newly ready
//!    messages (one per endpoint) and lease each endpoint's due deliveries, as many as its share
//!    of the in-flight slots allows, and for a healthy endpoint a few rounds ahead, queued
//!    (`endpoints.rs`: the queue refills before it runs dry);
//! 2. **deliver** (`deliver.rs`): outside any transaction, helper threads send them, each
//!    request on its own, with its endpoint's timeout; as a success comes back, the helper
//!    sends the endpoint's next queued delivery itself (`queue.rs`), and otherwise the main
//!    thread starts the next queued delivery of an endpoint with room, without waiting for a
//!    transaction;
//! 3. **record** (`record.rs`): the answers that came back, in one short transaction with the
//!    next claim (once a batch of answers is in, within [`RECORD_WITHIN`] of the first, or at
//!    once when nothing is queued): DONE, retried after the backoff, or DEAD; the attempt log;
//!    the messages whose deliveries have all ended; and what they mean for their endpoints
//!    (`breaker.rs`: failing, recovered, disabled after failing too long). What an operator's
//!    open transaction holds is never waited for: those answers, and the breaker's writes,
//!    wait for a later step;
//! 4. **sleep** (`sleep.rs`): until an answer comes back, a producer commits, a delivery falls
//!    due or the poll interval passes.
//!
//! SIGTERM, `pg_terminate_backend` and `DROP EXTENSION` start nothing new; the worker hands
//! back what it queued, records what comes back within the requests' timeouts and exits. A
//! crash leaves deliveries leased; the next worker of the database (never two at once) makes
//! them due again at its start.

mod breaker;
mod claim;
mod deliver;
mod endpoints;
mod held_back;
pub mod hooks;
mod housekeeping;
pub mod launcher;
mod queue;
mod record;
pub mod registry;
mod session;
mod sleep;
mod topic_filter;

pub use registry::wake_worker_at_commit as wake_at_commit;
use topic_filter::TopicFilter;

use crate::backend::shutdown_requested;
use crate::fmgr::{sql_function, SetResult};
use crate::settings::{self, WorkerSettings};
use crate::spi::Spi;
use crate::text::ServerText;
use crate::webhook::AllowedNetworks;
use claim::Claimed;
use deliver::{Finished, Pool};
use endpoints::Endpoints;
use held_back::HeldBack;
use housekeeping::Housekeeping;
use pgrx::datum::IntoDatum;
use pgrx::pg_sys;
use registry::{ExitReason, WorkerState};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// After a step failed (a lock timeout, a serialization failure, …), wait this long before the
/// next, doubling up to [`MAX_RETRY_WAIT`] while they keep failing.
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(100);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(10);
/// Stopping, the worker waits for the requests in flight (each gives up by its timeout) and
/// then this long to record their answers...
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// ... but no longer than this in all: a fast shutdown waits for the worker, and `pg_ctl`
/// gives up after 60 s, where an endpoint's timeout may be 10 minutes. What has not answered by
/// then is sent again by the next worker (at least once).
const MAX_DRAIN: Duration = Duration::from_secs(10);
/// A queued delivery is too late to start once its start_by has passed: the worker wakes this
/// long after it to hand it back.
const TOO_LATE_BY: Duration = Duration::from_millis(1);
/// Answers wait at most this long to be recorded while deliveries are queued (a batch of
/// answers, or nothing left to start, records them at once): one transaction records many.
const RECORD_WITHIN: Duration = Duration::from_millis(10);

/// The entry point of a delivery worker (a dynamic background worker the launcher starts; its
/// argument is its registry slot, which names the database; its extra data the database's name,
/// for the log).
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn outbox_worker_main(argument: pg_sys::Datum) {
    let slot = argument.value();
    let database = pgrx::bgworkers::BackgroundWorker::get_extra().to_owned();
    pgrx::bgworkers::BackgroundWorker::attach_signal_handlers(
        pgrx::bgworkers::SignalWakeFlags::SIGHUP | pgrx::bgworkers::SignalWakeFlags::SIGTERM,
    );
    session::connect(registry::attach(slot));

    let reason = Worker::new(slot).run(&database);
    registry::update(slot, |s| s.exit_reason = reason);
    if reason != ExitReason::NoExtension {
        pgrx::log!("outbox_ext: delivery worker for database \"{database}\" stopped");
    }
    // Exit code 0: the launcher, not the postmaster, decides whether this database gets another.
    // SAFETY: ends the process the normal way.
    unsafe { pg_sys::proc_exit(0) };
}

fn reload_requested() -> bool {
    pgrx::bgworkers::BackgroundWorker::sighup_received()
}

struct Worker {
    slot: usize,
    settings: WorkerSettings,
    endpoints: Endpoints,
    /// `outbox.allowed_networks`, shared with the HTTP client's resolver.
    allowed_networks: AllowedNetworks,
    pool: Pool,
    /// Answers not yet recorded (a failed step keeps them for the next), and when the first of
    /// them came back.
    finished: Vec<Finished>,
    finished_since: Option<Instant>,
    /// The clock when the answers that came back were last taken (claim::Room).
    answers_taken_at: pg_sys::TimestampTz,
    /// Answers whose deliveries an operator's open transaction held, for a later step.
    held_answers: HeldBack<Finished>,
    /// Leased deliveries that will not be sent, to hand back in the next step.
    handing_back: Vec<Claimed>,
    /// Deliveries to hand back that an operator's open transaction held, for a later step.
    held_hand_backs: HeldBack<Claimed>,
    /// The messages a step settles again (an operator's transaction held them before): held
    /// again if the step fails.
    settling_again: Vec<i64>,
    /// The ordering keys a step hands on again at their endpoints (an operator's transaction
    /// held their next delivery before): held again if the step fails.
    releasing_again: Vec<(i64, ServerText)>,
    /// The messages left without deliveries a step lets go again (an operator's transaction
    /// held them before): held again if the step fails.
    unhanding_again: Vec<i64>,
    /// The first step (of the database's version) hands on the keys a predecessor left behind
    /// (record.rs, hand_on_keys_left_behind); again if it fails.
    keys_left_behind: bool,
    housekeeping: Housekeeping,
    /// Subscriptions and due times are read again after this.
    next_refresh: Instant,
    retry_wait: Duration,
    /// After a failed step: no step before this (answers and wake-ups do not hasten it).
    retry_at: Option<Instant>,
    /// New messages may be ready: a producer committed, the last pick-up was a full batch, or
    /// a poll interval passed (delays and backoffs run out).
    messages_may_be_ready: bool,
    draining: bool,
    /// The database's extension is older than the library: nothing runs until its update.
    waiting_for_update: bool,
    /// Once draining: the time by which the worker exits, whatever is left (the slowest request
    /// in flight gives up by then, or MAX_DRAIN has passed).
    drain_deadline: Option<Instant>,
}

/// What a step found.
enum Step {
    /// Not run: a step failed a moment ago (see retry_at).
    BackingOff,
    /// Not run: nothing to record, hand back or claim.
    NotNeeded,
    Ran {
        recorded: record::Recorded,
        /// What the breaker wrote (forgotten once the step commits).
        breaker_written: breaker::Written,
        /// The deliveries to hand back (endpoint, message) that another transaction holds.
        hand_backs_held: BTreeSet<(i64, i64)>,
        claimed: Vec<endpoints::Queued>,
    },
    NoExtension,
    WaitingForUpdate,
}

impl Worker {
    fn new(slot: usize) -> Self {
        let settings = settings::worker_settings();
        let allowed_networks = AllowedNetworks::new(settings::allowed_networks().into());
        Worker {
            slot,
            pool: Pool::start(settings.max_in_flight, AllowedNetworks::clone(&allowed_networks)),
            allowed_networks,
            settings,
            endpoints: Endpoints::default(),
            finished: Vec::new(),
            finished_since: None,
            answers_taken_at: crate::backend::now(),
            held_answers: HeldBack::default(),
            handing_back: Vec::new(),
            held_hand_backs: HeldBack::default(),
            settling_again: Vec::new(),
            releasing_again: Vec::new(),
            unhanding_again: Vec::new(),
            keys_left_behind: true,
            housekeeping: Housekeeping::default(),
            next_refresh: Instant::now(),
            retry_wait: FIRST_RETRY_WAIT,
            retry_at: None,
            messages_may_be_ready: true,
            draining: false,
            waiting_for_update: false,
            drain_deadline: None,
        }
    }

    /// Whether the worker makes and leases deliveries: not while it stops, nor while it is
    /// paused (outbox.worker_enabled = off).
    fn claiming(&self) -> bool {
        !self.draining && self.settings.enabled
    }

    fn set_state(&self, state: WorkerState) {
        registry::update(self.slot, |s| s.state = state);
    }

    fn run(&mut self, database: &str) -> ExitReason {
        let schema = match session::transaction(session::extension_schema) {
            Ok(Some(schema)) => schema,
            Ok(None) => return ExitReason::NoExtension,
            Err(failure) => {
                pgrx::warning!("outbox_ext: the delivery worker for database \"{database}\" could not start: {failure}");
                return ExitReason::Unknown;
            }
        };
        pgrx::log!("outbox_ext: delivery worker started for database \"{database}\"");
        match session::transaction(|| crate::spi::version_matches().then(|| claim::release_predecessors_leases(schema))) {
            Ok(Some(released)) if released > 0 => {
                pgrx::log!("outbox_ext: {released} delivery(ies) in flight when the last worker stopped are due again")
            }
            _ => {}
        }

        loop {
            if registry::must_leave_now(self.slot) {
                self.last_step_before_leaving(schema);
                return ExitReason::LeftWhenAsked; // abandons what is in flight: redelivered later
            }
            if (shutdown_requested() || registry::must_drain(self.slot)) && !self.draining {
                self.draining = true;
                self.endpoints.allow_continuing(false, self.settings.max_in_flight, self.pool.in_flight());
                // (A request a helper thread went on to a moment ago ends by its timeout.)
                let just_started = Instant::now() + self.endpoints.longest_timeout_in_flight();
                let slowest = self.pool.latest_deadline.unwrap_or_else(Instant::now).max(just_started);
                self.drain_deadline = Some((slowest + DRAIN_GRACE).min(Instant::now() + MAX_DRAIN));
                self.set_state(WorkerState::Draining);
                self.retry_at = self.retry_at.map(|at| at.min(Instant::now() + Duration::from_secs(1)));
            }
            if reload_requested() {
                crate::backend::reload_configuration();
                if let Err(failure) = session::transaction(session::apply_database_settings) {
                    pgrx::warning!("outbox_ext: the delivery worker could not read its database's settings again: {failure}");
                }
                self.settings = settings::worker_settings();
                self.pool.grow_to(self.settings.max_in_flight);
                self.endpoints.waiting_for_payload_room = false; // (outbox.worker_memory may have grown)
                *self.allowed_networks.write().unwrap_or_else(std::sync::PoisonError::into_inner) = settings::allowed_networks();
                self.next_refresh = Instant::now();
            }
            self.take_answers();
            self.bring_back_held(Some(Instant::now()));
            self.endpoints.mark_due(crate::backend::now());

            let claiming = self.claiming();
            if !claiming {
                self.handing_back.extend(self.endpoints.take_unsendable(true));
            }
            self.start_queued();
            let backing_off = self.retry_at.is_some_and(|at| Instant::now() < at);
            let step = if backing_off {
                Ok(Step::BackingOff)
            } else if !self.step_needed(claiming) {
                Ok(Step::NotNeeded)
            } else {
                session::transaction(|| self.step(schema, claiming))
            };
            match step {
                Ok(Step::BackingOff | Step::NotNeeded) => {}
                Ok(Step::Ran { recorded, breaker_written, hand_backs_held, claimed }) => {
                    breaker::committed(&mut self.endpoints, breaker_written, Instant::now());
                    self.waiting_for_update = false;
                    self.retry_wait = FIRST_RETRY_WAIT;
                    self.retry_at = None;
                    let held =
                        std::mem::take(&mut self.finished).into_iter().enumerate().filter(|(index, _)| recorded.held.contains(index));
                    self.held_answers.hold(
                        held.map(|(_, mut answer)| {
                            answer.breaker_has_seen = true;
                            answer
                        }),
                        Instant::now(),
                    );
                    self.finished_since = None;
                    let (held, handed_back): (Vec<_>, Vec<_>) = std::mem::take(&mut self.handing_back)
                        .into_iter()
                        .partition(|back| hand_backs_held.contains(&(back.subscription_id, back.message_id)));
                    if !handed_back.is_empty() {
                        self.endpoints.waiting_for_payload_room = false; // their payloads' room is free
                    }
                    self.held_hand_backs.hold(held, Instant::now());
                    self.settling_again.clear();
                    self.releasing_again.clear();
                    self.unhanding_again.clear();
                    self.keys_left_behind = false;
                    self.endpoints.answers_recorded();
                    self.report(&recorded);
                    for queued in claimed {
                        if let Some(state) = self.endpoints.by_id.get_mut(&queued.delivery.subscription_id) {
                            state.queued.push_back(queued);
                        }
                    }
                    self.start_queued();
                }
                Ok(Step::NoExtension) => {
                    pgrx::log!("outbox_ext: database \"{database}\" no longer has outbox_ext; its delivery worker stops");
                    return ExitReason::NoExtension;
                }
                Ok(Step::WaitingForUpdate) => self.waiting_for_update = true,
                Err(failure) => {
                    pgrx::warning!("outbox_ext: a delivery step failed, trying again in {:?}: {failure}", self.retry_wait);
                    self.endpoints.settling_held.hold(std::mem::take(&mut self.settling_again), Instant::now());
                    self.endpoints.releasing_held.hold(std::mem::take(&mut self.releasing_again), Instant::now());
                    self.endpoints.unhanding_held.hold(std::mem::take(&mut self.unhanding_again), Instant::now());
                    // (What the step let go is back: look for it again.)
                    self.endpoints.look_for_orphans = true;
                    // What it learnt on the way is rolled back with its writes (no more messages
                    // ready: its pick-up is undone; nothing more due at an endpoint: its leases
                    // are): look again, rather than wait for the next poll.
                    self.messages_may_be_ready = true;
                    self.next_refresh = Instant::now();
                    // While draining, answers still wait to be recorded: try at least once a second.
                    let wait = if self.draining { self.retry_wait.min(Duration::from_secs(1)) } else { self.retry_wait };
                    self.retry_at = Some(Instant::now() + wait);
                    self.retry_wait = (self.retry_wait * 2).min(MAX_RETRY_WAIT);
                    if session::transaction(session::extension_schema).ok().flatten().is_none() {
                        return ExitReason::NoExtension;
                    }
                }
            }
            self.publish_state();

            if self.draining {
                if self.pool.in_flight() == 0 && self.nothing_left_to_write() {
                    return ExitReason::Stopped;
                }
                if self.drain_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                    self.last_step_before_leaving(schema);
                    return ExitReason::Stopped;
                }
            } else if self.settings.enabled && !self.waiting_for_update {
                // (Its statements are the new library's: an older schema waits for its update.)
                // Each may wait its lock_timeout: none starts once the worker is asked to stop
                // (a SIGTERM during the step went on to all three, and the worker took 28 s to
                // stop beside a lock: stop 58's probe of crashes).
                let slot = self.slot;
                let stop = || registry::must_leave_now(slot) || shutdown_requested() || registry::must_drain(slot);
                self.housekeeping.archive_if_due(schema, stop);
                if self.settings.compaction && self.housekeeping.compact_if_due(schema, stop) {
                    registry::update(slot, |s| {
                        s.compactions += 1;
                        s.last_compaction_at = crate::backend::now();
                    });
                }
                self.housekeeping.purge_if_due(schema, self.settings.retention, stop);
            }
            self.endpoints.allow_continuing(
                self.claiming() && !self.waiting_for_update,
                self.settings.max_in_flight,
                self.pool.in_flight(),
            );
            let woken = sleep::wait(Some(self.pool.wake_fd()), self.sleep_time());
            if self.endpoints.held_back_topics.take_expired(Instant::now()) {
                self.messages_may_be_ready = true; // a topic held back is to be tried again
            }
            if woken.by_latch {
                // A producer committed messages of a topic we deliver (or an operator changed
                // something): look again at once.
                self.messages_may_be_ready = true;
            }
            // Read the subscriptions again if an operator's function asked for it (not at every
            // producer's commit). Asked at every turn, not only when the latch woke the worker:
            // a step that waited for the operator's lock (outbox_rotate_secret's, say) spent the
            // wake-up sent at its commit ending that wait, and a busy worker is woken by answers.
            if registry::take_reload_request(self.slot) {
                self.next_refresh = Instant::now();
                self.messages_may_be_ready = true;
            }
        }
    }

    /// Before leaving at once (a statement that needs the database without connections, or
    /// DROP EXTENSION, waits for it), or when a drain runs out of time: one short transaction
    /// records the answers already back, with those held back (due or not), hands back what
    /// was queued and never sent, so that its attempt does not count, settles what waits to be
    /// settled and writes the breaker's changes. (The next worker would take the deliveries
    /// for requests in flight: counted, sent as a second attempt, dead with
    /// `outbox.max_attempts = 1`.) It waits for no lock; what is in flight is abandoned and sent
    /// again by the next worker.
    fn last_step_before_leaving(&mut self, schema: pg_sys::Oid) {
        self.endpoints.allow_continuing(false, self.settings.max_in_flight, self.pool.in_flight());
        self.take_answers();
        self.bring_back_held(None);
        self.handing_back.extend(self.endpoints.take_unsendable(true));
        self.settling_again.extend(self.endpoints.settling_held.take_all());
        self.releasing_again.extend(self.endpoints.releasing_held.take_all());
        self.unhanding_again.extend(self.endpoints.unhanding_held.take_all());
        if self.nothing_left_to_write() {
            return;
        }
        session::wait_briefly();
        match session::transaction(|| self.step(schema, false)) {
            Ok(Step::Ran { breaker_written, .. }) => breaker::committed(&mut self.endpoints, breaker_written, Instant::now()),
            Ok(_) => {}
            Err(failure) => pgrx::log!("outbox_ext: leaving, the delivery worker could not record what it holds: {failure}"),
        }
    }

    /// Brings the answers and hand-backs held back to the next step: those due by `due_by`, or
    /// all of them (`None`: the worker is leaving).
    fn bring_back_held(&mut self, due_by: Option<Instant>) {
        let (answers, hand_backs) = match due_by {
            Some(now) => (self.held_answers.take_due(now), self.held_hand_backs.take_due(now)),
            None => (self.held_answers.take_all(), self.held_hand_backs.take_all()),
        };
        if !answers.is_empty() {
            self.finished_since.get_or_insert_with(Instant::now);
            self.finished.extend(answers);
        }
        self.handing_back.extend(hand_backs);
    }

    /// Whether nothing the worker holds is still to be written: answers (held back or not),
    /// hand-backs, messages to settle, keys to hand on, the breaker's changes.
    fn nothing_left_to_write(&self) -> bool {
        self.finished.is_empty()
            && self.held_answers.is_empty()
            && self.handing_back.is_empty()
            && self.held_hand_backs.is_empty()
            && self.settling_again.is_empty()
            && self.endpoints.settling_held.is_empty()
            && self.releasing_again.is_empty()
            && self.endpoints.releasing_held.is_empty()
            && self.endpoints.breaker_unwritten.is_empty()
    }

    /// One step, in one transaction: record the answers that came back, then (unless draining)
    /// make new deliveries and claim what the endpoints have room for.
    fn step(&mut self, schema: pg_sys::Oid, claiming: bool) -> Step {
        if session::extension_schema().is_none() {
            return Step::NoExtension;
        }
        if !crate::spi::version_matches() {
            return Step::WaitingForUpdate;
        }
        let policy = settings::retry_policy();
        let mut spi = Spi::connect();
        let recorded = record::record(&mut spi, schema, &self.finished, &policy, &mut self.endpoints);
        self.settling_again.extend(self.endpoints.settling_held.take_due(Instant::now()));
        record::settle_messages(&mut spi, schema, self.settling_again.clone(), &mut self.endpoints.settling_held);
        if self.keys_left_behind {
            record::hand_on_keys_left_behind(&mut spi, schema, &mut self.endpoints);
        }
        self.releasing_again.extend(self.endpoints.releasing_held.take_due(Instant::now()));
        record::release_held_keys(&mut spi, schema, self.releasing_again.clone(), &mut self.endpoints);
        let breaker_written = breaker::record(&mut spi, schema, &self.finished, &mut self.endpoints, self.settings.endpoint_disable_after);
        let mut claimed = Vec::new();
        if claiming && Instant::now() >= self.next_refresh {
            if self.endpoints.reload(schema, self.settings.http_timeout) {
                self.endpoints.look_for_orphans = true;
            }
            let topics = self.endpoints.topics();
            registry::publish_topics(self.slot, TopicFilter::of_all(topics.iter().map(String::as_str)));
            self.endpoints.refresh_next_due(schema);
            self.housekeeping.warn_about_unsubscribed_topics(&mut spi, schema, &topics);
            self.next_refresh = Instant::now() + self.settings.poll_interval;
            self.messages_may_be_ready = true;
        }
        // Whether this step holds ordering keys' locks from here on (messages handed back to
        // their keys): then its pick-up waits for no other key (claim::fan_out).
        let mut holds_keys = false;
        if claiming && self.endpoints.look_for_orphans {
            let endpoints = &mut self.endpoints;
            holds_keys |= record::settle_orphans(&mut spi, schema, &mut endpoints.settling_held, &mut endpoints.unhanding_held);
            endpoints.look_for_orphans = false;
        }
        self.unhanding_again.extend(self.endpoints.unhanding_held.take_due(Instant::now()));
        holds_keys |= record::unhand(&mut spi, schema, self.unhanding_again.clone(), &mut self.endpoints.unhanding_held);
        // Queued for endpoints disabled (by the breaker, an operator) or gone: not sent. (A
        // worker not claiming emptied every queue before the step.)
        self.handing_back.extend(self.endpoints.take_unsendable(false));
        let hand_backs_held = claim::hand_back(&mut spi, schema, &self.handing_back);
        if claiming {
            if self.messages_may_be_ready {
                let batch = self.settings.batch_size;
                let now = crate::backend::now();
                self.messages_may_be_ready = claim::fan_out(&mut spi, schema, &mut self.endpoints, batch, now, !holds_keys);
            }
            // (Read after the pick-up, which may have waited seconds for an ordering key's lock:
            // leases and the queue's deadlines count from here, or they would have run out.)
            let (now, claimed_at) = (crate::backend::now(), Instant::now());
            let held = self.pool.bytes_in_flight() + self.endpoints.bytes_queued() + self.bytes_handing_back();
            let mut budget = (self.settings.max_payload_bytes as i64 - held as i64).max(0);
            let (max_in_flight, batch) = (self.settings.max_in_flight, self.settings.batch_size as usize);
            // Not leased again meanwhile: deliveries whose answers wait (from earlier steps, and
            // held back by this one's recording), and whose hand-backs wait (a later one must
            // not release a lease taken since). As (endpoint, message).
            let answers = self.held_answers.iter().chain(recorded.held.iter().map(|&index| &self.finished[index]));
            let held_deliveries: BTreeSet<(i64, i64)> = answers
                .map(|done| (done.subscription_id, done.message_id))
                .chain(self.held_hand_backs.iter().map(|back| (back.subscription_id, back.message_id)))
                .chain(hand_backs_held.iter().copied())
                .collect();
            for (subscription_id, size) in self.endpoints.claims(max_in_flight, self.pool.in_flight(), batch, claimed_at) {
                let nothing_in_flight = self.pool.in_flight() + claimed.len() == 0 && !self.endpoints.any_queued();
                if budget == 0 && !nothing_in_flight {
                    self.endpoints.waiting_for_payload_room = true;
                    break;
                }
                let held = held_deliveries.range((subscription_id, i64::MIN)..=(subscription_id, i64::MAX)).map(|&(_, id)| id).collect();
                let room = claim::Room { size, byte_budget: budget, nothing_in_flight, held, leases_run_out_by: self.answers_taken_at };
                let got =
                    claim::claim_for_endpoint(&mut spi, schema, &mut self.endpoints, subscription_id, room, &policy, (now, claimed_at));
                budget -= got.iter().map(|q| q.delivery.message.body.len() as i64).sum::<i64>();
                budget = budget.max(0);
                claimed.extend(got);
            }
        }
        spi.finish();
        Step::Ran { recorded, breaker_written, hand_backs_held, claimed }
    }

    /// The payload bytes of the deliveries to hand back: an operator's transaction may hold
    /// them back for as long as it lasts, and they count in `outbox.worker_memory` meanwhile.
    fn bytes_handing_back(&self) -> usize {
        self.handing_back.iter().chain(self.held_hand_backs.iter()).map(|back| back.message.body.len()).sum()
    }

    /// Whether a step has work: answers to record (a batch of them, or the first one waiting
    /// for [`RECORD_WITHIN`], or any when nothing is queued to start meanwhile), deliveries to
    /// hand back, subscriptions to read again, messages that may be ready, or an endpoint that
    /// wants more deliveries. A worker that is not claiming steps every time it wakes.
    fn step_needed(&self, claiming: bool) -> bool {
        if !claiming || !self.handing_back.is_empty() || self.messages_may_be_ready || Instant::now() >= self.next_refresh {
            return true;
        }
        let retries = [
            self.endpoints.settling_held.until(),
            self.endpoints.releasing_held.until(),
            self.endpoints.unhanding_held.until(),
            self.endpoints.breaker_unwritten.retry_at(),
        ];
        if self.endpoints.look_for_orphans || retries.into_iter().flatten().any(|at| Instant::now() >= at) {
            return true;
        }
        if !self.finished.is_empty() {
            let full = self.finished.len() >= self.settings.batch_size as usize;
            let waited = self.finished_since.is_some_and(|since| since.elapsed() >= RECORD_WITHIN);
            if full || waited || !self.endpoints.any_queued() {
                return true;
            }
        }
        let (max_in_flight, batch) = (self.settings.max_in_flight, self.settings.batch_size as usize);
        !self.endpoints.waiting_for_payload_room && self.endpoints.want_claims(max_in_flight, self.pool.in_flight(), batch, Instant::now())
    }

    /// Starts the queued deliveries the endpoints have room for; those found too late to start
    /// within their lease are handed back instead.
    fn start_queued(&mut self) {
        let (start, late) = self.endpoints.start_queued(self.settings.max_in_flight, self.pool.in_flight(), Instant::now());
        self.handing_back.extend(late);
        let endpoints = &self.endpoints;
        self.pool.send(start, |id| Arc::clone(&endpoints.by_id[&id].queued));
    }

    /// Moves the answers that came back from the helper threads to `finished`.
    fn take_answers(&mut self) {
        self.answers_taken_at = crate::backend::now(); // (before: what is still in flight then is known)
        for done in self.pool.take_finished() {
            self.finished_since.get_or_insert_with(Instant::now);
            self.endpoints.waiting_for_payload_room = false; // its payload's room is free
            if let Some(state) = self.endpoints.by_id.get_mut(&done.subscription_id) {
                if done.continued_with.is_none() {
                    state.in_flight = state.in_flight.saturating_sub(1); // (else: its slot went on)
                }
                if !matches!(done.answer.outcome, crate::webhook::Outcome::Delivered) {
                    state.failure_unrecorded = true;
                    state.failed_at = Some(Instant::now());
                }
            }
            self.finished.push(done);
        }
    }

    fn report(&self, recorded: &record::Recorded) {
        registry::update(self.slot, |s| {
            s.delivered += recorded.delivered as i64;
            s.failed += recorded.failed as i64;
        });
        if recorded.no_longer_held > 0 {
            pgrx::log!(
                "outbox_ext: {} answer(s) came back for deliveries that no longer waited for them (redelivered or unsubscribed meanwhile)",
                recorded.no_longer_held
            );
        }
    }

    fn publish_state(&self) {
        let in_flight = self.pool.in_flight() as i32;
        let state = if self.draining {
            WorkerState::Draining
        } else if self.waiting_for_update {
            WorkerState::WaitingForUpdate
        } else if !self.settings.enabled {
            WorkerState::Disabled
        } else if self.retry_at.is_some() {
            // (It said idle while a held lock failed every step: stop 58's probe of crashes.)
            WorkerState::Retrying
        } else if in_flight > 0 {
            WorkerState::Delivering
        } else {
            WorkerState::Idle
        };
        registry::update(self.slot, |s| {
            s.in_flight = in_flight;
            s.last_poll_at = crate::backend::now();
            s.state = state;
        });
    }

    /// How long to sleep: until the next due delivery, the next refresh, or a failed step's
    /// retry; answers and commits wake the worker earlier.
    fn sleep_time(&self) -> Duration {
        if let Some(at) = self.retry_at {
            return at.saturating_duration_since(Instant::now()); // a step failed
        }
        let claiming = self.claiming() && !self.waiting_for_update;
        // Not claiming (paused by outbox.worker_enabled = off, stopping, or waiting for the
        // database's ALTER EXTENSION … UPDATE), the worker refreshes nothing and starts nothing:
        // it waits for a reload, an answer or the update's commit, polling now and then.
        // (Counting from a refresh time it no longer moves, it ran a step per loop, without end.)
        let mut wait = if claiming { self.next_refresh.saturating_duration_since(Instant::now()) } else { self.settings.poll_interval };
        let now = crate::backend::now();
        let max_in_flight = self.settings.max_in_flight;
        if claiming && self.pool.in_flight() < max_in_flight {
            if self.messages_may_be_ready {
                wait = Duration::ZERO;
            }
            // An endpoint with due work and room starts now, or when its rate limit allows.
            if let Some(until_it_may) = self.endpoints.wait_for_due_work(max_in_flight, self.pool.in_flight(), Instant::now()) {
                wait = wait.min(until_it_may);
            }
            if let Some(until) = self.endpoints.held_back_topics.until() {
                wait = wait.min(until.saturating_duration_since(Instant::now()));
            }
            if let Some(due) = self.endpoints.earliest_due(max_in_flight, self.pool.in_flight()) {
                wait = wait.min(Duration::from_micros(u64::try_from(due - now).unwrap_or(0)));
            }
        }
        // Queued deliveries are handed back once too late to start, before their leases end:
        // the poll interval (up to an hour) must not outlast the margin between the two (2.5
        // s), whatever endpoint holds the slots meanwhile.
        if let Some(start_by) = self.endpoints.earliest_start_by() {
            wait = wait.min(start_by.saturating_duration_since(Instant::now()) + TOO_LATE_BY);
        }
        if let Some(since) = self.finished_since.filter(|_| !self.waiting_for_update) {
            wait = wait.min(RECORD_WITHIN.saturating_sub(since.elapsed()));
        }
        let holds = [
            self.held_answers.until(),
            self.held_hand_backs.until(),
            self.endpoints.settling_held.until(),
            self.endpoints.releasing_held.until(),
            self.endpoints.unhanding_held.until(),
            self.endpoints.breaker_unwritten.retry_at(),
        ];
        // (Waiting for the update, a step writes nothing: answers or held work due would make it
        // spin.)
        for until in holds.into_iter().flatten().filter(|_| !self.waiting_for_update) {
            wait = wait.min(until.saturating_duration_since(Instant::now()));
        }
        if self.draining {
            // Whatever is still out gives up by its timeout; look at least once a second.
            wait = wait.min(Duration::from_secs(1));
        }
        wait
    }
}

// outbox_wake_worker_at_commit() RETURNS void: when this transaction commits, wake the
// database's delivery worker, or have the launcher start one (CREATE EXTENSION, a redelivery).
// (Its symbol keeps the name pgrx gave it until 0.3.0.)
sql_function!(outbox_wake_worker_at_commit_wrapper, pg_finfo_outbox_wake_worker_at_commit_wrapper, |_args| {
    registry::wake_or_start_worker_at_commit();
    pg_sys::Datum::from(0)
});

// outbox_worker_status() RETURNS TABLE (database, pid, state, started_at, last_poll_at,
// in_flight, delivered, failed, compactions, last_compaction_at): the delivery workers, and the
// databases waiting for one.
sql_function!(outbox_worker_status_wrapper, pg_finfo_outbox_worker_status_wrapper, |args| {
    let mut result = SetResult::begin(&args);
    for row in registry::status() {
        let database = crate::backend::database_name(pg_sys::Oid::from(row.database_oid));
        let timestamp = |t: Option<pg_sys::TimestampTz>| t.map(pg_sys::Datum::from);
        result.push_values(&[
            database.map(|d| crate::text::to_datum(&d)),
            row.pid.into_datum(),
            Some(crate::text::to_datum(&row.state)),
            timestamp(row.started_at),
            timestamp(row.last_poll_at),
            row.in_flight.into_datum(),
            row.delivered.into_datum(),
            row.failed.into_datum(),
            row.compactions.into_datum(),
            timestamp(row.last_compaction_at),
        ]);
    }
    result.finish()
});

//! Record, the worker's third step: what each request's answer means for its delivery (DONE, a
//! retry after the backoff or the endpoint's Retry-After, or DEAD: policy.rs decides), the
//! attempt log, and the messages whose deliveries have all ended (DONE, or DEAD when any of
//! them is). All of one step's answers are recorded in one transaction, but for those whose
//! deliveries or messages an operator's open transaction holds (an unsubscribe, a redelivery):
//! they wait for a later step (held_back.rs), as does settling a message such a transaction
//! holds.

use super::deliver::Finished;
use super::endpoints::Endpoints;
use super::held_back::HeldBack;
use crate::policy::{self, AfterFailure, RetryPolicy};
use crate::spi::{Spi, Statement};
use crate::text::{self, ServerText};
use crate::webhook::Outcome;
use crate::{interval, ordering};
use pgrx::datum::IntoDatum;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::collections::BTreeSet;
use std::time::Instant;

static DELIVERED: Statement = Statement::new(include_str!("record_delivered.sql"), &[INT8ARRAYOID, INT8ARRAYOID, INT4ARRAYOID]);
static RETRY: Statement = Statement::new(
    include_str!("record_retry.sql"),
    &[INT8ARRAYOID, INT8ARRAYOID, INT4ARRAYOID, INTERVALARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID],
);
static DEAD: Statement = Statement::new(include_str!("record_dead.sql"), &[INT8ARRAYOID, INT8ARRAYOID, INT4ARRAYOID, TEXTARRAYOID]);
static LOG_ATTEMPTS: Statement = Statement::new(
    include_str!("log_attempts.sql"),
    &[INT8ARRAYOID, INT8ARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, INT8ARRAYOID, INT4ARRAYOID, TEXTARRAYOID],
);
static LOCK_ANSWERED: Statement = Statement::new(include_str!("lock_answered.sql"), &[INT8ARRAYOID, INT8ARRAYOID]);
static HELD_ANSWERED: Statement = Statement::new(include_str!("held_answered.sql"), &[INT8ARRAYOID, INT8ARRAYOID]);
static LOCK_MESSAGES: Statement = Statement::new(include_str!("lock_messages.sql"), &[INT8ARRAYOID]);
static HELD_MESSAGES: Statement = Statement::new(include_str!("held_messages.sql"), &[INT8ARRAYOID]);
static MESSAGES_TO_SETTLE: Statement = Statement::new(include_str!("messages_to_settle.sql"), &[INT8ARRAYOID]);
static ORPHANED: Statement = Statement::new(include_str!("orphaned_messages.sql"), &[]);
static KEYS_LEFT_BEHIND: Statement = Statement::new(include_str!("keys_left_behind.sql"), &[]);
static UNHAND: Statement = Statement::new(include_str!("unhand_messages.sql"), &[INT8ARRAYOID]);
static SETTLE: Statement = Statement::new(include_str!("settle_messages.sql"), &[INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID]);

/// What one step recorded.
#[derive(Default)]
pub struct Recorded {
    pub delivered: usize,
    pub failed: usize,
    /// Answers whose delivery no longer waited for them (an operator redelivered it meanwhile).
    pub no_longer_held: usize,
    /// The answers (indexes in the step's) whose deliveries another transaction holds: not
    /// recorded, left for a later step.
    pub held: Vec<usize>,
}

/// One column of a batch statement.
#[derive(Default)]
struct Columns {
    message_ids: Vec<i64>,
    subscription_ids: Vec<i64>,
    attempts: Vec<i32>,
}

impl Columns {
    fn push(&mut self, done: &Finished) {
        self.message_ids.push(done.message_id);
        self.subscription_ids.push(done.subscription_id);
        self.attempts.push(done.attempt);
    }
}

/// Records `finished` answers (in a transaction); the caller forgets them once it commits.
pub fn record(spi: &mut Spi, schema: pg_sys::Oid, finished: &[Finished], policy: &RetryPolicy, endpoints: &mut Endpoints) -> Recorded {
    let mut recorded = Recorded::default();
    if finished.is_empty() {
        return recorded;
    }
    // The messages first, then their deliveries: the order outbox_redeliver locks them in (the
    // other order deadlocked with it).
    let held_messages = lock_messages(spi, schema, finished.iter().map(|done| done.message_id).collect());
    let answered: Vec<&Finished> = finished.iter().filter(|done| !held_messages.contains(&done.message_id)).collect();
    let held_deliveries = held_by_others(spi, schema, &answered);
    let is_held =
        |done: &Finished| held_messages.contains(&done.message_id) || held_deliveries.contains(&(done.message_id, done.subscription_id));
    let (mut delivered, mut retried, mut dead) = (Columns::default(), Columns::default(), Columns::default());
    let (mut waits, mut retry_errors, mut dead_errors) = (Vec::new(), Vec::new(), Vec::new());
    let now = crate::backend::now();
    for (index, done) in finished.iter().enumerate() {
        if is_held(done) {
            recorded.held.push(index);
            continue;
        }
        match &done.answer.outcome {
            Outcome::Delivered => delivered.push(done),
            Outcome::Failed { error, retry_after } => {
                let error = text::to_server(error);
                let retry_after = retry_after.map(|wait| wait.min(policy::MAX_RETRY_AFTER));
                match policy.after_failure(done.attempt, retry_after, fastrand::f64()) {
                    AfterFailure::RetryIn(wait) => {
                        retried.push(done);
                        waits.push(interval::from_duration(wait));
                        retry_errors.push(error);
                        if let Some(state) = endpoints.by_id.get_mut(&done.subscription_id) {
                            let due = now + i64::try_from(wait.as_micros()).unwrap_or(i64::MAX / 2);
                            state.next_due = Some(state.next_due.map_or(due, |t| t.min(due)));
                        }
                    }
                    AfterFailure::Dead => {
                        dead.push(done);
                        dead_errors.push(error);
                    }
                }
            }
        }
    }

    let mut ended_messages: Vec<i64> = Vec::new();
    if !delivered.message_ids.is_empty() {
        let count = delivered.message_ids.len();
        let ended = end_deliveries(
            spi,
            schema,
            &DELIVERED,
            &[delivered.message_ids.into_datum(), delivered.subscription_ids.into_datum(), delivered.attempts.into_datum()],
            endpoints,
        );
        recorded.delivered = ended.len();
        recorded.no_longer_held += count - ended.len();
        ended_messages.extend(ended);
    }
    if !retried.message_ids.is_empty() {
        let count = retried.message_ids.len();
        let changed = spi
            .execute(
                &RETRY,
                schema,
                &[
                    retried.message_ids.into_datum(),
                    retried.subscription_ids.into_datum(),
                    retried.attempts.into_datum(),
                    waits.into_datum(),
                    retry_errors.into_datum(),
                    Some(pg_sys::Datum::from(now)),
                ],
            )
            .len();
        recorded.failed += changed;
        recorded.no_longer_held += count - changed;
    }
    if !dead.message_ids.is_empty() {
        let count = dead.message_ids.len();
        let ended = end_deliveries(
            spi,
            schema,
            &DEAD,
            &[dead.message_ids.into_datum(), dead.subscription_ids.into_datum(), dead.attempts.into_datum(), dead_errors.into_datum()],
            endpoints,
        );
        recorded.failed += ended.len();
        recorded.no_longer_held += count - ended.len();
        ended_messages.extend(ended);
    }

    log_attempts(spi, schema, finished.iter().filter(|done| !is_held(done)));
    settle_locked_messages(spi, schema, ended_messages);
    recorded
}

/// Runs `statement`, which ends deliveries (DONE or DEAD) and returns one row: their messages,
/// and the endpoints and ordering keys of those with a key. The next delivery of each such key
/// at its endpoint becomes claimable (src/ordering), but for those another transaction holds:
/// their keys go to `held`, for a later step. Returns the messages, whose other deliveries may
/// all have ended too (settle_messages).
pub fn end_deliveries(
    spi: &mut Spi,
    schema: pg_sys::Oid,
    statement: &'static Statement,
    arguments: &[Option<pg_sys::Datum>],
    all: &mut Endpoints,
) -> Vec<i64> {
    let rows = spi.execute(statement, schema, arguments);
    let messages = rows.get::<Vec<i64>>(0, 1).unwrap_or_default();
    let (endpoints_with_keys, keys) = (rows.get::<Vec<i64>>(0, 2).unwrap_or_default(), rows.get_server_text_array(0, 3));
    release_keys(spi, schema, endpoints_with_keys, keys, all);
    messages
}

/// Hands on ordering keys at endpoints (`endpoints` and `keys` pairwise: src/ordering); those
/// another transaction holds go to `all.releasing_held`. The endpoints are due now: a key's next
/// delivery may be claimable there (else an idle worker sent a key's backlog at one message per
/// outbox.poll_interval, as stop 56's probe saw).
fn release_keys(spi: &mut Spi, schema: pg_sys::Oid, endpoints: Vec<i64>, keys: Vec<ServerText>, all: &mut Endpoints) {
    if endpoints.is_empty() {
        return;
    }
    let (released, held_now) =
        ordering::release_delivery_keys(spi, schema, endpoints.clone().into_datum(), keys.into_datum(), ordering::Taking::Try);
    all.releasing_held.hold(held_now, Instant::now());
    if released > 0 {
        for id in endpoints {
            if let Some(state) = all.by_id.get_mut(&id) {
                state.due_now = true;
            }
        }
    }
}

/// A new worker's first step: hands on the ordering keys its predecessor left for later at their
/// endpoints (an operator's transaction held their next delivery, and it stopped meanwhile),
/// those still held going to `all.releasing_held`.
pub fn hand_on_keys_left_behind(spi: &mut Spi, schema: pg_sys::Oid, all: &mut Endpoints) {
    let left = spi.execute(&KEYS_LEFT_BEHIND, schema, &[]);
    let (endpoints, keys) = (left.get::<Vec<i64>>(0, 1).unwrap_or_default(), left.get_server_text_array(0, 2));
    release_keys(spi, schema, endpoints, keys, all);
}

/// Hands on `keys` (as (endpoint, key)) held back by an earlier step; those another transaction
/// still holds go back to `all.releasing_held`.
pub fn release_held_keys(spi: &mut Spi, schema: pg_sys::Oid, keys: Vec<(i64, ServerText)>, all: &mut Endpoints) {
    let (endpoints, keys): (Vec<i64>, Vec<ServerText>) = keys.into_iter().unzip();
    release_keys(spi, schema, endpoints, keys, all);
}

/// The answers among `finished` whose deliveries another transaction holds (an operator's
/// unsubscribe or redelivery not yet committed), as (message, endpoint); locks the others'.
fn held_by_others(spi: &mut Spi, schema: pg_sys::Oid, finished: &[&Finished]) -> BTreeSet<(i64, i64)> {
    fn keys<'a>(answers: impl Iterator<Item = &'a &'a Finished>) -> [Option<pg_sys::Datum>; 2] {
        let (messages, endpoints): (Vec<i64>, Vec<i64>) = answers.map(|done| (done.message_id, done.subscription_id)).unzip();
        [messages.into_datum(), endpoints.into_datum()]
    }
    fn rows_to_keys(rows: &crate::spi::Rows<'_>) -> BTreeSet<(i64, i64)> {
        (0..rows.len()).map(|row| (rows.get(row, 1).expect("message"), rows.get(row, 2).expect("endpoint"))).collect()
    }
    if finished.is_empty() {
        return BTreeSet::new();
    }
    let locked = rows_to_keys(&spi.execute(&LOCK_ANSWERED, schema, &keys(finished.iter())));
    let mut not_locked = finished.iter().filter(|done| !locked.contains(&(done.message_id, done.subscription_id))).peekable();
    if not_locked.peek().is_none() {
        return BTreeSet::new();
    }
    rows_to_keys(&spi.execute(&HELD_ANSWERED, schema, &keys(not_locked)))
}

fn log_attempts<'a>(spi: &mut Spi, schema: pg_sys::Oid, finished: impl Iterator<Item = &'a Finished>) {
    let mut columns = Columns::default();
    let (mut started, mut micros, mut statuses, mut errors) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for done in finished {
        columns.push(done);
        started.push(pgrx::datum::TimestampWithTimeZone::try_from(crate::backend::from_system_time(done.started_at)).ok());
        micros.push(i64::try_from(done.duration.as_micros()).unwrap_or(i64::MAX));
        statuses.push(done.answer.http_status.map(i32::from));
        errors.push(match &done.answer.outcome {
            Outcome::Delivered => None,
            Outcome::Failed { error, .. } => Some(text::to_server(error)),
        });
    }
    spi.execute(
        &LOG_ATTEMPTS,
        schema,
        &[
            columns.message_ids.into_datum(),
            columns.subscription_ids.into_datum(),
            columns.attempts.into_datum(),
            started.into_datum(),
            micros.into_datum(),
            statuses.into_datum(),
            errors.into_datum(),
        ],
    );
}

/// Locks the PENDING messages among `ids`, in id order.
/// Locks messages `ids` still PENDING (in id order); returns those another transaction holds
/// (an operator's redelivery not yet committed).
fn lock_messages(spi: &mut Spi, schema: pg_sys::Oid, mut ids: Vec<i64>) -> BTreeSet<i64> {
    if ids.is_empty() {
        return BTreeSet::new();
    }
    ids.sort_unstable();
    ids.dedup();
    fn id_set(rows: &crate::spi::Rows<'_>) -> BTreeSet<i64> {
        (0..rows.len()).map(|row| rows.get(row, 1).expect("id")).collect()
    }
    let locked = id_set(&spi.execute(&LOCK_MESSAGES, schema, &[ids.clone().into_datum()]));
    ids.retain(|id| !locked.contains(id));
    if ids.is_empty() {
        return BTreeSet::new();
    }
    id_set(&spi.execute(&HELD_MESSAGES, schema, &[ids.into_datum()]))
}

/// Messages whose deliveries have all ended end too: DONE, or DEAD (policy.rs). Those another
/// transaction holds go to `held`, for a later step.
pub fn settle_messages(spi: &mut Spi, schema: pg_sys::Oid, mut candidates: Vec<i64>, held: &mut HeldBack<i64>) {
    let held_now = lock_messages(spi, schema, candidates.clone());
    candidates.retain(|id| !held_now.contains(id));
    held.hold(held_now, Instant::now());
    settle_locked_messages(spi, schema, candidates);
}

/// [`settle_messages`] of messages this transaction has locked already.
/// (No order needed here: the messages were locked in id order already.)
fn settle_locked_messages(spi: &mut Spi, schema: pg_sys::Oid, candidates: Vec<i64>) {
    if candidates.is_empty() {
        return;
    }
    let rows = spi.execute(&MESSAGES_TO_SETTLE, schema, &[candidates.into_datum()]);
    let (mut ids, mut statuses, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for row in 0..rows.len() {
        let delivered: i64 = rows.get(row, 2).expect("count");
        let dead: i64 = rows.get(row, 3).expect("count");
        let (status, error) = policy::message_outcome(delivered as usize, dead as usize, rows.get_text(row, 4));
        ids.push(rows.get::<i64>(row, 1).expect("id"));
        statuses.push(status.to_string());
        errors.push(error.map(|error| text::to_server(&error)));
    }
    if !ids.is_empty() {
        spi.execute(&SETTLE, schema, &[ids.into_datum(), statuses.into_datum(), errors.into_datum()]);
    }
}

/// After endpoints were unsubscribed (their deliveries deleted with them): messages whose other
/// deliveries have all ended end (settle_messages: those another transaction holds go to
/// `settling_held`); those left without any delivery are no longer the worker's
/// ([`unhand`]: those held go to `unhanding_held`). Returns whether it took ordering keys' locks
/// ([`unhand`]).
pub fn settle_orphans(spi: &mut Spi, schema: pg_sys::Oid, settling_held: &mut HeldBack<i64>, unhanding_held: &mut HeldBack<i64>) -> bool {
    let rows = spi.execute_by_index(&ORPHANED, schema, &[]);
    let (mut with_deliveries, mut without) = (Vec::new(), Vec::new());
    for row in 0..rows.len() {
        let id: i64 = rows.get(row, 1).expect("id");
        if rows.get::<bool>(row, 2).unwrap_or(false) {
            with_deliveries.push(id)
        } else {
            without.push(id)
        }
    }
    let took_keys = unhand(spi, schema, without, unhanding_held);
    settle_messages(spi, schema, with_deliveries, settling_held);
    took_keys
}

/// Lets go messages `ids` left without deliveries (unhand_messages.sql): PENDING for whoever
/// comes next. Those another transaction holds (a redelivery adding a delivery, not yet
/// committed) go to `held`, for a later step, rather than be waited for. Returns whether it took
/// the locks of their ordering keys (held until the step commits).
pub fn unhand(spi: &mut Spi, schema: pg_sys::Oid, mut ids: Vec<i64>, held: &mut HeldBack<i64>) -> bool {
    if ids.is_empty() {
        return false;
    }
    let held_now = lock_messages(spi, schema, ids.clone());
    ids.retain(|id| !held_now.contains(id));
    held.hold(held_now, Instant::now());
    if ids.is_empty() {
        return false;
    }
    let unhanded = spi.execute_seeing_latest_commits(&UNHAND, schema, &[ids.into_datum()]);
    let keys: Vec<ServerText> = (0..unhanded.len()).filter_map(|row| unhanded.get_server_text(row, 1)).collect();
    if keys.is_empty() {
        return false;
    }
    ordering::requeue_in_key_order(spi, schema, keys.into_datum());
    true
}

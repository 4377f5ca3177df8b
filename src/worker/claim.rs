//! Claim, the worker's first step: pick up ready messages of the topics it delivers and make
//! their deliveries (one per endpoint), then lease each endpoint's due deliveries, as many as
//! its share of the in-flight slots allows and a few rounds ahead (endpoints.rs; a delivery's
//! last attempt only to start at once), and queue them for their endpoint. A delivery out of
//! attempts is dead-lettered here instead (policy.rs decides, as for `outbox_claim`).

use super::endpoints::{self, ClaimSize, Endpoints, Queued};
use super::record;
use crate::policy::RetryPolicy;
use crate::spi::{Spi, Statement};
use crate::text::ServerText;
use crate::webhook::Message;
use crate::{interval, ordering};
use pgrx::datum::IntoDatum;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

static PICK_UP: crate::topic::WalkOfTopics =
    crate::topic::WalkOfTopics::new(include_str!("pick_up.sql"), &[TIMESTAMPTZOID, TEXTARRAYOID, INT4OID, TIMESTAMPTZOID, INT4OID]);
static FAN_OUT: Statement = Statement::new(include_str!("fan_out.sql"), &[TIMESTAMPTZOID, INT8ARRAYOID]);
static LOCK: Statement =
    Statement::new(include_str!("lock_deliveries.sql"), &[INT8OID, TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID]);
static LAST_ATTEMPTS_ANSWERED: Statement =
    Statement::new(include_str!("last_attempts_answered.sql"), &[INT8OID, INT8ARRAYOID, INT4ARRAYOID]);
static DEAD_LETTER: Statement = Statement::new(include_str!("dead_letter_deliveries.sql"), &[INT8OID, INT8ARRAYOID, TEXTARRAYOID]);
static LEASE: Statement = Statement::new(include_str!("lease_deliveries.sql"), &[INT8OID, INT8ARRAYOID, TIMESTAMPTZOID, INTERVALOID]);
static RELEASE_LEASES: Statement = Statement::new(include_str!("release_leases.sql"), &[]);
static HAND_BACK: Statement = Statement::new(include_str!("hand_back_deliveries.sql"), &[INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZARRAYOID]);

/// A delivery leased for one request.
pub struct Claimed {
    pub message_id: i64,
    pub subscription_id: i64,
    /// When the lease runs out: it names this lease (a later one of the delivery ends later), so
    /// that handing it back never releases another.
    pub lease_until: pg_sys::TimestampTz,
    pub message: Arc<Message>,
}

/// Makes the deliveries of up to `batch` ready messages of the delivered topics; marks the
/// endpoints that got some as due. Returns whether more messages may be ready now (the batch
/// was full, or ordering keys were released: their next messages are ready). Messages whose
/// topic an operator, or whose ordering key a producer, is changing in an open transaction are
/// left for a later pick-up (held_back.rs).
pub fn fan_out(
    spi: &mut Spi,
    schema: pg_sys::Oid,
    endpoints: &mut Endpoints,
    batch: i32,
    now: pg_sys::TimestampTz,
    may_wait_for_a_key: bool,
) -> bool {
    let started = Instant::now();
    let topics = endpoints.held_back_topics.excluding(endpoints.topics(), started);
    if topics.is_empty() {
        return false;
    }
    // Read from where the last pick-up of these topics found the head (src/claim/head.rs).
    let pick_up = PICK_UP.for_topics(topics.len());
    let topics = Some(topics);
    let start_from = endpoints.fan_out_head.start(&topics, started);
    // A key producers keep holding is waited for first, holding no other key meanwhile
    // (held_back.rs, to_wait_for); the pick-up then finds it held. Not by a step that holds
    // keys already (`may_wait_for_a_key` false): a producer holding this key may be about to
    // enqueue with one of those, and would wait for the worker while the worker waited for it.
    // The next step waits.
    if let Some(key) = endpoints.held_back_keys.to_wait_for(started).filter(|_| may_wait_for_a_key) {
        ordering::lock_key(spi, schema, &key);
    }
    // Lock the messages and their ordering keys first; their deliveries are made by a second
    // statement, whose snapshot sees every head made before those keys were locked.
    let rows = spi.execute(
        pick_up,
        schema,
        &[
            Some(pg_sys::Datum::from(now)),
            topics.clone().into_datum(),
            batch.into_datum(),
            Some(start_from.into()),
            ordering::key_lock_space(schema).into_datum(),
        ],
    );
    endpoints.fan_out_head.found(&topics, start_from, now, rows.get(0, 2), started);
    let locked: i64 = rows.get(0, 1).unwrap_or(0);
    let picked: Vec<i64> = rows.get(0, 3).unwrap_or_default();
    let keys_left_alone: Vec<(ServerText, i64)> =
        rows.get_server_text_array(0, 4).into_iter().zip(rows.get::<Vec<i64>>(0, 5).unwrap_or_default()).collect();
    if !keys_left_alone.is_empty() {
        endpoints.held_back_topics.hold_keyed(started); // their producers wake the worker too
    }
    endpoints.held_back_keys.left_alone(keys_left_alone, started);
    if picked.is_empty() {
        return false; // (a full batch of messages whose keys are held is not "more ready")
    }
    let rows = spi.execute(&FAN_OUT, schema, &[Some(pg_sys::Datum::from(now)), picked.into_datum()]);
    for id in rows.get::<Vec<i64>>(0, 1).unwrap_or_default() {
        if let Some(state) = endpoints.by_id.get_mut(&id) {
            state.due_now = true;
        }
    }
    let released_keys = rows.datum(0, 2);
    endpoints.held_back_topics.hold(rows.get_text_array(0, 3), started);
    ordering::release_message_keys(spi, schema, released_keys);
    locked == i64::from(batch) || released_keys.is_some()
}

/// What an endpoint may take in one claim.
pub struct Room {
    /// Deliveries it may lease, with what is ahead of them (endpoints::ClaimSize).
    pub size: ClaimSize,
    /// Payload bytes the worker may still hold (outbox.worker_memory).
    pub byte_budget: i64,
    /// No request is in flight: the first delivery goes even beyond the budget (alone).
    pub nothing_in_flight: bool,
    /// Messages whose deliveries to this endpoint wait for an answer to be recorded or a
    /// hand-back (held_back.rs): not leased again meanwhile, should their leases run out.
    pub held: Vec<i64>,
    /// Leases that ran out by this clock are due again (retries and new deliveries by the
    /// transaction's): when the worker last took the answers that came back. A request still
    /// in flight then ends within its lease, and its answer is recorded before a later step's
    /// claim; a lease that ran out during a long step may be one whose answer came back
    /// meanwhile (leased again, the delivery went out twice).
    pub leases_run_out_by: pg_sys::TimestampTz,
}

/// Leases due deliveries of endpoint `subscription_id` within `room`; dead-letters those out of
/// attempts. `now` is the transaction's clock, the leases' start, `started` the same moment as
/// an Instant. Returns the leased ones, to queue once the transaction commits.
pub fn claim_for_endpoint(
    spi: &mut Spi,
    schema: pg_sys::Oid,
    endpoints: &mut Endpoints,
    subscription_id: i64,
    room: Room,
    policy: &RetryPolicy,
    (now, started): (pg_sys::TimestampTz, Instant),
) -> Vec<Queued> {
    let Room { size, byte_budget, nothing_in_flight, held, leases_run_out_by } = room;
    let leases_run_out_by = leases_run_out_by.min(now);
    let slots = size.count;
    let Some(state) = endpoints.by_id.get_mut(&subscription_id) else { return Vec::new() };
    // Read from where the endpoint's last claim found its head (src/claim/head.rs).
    let start_from = state.head.start(&None, started);
    let locked = spi.execute(
        &LOCK,
        schema,
        &[
            subscription_id.into_datum(),
            Some(pg_sys::Datum::from(now)),
            (slots as i32).into_datum(),
            Some(start_from.into()),
            Some(pg_sys::Datum::from(leases_run_out_by)),
        ],
    );
    let first: Option<i64> = (!locked.is_empty()).then(|| locked.get(0, 4).expect("available_at"));
    // (Leases that ran out since leases_run_out_by were not read: the next claim reads from
    // before them.)
    state.head.found(&None, start_from, leases_run_out_by, first, started);
    // (message, attempts, payload bytes) of each, oldest due first.
    let mut rows: Vec<(i64, i32, i64)> = (0..locked.len())
        .map(|r| (locked.get(r, 1).expect("message"), locked.get(r, 2).expect("attempts"), locked.get::<i32>(r, 3).unwrap_or(0).into()))
        .collect();
    if rows.len() < slots {
        // Nothing more is due now. A due time still ahead (a retry recorded since the last
        // reading) stays, to wake the worker then; the next refresh reads them all again.
        state.due_now = false;
        if state.next_due.is_some_and(|due| due <= leases_run_out_by) {
            state.next_due = None;
        }
    }
    rows.retain(|(id, _, _)| !held.contains(id));
    let (exhausted, mut live): (Vec<_>, Vec<_>) = rows.into_iter().partition(|&(_, attempts, _)| policy.is_exhausted(attempts));
    // A lease counts its attempt, and a crash keeps it counted (the request may have gone out):
    // a delivery queued behind the slots on its last attempt would die unsent. Such a one is
    // leased only to start at once; those beyond wait, still due, for a slot of theirs to free.
    let due = live.len();
    let mut leasing = 0;
    live.retain(|&(_, attempts, _)| {
        let lease = leasing < size.at_once || !policy.is_last_attempt_next(attempts);
        leasing += usize::from(lease);
        lease
    });
    state.last_attempts_wait = live.len() < due;
    state.due_now |= state.last_attempts_wait;
    if !exhausted.is_empty() {
        let ids: Vec<i64> = exhausted.iter().map(|&(id, _, _)| id).collect();
        // Out of attempts with their last one answered: the limit was lowered. Else the worker's
        // lease of the last one ran out (it stopped during the request).
        let attempts: Vec<i32> = exhausted.iter().map(|&(_, attempts, _)| attempts).collect();
        let answered =
            spi.execute(&LAST_ATTEMPTS_ANSWERED, schema, &[subscription_id.into_datum(), ids.clone().into_datum(), attempts.into_datum()]);
        let answered: BTreeSet<i64> = (0..answered.len()).filter_map(|r| answered.get(r, 1)).collect();
        let reasons: Vec<String> = exhausted
            .iter()
            .map(|&(id, attempts, _)| policy.exhausted_reason(attempts, (!answered.contains(&id)).then_some("delivery worker")))
            .collect();
        let arguments = [subscription_id.into_datum(), ids.into_datum(), reasons.into_datum()];
        let messages = record::end_deliveries(spi, schema, &DEAD_LETTER, &arguments, endpoints);
        record::settle_messages(spi, schema, messages, &mut endpoints.settling_held);
    }
    let chosen = fitting(&live.iter().map(|&(id, _, bytes)| (id, bytes)).collect::<Vec<_>>(), byte_budget, nothing_in_flight);
    let left_for_room = chosen.len() < live.len();
    let Some(state) = endpoints.by_id.get_mut(&subscription_id) else { return Vec::new() };
    if left_for_room {
        // The worker's memory for payloads is spent: the rest waits for room (and stays
        // locked only until this transaction ends); no claim until an answer frees some.
        state.due_now = true;
    }
    let timeout = state.endpoint.timeout;
    endpoints.waiting_for_payload_room |= left_for_room;
    if chosen.is_empty() {
        return Vec::new();
    }
    let (lease, start_within) = endpoints::lease_for(timeout, size.rounds(chosen.len()));
    let lease = interval::from_duration(lease);
    let leased = spi.execute(
        &LEASE,
        schema,
        &[subscription_id.into_datum(), chosen.clone().into_datum(), Some(pg_sys::Datum::from(now)), lease.into_datum()],
    );
    let mut claimed: Vec<Claimed> = (0..leased.len())
        .map(|row| Claimed {
            message_id: leased.get(row, 1).expect("message"),
            subscription_id,
            lease_until: leased.get::<pgrx::datum::TimestampWithTimeZone>(row, 7).expect("available_at").into_inner(),
            message: Arc::new(Message {
                attempt: leased.get(row, 2).expect("attempt"),
                public_id: leased.get_text(row, 3).expect("public_id"),
                topic: leased.get_text(row, 4).expect("topic"),
                // The database's encoding to UTF-8 (SQL_ASCII bytes that are not UTF-8: U+FFFD).
                body: leased.get_text(row, 5).expect("body").into_bytes(),
                headers: pairs(leased.get_text_array(row, 6)),
            }),
        })
        .collect();
    // Oldest due first, as they were locked.
    claimed.sort_by_key(|c| chosen.iter().position(|&id| id == c.message_id));
    let start_by = started + start_within;
    // The first `at_once` start before any other queued delivery (Endpoints::start_queued).
    claimed.into_iter().enumerate().map(|(index, delivery)| Queued { delivery, start_by, at_once: index < size.at_once }).collect()
}

/// Hands back deliveries leased but not sent (in a transaction): due again, their attempt not
/// counted. Returns those another transaction holds (endpoint, message), still leased: to be
/// handed back by a later step.
pub fn hand_back(spi: &mut Spi, schema: pg_sys::Oid, deliveries: &[Claimed]) -> BTreeSet<(i64, i64)> {
    if deliveries.is_empty() {
        return BTreeSet::new();
    }
    let endpoints: Vec<i64> = deliveries.iter().map(|d| d.subscription_id).collect();
    let messages: Vec<i64> = deliveries.iter().map(|d| d.message_id).collect();
    let leases: Vec<Option<pgrx::datum::TimestampWithTimeZone>> =
        deliveries.iter().map(|d| pgrx::datum::TimestampWithTimeZone::try_from(d.lease_until).ok()).collect();
    let held = spi.execute(&HAND_BACK, schema, &[endpoints.into_datum(), messages.into_datum(), leases.into_datum()]);
    (0..held.len()).map(|row| (held.get(row, 1).expect("endpoint"), held.get(row, 2).expect("message"))).collect()
}

/// [name, value, name, value, …] as pairs.
pub fn pairs(flat: Vec<String>) -> Vec<(String, String)> {
    flat.chunks(2).map(|pair| (pair[0].clone(), pair.get(1).cloned().unwrap_or_default())).collect()
}

/// The deliveries (message, payload bytes) that fit `budget` bytes, in order; the first one
/// anyway when nothing else is in flight (a payload larger than the budget then goes alone).
fn fitting(candidates: &[(i64, i64)], budget: i64, nothing_in_flight: bool) -> Vec<i64> {
    let mut used = 0;
    let mut chosen = Vec::new();
    for &(id, bytes) in candidates {
        let first_alone = chosen.is_empty() && nothing_in_flight;
        if used + bytes > budget && !first_alone {
            break;
        }
        used += bytes;
        chosen.push(id);
    }
    chosen
}

/// A new worker makes every delivery its predecessor leased due again (in a transaction).
pub fn release_predecessors_leases(schema: pg_sys::Oid) -> usize {
    let mut spi = Spi::connect();
    let released = spi.execute(&RELEASE_LEASES, schema, &[]).len();
    spi.finish();
    released
}

#[cfg(test)]
mod unit_tests {
    use super::fitting;

    #[test]
    fn payloads_are_chosen_within_the_memory_budget() {
        assert_eq!(fitting(&[(1, 10), (2, 10), (3, 10)], 25, false), vec![1, 2]);
        assert_eq!(fitting(&[(1, 30), (2, 30)], 40, true), vec![1], "a large one goes alone");
        assert_eq!(fitting(&[(1, 30)], 10, false), vec![] as Vec<i64>, "not beside others beyond the budget");
        assert_eq!(fitting(&[(1, 50)], 10, true), vec![1]);
    }
}

//! Claim: a consumer takes up to `batch_size` ready messages (of some topics, or all), oldest
//! ready first, with `FOR UPDATE SKIP LOCKED`: a second consumer never waits for the first.
//!
//! With a lease, each claimed message is a delivery: one more attempt, a new lease_token, and
//! ready again only when the lease runs out. Without one (`lease => NULL`) nothing is written:
//! the rows stay locked until the caller's transaction ends. A message that has had all its
//! attempts without an outcome is dead-lettered here instead (policy.rs decides).
//!
//! A claim reads the ready queue from where this connection's previous claim found its head,
//! not over the dead index entries before it (head.rs).

pub mod head;
mod serializable;

use crate::error::{or_raise, raise, OutboxError};
use crate::fmgr::{require_one_dimension, required, sql_function, SetResult};
use crate::spi::{schema_of_function, Rows, Spi, Statement};
use crate::{interval, ordering, settings, topic};
use pgrx::datum::IntoDatum;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::time::Instant;

thread_local! {
    /// This connection's knowledge of the head of the ready queue (a backend is one thread).
    static QUEUE_HEAD: RefCell<head::QueueHead> = RefCell::default();
}

/// The largest batch one call may claim.
pub const MAX_BATCH_SIZE: i32 = 10_000;

static LOCK: topic::WalkOfTopics =
    topic::WalkOfTopics::new(include_str!("lock.sql"), &[TIMESTAMPTZOID, TEXTARRAYOID, INT4OID, TIMESTAMPTZOID]);
static DEAD_LETTER: Statement = Statement::new(include_str!("dead_letter.sql"), &[INT8ARRAYOID, TIMESTAMPTZOID, TEXTARRAYOID]);
static LEASE: Statement = Statement::new(include_str!("lease.sql"), &[INT8ARRAYOID, TIMESTAMPTZOID, INTERVALOID]);
static TAKE_OVER_EXPIRED_LEASE: Statement = Statement::new(include_str!("take_over_expired_lease.sql"), &[INT8ARRAYOID]);

/// A locked message: its whole row, id, attempts, and whether a lease names a holder.
struct Locked {
    row: pg_sys::Datum,
    id: i64,
    attempts: i32,
    held_under_a_lease: bool,
}

// outbox_claim(batch_size integer, topics text[], lease interval) RETURNS SETOF outbox
sql_function!(outbox_claim_c, pg_finfo_outbox_claim_c, |args| {
    const FUNCTION: &str = "outbox_claim";
    crate::error::require_writable(FUNCTION);
    let batch_size = required(args.get::<i32>(0), FUNCTION, "batch_size");
    if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
        raise(OutboxError::invalid(FUNCTION, "batch_size", format!("must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}")));
    }
    let topics: Option<Vec<String>> = args.text_array(1).map(|(topics, dimensions)| {
        require_one_dimension(dimensions, FUNCTION, "topics");
        topics
            .into_iter()
            .map(|wanted| {
                let Some(wanted) = wanted else { raise(OutboxError::null_element(FUNCTION, "topics")) };
                topic::require_valid(FUNCTION, "topics", Some(&wanted));
                wanted
            })
            .collect()
    });
    let lease = args.interval(2);
    if let Some(lease) = &lease {
        or_raise(interval::validate_reach(FUNCTION, "lease", lease));
    }
    if lease.as_ref().is_some_and(|lease| interval::moves_clock(lease) != Ordering::Greater) {
        let shown = interval::shown(lease.as_ref().expect("not NULL"));
        raise(OutboxError::invalid(FUNCTION, "lease", format!("must be positive, got {shown}")));
    }
    let policy = settings::retry_policy();
    // One reading of the clock for the whole claim: readiness is judged by it (not by the start
    // of the caller's transaction).
    let clock = crate::backend::now();
    let claimed_at = pg_sys::Datum::from(clock);
    let started = Instant::now();
    let start_from = QUEUE_HEAD.with_borrow(|queue_head| queue_head.start(&topics, started));

    let schema = schema_of_function(args.fcinfo());
    let mut result = SetResult::begin(&args);
    let mut spi = Spi::connect();
    serializable::lock_the_ready_index_whole(schema);
    let lock = LOCK.for_topics(topics.as_ref().map_or(0, Vec::len));
    let rows = spi.execute(lock, schema, &[Some(claimed_at), args.datum(1), batch_size.into_datum(), Some(start_from.into())]);
    // The oldest locked message's available_at (microseconds).
    let first: Option<i64> = (!rows.is_empty()).then(|| rows.get(0, 5).expect("available_at"));
    QUEUE_HEAD.with_borrow_mut(|queue_head| queue_head.found(&topics, start_from, clock, first, started));
    let locked: Vec<Locked> = (0..rows.len())
        .map(|row| Locked {
            row: rows.datum(row, 1).expect("a whole row is never NULL"),
            id: rows.get(row, 2).expect("id"),
            attempts: rows.get(row, 3).expect("attempts"),
            held_under_a_lease: rows.get(row, 4).expect("lease held"),
        })
        .collect();

    let (exhausted, live): (Vec<Locked>, Vec<Locked>) = locked.into_iter().partition(|m| policy.is_exhausted(m.attempts));
    if !exhausted.is_empty() {
        let ids: Vec<i64> = exhausted.iter().map(|m| m.id).collect();
        let reasons: Vec<String> =
            exhausted.iter().map(|m| policy.exhausted_reason(m.attempts, m.held_under_a_lease.then_some("consumer"))).collect();
        let keys = spi.execute(&DEAD_LETTER, schema, &[ids.into_datum(), Some(claimed_at), reasons.into_datum()]).datum(0, 1);
        ordering::release_message_keys(&mut spi, schema, keys);
    }

    if lease.is_none() {
        // No lease: the rows stay locked until the caller's transaction ends, and nothing is
        // written. The caller completes or fails them in that transaction (outbox_fail counts
        // the attempt); if it rolls back or dies, they are as if never claimed. Only a message
        // whose last holder's lease ran out loses that holder's token (its attempt would
        // otherwise count as this one's, and the old token would still act on it).
        let expired: Vec<i64> = live.iter().filter(|m| m.held_under_a_lease).map(|m| m.id).collect();
        let by_id = if expired.is_empty() {
            HashMap::new()
        } else {
            rows_by_id(&spi.execute(&TAKE_OVER_EXPIRED_LEASE, schema, &[expired.into_datum()]))
        };
        for message in &live {
            result.push_row(by_id.get(&message.id).copied().unwrap_or(message.row));
        }
    } else if !live.is_empty() {
        let ids: Vec<i64> = live.iter().map(|m| m.id).collect();
        let by_id = rows_by_id(&spi.execute(&LEASE, schema, &[ids.into_datum(), Some(claimed_at), args.datum(2)]));
        // In the order they were locked: oldest ready first.
        for row in live.iter().filter_map(|m| by_id.get(&m.id)) {
            result.push_row(*row);
        }
    }
    spi.finish();
    result.finish()
});

/// The rows written by lease.sql or take_over_expired_lease.sql (`RETURNING o, o.id`), whole, by
/// id.
fn rows_by_id(rows: &Rows) -> HashMap<i64, pg_sys::Datum> {
    (0..rows.len()).map(|row| (rows.get(row, 2).expect("id"), rows.datum(row, 1).expect("a whole row is never NULL"))).collect()
}

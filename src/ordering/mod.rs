//! Ordering keys: the essay's partial ordering. Messages that share an `ordering_key` are handed
//! out one at a time, in enqueue order, across all topics, while different keys proceed in
//! parallel:
//!
//! - per key, at most one PENDING message is claimable, the head (`waiting_for IS NULL`; a
//!   unique index holds the database to it); the others wait behind it
//!   (`waiting_for = 'ordering_key'`), out of the ready index, so claims never walk over them;
//! - when the head ends, DONE or DEAD (a dead letter releases its key: the rest proceeds, and
//!   the dead letter stays for the operator), or goes to the delivery worker, the oldest waiting
//!   message becomes the head, in the same transaction;
//! - the delivery worker keeps the same order per endpoint, on the deliveries.
//!
//! A producer enqueuing with a key makes its message the head when the key has none, and
//! otherwise queues it behind the head. It first holds the key (`hold_key_for_producer`): a
//! shared advisory lock until it commits, which whoever releases the key takes exclusively, so
//! a consumer ending the head meanwhile waits, then sees the new message and releases it. A
//! consumer that merely holds the head (a claim without a lease, for as long as its handler
//! runs) does not hold the producer up.

mod key_locks;

pub use key_locks::key_lock_space;

use crate::error::{raise, OutboxError};
use crate::fmgr::sql_function;
use crate::spi::{schema_of_function, Spi, Statement};
use crate::text::ServerText;
use pgrx::datum::IntoDatum;
use pgrx::pg_sys::{self, BuiltinOid::*};

static LOCK_HEAD: Statement = Statement::new(include_str!("lock_head.sql"), &[TEXTOID]);
static RELEASE_MESSAGES: Statement = Statement::new(include_str!("release_messages.sql"), &[TEXTARRAYOID]);
static STEP_BACK_NEWER_HEADS: Statement = Statement::new(include_str!("step_back_newer_heads.sql"), &[TEXTARRAYOID]);
static RELEASE_DELIVERIES: Statement = Statement::new(include_str!("release_deliveries.sql"), &[INT8ARRAYOID, TEXTARRAYOID]);
static LOCK_QUEUED_DELIVERIES: Statement = Statement::new(include_str!("lock_queued_deliveries.sql"), &[INT8ARRAYOID, TEXTARRAYOID]);
static LOCK_ENDPOINTS_KEYS: Statement = Statement::new(include_str!("lock_endpoints_keys.sql"), &[INT8ARRAYOID, INT4OID]);
static TRY_ENDPOINTS_KEYS: Statement = Statement::new(include_str!("try_endpoints_keys.sql"), &[INT8ARRAYOID, TEXTARRAYOID, INT4OID]);

/// Before a producer adds messages to ordering key `key` (a text datum) in this transaction:
/// whoever ends the key's head from now on waits for this transaction, then sees what it added
/// (`hold_key_in_read_committed`; under REPEATABLE READ or SERIALIZABLE, lock_head.sql).
pub fn hold_key_for_producer(spi: &mut Spi, schema: pg_sys::Oid, key: pg_sys::Datum) {
    if !hold_key_in_read_committed(schema, key) {
        spi.execute(&LOCK_HEAD, schema, &[Some(key)]);
    }
}

/// A producer about to add a message to ordering key `key` (a text datum), in READ COMMITTED:
/// holds the key's lock shared until the transaction ends (key_locks.rs). Whoever releases the
/// key takes it exclusively first, so it waits for this transaction and then sees its message;
/// a consumer that holds the key's head (a claim without a lease) does not hold this producer up.
///
/// Returns false, holding nothing, under REPEATABLE READ or SERIALIZABLE: there the producer's
/// one snapshot could predate a release it waited for, so it locks the head row instead
/// (lock_head.sql).
pub fn hold_key_in_read_committed(schema: pg_sys::Oid, key: pg_sys::Datum) -> bool {
    // SAFETY: XactIsoLevel is this backend's.
    if unsafe { pg_sys::XactIsoLevel } != pg_sys::XACT_READ_COMMITTED as i32 {
        return false;
    }
    key_locks::hold_for_producer(schema, key);
    true
}

/// The first half of the tag of the advisory locks named after the extension's table `table`:
/// its oid as an int4.
fn lock_space(schema: pg_sys::Oid, table: &std::ffi::CStr) -> i32 {
    u32::from(crate::spi::relation(schema, table)) as i32
}

/// Takes the lock of ordering key `key` exclusively until the transaction ends, waiting for the
/// producers holding it (key_locks.rs): the worker's pick-up, for a key they keep holding.
pub fn lock_key(spi: &mut Spi, schema: pg_sys::Oid, key: &ServerText) {
    key_locks::lock_keys(spi, schema, vec![key.clone()].into_datum());
}

/// After messages with the keys `keys` (a text[] datum; `None` when none had a key) ended or went
/// to the worker: the next message of each key becomes claimable. Returns how many did.
pub fn release_message_keys(spi: &mut Spi, schema: pg_sys::Oid, keys: Option<pg_sys::Datum>) -> i32 {
    release_keys(spi, schema, keys, false)
}

/// After messages with the keys `keys` (a text[] datum) came back from the delivery worker,
/// queued behind their keys: each key's oldest message becomes its head again, where a newer
/// one had become it meanwhile and nobody holds it (step_back_newer_heads.sql).
pub fn requeue_in_key_order(spi: &mut Spi, schema: pg_sys::Oid, keys: Option<pg_sys::Datum>) -> i32 {
    release_keys(spi, schema, keys, true)
}

fn release_keys(spi: &mut Spi, schema: pg_sys::Oid, keys: Option<pg_sys::Datum>, step_back_newer_heads: bool) -> i32 {
    if keys.is_none() {
        return 0;
    }
    key_locks::lock_keys(spi, schema, keys);
    if step_back_newer_heads {
        spi.execute(&STEP_BACK_NEWER_HEADS, schema, &[keys]);
    }
    spi.execute_seeing_latest_commits(&RELEASE_MESSAGES, schema, &[keys]).get::<i32>(0, 1).unwrap_or(0)
}

// outbox_release_keys(keys text[]) RETURNS integer: the same for SQL callers (outbox_requeue_dead).
sql_function!(outbox_release_keys_c, pg_finfo_outbox_release_keys_c, |args| {
    crate::error::require_writable("outbox_release_keys");
    args.array_without_nulls::<&str>(0, "outbox_release_keys", "keys");
    let schema = schema_of_function(args.fcinfo());
    let mut spi = Spi::connect();
    let released = release_message_keys(&mut spi, schema, args.datum(0));
    spi.finish();
    released.into_datum().unwrap()
});

/// How a hand-on of keys at endpoints takes the lock of each endpoint's keys
/// (lock_endpoints_keys.sql).
#[derive(Clone, Copy)]
pub enum Taking {
    /// Waits for whoever holds it: the operators' functions.
    Wait,
    /// Leaves the endpoint's keys as held: the worker, which comes back to them.
    Try,
}

/// After deliveries ended (`endpoints` and `keys` pairwise, as bigint[] and text[] datums; `None`
/// when none had a key): per endpoint and key, the next delivery becomes claimable. Returns how
/// many did, and the keys whose next delivery another transaction holds (an operator's
/// redelivery not yet committed), or, [`Taking::Try`], at endpoints where another transaction
/// hands on keys (an operator's requeue not yet committed), as (endpoint, key), left as they are
/// rather than waited for: release them again later.
pub fn release_delivery_keys(
    spi: &mut Spi,
    schema: pg_sys::Oid,
    endpoints: Option<pg_sys::Datum>,
    keys: Option<pg_sys::Datum>,
    taking: Taking,
) -> (i32, Vec<(i64, ServerText)>) {
    if endpoints.is_none() || keys.is_none() {
        return (0, Vec::new());
    }
    // The locks first: the hand-on's snapshot, taken after them, sees every head made by whoever
    // held them before.
    // (The lock's tag: outbox_delivery's oid as an int4, then the endpoint's hash.)
    let space = Some(pg_sys::Datum::from(lock_space(schema, c"outbox_delivery")));
    let (endpoints, keys, mut held) = match taking {
        Taking::Wait => {
            spi.execute(&LOCK_ENDPOINTS_KEYS, schema, &[endpoints, space]);
            (endpoints, keys, Vec::new())
        }
        Taking::Try => {
            let tried = spi.execute(&TRY_ENDPOINTS_KEYS, schema, &[endpoints, keys, space]);
            let (mut got, mut held) = (Vec::new(), Vec::new());
            for row in 0..tried.len() {
                let pair: (i64, ServerText) = (tried.get(row, 1).expect("endpoint"), tried.get_server_text(row, 2).expect("key"));
                if tried.get::<bool>(row, 3).unwrap_or(false) {
                    got.push(pair)
                } else {
                    held.push(pair)
                }
            }
            if got.is_empty() {
                return (0, held);
            }
            let (endpoints, keys): (Vec<i64>, Vec<ServerText>) = got.into_iter().unzip();
            (endpoints.into_datum(), keys.into_datum(), held)
        }
    };
    let rows = spi.execute_seeing_latest_commits(&RELEASE_DELIVERIES, schema, &[endpoints, keys]);
    let held_endpoints = rows.get::<Vec<i64>>(0, 2).unwrap_or_default();
    held.extend(held_endpoints.into_iter().zip(rows.get_server_text_array(0, 3)));
    (rows.get::<i32>(0, 1).unwrap_or(0), held)
}

// outbox_release_delivery_keys(subscriptions bigint[], keys text[]) RETURNS integer: the same
// for SQL callers (outbox_requeue_dead, outbox_redeliver), who wait for the deliveries another
// transaction holds: no worker would come back to them.
sql_function!(outbox_release_delivery_keys_c, pg_finfo_outbox_release_delivery_keys_c, |args| {
    // (The worker's and the operators' functions' own, but callable: a NULL key reached a pgrx
    // panic, XX000, and arrays that did not pair up released nothing, silently.)
    const FUNCTION: &str = "outbox_release_delivery_keys";
    crate::error::require_writable(FUNCTION);
    let subscriptions = args.array_without_nulls::<i64>(0, FUNCTION, "subscriptions");
    let keys = args.array_without_nulls::<&str>(1, FUNCTION, "keys");
    if let (Some(subscriptions), Some(keys)) = (subscriptions, keys) {
        if subscriptions.len() != keys.len() {
            raise(OutboxError::invalid(
                FUNCTION,
                "keys",
                format!("has {} elements but subscriptions has {}", keys.len(), subscriptions.len()),
            ));
        }
    }
    let schema = schema_of_function(args.fcinfo());
    let mut spi = Spi::connect();
    let (mut released, mut held) = release_delivery_keys(&mut spi, schema, args.datum(0), args.datum(1), Taking::Wait);
    while !held.is_empty() {
        let (endpoints, keys): (Vec<i64>, Vec<ServerText>) = held.into_iter().unzip();
        let (endpoints, keys) = (endpoints.into_datum(), keys.into_datum());
        spi.execute_seeing_latest_commits(&LOCK_QUEUED_DELIVERIES, schema, &[endpoints, keys]);
        let (more, still_held) = release_delivery_keys(&mut spi, schema, endpoints, keys, Taking::Wait);
        released += more;
        held = still_held;
    }
    spi.finish();
    released.into_datum().unwrap()
});

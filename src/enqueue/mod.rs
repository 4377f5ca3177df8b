//! Enqueue: the first stage of a message's life. `outbox_enqueue` and `outbox_enqueue_batch`
//! record messages in the caller's transaction and never commit: the caller's COMMIT makes the
//! business change and the work it owes durable together, and a rollback takes both away.
//!
//! A `dedupe_key` makes the enqueue "at most once per key and topic": a second enqueue with the
//! key gets back only the id and public_id of the message that holds it (its payload NULL says
//! it was a duplicate), never the content of another producer's message. An `ordering_key`
//! queues the message behind the earlier ones of its key (src/ordering). `headers` travel with
//! the message to consumers and endpoints.

use crate::error::{or_raise, raise, OutboxError};
use crate::fmgr::{require_one_dimension, required, sql_function, Args, SetResult};
use crate::spi::{schema_of_function, Spi, Statement};
use crate::{interval, ordering, subscriptions, text, topic, worker};
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::cmp::Ordering;

mod direct_insert;
mod payload;
mod public_id;

/// dedupe_key's limit, in characters.
pub const MAX_DEDUPE_KEY_CHARS: usize = 255;

static INSERT: Statement = Statement::new(include_str!("insert.sql"), &[TEXTOID, JSONBOID, TIMESTAMPTZOID, JSONBOID]);
static INSERT_ONCE_PER_KEY: Statement =
    Statement::new(include_str!("insert_once_per_key.sql"), &[TEXTOID, JSONBOID, TIMESTAMPTZOID, JSONBOID, TEXTOID]);
static INSERT_KEYED: Statement =
    Statement::new(include_str!("insert_keyed.sql"), &[TEXTOID, JSONBOID, TIMESTAMPTZOID, JSONBOID, TEXTOID, TEXTOID]);
static KEY_HOLDER: Statement = Statement::new(include_str!("key_holder.sql"), &[TEXTOID, TEXTOID]);
static INSERT_BATCH: Statement = Statement::new(include_str!("insert_batch.sql"), &[TEXTOID, JSONBARRAYOID, TIMESTAMPTZOID]);

const EMPTY_PAYLOAD_HINT: &str = "Use '{}'::jsonb for an empty payload.";

/// When a message enqueued now with the `delay` argument `n` becomes due (its `available_at`):
/// the clock plus the delay. The one place this rule is written: the INSERT statements and the
/// direct insert are given its result. The delay must not be NULL nor take the clock back.
fn available_at(function: &'static str, args: &Args, n: usize) -> pg_sys::Datum {
    use pgrx::datum::IntoDatum;
    let delay = required(args.interval(n), function, "delay");
    or_raise(interval::validate_reach(function, "delay", &delay));
    if interval::moves_clock(&delay) == Ordering::Less {
        let shown = interval::shown(&delay);
        raise(OutboxError::invalid(function, "delay", format!("must not be negative, got {shown}")));
    }
    (pgrx::datum::clock_timestamp() + delay).into_datum().expect("a timestamp")
}

/// A `dedupe_key` or `ordering_key` argument: NULL for none, else not empty and at most 255
/// characters.
fn check_key(function: &'static str, argument: &'static str, key: &[u8]) {
    if key.is_empty() {
        raise(OutboxError::invalid(function, argument, "must not be empty (pass NULL for no key)"));
    }
    if text::server_chars(key) > MAX_DEDUPE_KEY_CHARS {
        raise(OutboxError::too_long(function, argument, format!("is longer than {MAX_DEDUPE_KEY_CHARS} characters")));
    }
}

/// Inserts one message (the arguments in the order of insert_keyed.sql) and returns its row,
/// or the duplicate's (id, public_id, topic and key only) when its dedupe_key is taken. With an
/// ordering key, the caller holds it (`ordering::hold_key_for_producer`).
fn insert(spi: &mut Spi, schema: pg_sys::Oid, arguments: [Option<pg_sys::Datum>; 6]) -> Option<pg_sys::Datum> {
    let [topic, payload, delay, headers, dedupe_key, ordering_key] = arguments;
    // Each loop ends in one of its returns unless a row it relies on changed in between (a
    // dedupe key's holder discarded or purged, another transaction's new head of the ordering
    // key): then it tries again.
    loop {
        if ordering_key.is_some() {
            let inserted = spi.execute(&INSERT_KEYED, schema, &arguments);
            if !inserted.is_empty() {
                return inserted.datum_for_caller(0, 1);
            }
        } else if dedupe_key.is_some() {
            let inserted = spi.execute(&INSERT_ONCE_PER_KEY, schema, &[topic, payload, delay, headers, dedupe_key]);
            if !inserted.is_empty() {
                return inserted.datum_for_caller(0, 1);
            }
        } else {
            return spi.execute(&INSERT, schema, &[topic, payload, delay, headers]).datum_for_caller(0, 1);
        }
        if dedupe_key.is_some() {
            let holder = spi.execute(&KEY_HOLDER, schema, &[topic, dedupe_key]);
            if !holder.is_empty() {
                return holder.datum_for_caller(0, 1);
            }
        }
    }
}

// outbox_enqueue(topic text, payload jsonb, delay interval, dedupe_key text, ordering_key text,
// headers jsonb) RETURNS outbox
sql_function!(outbox_enqueue_c, pg_finfo_outbox_enqueue_c, |args| {
    const FUNCTION: &str = "outbox_enqueue";
    crate::error::require_writable(FUNCTION);
    let topic = topic::valid_argument(FUNCTION, "topic", args.text(0));
    if args.is_null(1) {
        raise(OutboxError::null(FUNCTION, "payload").with_hint(EMPTY_PAYLOAD_HINT));
    }
    payload::check(FUNCTION, "payload", args.datum(1).expect("not NULL"));
    let available_at = available_at(FUNCTION, &args, 2);
    for (n, argument) in [(3, "dedupe_key"), (4, "ordering_key")] {
        if let Some(key) = args.text_bytes(n) {
            check_key(FUNCTION, argument, key);
        }
    }
    subscriptions::check_headers_argument(FUNCTION, &args, 5, subscriptions::HeadersOf::Message);

    // When this transaction commits, an idle delivery worker that delivers the topic starts at
    // once.
    worker::wake_at_commit(&topic);

    let schema = schema_of_function(args.fcinfo());
    // Without a dedupe_key the row is written without a plan (direct_insert), or by the
    // statements when the table has triggers (or, with an ordering key, outside READ COMMITTED).
    if args.is_null(3) {
        let mut columns = message_columns(&args, args.datum(1).expect("not NULL"), available_at);
        if let Some(headers) = args.datum(5) {
            columns.push(("headers", headers));
        }
        if let Some(message) = direct_insert::insert(schema, &columns, args.datum(4)) {
            return message;
        }
    }
    let mut spi = Spi::connect();
    let arguments = [args.datum(0), args.datum(1), Some(available_at), args.datum(5), args.datum(3), args.datum(4)];
    if let Some(ordering_key) = args.datum(4) {
        ordering::hold_key_for_producer(&mut spi, schema, ordering_key);
    }
    let message = insert(&mut spi, schema, arguments);
    spi.finish();
    message.unwrap_or_else(|| or_raise(Err(OutboxError::Internal("outbox_enqueue: the insert returned no row".into()))))
});

// outbox_enqueue_batch(topic text, payloads jsonb[], delay interval, ordering_key text)
// RETURNS SETOF outbox
sql_function!(outbox_enqueue_batch_c, pg_finfo_outbox_enqueue_batch_c, |args| {
    const FUNCTION: &str = "outbox_enqueue_batch";
    crate::error::require_writable(FUNCTION);
    let topic = topic::valid_argument(FUNCTION, "topic", args.text(0));
    let (elements, dimensions) = required(args.jsonb_array(1), FUNCTION, "payloads");
    require_one_dimension(dimensions, FUNCTION, "payloads");
    if elements.contains(&None) {
        raise(OutboxError::null_element(FUNCTION, "payloads"));
    }
    for element in elements.iter().flatten() {
        payload::check(FUNCTION, "payloads", *element);
    }
    // (One reading of the clock: the batch's messages are due together, in the payloads' order.)
    let available_at = available_at(FUNCTION, &args, 2);
    if let Some(key) = args.text_bytes(3) {
        check_key(FUNCTION, "ordering_key", key);
    }
    if dimensions == 0 {
        return SetResult::begin(&args).finish(); // an empty array: nothing to record
    }
    worker::wake_at_commit(&topic);

    let schema = schema_of_function(args.fcinfo());
    let mut result = SetResult::begin(&args);
    let Some(ordering_key) = args.datum(3) else {
        let mut spi = Spi::connect();
        let rows = spi.execute(&INSERT_BATCH, schema, &[args.datum(0), args.datum(1), Some(available_at)]);
        for row in 0..rows.len() {
            result.push_row(rows.datum(row, 1).expect("a whole row is never NULL"));
        }
        spi.finish();
        return result.finish();
    };
    // One key for the batch: each message behind the one before, in the payloads' order. They
    // are written without a plan while that can be done (the answer is the same for each).
    let mut payloads = elements.into_iter().flatten().peekable();
    while let Some(&payload) = payloads.peek() {
        let Some(row) = direct_insert::insert(schema, &message_columns(&args, payload, available_at), Some(ordering_key)) else {
            break;
        };
        result.push_row(row);
        payloads.next();
    }
    if payloads.peek().is_some() {
        let mut spi = Spi::connect();
        ordering::hold_key_for_producer(&mut spi, schema, ordering_key);
        for payload in payloads {
            let arguments = [args.datum(0), Some(payload), Some(available_at), None, None, Some(ordering_key)];
            if let Some(row) = insert(&mut spi, schema, arguments) {
                result.push_row(row);
            }
        }
        spi.finish();
    }
    result.finish()
});

/// A message's topic (argument 0), `payload` and `available_at`, as the columns the direct
/// insert takes.
fn message_columns(args: &Args, payload: pg_sys::Datum, available_at: pg_sys::Datum) -> Vec<(&'static str, pg_sys::Datum)> {
    vec![("topic", args.datum(0).expect("not NULL")), ("payload", payload), ("available_at", available_at)]
}

// outbox_uuid_v7() RETURNS uuid: a time-ordered UUID (version 7), the default of public_id
// (src/enqueue/public_id.rs). (Its symbol keeps the name pgrx gave it until 0.3.0.)
sql_function!(outbox_uuid_v7_wrapper, pg_finfo_outbox_uuid_v7_wrapper, |_args| {
    // SAFETY: this backend's pid, set before any function runs.
    let process = unsafe { pg_sys::MyProcPid } as u32;
    pgrx::datum::IntoDatum::into_datum(pgrx::datum::Uuid::from_bytes(public_id::new_public_id(process))).expect("a uuid")
});

//! Complete: the message was handled; it becomes DONE. With lease tokens, only while the token
//! still holds the message (a consumer whose lease ran out and was re-claimed changes nothing);
//! without, whoever holds it (a claim without lease holds its rows' locks: nobody else can).
//! A DONE message leaves the table the claims read in the same statement, for the history of
//! its day (src/history.rs), so that it leaves one dead row version there instead of two; those
//! whose dedupe_key must keep holding, and those with deliveries, stay for outbox_archive.
//!
//! `outbox_complete(id, lease_token)` for one message; `outbox_complete_batch(ids, lease_tokens)`
//! for many. The batch form's old name, `outbox_complete(bigint[], uuid[])`, is kept for one
//! release: with it beside the one-message form, drivers that send untyped parameters cannot
//! call `outbox_complete($1)` without a cast.

use crate::error::{raise, OutboxError};
use crate::fmgr::{required, sql_function, Args};
use crate::spi::{schema_of_function, Rows, Spi, Statement};
use crate::{backend, history, ordering};
use pgrx::datum::{Array, IntoDatum, Uuid};
use pgrx::pg_sys::{self, BuiltinOid::*};

static WITH_TOKENS: Statement = Statement::new(include_str!("with_tokens.sql"), &[INT8ARRAYOID, UUIDARRAYOID, TIMESTAMPTZOID]);
static IN_PLACE_WITH_TOKENS: Statement =
    Statement::new(include_str!("in_place_with_tokens.sql"), &[INT8ARRAYOID, UUIDARRAYOID, TIMESTAMPTZOID]);
static ANY_HOLDER: Statement = Statement::new(include_str!("any_holder.sql"), &[INT8ARRAYOID, TIMESTAMPTZOID]);
static IN_PLACE_ANY_HOLDER: Statement = Statement::new(include_str!("in_place_any_holder.sql"), &[INT8ARRAYOID, TIMESTAMPTZOID]);

/// Marks the PENDING messages among `ids` (`count` of them) DONE, each only while its element
/// of `tokens`, if any, still holds it, and lets the next message of their ordering keys go;
/// returns how many. Most leave outbox for their history in one statement; a second one, for
/// those that must stay, runs only when the first did not complete them all (a batch of plain
/// messages pays for one).
fn complete(args: &Args, ids: Option<pg_sys::Datum>, count: usize, tokens: Option<pg_sys::Datum>) -> usize {
    let schema = schema_of_function(args.fcinfo());
    // One reading of the clock: the messages' processed_at, and the day of the history they go to.
    let completed_at = backend::now();
    let day = history::day_slot(completed_at);
    let completed_at = Some(pg_sys::Datum::from(completed_at));
    let (moving, in_place, arguments) = match tokens {
        Some(_) => (&WITH_TOKENS, &IN_PLACE_WITH_TOKENS, vec![ids, tokens, completed_at]),
        None => (&ANY_HOLDER, &IN_PLACE_ANY_HOLDER, vec![ids, completed_at]),
    };
    let mut spi = Spi::connect();
    let (moved, keys) = completed_and_keys(spi.execute_in_day(moving, schema, day, &arguments));
    ordering::release_message_keys(&mut spi, schema, keys);
    let mut completed = moved;
    if moved < count {
        let (done_in_place, keys) = completed_and_keys(spi.execute(in_place, schema, &arguments));
        ordering::release_message_keys(&mut spi, schema, keys);
        completed += done_in_place;
    }
    spi.finish();
    completed
}

/// What each step of `complete` returns: how many it completed, and their ordering keys.
fn completed_and_keys(rows: Rows) -> (usize, Option<pg_sys::Datum>) {
    (rows.get::<i64>(0, 1).unwrap_or(0) as usize, rows.datum(0, 2))
}

// outbox_complete(id bigint, lease_token uuid) RETURNS boolean
sql_function!(outbox_complete_c, pg_finfo_outbox_complete_c, |args| {
    crate::error::require_writable("outbox_complete");
    let id = required(args.get::<i64>(0), "outbox_complete", "id");
    let token = args.get::<Uuid>(1);
    let completed = complete(&args, vec![id].into_datum(), 1, token.map(|t| vec![t]).into_datum());
    (completed == 1).into_datum().unwrap()
});

// outbox_complete_batch(ids bigint[], lease_tokens uuid[]) RETURNS integer, and the deprecated
// outbox_complete(ids bigint[], lease_tokens uuid[]).
sql_function!(outbox_complete_batch_c, pg_finfo_outbox_complete_batch_c, |args| {
    let function = if args.called_as("outbox_complete") { "outbox_complete" } else { "outbox_complete_batch" };
    crate::error::require_writable(function);
    let ids = required(args.get::<Array<i64>>(0), function, "ids");
    args.check_one_dimension(0, function, "ids");
    args.check_one_dimension(1, function, "lease_tokens");
    if ids.contains_nulls() {
        raise(OutboxError::null_element(function, "ids"));
    }
    if let Some(tokens) = args.get::<Array<Uuid>>(1) {
        if tokens.len() != ids.len() {
            raise(OutboxError::invalid(function, "lease_tokens", format!("has {} elements but ids has {}", tokens.len(), ids.len())));
        }
    }
    let completed = complete(&args, args.datum(0), ids.len(), args.datum(1));
    (completed as i32).into_datum().unwrap()
});

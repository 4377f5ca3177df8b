//! The circuit breaker: what an endpoint's answers mean for the endpoint itself (not for the
//! deliveries: record.rs). An endpoint whose latest answer was a failure is *failing*: it gets
//! one request at a time (endpoints.rs) until one succeeds. Failing for
//! `outbox.endpoint_disable_after`, it is disabled, with a WARNING and a reason in
//! `outbox_subscriptions`; its deliveries are then parked until `outbox_enable_subscription`.
//!
//! The state lives in the subscription (`failing_since`), so that it survives the worker; it is
//! written only when it changes, and never waited for. The worker's own state follows the
//! answers at once, except for disabling, which takes effect (and is announced) once the step
//! that wrote it commits; a write that an operator's open transaction holds
//! (outbox_rotate_secret, …: waiting would hold back the step, every endpoint's) is kept in
//! [`Unwritten`] and tried again [`HOLD_BACK`] later, whether or not another answer comes.

use super::deliver::Finished;
use super::endpoints::Endpoints;
use super::held_back::HOLD_BACK;
use crate::interval;
use crate::spi::{Spi, Statement};
use crate::text;
use crate::webhook::Outcome;
use pgrx::datum::IntoDatum;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

static RECOVERED: Statement = Statement::new(include_str!("breaker_recovered.sql"), &[INT8ARRAYOID]);
static FAILING: Statement = Statement::new(include_str!("breaker_failing.sql"), &[INT8ARRAYOID, TIMESTAMPTZARRAYOID]);
static DISABLE: Statement = Statement::new(include_str!("breaker_disable.sql"), &[INT8ARRAYOID, TEXTARRAYOID, INTERVALOID]);

/// How the answers of one step change the endpoints' circuits.
#[derive(Debug, Default, PartialEq)]
struct Changes {
    /// Failing endpoints whose latest answer succeeded.
    recovered: Vec<i64>,
    /// Endpoints that were not failing and whose latest answer failed.
    started_failing: Vec<i64>,
    /// Failing endpoints whose latest answer failed too, with that answer's error: disabled
    /// when they have been failing for long enough.
    still_failing: Vec<(i64, String)>,
}

/// `latest`: each endpoint's latest answer in this step (`None`: it succeeded, else the error);
/// `failing`: whether each endpoint was failing before.
fn changes(latest: &BTreeMap<i64, Option<String>>, failing: impl Fn(i64) -> bool) -> Changes {
    let mut changes = Changes::default();
    for (&id, error) in latest {
        match (error, failing(id)) {
            (None, true) => changes.recovered.push(id),
            (None, false) => {}
            (Some(_), false) => changes.started_failing.push(id),
            (Some(error), true) => changes.still_failing.push((id, error.clone())),
        }
    }
    changes
}

/// What the worker knows of its endpoints' circuits and their subscriptions do not show yet.
#[derive(Debug, Default)]
pub struct Unwritten {
    /// Endpoints whose `failing_since` is the worker's (`EndpointState::failing_since`), not the
    /// subscription's.
    failing_since: BTreeSet<i64>,
    /// Endpoints to disable, with their latest error.
    disable: BTreeMap<i64, String>,
    /// When what an operator's transaction held is to be tried again.
    retry_at: Option<Instant>,
}

impl Unwritten {
    /// Whether the worker's `failing_since` of endpoint `id` is still to be written (so its
    /// subscription's is not to be read).
    pub fn failing_since_of(&self, id: i64) -> bool {
        self.failing_since.contains(&id)
    }

    /// Forgets what is unwritten of endpoint `id`: an operator enabled its subscription again,
    /// which starts its circuit afresh.
    pub fn forget(&mut self, id: i64) {
        self.failing_since.remove(&id);
        self.disable.remove(&id);
    }

    pub fn is_empty(&self) -> bool {
        self.failing_since.is_empty() && self.disable.is_empty()
    }

    /// When a step is to try again what an operator's transaction held.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }
}

/// What a step wrote of [`Unwritten`], forgotten once it commits.
#[derive(Debug, Default)]
pub struct Written {
    failing_since: Vec<i64>,
    disable: Vec<i64>,
    /// The endpoints the step disabled, with the WARNING that says so.
    disabled: Vec<(i64, String)>,
}

/// Once the step that wrote `written` committed: forgets it, and the endpoints it disabled send
/// nothing more (a step that fails disables nothing: tried again at the next). What is left
/// was held by an operator's transaction.
pub fn committed(endpoints: &mut Endpoints, written: Written, now: Instant) {
    let unwritten = &mut endpoints.breaker_unwritten;
    for id in &written.failing_since {
        unwritten.failing_since.remove(id);
    }
    for id in &written.disable {
        unwritten.disable.remove(id);
    }
    unwritten.retry_at = (!unwritten.is_empty()).then_some(now + HOLD_BACK);
    for (id, warning) in written.disabled {
        pgrx::warning!("{}", text::for_server_message(&warning));
        if let Some(state) = endpoints.by_id.get_mut(&id) {
            state.enabled = false;
        }
    }
}

/// Applies what `finished` answers (in arrival order; those the breaker has not seen) mean for
/// their endpoints, and writes what the subscriptions do not show yet (in the step's
/// transaction).
pub fn record(
    spi: &mut Spi,
    schema: pg_sys::Oid,
    finished: &[Finished],
    endpoints: &mut Endpoints,
    disable_after: Option<Duration>,
) -> Written {
    let now = crate::backend::now();
    let mut latest = BTreeMap::new();
    for done in finished.iter().filter(|done| !done.breaker_has_seen) {
        let error = match &done.answer.outcome {
            Outcome::Delivered => None,
            Outcome::Failed { error, .. } => Some(error.clone()),
        };
        latest.insert(done.subscription_id, error);
    }
    let changes = changes(&latest, |id| endpoints.by_id.get(&id).is_some_and(|e| e.failing_since.is_some()));
    let unwritten = &mut endpoints.breaker_unwritten;
    for (ids, since) in [(&changes.recovered, None), (&changes.started_failing, Some(now))] {
        for &id in ids {
            if let Some(state) = endpoints.by_id.get_mut(&id) {
                state.failing_since = since;
                unwritten.failing_since.insert(id);
                unwritten.disable.remove(&id);
            }
        }
    }
    if disable_after.is_some() {
        unwritten.disable.extend(changes.still_failing);
    }
    let mut written = Written::default();
    // (A subscription gone has nothing to write.)
    unwritten.failing_since.retain(|id| endpoints.by_id.contains_key(id));
    unwritten.disable.retain(|id, _| endpoints.by_id.contains_key(id));

    let (mut clear, mut set, mut since) = (Vec::new(), Vec::new(), Vec::new());
    for &id in &unwritten.failing_since {
        match endpoints.by_id[&id].failing_since {
            None => clear.push(id),
            Some(at) => {
                set.push(id);
                since.push(pgrx::datum::TimestampWithTimeZone::try_from(at).ok());
            }
        }
    }
    if !clear.is_empty() {
        written.failing_since.extend(locked_ids(spi.execute(&RECOVERED, schema, &[clear.into_datum()])));
    }
    if !set.is_empty() {
        written.failing_since.extend(locked_ids(spi.execute(&FAILING, schema, &[set.into_datum(), since.into_datum()])));
    }

    let Some(disable_after) = disable_after else {
        written.disable.extend(unwritten.disable.keys());
        return written;
    };
    let limit = i64::try_from(disable_after.as_micros()).unwrap_or(i64::MAX);
    let (mut ids, mut errors) = (Vec::new(), Vec::new());
    for (&id, error) in &unwritten.disable {
        let state = &endpoints.by_id[&id];
        if state.enabled && state.failing_since.is_some_and(|since| now.saturating_sub(since) >= limit) {
            ids.push(id);
            errors.push(text::to_server(error));
        } else {
            written.disable.push(id); // not for long enough (a later failure asks again), or disabled meanwhile
        }
    }
    if ids.is_empty() {
        return written;
    }
    let rows = spi.execute(&DISABLE, schema, &[ids.into_datum(), errors.into_datum(), interval::from_duration(disable_after).into_datum()]);
    for row in 0..rows.len() {
        let id: i64 = rows.get(row, 1).expect("id");
        let topic = rows.get_text(row, 2).unwrap_or_default();
        let origin = crate::webhook::origin(&rows.get_text(row, 3).unwrap_or_default());
        let reason = rows.get_text(row, 4).unwrap_or_default();
        let warning = format!(
            "outbox_ext: subscription {id} of \"{topic}\" to {origin} disabled: {reason}; its deliveries are parked until SELECT outbox_enable_subscription({id})"
        );
        written.disabled.push((id, warning));
        written.disable.push(id);
    }
    written
}

/// The ids (first column) of the subscriptions a statement locked.
fn locked_ids(rows: crate::spi::Rows<'_>) -> Vec<i64> {
    (0..rows.len()).map(|row| rows.get::<i64>(row, 1).expect("id")).collect()
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn the_latest_answer_decides_and_only_changes_are_written() {
        let latest: BTreeMap<i64, Option<String>> = [
            (1, None),                                 // failing, now answers: recovered
            (2, None),                                 // healthy stays healthy: nothing to write
            (3, Some("HTTP 503".to_string())),         // healthy, now fails
            (4, Some("timeout after 5s".to_string())), // failing still
        ]
        .into();
        let failing = |id| id == 1 || id == 4;
        assert_eq!(
            changes(&latest, failing),
            Changes { recovered: vec![1], started_failing: vec![3], still_failing: vec![(4, "timeout after 5s".into())] }
        );
    }
}

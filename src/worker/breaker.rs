//! The circuit breaker: what an endpoint's answers mean for the endpoint itself (not for the
//! deliveries: record.rs). An endpoint whose latest answer was a failure is *failing*: it gets
//! one request at a time (endpoints.rs) until one succeeds. Failing for
//! `outbox.endpoint_disable_after`, it is disabled, with a WARNING and a reason in
//! `outbox_subscriptions`; its deliveries are then parked until `outbox_enable_subscription`.
//!
//! The state lives in the subscription (`failing_since`), so that it survives the worker; it is
//! written only when it changes, and never waited for: an endpoint that an operator's open
//! transaction is changing keeps its state in the worker's eyes until a later answer can write
//! it (the step, every endpoint's, would wait for that transaction).

use super::deliver::Finished;
use super::endpoints::Endpoints;
use crate::interval;
use crate::spi::{Spi, Statement};
use crate::text;
use crate::webhook::Outcome;
use pgrx::datum::{IntoDatum, TimestampWithTimeZone};
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::collections::BTreeMap;
use std::time::Duration;

static RECOVERED: Statement = Statement::new(include_str!("breaker_recovered.sql"), &[INT8ARRAYOID]);
static FAILING: Statement = Statement::new(include_str!("breaker_failing.sql"), &[INT8ARRAYOID]);
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

/// Applies what `finished` answers (in arrival order) mean for their endpoints (in the step's
/// transaction).
pub fn record(spi: &mut Spi, schema: pg_sys::Oid, finished: &[Finished], endpoints: &mut Endpoints, disable_after: Option<Duration>) {
    let mut latest = BTreeMap::new();
    for done in finished {
        let error = match &done.answer.outcome {
            Outcome::Delivered => None,
            Outcome::Failed { error, .. } => Some(text::for_server_message(error).into_owned()),
        };
        latest.insert(done.subscription_id, error);
    }
    let changes = changes(&latest, |id| endpoints.by_id.get(&id).is_some_and(|e| e.failing_since.is_some()));

    if !changes.recovered.is_empty() {
        let rows = spi.execute(&RECOVERED, schema, &[changes.recovered.into_datum()]);
        for row in 0..rows.len() {
            if let Some(state) = endpoints.by_id.get_mut(&rows.get::<i64>(row, 1).expect("id")) {
                state.failing_since = None;
            }
        }
    }
    if !changes.started_failing.is_empty() {
        let rows = spi.execute(&FAILING, schema, &[changes.started_failing.into_datum()]);
        for row in 0..rows.len() {
            let id: i64 = rows.get(row, 1).expect("id");
            if let Some(state) = endpoints.by_id.get_mut(&id) {
                state.failing_since = rows.get::<TimestampWithTimeZone>(row, 2).map(TimestampWithTimeZone::into_inner);
            }
        }
    }
    let Some(disable_after) = disable_after else { return };
    let now = crate::backend::now();
    let limit = i64::try_from(disable_after.as_micros()).unwrap_or(i64::MAX);
    let (ids, errors): (Vec<i64>, Vec<String>) = changes
        .still_failing
        .into_iter()
        .filter(|(id, _)| {
            endpoints.by_id.get(id).is_some_and(|e| e.enabled && e.failing_since.is_some_and(|since| now.saturating_sub(since) >= limit))
        })
        .unzip();
    if ids.is_empty() {
        return;
    }
    let rows = spi.execute(&DISABLE, schema, &[ids.into_datum(), errors.into_datum(), interval::from_duration(disable_after).into_datum()]);
    for row in 0..rows.len() {
        let id: i64 = rows.get(row, 1).expect("id");
        let (topic, url) = (rows.get_text(row, 2).unwrap_or_default(), rows.get_text(row, 3).unwrap_or_default());
        let reason = rows.get_text(row, 4).unwrap_or_default();
        pgrx::warning!(
            "outbox_ext: subscription {id} of \"{topic}\" to {url} disabled: {reason}; its deliveries are parked until SELECT outbox_enable_subscription({id})"
        );
        if let Some(state) = endpoints.by_id.get_mut(&id) {
            state.enabled = false;
        }
    }
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

//! The endpoints the worker sends to (the enabled subscriptions), and how the in-flight slots
//! are shared between them, so that a slow or hanging endpoint holds only its own share and the
//! others keep flowing:
//!
//! - each endpoint with work (due now, or requests in flight) gets an equal share of
//!   `outbox.max_in_flight`, at least one;
//! - and even alone, an endpoint leaves some slots free for the others (one per other endpoint,
//!   up to half of them): when another one gets work, it starts at once instead of waiting for
//!   a hanging endpoint's requests to time out.

use crate::spi::{Spi, Statement};
use crate::webhook::{self, Endpoint};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

static LOAD_ENDPOINTS: Statement = Statement::new(include_str!("load_endpoints.sql"), &[]);
static NEXT_DUE: Statement = Statement::new(include_str!("next_due.sql"), &[INT8ARRAYOID]);

/// The longest a request may take: its lease (the request plus [`LEASE_MARGIN`]) then stays
/// within 10 minutes, whatever the subscription's timeout says.
pub const MAX_REQUEST: Duration = Duration::from_secs(595);
/// A lease covers one request: its timeout plus this.
pub const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// One endpoint and its scheduling state.
pub struct EndpointState {
    pub id: i64,
    pub topic: String,
    pub endpoint: Arc<Endpoint>,
    /// Requests in flight now.
    pub in_flight: usize,
    /// It has deliveries due now (as far as the worker knows).
    pub due_now: bool,
    /// When its next delivery is due, if known (microseconds since the PostgreSQL epoch).
    pub next_due: Option<pg_sys::TimestampTz>,
}

#[derive(Default)]
pub struct Endpoints {
    pub by_id: BTreeMap<i64, EndpointState>,
    /// Where the next sharing of the slots starts, so that when slots are scarce every endpoint
    /// gets its turn.
    turn: std::cell::Cell<usize>,
}

impl Endpoints {
    /// Reads the enabled subscriptions (in a transaction), keeping what is known of the ones
    /// that stay. A subscription whose secret does not decode is skipped (its messages wait)
    /// rather than sent unsigned.
    pub fn reload(&mut self, schema: pg_sys::Oid, http_timeout: Duration) {
        let mut spi = Spi::connect();
        let rows = spi.execute(&LOAD_ENDPOINTS, schema, &[]);
        let mut fresh = BTreeMap::new();
        for row in 0..rows.len() {
            let id: i64 = rows.get(row, 1).expect("id");
            let topic = rows.get_text(row, 2).expect("topic");
            let url = rows.get_text(row, 3).expect("url");
            let secret = rows.get_text(row, 4);
            let headers: Vec<String> = rows.get_text_array(row, 5);
            let timeout_ms: Option<i64> = rows.get(row, 6);
            let signing_key = match secret.as_deref().map(webhook::decode_secret) {
                None => None,
                Some(Ok(key)) => Some(key),
                Some(Err(why)) => {
                    pgrx::warning!("outbox_ext: subscription {id} of \"{topic}\" to {url} skipped: its secret {why}");
                    continue;
                }
            };
            let timeout = timeout_ms.map(|ms| Duration::from_millis(ms.max(0) as u64)).unwrap_or(http_timeout).min(MAX_REQUEST);
            let endpoint = Arc::new(Endpoint {
                url,
                signing_key,
                headers: super::claim::pairs(headers),
                timeout,
            });
            let (in_flight, due_now, next_due) = match self.by_id.get(&id) {
                Some(known) => (known.in_flight, known.due_now, known.next_due),
                None => (0, true, None),
            };
            fresh.insert(id, EndpointState { id, topic, endpoint, in_flight, due_now, next_due });
        }
        spi.finish();
        // Requests in flight to a subscription that went away still come back and are recorded.
        for (id, gone) in std::mem::take(&mut self.by_id) {
            if gone.in_flight > 0 && !fresh.contains_key(&id) {
                fresh.insert(id, EndpointState { due_now: false, next_due: None, ..gone });
            }
        }
        self.by_id = fresh;
    }

    /// Asks the database when each endpoint next has a delivery due (in a transaction).
    pub fn refresh_next_due(&mut self, schema: pg_sys::Oid) {
        if self.by_id.is_empty() {
            return;
        }
        let ids: Vec<i64> = self.by_id.keys().copied().collect();
        let mut spi = Spi::connect();
        let rows = spi.execute(&NEXT_DUE, schema, &[pgrx::IntoDatum::into_datum(ids)]);
        // SAFETY: reads the clock.
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        for row in 0..rows.len() {
            let id: i64 = rows.get(row, 1).expect("id");
            let due: Option<TimestampWithTimeZone> = rows.get(row, 2);
            if let Some(state) = self.by_id.get_mut(&id) {
                state.next_due = due.map(|t| t.into_inner());
                state.due_now = state.next_due.is_some_and(|t| t <= now);
            }
        }
        spi.finish();
    }

    /// The distinct topics the worker delivers.
    pub fn topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self.by_id.values().map(|e| e.topic.clone()).collect();
        topics.sort();
        topics.dedup();
        topics
    }

    /// How many more requests each endpoint may start now: its share of `max_in_flight` among
    /// the endpoints with work (due now or in flight), less what it has in flight.
    pub fn free_slots(&self, max_in_flight: usize, total_in_flight: usize) -> Vec<(i64, usize)> {
        let busy = self.by_id.values().filter(|e| e.due_now || e.in_flight > 0).count().max(1);
        let others = self.by_id.len().saturating_sub(1);
        let reserved = others.min(max_in_flight / 2);
        let share = (max_in_flight / busy).min(max_in_flight - reserved).max(1);
        let mut left = max_in_flight.saturating_sub(total_in_flight);
        let mut free = Vec::new();
        let due: Vec<&EndpointState> = self.by_id.values().filter(|e| e.due_now).collect();
        let first = if due.is_empty() { 0 } else { self.turn.get() % due.len() };
        self.turn.set(first + 1);
        for state in due[first..].iter().chain(&due[..first]) {
            let slots = share.saturating_sub(state.in_flight).min(left);
            if slots > 0 {
                free.push((state.id, slots));
                left -= slots;
            }
        }
        free
    }

    /// The earliest time an endpoint with room for a request has a delivery due.
    pub fn earliest_due(&self) -> Option<pg_sys::TimestampTz> {
        self.by_id.values().filter_map(|e| e.next_due).min()
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    fn endpoints(states: &[(i64, usize, bool)]) -> Endpoints {
        let mut endpoints = Endpoints::default();
        for &(id, in_flight, due_now) in states {
            let endpoint = Arc::new(Endpoint { url: format!("http://e{id}/"), signing_key: None, headers: vec![], timeout: Duration::from_secs(5) });
            endpoints.by_id.insert(id, EndpointState { id, topic: "t".into(), endpoint, in_flight, due_now, next_due: None });
        }
        endpoints
    }

    #[test]
    fn an_endpoint_alone_takes_every_slot() {
        assert_eq!(endpoints(&[(1, 0, true)]).free_slots(8, 0), vec![(1, 8)]);
    }

    #[test]
    fn endpoints_with_work_share_the_slots() {
        assert_eq!(endpoints(&[(1, 0, true), (2, 0, true)]).free_slots(8, 0), vec![(1, 4), (2, 4)]);
        assert_eq!(endpoints(&[(1, 3, true), (2, 0, true)]).free_slots(8, 3), vec![(1, 1), (2, 4)]);
    }

    #[test]
    fn a_busy_endpoint_leaves_room_for_the_others() {
        // Endpoint 2 is idle: 1 may use 7 of 8 slots, not the last.
        assert_eq!(endpoints(&[(1, 0, true), (2, 0, false)]).free_slots(8, 0), vec![(1, 7)]);
        // Endpoint 1 hangs with its 7; endpoint 2 gets work: it starts at once.
        assert_eq!(endpoints(&[(1, 7, true), (2, 0, true)]).free_slots(8, 7), vec![(2, 1)]);
        // With many endpoints, at most half the slots are kept free.
        let many: Vec<(i64, usize, bool)> = (1..=10).map(|id| (id, 0, id == 1)).collect();
        assert_eq!(endpoints(&many).free_slots(8, 0), vec![(1, 4)]);
    }

    #[test]
    fn every_endpoint_with_work_gets_a_slot_however_many_share_them() {
        let many: Vec<(i64, usize, bool)> = (1..=3).map(|id| (id, 0, true)).collect();
        let endpoints = endpoints(&many);
        assert_eq!(endpoints.free_slots(2, 0), vec![(1, 1), (2, 1)]);
        assert_eq!(endpoints.free_slots(2, 0), vec![(2, 1), (3, 1)], "the next round starts further on");
        assert_eq!(endpoints.free_slots(2, 0), vec![(3, 1), (1, 1)]);
    }
}

//! The endpoints the worker sends to (the subscriptions), how the in-flight slots are shared
//! between them, and how each is protected, so that a slow, hanging or failing endpoint holds
//! only its own share and the others keep flowing:
//!
//! - each endpoint with work (due now, or requests in flight) gets an equal share of
//!   `outbox.max_in_flight`, at least one;
//! - even alone, an endpoint leaves some slots free for the others (one per other endpoint, up
//!   to half of them): when another one gets work, it starts at once instead of waiting for a
//!   hanging endpoint's requests to time out;
//! - a subscription's `max_in_flight` caps its share, and its `rate_limit` is a token bucket
//!   (a tenth of a second's worth of burst) that holds across the worker's rounds;
//! - circuit breaker: while an endpoint fails (its latest answer was a failure), it gets one
//!   request at a time until one succeeds (half-open probing); failing for
//!   `outbox.endpoint_disable_after`, it is disabled (record.rs);
//! - a disabled endpoint gets no request: its deliveries are parked until it is enabled again.

use crate::spi::{Spi, Statement};
use crate::webhook::{self, Endpoint};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Disabled endpoints get no request (their deliveries are parked).
    pub enabled: bool,
    /// Since when every answer has been a failure (`None`: the latest one succeeded).
    pub failing_since: Option<pg_sys::TimestampTz>,
    /// The subscription's own cap on requests at once.
    pub max_in_flight: Option<usize>,
    pub rate: Option<TokenBucket>,
    /// Requests in flight now.
    pub in_flight: usize,
    /// It has deliveries due now (as far as the worker knows).
    pub due_now: bool,
    /// When its next delivery is due, if known (microseconds since the PostgreSQL epoch).
    pub next_due: Option<pg_sys::TimestampTz>,
}

/// A rate limit: `per_second` tokens a second, at most a tenth of a second's worth (and at
/// least one) saved up; a request takes one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    per_second: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn new(per_second: f64, now: Instant) -> Self {
        let mut bucket = TokenBucket { per_second, tokens: 0.0, at: now };
        bucket.tokens = bucket.capacity();
        bucket
    }

    fn capacity(&self) -> f64 {
        (self.per_second / 10.0).max(1.0)
    }

    /// Tokens saved up at `now` (fractions included), at most the capacity.
    fn level(&self, now: Instant) -> f64 {
        let refilled = self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * self.per_second;
        refilled.min(self.capacity())
    }

    /// Whole tokens available at `now`.
    pub fn available(&self, now: Instant) -> usize {
        self.level(now).floor() as usize
    }

    /// Takes `count` tokens (no more than available).
    pub fn take(&mut self, count: usize, now: Instant) {
        self.tokens = (self.level(now) - count as f64).max(0.0);
        self.at = now;
    }

    /// How long until a token is available.
    pub fn wait_for_one(&self, now: Instant) -> Duration {
        Duration::from_secs_f64(((1.0 - self.level(now)) / self.per_second).max(0.0))
    }

    /// The same bucket under a (possibly) changed limit.
    fn with_rate(self, per_second: f64) -> Self {
        TokenBucket { per_second, ..self }
    }
}

impl EndpointState {
    /// How many requests it may start now with `share` slots, leaving aside the rate limit.
    fn room(&self, share: usize) -> usize {
        let mut cap = share;
        if let Some(own) = self.max_in_flight {
            cap = cap.min(own);
        }
        if self.failing_since.is_some() {
            cap = cap.min(1); // half-open: one probe at a time
        }
        cap.saturating_sub(self.in_flight)
    }

    /// Whether the endpoint is due now and enabled (it has work the worker may start).
    fn wants_to_send(&self) -> bool {
        self.enabled && self.due_now
    }
}

#[derive(Default)]
pub struct Endpoints {
    pub by_id: BTreeMap<i64, EndpointState>,
    /// Where the next sharing of the slots starts, so that when slots are scarce every endpoint
    /// gets its turn.
    turn: std::cell::Cell<usize>,
    /// The subscriptions were read at least once.
    loaded: bool,
}

impl Endpoints {
    /// Reads the subscriptions (in a transaction), keeping what is known of the ones that
    /// stay. A subscription whose secret does not decode is skipped (its messages wait) rather
    /// than sent unsigned. Returns whether subscriptions may have gone away since the last
    /// reload (always so at the first: the worker may have been away).
    pub fn reload(&mut self, schema: pg_sys::Oid, http_timeout: Duration) -> bool {
        let first = !self.loaded;
        self.loaded = true;
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
            let enabled: bool = rows.get(row, 7).unwrap_or(true);
            let failing_since = rows.get::<TimestampWithTimeZone>(row, 8).map(TimestampWithTimeZone::into_inner);
            let rate_limit: Option<f64> = rows.get(row, 9);
            let max_in_flight = rows.get::<i32>(row, 10).map(|n| n.max(1) as usize);
            // The key before a rotation, while the overlap lasts (an undecodable one is dropped).
            let previous_key = rows
                .get_text(row, 11)
                .and_then(|secret| webhook::decode_secret(&secret).ok())
                .zip(rows.get::<TimestampWithTimeZone>(row, 12).map(|until| crate::backend::to_system_time(until.into_inner())));
            let endpoint = Arc::new(Endpoint { url, signing_key, previous_key, headers: super::claim::pairs(headers), timeout });
            let known = self.by_id.get(&id);
            let (in_flight, due_now, next_due) = known.map_or((0, true, None), |k| (k.in_flight, k.due_now, k.next_due));
            // The bucket carries over a reload (a new limit applies from its current level).
            let rate = rate_limit.map(|per_second| match known.and_then(|k| k.rate) {
                Some(bucket) => bucket.with_rate(per_second),
                None => TokenBucket::new(per_second, Instant::now()),
            });
            fresh.insert(
                id,
                EndpointState { id, topic, endpoint, enabled, failing_since, max_in_flight, rate, in_flight, due_now, next_due },
            );
        }
        spi.finish();
        // Requests in flight to a subscription that went away still come back and are recorded.
        let mut some_went_away = first;
        for (id, gone) in std::mem::take(&mut self.by_id) {
            if fresh.contains_key(&id) {
                continue;
            }
            some_went_away = true;
            if gone.in_flight > 0 {
                // Kept, sent nothing more, only until its answers are in.
                fresh.insert(id, EndpointState { enabled: false, due_now: false, next_due: None, ..gone });
            }
        }
        self.by_id = fresh;
        some_went_away
    }

    /// Asks the database when each enabled endpoint next has a delivery due (in a transaction).
    pub fn refresh_next_due(&mut self, schema: pg_sys::Oid) {
        let ids: Vec<i64> = self.by_id.values().filter(|e| e.enabled).map(|e| e.id).collect();
        if ids.is_empty() {
            return;
        }
        let mut spi = Spi::connect();
        let rows = spi.execute(&NEXT_DUE, schema, &[pgrx::IntoDatum::into_datum(ids)]);
        let now = crate::backend::now();
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

    /// Each enabled endpoint's share of `max_in_flight`: equal among those with work (due now
    /// or in flight), less what is kept free for the others.
    fn share(&self, max_in_flight: usize) -> usize {
        let enabled = self.by_id.values().filter(|e| e.enabled).count();
        let busy = self.by_id.values().filter(|e| e.wants_to_send() || e.in_flight > 0).count().max(1);
        let reserved = enabled.saturating_sub(1).min(max_in_flight / 2);
        (max_in_flight / busy).min(max_in_flight - reserved).max(1)
    }

    /// How many more requests each endpoint may start now: its share, within its own limits,
    /// less what it has in flight, and no more than its rate limit's tokens.
    pub fn free_slots(&self, max_in_flight: usize, total_in_flight: usize, now: Instant) -> Vec<(i64, usize)> {
        let share = self.share(max_in_flight);
        let mut left = max_in_flight.saturating_sub(total_in_flight);
        let mut free = Vec::new();
        let due: Vec<&EndpointState> = self.by_id.values().filter(|e| e.wants_to_send()).collect();
        let first = if due.is_empty() { 0 } else { self.turn.get() % due.len() };
        self.turn.set(first + 1);
        for state in due[first..].iter().chain(&due[..first]) {
            let tokens = state.rate.map_or(usize::MAX, |bucket| bucket.available(now));
            let slots = state.room(share).min(tokens).min(left);
            if slots > 0 {
                free.push((state.id, slots));
                left -= slots;
            }
        }
        free
    }

    /// Requests were started for endpoint `id`: its rate limit's tokens are spent.
    pub fn started(&mut self, id: i64, count: usize, now: Instant) {
        if let Some(state) = self.by_id.get_mut(&id) {
            state.in_flight += count;
            if let Some(bucket) = state.rate.as_mut() {
                bucket.take(count, now);
            }
        }
    }

    /// How long the worker may sleep before an endpoint with work can start a request: zero
    /// when one can now, the wait for a rate limit's next token, or `None` when every endpoint
    /// with work waits for an answer (which wakes the worker) or has none due.
    pub fn wait_for_due_work(&self, max_in_flight: usize, now: Instant) -> Option<Duration> {
        let share = self.share(max_in_flight);
        self.by_id
            .values()
            .filter(|e| e.wants_to_send() && e.room(share) > 0)
            .map(|e| e.rate.map_or(Duration::ZERO, |bucket| bucket.wait_for_one(now)))
            .min()
    }

    /// The earliest time an enabled endpoint with room for a request has a delivery due (one
    /// without room is woken by an answer).
    pub fn earliest_due(&self, max_in_flight: usize) -> Option<pg_sys::TimestampTz> {
        let share = self.share(max_in_flight);
        self.by_id.values().filter(|e| e.enabled && e.room(share) > 0).filter_map(|e| e.next_due).min()
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    fn endpoints(states: &[(i64, usize, bool)]) -> Endpoints {
        let mut endpoints = Endpoints::default();
        for &(id, in_flight, due_now) in states {
            let endpoint = Arc::new(Endpoint {
                url: format!("http://e{id}/"),
                signing_key: None,
                previous_key: None,
                headers: vec![],
                timeout: Duration::from_secs(5),
            });
            endpoints.by_id.insert(
                id,
                EndpointState {
                    id,
                    topic: "t".into(),
                    endpoint,
                    enabled: true,
                    failing_since: None,
                    max_in_flight: None,
                    rate: None,
                    in_flight,
                    due_now,
                    next_due: None,
                },
            );
        }
        endpoints
    }

    fn free_slots(endpoints: &Endpoints, max_in_flight: usize, in_flight: usize) -> Vec<(i64, usize)> {
        endpoints.free_slots(max_in_flight, in_flight, Instant::now())
    }

    #[test]
    fn an_endpoint_alone_takes_every_slot() {
        assert_eq!(free_slots(&endpoints(&[(1, 0, true)]), 8, 0), vec![(1, 8)]);
    }

    #[test]
    fn endpoints_with_work_share_the_slots() {
        assert_eq!(free_slots(&endpoints(&[(1, 0, true), (2, 0, true)]), 8, 0), vec![(1, 4), (2, 4)]);
        assert_eq!(free_slots(&endpoints(&[(1, 3, true), (2, 0, true)]), 8, 3), vec![(1, 1), (2, 4)]);
    }

    #[test]
    fn a_busy_endpoint_leaves_room_for_the_others() {
        // Endpoint 2 is idle: 1 may use 7 of 8 slots, not the last.
        assert_eq!(free_slots(&endpoints(&[(1, 0, true), (2, 0, false)]), 8, 0), vec![(1, 7)]);
        // Endpoint 1 hangs with its 7; endpoint 2 gets work: it starts at once.
        assert_eq!(free_slots(&endpoints(&[(1, 7, true), (2, 0, true)]), 8, 7), vec![(2, 1)]);
        // With many endpoints, at most half the slots are kept free.
        let many: Vec<(i64, usize, bool)> = (1..=10).map(|id| (id, 0, id == 1)).collect();
        assert_eq!(free_slots(&endpoints(&many), 8, 0), vec![(1, 4)]);
    }

    #[test]
    fn every_endpoint_with_work_gets_a_slot_however_many_share_them() {
        let many: Vec<(i64, usize, bool)> = (1..=3).map(|id| (id, 0, true)).collect();
        let endpoints = endpoints(&many);
        assert_eq!(free_slots(&endpoints, 2, 0), vec![(1, 1), (2, 1)]);
        assert_eq!(free_slots(&endpoints, 2, 0), vec![(2, 1), (3, 1)], "the next round starts further on");
        assert_eq!(free_slots(&endpoints, 2, 0), vec![(3, 1), (1, 1)]);
    }

    #[test]
    fn a_failing_endpoint_gets_one_request_at_a_time_and_the_others_their_share() {
        let mut all = endpoints(&[(1, 0, true), (2, 0, true)]);
        all.by_id.get_mut(&1).unwrap().failing_since = Some(0);
        assert_eq!(free_slots(&all, 8, 0), vec![(1, 1), (2, 4)]);
        all.by_id.get_mut(&1).unwrap().in_flight = 1;
        assert_eq!(free_slots(&all, 8, 1), vec![(2, 4)], "its probe is out: nothing more until it answers");
        assert_eq!(all.wait_for_due_work(8, Instant::now()), Some(Duration::ZERO), "endpoint 2 can start");
    }

    #[test]
    fn a_disabled_endpoint_gets_nothing_and_keeps_no_room() {
        let mut all = endpoints(&[(1, 0, true), (2, 0, true)]);
        all.by_id.get_mut(&1).unwrap().enabled = false;
        assert_eq!(free_slots(&all, 8, 0), vec![(2, 8)]);
    }

    #[test]
    fn a_subscription_caps_its_own_requests_at_once() {
        let mut all = endpoints(&[(1, 0, true)]);
        all.by_id.get_mut(&1).unwrap().max_in_flight = Some(2);
        assert_eq!(free_slots(&all, 8, 0), vec![(1, 2)]);
    }

    #[test]
    fn a_rate_limit_lets_requests_go_as_its_tokens_come() {
        let start = Instant::now();
        let mut all = endpoints(&[(1, 0, true)]);
        all.by_id.get_mut(&1).unwrap().rate = Some(TokenBucket::new(50.0, start));
        // 50/s saves up a tenth of a second: 5 at once, then one every 20 ms.
        assert_eq!(all.free_slots(8, 0, start), vec![(1, 5)]);
        all.started(1, 5, start);
        all.by_id.get_mut(&1).unwrap().in_flight = 0;
        assert_eq!(all.free_slots(8, 0, start), vec![]);
        let wait = all.wait_for_due_work(8, start).unwrap();
        assert!(wait > Duration::from_millis(15) && wait <= Duration::from_millis(20), "{wait:?}");
        assert_eq!(all.free_slots(8, 0, start + Duration::from_millis(41)), vec![(1, 2)]);
        // Over a long run the rate holds: 1,000 rounds of 10 ms let 50/s through.
        let mut sent = 0;
        for round in 1..=1000 {
            let now = start + Duration::from_millis(10 * round);
            if let Some(&(_, slots)) = all.free_slots(8, 0, now).first() {
                all.started(1, slots, now);
                all.by_id.get_mut(&1).unwrap().in_flight = 0;
                sent += slots;
            }
        }
        assert!((495..=505).contains(&sent), "{sent} in 10 s");
    }
}

//! An endpoint's queue: the deliveries it has leased and not yet started, oldest due first.
//!
//! The main thread fills it (claims) and starts from it (as slots free up). A helper thread
//! whose request to the endpoint was answered with a success takes the next one itself, in the
//! same slot, while the main thread allows it ([`EndpointQueue::allow_continuing`]): the next
//! request leaves at once, even while the main thread is inside a transaction, instead of
//! waiting for it to come round. The main thread allows it only for a healthy endpoint that
//! may keep its slot (no rate limit, within its share, the worker claiming), and checks that
//! at every turn of its loop.

use super::claim::Claimed;
use crate::webhook::Endpoint;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// A leased delivery waiting for its endpoint to have room.
pub struct Queued {
    pub delivery: Claimed,
    /// It starts by then or not at all (see [`super::endpoints::lease_for`]).
    pub start_by: Instant,
    /// Its claim leased it to start at once, in a free slot promised to it
    /// ([`super::endpoints::ClaimSize::at_once`]); it starts before any other queued delivery.
    pub at_once: bool,
}

impl Queued {
    /// Whether it is too late to start at `now` (it is handed back instead).
    pub fn too_late(&self, now: Instant) -> bool {
        now > self.start_by
    }
}

/// The queue, shared by the main thread and the helper threads (hence the lock, held only to
/// push or pop).
pub struct EndpointQueue {
    deliveries: Mutex<VecDeque<Queued>>,
    /// Whether a helper thread may start the next queued delivery after a success.
    continuing: AtomicBool,
    /// The endpoint as last read: a helper that continues sends to it.
    endpoint: Mutex<Arc<Endpoint>>,
}

impl EndpointQueue {
    pub fn new(endpoint: Arc<Endpoint>) -> Arc<EndpointQueue> {
        Arc::new(EndpointQueue { deliveries: Mutex::default(), continuing: AtomicBool::new(false), endpoint: Mutex::new(endpoint) })
    }

    fn deliveries(&self) -> MutexGuard<'_, VecDeque<Queued>> {
        self.deliveries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn len(&self) -> usize {
        self.deliveries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.deliveries().is_empty()
    }

    pub fn push_back(&self, queued: Queued) {
        self.deliveries().push_back(queued);
    }

    /// Whether the next delivery was leased to start at once.
    pub fn next_is_at_once(&self) -> bool {
        self.deliveries().front().is_some_and(|next| next.at_once)
    }

    pub fn pop_front(&self) -> Option<Queued> {
        self.deliveries().pop_front()
    }

    /// Takes out the deliveries too late to start at `now` (they are handed back).
    pub fn take_too_late(&self, now: Instant) -> Vec<Claimed> {
        let mut deliveries = self.deliveries();
        if !deliveries.iter().any(|queued| queued.too_late(now)) {
            return Vec::new();
        }
        let (late, on_time): (VecDeque<Queued>, VecDeque<Queued>) = deliveries.drain(..).partition(|queued| queued.too_late(now));
        *deliveries = on_time;
        late.into_iter().map(|queued| queued.delivery).collect()
    }

    /// When the first of the queued deliveries must have started (else it is handed back).
    pub fn earliest_start_by(&self) -> Option<Instant> {
        self.deliveries().iter().map(|queued| queued.start_by).min()
    }

    /// Empties the queue (its deliveries are handed back).
    pub fn take_all(&self) -> Vec<Claimed> {
        self.deliveries().drain(..).map(|q| q.delivery).collect()
    }

    /// Payload bytes of the queued deliveries.
    pub fn bytes(&self) -> usize {
        self.deliveries().iter().map(|q| q.delivery.message.body.len()).sum()
    }

    /// Lets helper threads start the next delivery after a success, or stops them.
    pub fn allow_continuing(&self, allowed: bool) {
        self.continuing.store(allowed, Ordering::Release);
    }

    pub fn endpoint(&self) -> Arc<Endpoint> {
        Arc::clone(&self.endpoint.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// The subscription was read again.
    pub fn set_endpoint(&self, endpoint: Arc<Endpoint>) {
        *self.endpoint.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = endpoint;
    }

    /// For a helper thread whose request to this endpoint just succeeded: the next delivery
    /// to send in the same slot, if continuing is allowed and one may still start by `now`
    /// (a late one stays queued, for the main thread to hand back).
    pub fn next_after_success(&self, now: Instant) -> Option<Queued> {
        if !self.continuing.load(Ordering::Acquire) {
            return None;
        }
        let mut deliveries = self.deliveries();
        if deliveries.front().is_some_and(|next| !next.too_late(now)) {
            deliveries.pop_front()
        } else {
            None
        }
    }

    #[cfg(test)]
    pub fn continuing(&self) -> bool {
        self.continuing.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub fn truncate(&self, len: usize) {
        self.deliveries().truncate(len);
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;
    use crate::webhook::Message;
    use std::time::Duration;

    fn queue_of(count: usize, start_by: Instant) -> Arc<EndpointQueue> {
        let endpoint = Arc::new(Endpoint {
            url: "http://e/".into(),
            signing_key: None,
            previous_key: None,
            headers: vec![],
            timeout: Duration::from_secs(5),
        });
        let queue = EndpointQueue::new(endpoint);
        let message = Arc::new(Message { public_id: String::new(), topic: "t".into(), body: vec![b'x'; 10], attempt: 1, headers: vec![] });
        for n in 0..count {
            queue.push_back(Queued {
                delivery: Claimed { message_id: n as i64, subscription_id: 1, lease_until: 0, message: Arc::clone(&message) },
                start_by,
                at_once: false,
            });
        }
        queue
    }

    #[test]
    fn a_helper_continues_only_while_allowed_and_in_order() {
        let now = Instant::now();
        let queue = queue_of(3, now + Duration::from_secs(5));
        assert!(queue.next_after_success(now).is_none(), "not allowed until the main thread says so");
        queue.allow_continuing(true);
        assert_eq!(queue.next_after_success(now).map(|q| q.delivery.message_id), Some(0));
        assert_eq!(queue.next_after_success(now).map(|q| q.delivery.message_id), Some(1));
        queue.allow_continuing(false);
        assert!(queue.next_after_success(now).is_none());
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.bytes(), 10);
    }

    #[test]
    fn a_late_delivery_is_left_for_the_main_thread_to_hand_back() {
        let now = Instant::now();
        let queue = queue_of(2, now);
        queue.allow_continuing(true);
        assert!(queue.next_after_success(now + Duration::from_millis(1)).is_none());
        assert_eq!(queue.len(), 2, "still queued: the main thread hands it back");
        assert_eq!(queue.take_all().len(), 2);
        assert!(queue.is_empty());
    }
}

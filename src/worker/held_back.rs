//! What the worker holds back for a moment because an operator's open transaction holds the
//! rows it needs (an unsubscribe deleting an endpoint's deliveries, a redelivery): the worker
//! skips those rows (`SKIP LOCKED`) rather than wait for them with its whole step, every
//! endpoint's, and comes back to them after [`HOLD_BACK`].

use crate::text::ServerText;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long the worker leaves alone what an operator's open transaction holds.
pub const HOLD_BACK: Duration = Duration::from_millis(100);

/// Topics a pick-up left alone because an operator was changing their subscriptions (an
/// unsubscribe not yet committed: fan_out.sql). The next pick-ups skip them for [`HOLD_BACK`],
/// so that their messages do not fill every batch meanwhile; then they are tried again. So are,
/// after the same time, messages it left alone because a producer's open transaction held their
/// ordering keys (each pick-up leaves those alone by itself).
#[derive(Debug, Default)]
pub struct HeldBackTopics {
    topics: Vec<String>,
    until: Option<Instant>,
}

impl HeldBackTopics {
    /// `topics` less those held back at `now`.
    pub fn excluding(&self, mut topics: Vec<String>, now: Instant) -> Vec<String> {
        if self.until.is_some_and(|until| now < until) {
            topics.retain(|topic| !self.topics.contains(topic));
        }
        topics
    }

    /// Holds `topics` back from `now` (with those already held, for the whole new term).
    pub fn hold(&mut self, topics: Vec<String>, now: Instant) {
        if topics.is_empty() {
            return;
        }
        for topic in topics {
            if !self.topics.contains(&topic) {
                self.topics.push(topic);
            }
        }
        self.until = Some(now + HOLD_BACK);
    }

    /// A pick-up at `now` left keyed messages alone: the next pick-ups may leave them alone
    /// too, and one is tried again after [`HOLD_BACK`] (if nothing else ran one meanwhile).
    pub fn hold_keyed(&mut self, now: Instant) {
        self.until.get_or_insert(now + HOLD_BACK);
    }

    /// When the topics held back are to be tried again.
    pub fn until(&self) -> Option<Instant> {
        self.until
    }

    /// Whether a hold ran out by `now`: then it is forgotten, and its topics' messages may be
    /// ready.
    pub fn take_expired(&mut self, now: Instant) -> bool {
        let expired = self.until.is_some_and(|until| now >= until);
        if expired {
            *self = HeldBackTopics::default();
        }
        expired
    }
}

/// How long the pick-up leaves alone a message whose ordering key producers keep holding
/// (pick_up.sql), committing new messages of the key meanwhile, before it waits for the key as
/// every other releaser does: producers whose transactions overlap, each beginning before the
/// last one ends, would otherwise keep the key from being handed on for good. (The wait queues
/// the worker ahead of the producers that come after it.) A key that no producer commits to
/// meanwhile is held by the same transaction(s) all along: waiting for one that stays open
/// (idle in transaction) would hold back the worker's steps, so it is left alone for as long.
pub const KEY_PATIENCE: Duration = Duration::from_secs(1);

/// The ordering keys whose messages the pick-up left alone because producers held them.
#[derive(Debug, Default)]
pub struct HeldBackKeys {
    held: BTreeMap<ServerText, HeldKey>,
}

#[derive(Debug, Clone, Copy)]
struct HeldKey {
    /// First left alone then (in a row of pick-ups).
    since: Instant,
    /// The newest message queued behind the key then.
    newest_then: i64,
    /// Producers committed messages of the key since.
    churning: bool,
}

impl HeldBackKeys {
    /// The key to wait for at `now`: of those left alone for [`KEY_PATIENCE`] or longer while
    /// their producers kept committing, the one left alone longest. One at a time, waited for
    /// before the pick-up tries any other key: a producer holding one such key may be about
    /// to enqueue with another, and would wait for the worker while the worker waits for it.
    pub fn to_wait_for(&self, now: Instant) -> Option<ServerText> {
        self.held
            .iter()
            .filter(|(_, key)| key.churning && now.duration_since(key.since) >= KEY_PATIENCE)
            .min_by_key(|(_, key)| key.since)
            .map(|(name, _)| name.clone())
    }

    /// A pick-up at `now` left alone the messages of `keys`, each with the newest message queued
    /// behind it. The other keys are forgotten (handed on, or their messages not picked up this
    /// time: their patience starts again).
    pub fn left_alone(&mut self, keys: Vec<(ServerText, i64)>, now: Instant) {
        let mut held = BTreeMap::new();
        for (name, newest) in keys {
            let key = match self.held.get(&name) {
                Some(&before) => HeldKey { churning: before.churning || newest != before.newest_then, ..before },
                None => HeldKey { since: now, newest_then: newest, churning: false },
            };
            held.insert(name, key);
        }
        self.held = held;
    }
}

/// Work on deliveries an operator's open transaction held (an unsubscribe deleting them, a
/// redelivery): answers to record, deliveries to hand back, messages to settle. Each is tried
/// again [`HOLD_BACK`] after it was held, rather than at every step meanwhile (and never later
/// because others were held since).
pub struct HeldBack<T> {
    /// Oldest first, each with the time it is to be tried again.
    held: Vec<(Instant, T)>,
}

impl<T> Default for HeldBack<T> {
    fn default() -> Self {
        HeldBack { held: Vec::new() }
    }
}

impl<T> HeldBack<T> {
    /// Holds `items` back from `now`.
    pub fn hold(&mut self, items: impl IntoIterator<Item = T>, now: Instant) {
        self.held.extend(items.into_iter().map(|item| (now + HOLD_BACK, item)));
    }

    /// The items whose hold ran out by `now`, oldest first.
    pub fn take_due(&mut self, now: Instant) -> Vec<T> {
        let (due, held) = std::mem::take(&mut self.held).into_iter().partition(|(until, _)| *until <= now);
        self.held = held;
        due.into_iter().map(|(_, item)| item).collect()
    }

    /// All items, due or not (a worker leaving tries them once more).
    pub fn take_all(&mut self) -> Vec<T> {
        std::mem::take(&mut self.held).into_iter().map(|(_, item)| item).collect()
    }

    /// When the next item is to be tried again.
    pub fn until(&self) -> Option<Instant> {
        self.held.iter().map(|(until, _)| *until).min()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.held.iter().map(|(_, item)| item)
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod unit_tests {
    use super::{HeldBack, HeldBackKeys, HeldBackTopics, ServerText, HOLD_BACK, KEY_PATIENCE};
    use std::time::{Duration, Instant};

    fn topics(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn a_topic_held_back_is_skipped_until_the_hold_runs_out() {
        let mut held = HeldBackTopics::default();
        let start = Instant::now();
        assert_eq!(held.excluding(topics(&["a", "b"]), start), topics(&["a", "b"]));
        assert!(!held.take_expired(start), "nothing held");
        held.hold(topics(&["a"]), start);
        assert_eq!(held.until(), Some(start + HOLD_BACK));
        assert_eq!(held.excluding(topics(&["a", "b"]), start + HOLD_BACK / 2), topics(&["b"]));
        held.hold(topics(&["b"]), start + HOLD_BACK / 2);
        assert_eq!(held.excluding(topics(&["a", "b", "c"]), start + HOLD_BACK), topics(&["c"]), "both, for the new term");
        let end = start + HOLD_BACK / 2 + HOLD_BACK;
        assert_eq!(held.excluding(topics(&["a", "b"]), end), topics(&["a", "b"]));
        assert!(!held.take_expired(end - Duration::from_millis(1)));
        assert!(held.take_expired(end), "then the topics' messages may be ready");
        assert_eq!(held.until(), None);
        assert!(!held.take_expired(end), "once");
        held.hold(Vec::new(), end);
        assert_eq!(held.until(), None, "nothing to hold");
    }

    #[test]
    fn keyed_messages_left_alone_are_tried_again_after_the_hold_holding_back_no_topic() {
        let mut held = HeldBackTopics::default();
        let start = Instant::now();
        held.hold_keyed(start);
        held.hold_keyed(start + HOLD_BACK / 2);
        assert_eq!(held.until(), Some(start + HOLD_BACK), "the first hold's term");
        assert_eq!(held.excluding(topics(&["a"]), start), topics(&["a"]), "no topic skipped");
        assert!(!held.take_expired(start + HOLD_BACK / 2));
        assert!(held.take_expired(start + HOLD_BACK), "then a pick-up tries them again");
    }

    #[test]
    fn a_key_producers_keep_committing_to_is_waited_for_once_the_patience_runs_out() {
        let mut keys = HeldBackKeys::default();
        let start = Instant::now();
        let key = |name: &str, newest: i64| (ServerText::from_bytes(name.as_bytes()), newest);
        let named = |name: &str| Some(ServerText::from_bytes(name.as_bytes()));
        keys.left_alone(vec![key("a", 10), key("b", 20), key("idle", 30)], start);
        assert_eq!(keys.to_wait_for(start), None, "left alone first");
        keys.left_alone(vec![key("a", 11), key("idle", 30)], start + KEY_PATIENCE / 2); // b handed on
        keys.left_alone(vec![key("a", 12), key("b", 21), key("idle", 30)], start + KEY_PATIENCE / 2);
        assert_eq!(keys.to_wait_for(start + KEY_PATIENCE), named("a"), "b's patience started again");
        keys.left_alone(vec![key("a", 12), key("b", 22), key("idle", 30)], start + KEY_PATIENCE);
        let later = start + KEY_PATIENCE / 2 + KEY_PATIENCE;
        assert_eq!(keys.to_wait_for(later), named("a"), "both due: one at a time, the longest left alone first");
        keys.left_alone(vec![key("b", 23), key("idle", 30)], later); // a handed on
        assert_eq!(keys.to_wait_for(later), named("b"));
        keys.left_alone(vec![key("idle", 30)], start + 10 * KEY_PATIENCE);
        assert_eq!(
            keys.to_wait_for(start + 10 * KEY_PATIENCE),
            None,
            "a key nobody commits to is held by the same transaction: not waited for"
        );
        keys.left_alone(Vec::new(), start + 11 * KEY_PATIENCE);
        assert_eq!(keys.to_wait_for(start + 12 * KEY_PATIENCE), None, "every key handed on");
    }

    #[test]
    fn each_item_held_back_comes_back_once_its_own_hold_runs_out() {
        let start = Instant::now();
        let mut held = HeldBack::default();
        held.hold([1, 2], start);
        assert_eq!(held.until(), Some(start + HOLD_BACK));
        assert!(held.take_due(start + HOLD_BACK / 2).is_empty(), "not before the hold runs out");
        held.hold([3], start + HOLD_BACK / 2);
        assert_eq!(held.until(), Some(start + HOLD_BACK), "a later hold does not put off the earlier ones");
        assert_eq!(held.take_due(start + HOLD_BACK), vec![1, 2]);
        assert_eq!(held.until(), Some(start + HOLD_BACK / 2 + HOLD_BACK));
        assert!(held.take_due(start + HOLD_BACK).is_empty());
        assert_eq!(held.take_due(start + HOLD_BACK / 2 + HOLD_BACK), vec![3]);
        assert!(held.is_empty() && held.until().is_none());
        held.hold([], start);
        assert_eq!(held.until(), None, "holding nothing sets no term");
    }

    #[test]
    fn a_worker_leaving_takes_every_item_held_due_or_not() {
        let start = Instant::now();
        let mut held = HeldBack::default();
        held.hold([1], start);
        held.hold([2], start + HOLD_BACK / 2);
        assert_eq!(held.take_all(), vec![1, 2]);
        assert!(held.is_empty() && held.until().is_none());
    }
}

//! Which topics a delivery worker delivers, as 64 bits it keeps in shared memory, so that a
//! producer's commit wakes it only for messages it may have work for. Without it, every commit
//! of every topic woke the worker (a topic only SQL consumers take, at 8,000 commits/s, kept it
//! at 40% of a core and cost the producers a fifth of their rate on two cores).
//!
//! A topic sets one bit (a hash of its name). Two topics may share a bit: then the worker wakes
//! for nothing now and then, which is what every commit did before. A worker that has not yet
//! read its subscriptions publishes [`TopicFilter::ALL`].
//!
//! Plain logic: no PostgreSQL calls.

/// A set of topics, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicFilter(u64);

impl TopicFilter {
    /// No topic: the worker delivers nothing, no commit needs to wake it.
    pub const NONE: TopicFilter = TopicFilter(0);
    /// Every topic (a worker whose subscriptions are not known yet; a wake-up for any reason).
    pub const ALL: TopicFilter = TopicFilter(u64::MAX);

    /// The bit of one topic.
    pub fn of(topic: &str) -> TopicFilter {
        TopicFilter(1 << (fnv1a(topic.as_bytes()) % 64))
    }

    /// The bits of all these topics.
    pub fn of_all<'a>(topics: impl IntoIterator<Item = &'a str>) -> TopicFilter {
        topics.into_iter().fold(TopicFilter::NONE, |filter, topic| filter.with(TopicFilter::of(topic)))
    }

    pub fn with(self, other: TopicFilter) -> TopicFilter {
        TopicFilter(self.0 | other.0)
    }

    /// Whether a topic of `other` may be one of these.
    pub fn overlaps(self, other: TopicFilter) -> bool {
        self.0 & other.0 != 0
    }

    pub fn bits(self) -> u64 {
        self.0
    }

    pub fn from_bits(bits: u64) -> TopicFilter {
        TopicFilter(bits)
    }
}

/// Until the worker says, it may deliver anything.
impl Default for TopicFilter {
    fn default() -> Self {
        TopicFilter::ALL
    }
}

/// FNV-1a, 64 bits: the same in every process (std's hasher is seeded per process).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn a_worker_is_woken_for_the_topics_it_delivers() {
        let delivered = TopicFilter::of_all(["booking.created", "invoice.paid"]);
        assert!(delivered.overlaps(TopicFilter::of("booking.created")));
        assert!(delivered.overlaps(TopicFilter::of("invoice.paid")));
        assert!(delivered.overlaps(TopicFilter::of("booking.created").with(TopicFilter::of("report.requested"))));
    }

    #[test]
    fn a_worker_without_subscriptions_is_woken_by_no_topic() {
        assert!(!TopicFilter::of_all([]).overlaps(TopicFilter::of("booking.created")));
        assert!(!TopicFilter::NONE.overlaps(TopicFilter::ALL));
    }

    #[test]
    fn most_other_topics_do_not_wake_it() {
        let delivered = TopicFilter::of("booking.created");
        let others: Vec<String> = (0..1000).map(|n| format!("report.kind_{n}")).collect();
        let woken = others.iter().filter(|topic| delivered.overlaps(TopicFilter::of(topic))).count();
        // One bit of 64: about 16 of 1,000 share it.
        assert!(woken < 50, "{woken} of 1,000 unrelated topics would wake the worker");
    }

    #[test]
    fn a_worker_whose_subscriptions_are_unknown_is_woken_by_every_topic() {
        assert!(TopicFilter::default().overlaps(TopicFilter::of("anything.at_all")));
        assert_eq!(TopicFilter::from_bits(TopicFilter::ALL.bits()), TopicFilter::ALL);
    }
}

//! Where a connection's next claim starts reading the ready queue.
//!
//! Every claim and completion leaves a dead entry at the front of `outbox_ready_idx` (the old
//! row version was ready, the new one is leased or ended). Only VACUUM removes index pages, so
//! until it runs (autovacuum wakes once a minute; a session idle in a transaction or a long
//! query holds it back for as long as it lasts) a claim that reads the index from its start
//! walks over every page of them: at 10,000 messages/s that is hundreds more pages per claim
//! every second. So a claim reads from where this connection's previous claim found the head,
//! less [`SLACK_MICROS`], and from the very start at least every [`FULL_SCAN_EVERY`].
//!
//! Why that misses nothing for long: a message that becomes ready gets an `available_at` of at
//! least the clock of the transaction that makes it ready (enqueue, retry, lease, redelivery,
//! the release of its ordering key), so it lands at or after the bound unless that transaction
//! commits more than the slack after its clock reading. That, a rolled-back claim of another
//! consumer (its rows stay where they were, behind the head) and a row given an earlier time
//! by hand are what the scan from the start, within [`FULL_SCAN_EVERY`], picks up.
//!
//! Plain logic: the clock and the monotonic instant come from the caller.

use std::time::{Duration, Instant};

/// How far before the head (and before the clock) the next claim starts: what a transaction
/// that makes a message ready may take between reading the clock and committing.
pub const SLACK_MICROS: i64 = 1_000_000;

/// How often a connection's claim reads the ready queue from its start.
pub const FULL_SCAN_EVERY: Duration = Duration::from_secs(1);

/// A lower bound on `available_at`; `i64::MIN` is PostgreSQL's `-infinity` (read from the start).
pub type Bound = i64;

/// From the start of the queue.
pub const FROM_THE_START: Bound = i64::MIN;

/// What one connection knows of the head of the ready queue, for one set of topics.
#[derive(Debug, Default)]
pub struct QueueHead {
    /// The topics the bound is for (None: all topics).
    topics: Option<Vec<String>>,
    /// Where the next claim of those topics may start; None until a scan from the start.
    bound: Option<Bound>,
    /// When the last scan from the start ran.
    scanned_from_start_at: Option<Instant>,
}

impl QueueHead {
    /// Where a claim of `topics` at `instant` starts reading.
    pub fn start(&self, topics: &Option<Vec<String>>, instant: Instant) -> Bound {
        match (self.bound, self.scanned_from_start_at) {
            (Some(bound), Some(at)) if self.topics == *topics && instant.duration_since(at) < FULL_SCAN_EVERY => bound,
            _ => FROM_THE_START,
        }
    }

    /// Learns from a claim of `topics` that started at `started_from`, read the clock `clock`
    /// (microseconds) and found `first` (the `available_at` of the oldest message it locked, if
    /// any). Nothing ready and free lies before it; a message that becomes ready later lands
    /// after `clock - SLACK_MICROS` (see the module's comment).
    pub fn found(&mut self, topics: &Option<Vec<String>>, started_from: Bound, clock: i64, first: Option<i64>, instant: Instant) {
        if self.topics != *topics {
            *self = QueueHead { topics: topics.clone(), ..QueueHead::default() };
        }
        if started_from == FROM_THE_START {
            self.scanned_from_start_at = Some(instant);
        }
        let newcomers = clock.saturating_sub(SLACK_MICROS);
        self.bound = Some(first.map_or(newcomers, |first| first.min(newcomers)));
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    const SECOND: i64 = 1_000_000;

    fn all() -> Option<Vec<String>> {
        None
    }

    #[test]
    fn the_first_claim_reads_from_the_start() {
        assert_eq!(QueueHead::default().start(&all(), Instant::now()), FROM_THE_START);
    }

    #[test]
    fn the_next_claim_starts_at_the_head_it_found_or_a_slack_before_the_clock() {
        let (mut head, now) = (QueueHead::default(), Instant::now());
        // A backlog an hour old: the head is older than the clock's slack.
        head.found(&all(), FROM_THE_START, 3600 * SECOND, Some(5 * SECOND), now);
        assert_eq!(head.start(&all(), now), 5 * SECOND);
        // A fresh head: a message made ready by a transaction still committing may be older.
        head.found(&all(), 5 * SECOND, 3600 * SECOND, Some(3600 * SECOND - 10), now);
        assert_eq!(head.start(&all(), now), 3599 * SECOND);
        // Nothing found: what becomes ready later lands after the clock, less the slack.
        head.found(&all(), 3599 * SECOND, 3700 * SECOND, None, now);
        assert_eq!(head.start(&all(), now), 3699 * SECOND);
    }

    #[test]
    fn a_claim_reads_from_the_start_again_once_a_second() {
        let (mut head, now) = (QueueHead::default(), Instant::now());
        head.found(&all(), FROM_THE_START, 100 * SECOND, Some(50 * SECOND), now);
        // Claims that start at the bound do not restart the second.
        head.found(&all(), 50 * SECOND, 100 * SECOND, Some(60 * SECOND), now + Duration::from_millis(900));
        assert_eq!(head.start(&all(), now + Duration::from_millis(999)), 60 * SECOND);
        assert_eq!(head.start(&all(), now + FULL_SCAN_EVERY), FROM_THE_START);
    }

    #[test]
    fn a_bound_holds_only_for_the_topics_it_was_found_for() {
        let (mut head, now) = (QueueHead::default(), Instant::now());
        let bookings = Some(vec!["booking.created".to_string()]);
        head.found(&bookings, FROM_THE_START, 100 * SECOND, Some(50 * SECOND), now);
        assert_eq!(head.start(&bookings, now), 50 * SECOND);
        assert_eq!(head.start(&all(), now), FROM_THE_START);
        // A bounded claim of other topics (which cannot happen: their first claim reads from
        // the start) would not make a bound for them without a scan from the start.
        head.found(&all(), 50 * SECOND, 100 * SECOND, Some(70 * SECOND), now);
        assert_eq!(head.start(&all(), now), FROM_THE_START);
        assert_eq!(head.start(&bookings, now), FROM_THE_START);
    }
}

//! Housekeeping between deliveries: DONE messages moved out of the table the claims read into
//! their day's history (every second), the hot tables compacted while vacuum is held back
//! (looked at every second), what is older than `outbox.retention` purged, all in short
//! transactions, and a warning, at most once a minute per
//! topic, for topics with pending messages nobody subscribes to (they stay pending: a producer
//! deployed ahead of its consumer is not data loss).

use super::session;
use crate::interval;
use crate::spi::{Spi, Statement};
use pgrx::datum::IntoDatum;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::collections::HashMap;
use std::time::{Duration, Instant};

// The worker's share of housekeeping: the functions operators call (outbox_archive,
// outbox_purge, and outbox_compact, which decides whether compacting is worth it). Their
// statements are one line without comments: the server log shows them as the CONTEXT of what
// the functions log (a compaction), where comments made five lines of one.
static ARCHIVE: Statement = Statement::new(include_str!("archive.sql"), &[INT4OID]);
static PURGE: Statement = Statement::new(include_str!("purge.sql"), &[INTERVALOID, INT4OID]);
static COMPACT: Statement = Statement::new(include_str!("compact.sql"), &[]);
static UNSUBSCRIBED_TOPICS: Statement = Statement::new(include_str!("unsubscribed_topics.sql"), &[]);

/// How often, at most, the worker moves DONE messages to the history ...
const ARCHIVE_INTERVAL: Duration = Duration::from_secs(1);
/// ... in transactions of at most this many messages ...
const ARCHIVE_BATCH_ROWS: i32 = 5_000;
/// ... and at most this many of them per pass.
const ARCHIVE_BATCHES_PER_PASS: usize = 10;
/// How often, at most, the worker asks whether the hot tables need compacting.
const COMPACT_INTERVAL: Duration = Duration::from_secs(1);
/// How often, at most, the worker purges ...
const PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// ... in transactions of at most this many rows ...
const PURGE_BATCH_ROWS: i32 = 10_000;
/// ... and at most this many of them per pass, so deliveries are not held up for long.
const PURGE_BATCHES_PER_PASS: usize = 30;
/// How often, at most, the worker looks for pending messages nobody subscribes to ...
const UNSUBSCRIBED_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// ... and how often, at most, it warns about the same topic.
const UNSUBSCRIBED_WARNING_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct Housekeeping {
    last_archive: Option<Instant>,
    last_purge: Option<Instant>,
    last_compact: Option<Instant>,
    last_unsubscribed_check: Option<Instant>,
    warned_about_topic: HashMap<String, Instant>,
}

impl Housekeeping {
    /// Moves DONE messages to the history, at most once a second, in transactions of bounded
    /// size; stops early when `stop` says so.
    pub fn archive_if_due(&mut self, schema: pg_sys::Oid, stop: impl Fn() -> bool) {
        if !due(&mut self.last_archive, ARCHIVE_INTERVAL) {
            return;
        }
        let batches = Batches { what: "moving DONE messages to the history", count: ARCHIVE_BATCHES_PER_PASS, rows: ARCHIVE_BATCH_ROWS };
        batches.run(&ARCHIVE, schema, Vec::new, stop);
    }

    /// Compacts the hot tables when `outbox_compact` finds it worth it (a held-back horizon has
    /// left them large), at most once a second, in a transaction of its own. Whether it did
    /// (the function itself logs what it did). Not once `stop` says so.
    pub fn compact_if_due(&mut self, schema: pg_sys::Oid, stop: impl Fn() -> bool) -> bool {
        if stop() || !due(&mut self.last_compact, COMPACT_INTERVAL) {
            return false;
        }
        match count_in_transaction(&COMPACT, schema, Vec::new) {
            Ok(kept) => kept.is_some(),
            Err(failure) => {
                pgrx::warning!("outbox_ext: compacting the hot tables failed: {failure}");
                false
            }
        }
    }

    /// Purges what is older than `retention`, at most once a minute (or once per retention,
    /// when it is shorter), in transactions of bounded size; stops early when `stop` says so.
    pub fn purge_if_due(&mut self, schema: pg_sys::Oid, retention: Option<Duration>, stop: impl Fn() -> bool) {
        let Some(retention) = retention else { return };
        let interval = PURGE_INTERVAL.min(retention.max(Duration::from_secs(1)));
        if !due(&mut self.last_purge, interval) {
            return;
        }
        let older_than = interval::from_duration(retention);
        let batches = Batches { what: "purging DONE messages", count: PURGE_BATCHES_PER_PASS, rows: PURGE_BATCH_ROWS };
        let purged_total = batches.run(&PURGE, schema, || vec![older_than.into_datum()], stop);
        if purged_total > 0 {
            pgrx::log!("outbox_ext: purged {purged_total} DONE message(s) older than outbox.retention");
        }
    }

    /// Warns about topics with pending messages but no subscription (in a transaction);
    /// `subscribed` names, in the warning, the topics the worker delivers.
    pub fn warn_about_unsubscribed_topics(&mut self, spi: &mut Spi, schema: pg_sys::Oid, subscribed: &[String]) {
        if !due(&mut self.last_unsubscribed_check, UNSUBSCRIBED_CHECK_INTERVAL) {
            return;
        }
        let rows = spi.execute(&UNSUBSCRIBED_TOPICS, schema, &[]);
        let orphans: Vec<(String, i64)> =
            (0..rows.len()).map(|row| (rows.get_text(row, 1).unwrap_or_default(), rows.get(row, 2).unwrap_or(0))).collect();
        // (Counted within a sample of the pending rows: when the sample is full, a count is a
        // lower bound.)
        let sampled: i64 = if rows.is_empty() { 0 } else { rows.get(0, 3).unwrap_or(0) };
        let at_least = if sampled >= UNSUBSCRIBED_SAMPLE_ROWS { "at least " } else { "" };
        let known = names_in_a_warning(subscribed);
        self.warned_about_topic.retain(|_, at| at.elapsed() < UNSUBSCRIBED_WARNING_INTERVAL);
        for (topic, pending) in orphans {
            if self.warned_about_topic.contains_key(&topic) {
                continue;
            }
            pgrx::warning!(
                "outbox_ext: no subscription for topic \"{topic}\": {at_least}{pending} message(s) left pending (topics with subscriptions: {known})"
            );
            self.warned_about_topic.insert(topic, Instant::now());
        }
    }
}

/// Rows of pending messages unsubscribed_topics.sql looks at, at most.
const UNSUBSCRIBED_SAMPLE_ROWS: i64 = 10_000;
/// Topic names a warning lists, at most: a database may have thousands of subscriptions.
const NAMES_IN_A_WARNING: usize = 10;

/// `names` for a log line: the first few, then how many more.
fn names_in_a_warning(names: &[String]) -> String {
    match names.len() {
        0 => "none".to_string(),
        n if n <= NAMES_IN_A_WARNING => names.join(", "),
        n => format!("{} and {} more", names[..NAMES_IN_A_WARNING].join(", "), n - NAMES_IN_A_WARNING),
    }
}

/// Whether a step last run at `last` is due again after `interval`; if so, `last` becomes now.
fn due(last: &mut Option<Instant>, interval: Duration) -> bool {
    if last.is_some_and(|at| at.elapsed() < interval) {
        return false;
    }
    *last = Some(Instant::now());
    true
}

/// Runs `statement` in a transaction of its own, with the `arguments` made inside it (their
/// memory is the transaction's), and returns its one value: a count, or NULL.
fn count_in_transaction(
    statement: &'static Statement,
    schema: pg_sys::Oid,
    arguments: impl FnOnce() -> Vec<Option<pg_sys::Datum>>,
) -> Result<Option<i64>, session::Failure> {
    session::transaction(|| {
        let arguments = arguments();
        let mut spi = Spi::connect();
        let count: Option<i64> = spi.execute(statement, schema, &arguments).get(0, 1);
        spi.finish();
        count
    })
}

/// A pass of housekeeping in batches: a statement whose last parameter is the most rows it may
/// handle and whose result is how many it did, run in transactions of its own while it handles
/// full batches, at most `count` times.
struct Batches {
    what: &'static str,
    count: usize,
    rows: i32,
}

impl Batches {
    /// Runs `statement` with the `leading` arguments and the batch size, until a batch is not
    /// full, `count` ran, or `stop` says so (before the first too: each batch may wait its
    /// lock_timeout); returns the rows handled. A failure ends the pass with a warning: the next
    /// pass tries again.
    fn run(
        &self,
        statement: &'static Statement,
        schema: pg_sys::Oid,
        leading: impl Fn() -> Vec<Option<pg_sys::Datum>>,
        stop: impl Fn() -> bool,
    ) -> i64 {
        let mut total = 0;
        for _ in 0..self.count {
            if stop() {
                break;
            }
            let arguments = || {
                let mut arguments = leading();
                arguments.push(self.rows.into_datum());
                arguments
            };
            match count_in_transaction(statement, schema, arguments) {
                Ok(handled) => {
                    let handled = handled.unwrap_or(0);
                    total += handled;
                    if handled < i64::from(self.rows) {
                        break;
                    }
                }
                Err(failure) => {
                    pgrx::warning!("outbox_ext: {} failed: {failure}", self.what);
                    break;
                }
            }
        }
        total
    }
}

#[cfg(test)]
mod unit_tests {
    use super::{due, names_in_a_warning};
    use std::time::Duration;

    #[test]
    fn a_warning_lists_ten_topics_at_most_and_counts_the_rest() {
        let names = |n: usize| (1..=n).map(|i| format!("t{i}")).collect::<Vec<_>>();
        assert_eq!(names_in_a_warning(&[]), "none");
        assert_eq!(names_in_a_warning(&names(2)), "t1, t2");
        assert_eq!(names_in_a_warning(&names(10)), "t1, t2, t3, t4, t5, t6, t7, t8, t9, t10");
        assert_eq!(names_in_a_warning(&names(2000)), "t1, t2, t3, t4, t5, t6, t7, t8, t9, t10 and 1990 more");
    }

    #[test]
    fn a_step_is_due_at_first_then_once_per_interval() {
        let mut last = None;
        assert!(due(&mut last, Duration::from_secs(60)), "never run: due");
        assert!(!due(&mut last, Duration::from_secs(60)), "just run: not due");
        assert!(due(&mut last, Duration::ZERO), "its interval past: due again");
    }
}

//! Housekeeping between deliveries: DONE messages (and the attempt log) older than
//! `outbox.retention` purged in short transactions, and a warning, at most once a minute per
//! topic, for topics with pending messages nobody subscribes to (they stay pending: a producer
//! deployed ahead of its consumer is not data loss).

use super::session;
use crate::interval;
use crate::spi::{Spi, Statement};
use pgrx::datum::IntoDatum;
use pgrx::pg_sys::{self, BuiltinOid::*};
use std::collections::HashMap;
use std::time::{Duration, Instant};

static PURGE: Statement = Statement::new(include_str!("purge.sql"), &[INTERVALOID, INT4OID]);
static UNSUBSCRIBED_TOPICS: Statement = Statement::new(include_str!("unsubscribed_topics.sql"), &[TEXTARRAYOID]);

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
    last_purge: Option<Instant>,
    last_unsubscribed_check: Option<Instant>,
    warned_about_topic: HashMap<String, Instant>,
}

impl Housekeeping {
    /// Purges what is older than `retention`, at most once a minute (or once per retention,
    /// when it is shorter), in transactions of bounded size; stops early when `stop` says so.
    pub fn purge_if_due(&mut self, schema: pg_sys::Oid, retention: Option<Duration>, stop: impl Fn() -> bool) {
        let Some(retention) = retention else { return };
        let interval = PURGE_INTERVAL.min(retention.max(Duration::from_secs(1)));
        if self.last_purge.is_some_and(|at| at.elapsed() < interval) {
            return;
        }
        self.last_purge = Some(Instant::now());
        let older_than = interval::from_duration(retention);
        let mut purged_total = 0;
        for _ in 0..PURGE_BATCHES_PER_PASS {
            let purged = session::transaction(|| {
                let mut spi = Spi::connect();
                let rows = spi.execute(&PURGE, schema, &[older_than.into_datum(), PURGE_BATCH_ROWS.into_datum()]);
                let purged: i64 = rows.get(0, 1).unwrap_or(0);
                spi.finish();
                purged
            });
            match purged {
                Ok(purged) => {
                    purged_total += purged;
                    if purged < i64::from(PURGE_BATCH_ROWS) || stop() {
                        break;
                    }
                }
                Err(failure) => {
                    pgrx::warning!("outbox_ext: purging DONE messages failed: {failure}");
                    break;
                }
            }
        }
        if purged_total > 0 {
            pgrx::log!("outbox_ext: purged {purged_total} DONE message(s) older than outbox.retention");
        }
    }

    /// Warns about topics with pending messages but no subscription (in a transaction).
    pub fn warn_about_unsubscribed_topics(&mut self, spi: &mut Spi, schema: pg_sys::Oid, subscribed: &[String]) {
        if self.last_unsubscribed_check.is_some_and(|at| at.elapsed() < UNSUBSCRIBED_CHECK_INTERVAL) {
            return;
        }
        self.last_unsubscribed_check = Some(Instant::now());
        let rows = spi.execute(&UNSUBSCRIBED_TOPICS, schema, &[subscribed.to_vec().into_datum()]);
        let orphans: Vec<(String, i64)> =
            (0..rows.len()).map(|row| (rows.get_text(row, 1).unwrap_or_default(), rows.get(row, 2).unwrap_or(0))).collect();
        let known = if subscribed.is_empty() { "none".to_string() } else { subscribed.join(", ") };
        self.warned_about_topic.retain(|_, at| at.elapsed() < UNSUBSCRIBED_WARNING_INTERVAL);
        for (topic, pending) in orphans {
            if self.warned_about_topic.contains_key(&topic) {
                continue;
            }
            pgrx::warning!(
                "outbox_ext: no subscription for topic \"{topic}\": {pending} message(s) left pending (topics with subscriptions: {known})"
            );
            self.warned_about_topic.insert(topic, Instant::now());
        }
    }
}

//! The retry policy, in one place: when a failed message (or delivery) is tried again, how many
//! attempts it gets, and when it is dead-lettered. `outbox_claim`, `outbox_fail` and the
//! delivery worker all decide through here; the settings that shape it are in `settings.rs`.
//!
//! - The schedule: `base · 2^(attempts−1)`, capped, plus jitter. Growth spares a struggling
//!   endpoint, the cap keeps a message that would succeed on the next try from waiting for
//!   days, and jitter spreads out messages that failed in the same outage so the recovering
//!   endpoint is not hit by all of them at the same instant. A `retry_in` (an endpoint's
//!   `Retry-After`) replaces the schedule for that one retry.
//! - The attempt limit and the dead-letter rule: a failure that brings `attempts` to
//!   `outbox.max_attempts` dead-letters the message; so does a claim that finds a message
//!   already at the limit (its consumers kept crashing or their leases kept running out).

use std::time::Duration;

/// An endpoint's `Retry-After` longer than this is cut to it: a misbehaving endpoint cannot park
/// a message for months. (A consumer's own `retry_in` is taken as it is.)
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// How much of an error is kept in `last_error`, in characters: enough to diagnose, bounded so
/// that a consumer failing with a huge message cannot bloat the table.
pub const MAX_ERROR_CHARS: i32 = 4096;

/// The limit and the schedule in force (from the settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub max_attempts: i32,
    pub backoff: BackoffPolicy,
}

/// What happens to a message (or delivery) after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AfterFailure {
    /// Ready again after this long.
    RetryIn(Duration),
    /// Out of attempts: DEAD, with its last error.
    Dead,
}

impl RetryPolicy {
    /// The rule for a failure that brings the attempts made to `attempts`. `retry_in` (the
    /// caller's, or an endpoint's Retry-After, capped by the worker at [`MAX_RETRY_AFTER`])
    /// replaces the schedule; `unit` is a uniform random number in [0, 1) for the jitter.
    pub fn after_failure(&self, attempts: i32, retry_in: Option<Duration>, unit: f64) -> AfterFailure {
        if attempts >= self.max_attempts {
            return AfterFailure::Dead;
        }
        let delay = match retry_in {
            Some(wait) => wait,
            None => self.backoff.delay(attempts.max(0) as u32, unit),
        };
        AfterFailure::RetryIn(delay)
    }

    /// A claim finds a message that has already had all its attempts without an outcome: it is
    /// dead-lettered instead of delivered again.
    pub fn is_exhausted(&self, attempts: i32) -> bool {
        attempts >= self.max_attempts
    }

    /// Whether the next attempt of something that has had `attempts` is its last: the worker
    /// leases such a delivery only to start it at once (claim.rs), since a crash keeps a lease's
    /// attempt counted, sent or not.
    pub fn is_last_attempt_next(&self, attempts: i32) -> bool {
        attempts + 1 >= self.max_attempts
    }

    /// Why a claim dead-lettered a message (kept in `last_error`, before the previous error):
    /// the lease of its last `holder` (a consumer, the delivery worker) ran out (it crashed or
    /// hung), or, held by none, the limit was lowered.
    pub fn exhausted_reason(&self, attempts: i32, holder: Option<&str>) -> String {
        match holder {
            Some(holder) => format!("lease expired without an outcome after {attempts} attempts (did the {holder} crash?)"),
            None => format!("attempts ({attempts}) reached outbox.max_attempts ({})", self.max_attempts),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    /// Delay after the first failed attempt.
    pub base: Duration,
    /// No delay (before jitter) exceeds this.
    pub max: Duration,
    /// Fraction in [0, 1]: the delay is stretched by a random share of up to this much.
    pub jitter: f64,
}

impl BackoffPolicy {
    /// The delay before the next attempt after `attempts` deliveries have failed,
    /// without jitter. `attempts` of 0 (a failure recorded before any claim) counts as 1.
    pub fn exact_delay(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(62);
        let factor = 1u64 << doublings;
        let base_us = u64::try_from(self.base.as_micros()).unwrap_or(u64::MAX);
        let max_us = u64::try_from(self.max.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(base_us.saturating_mul(factor).min(max_us))
    }

    /// The delay with jitter applied: `exact · (1 + jitter · unit)`, where `unit` is a
    /// uniform random number in [0, 1) supplied by the caller (so tests can pin it).
    pub fn delay(&self, attempts: u32, unit: f64) -> Duration {
        let exact = self.exact_delay(attempts);
        let stretch = self.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0);
        exact + exact.mul_f64(stretch)
    }
}

/// What a message sent to several endpoints becomes once all its deliveries have ended: DONE
/// when every endpoint took it, DEAD (saying which endpoints and why) when any delivery is.
pub fn message_outcome(delivered: usize, dead: usize, dead_errors: Option<String>) -> (&'static str, Option<String>) {
    if dead == 0 {
        ("DONE", None)
    } else {
        let why = dead_errors.unwrap_or_default();
        ("DEAD", Some(format!("{dead} of {} deliveries dead: {why}", delivered + dead)))
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    fn essay_retry_policy() -> RetryPolicy {
        RetryPolicy { max_attempts: 8, backoff: essay_policy(0.0) }
    }

    #[test]
    fn the_eighth_failure_dead_letters() {
        let policy = essay_retry_policy();
        let schedule: Vec<AfterFailure> = (1..=8).map(|attempts| policy.after_failure(attempts, None, 0.5)).collect();
        let seconds: Vec<u64> = (1..=7).map(|a| 1u64 << a).collect();
        let expected: Vec<AfterFailure> =
            seconds.iter().map(|&s| AfterFailure::RetryIn(Duration::from_secs(s))).chain([AfterFailure::Dead]).collect();
        assert_eq!(schedule, expected);
        assert_eq!(policy.after_failure(9, None, 0.0), AfterFailure::Dead);
    }

    #[test]
    fn retry_in_replaces_the_schedule_but_not_the_limit() {
        let policy = essay_retry_policy();
        assert_eq!(policy.after_failure(1, Some(Duration::from_secs(90)), 0.0), AfterFailure::RetryIn(Duration::from_secs(90)));
        assert_eq!(policy.after_failure(8, Some(Duration::from_secs(1)), 0.0), AfterFailure::Dead);
    }

    #[test]
    fn a_message_ends_dead_when_any_delivery_is() {
        assert_eq!(message_outcome(3, 0, None), ("DONE", None));
        assert_eq!(
            message_outcome(1, 1, Some("subscription 2 (http://b): HTTP 503".into())),
            ("DEAD", Some("1 of 2 deliveries dead: subscription 2 (http://b): HTTP 503".into()))
        );
    }

    #[test]
    fn a_claim_dead_letters_what_is_out_of_attempts() {
        let policy = essay_retry_policy();
        assert!(!policy.is_exhausted(7));
        assert!(policy.is_exhausted(8));
        assert!(!policy.is_last_attempt_next(6));
        assert!(policy.is_last_attempt_next(7));
        assert_eq!(
            policy.exhausted_reason(3, Some("consumer")),
            "lease expired without an outcome after 3 attempts (did the consumer crash?)"
        );
        assert!(policy.exhausted_reason(8, Some("delivery worker")).ends_with("(did the delivery worker crash?)"));
        assert_eq!(policy.exhausted_reason(9, None), "attempts (9) reached outbox.max_attempts (8)");
    }

    fn essay_policy(jitter: f64) -> BackoffPolicy {
        BackoffPolicy { base: Duration::from_secs(2), max: Duration::from_secs(256), jitter }
    }

    #[test]
    fn doubles_from_the_base_like_the_essay() {
        let policy = essay_policy(0.0);
        let schedule: Vec<u64> = (1..=8).map(|a| policy.exact_delay(a).as_secs()).collect();
        assert_eq!(schedule, vec![2, 4, 8, 16, 32, 64, 128, 256]);
    }

    #[test]
    fn is_capped() {
        let policy = essay_policy(0.0);
        assert_eq!(policy.exact_delay(9), Duration::from_secs(256));
        assert_eq!(policy.exact_delay(40), Duration::from_secs(256));
        // Absurd attempt counts neither overflow nor panic.
        assert_eq!(policy.exact_delay(u32::MAX), Duration::from_secs(256));
    }

    #[test]
    fn zero_attempts_counts_as_the_first() {
        assert_eq!(essay_policy(0.0).exact_delay(0), Duration::from_secs(2));
    }

    #[test]
    fn no_jitter_means_exact_delays() {
        let policy = essay_policy(0.0);
        assert_eq!(policy.delay(3, 0.99), Duration::from_secs(8));
    }

    #[test]
    fn jitter_stretches_within_its_fraction() {
        let policy = essay_policy(0.25);
        assert_eq!(policy.delay(3, 0.0), Duration::from_secs(8));
        assert_eq!(policy.delay(3, 0.5), Duration::from_secs(9));
        let top = policy.delay(3, 0.999_999);
        assert!(top < Duration::from_secs(10) && top > Duration::from_millis(9_999));
    }

    #[test]
    fn out_of_range_inputs_are_clamped() {
        let policy = essay_policy(5.0);
        assert_eq!(policy.delay(1, 2.0), Duration::from_secs(4));
        assert_eq!(policy.delay(1, -1.0), Duration::from_secs(2));
    }

    #[test]
    fn sub_second_bases_work() {
        let policy = BackoffPolicy { base: Duration::from_millis(250), max: Duration::from_secs(1), jitter: 0.0 };
        let schedule: Vec<u128> = (1..=4).map(|a| policy.exact_delay(a).as_millis()).collect();
        assert_eq!(schedule, vec![250, 500, 1000, 1000]);
    }
}

// The policy as SQL helpers, for consumers and operators who want to see it. (Their symbols
// keep the names pgrx gave them until 0.3.0.)

// outbox_backoff(attempts integer) RETURNS interval (STRICT): the delay before the next attempt
// of a message that has failed `attempts` times, under the current settings (with jitter).
crate::fmgr::sql_function!(outbox_backoff_wrapper, pg_finfo_outbox_backoff_wrapper, |args| {
    let attempts = crate::fmgr::required(args.get::<i32>(0), "outbox_backoff", "attempts");
    let Ok(attempts) = u32::try_from(attempts) else {
        crate::error::raise(crate::error::OutboxError::invalid(
            "outbox_backoff",
            "attempts",
            format!("must not be negative, got {attempts}"),
        ));
    };
    let delay = crate::settings::retry_policy().backoff.delay(attempts, fastrand::f64());
    pgrx::datum::IntoDatum::into_datum(crate::interval::from_duration(delay)).expect("an interval")
});

// outbox_max_attempts() RETURNS integer: outbox.max_attempts as it is now.
crate::fmgr::sql_function!(outbox_max_attempts_wrapper, pg_finfo_outbox_max_attempts_wrapper, |_args| {
    pgrx::datum::IntoDatum::into_datum(crate::settings::retry_policy().max_attempts).expect("an integer")
});

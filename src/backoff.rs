//! The retry schedule, as pure logic: `base · 2^(attempts−1)`, capped, plus jitter.
//!
//! Growth spares a struggling endpoint, the cap keeps a message that would succeed on the next
//! try from waiting for days, and jitter spreads out messages that failed in the same outage so
//! the recovering endpoint is not hit by all of them at the same instant.

use std::time::Duration;

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

#[cfg(test)]
mod unit_tests {
    use super::*;

    fn essay_policy(jitter: f64) -> BackoffPolicy {
        BackoffPolicy {
            base: Duration::from_secs(2),
            max: Duration::from_secs(256),
            jitter,
        }
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
        let policy = BackoffPolicy {
            base: Duration::from_millis(250),
            max: Duration::from_secs(1),
            jitter: 0.0,
        };
        let schedule: Vec<u128> = (1..=4).map(|a| policy.exact_delay(a).as_millis()).collect();
        assert_eq!(schedule, vec![250, 500, 1000, 1000]);
    }
}

//! Intervals as arguments: judged by where they take the clock, turned into durations (a month
//! as 30 days, as PostgreSQL compares intervals), and shown as PostgreSQL shows them (in error
//! messages).

use pgrx::datum::Interval;
use std::cmp::Ordering;
use std::time::Duration;

/// Microseconds in an interval of these parts, a month counting 30 days (as
/// `interval < interval '0'` does).
fn total_micros(months: i32, days: i32, micros: i64) -> i128 {
    let days = i128::from(months) * 30 + i128::from(days);
    days * 86_400_000_000 + i128::from(micros)
}

fn micros_of(value: &Interval) -> i128 {
    total_micros(value.months(), value.days(), value.micros())
}

/// Where adding `value` to the clock now takes it: ahead (Greater), nowhere, or back. A lease or
/// a delay is added to the clock, which counts a month as its calendar length: compared with
/// zero (a month as 30 days), '-1 year +361 days' is a day, but the clock goes back four or
/// five days with it, and a lease of it had run out when it was given.
pub fn moves_clock(value: &Interval) -> Ordering {
    let now = pgrx::datum::clock_timestamp();
    (now + *value).into_inner().cmp(&now.into_inner())
}

/// The interval as a duration; `None` when it is negative.
pub fn to_duration(value: &Interval) -> Option<Duration> {
    as_duration(micros_of(value))
}

fn as_duration(micros: i128) -> Option<Duration> {
    (micros >= 0).then(|| Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX)))
}

/// A duration as an interval (microseconds; saturating).
pub fn from_duration(value: Duration) -> Interval {
    Interval::from_micros(i64::try_from(value.as_micros()).unwrap_or(i64::MAX))
}

/// An interval as PostgreSQL shows it (its output function, through pgrx's `Display`).
pub fn shown(value: &Interval) -> String {
    value.to_string()
}

#[cfg(test)]
mod unit_tests {
    use super::*;
    use std::cmp::Ordering::*;

    #[test]
    fn compares_with_zero_like_postgres() {
        // (Mixed signs, such as '1 mon -31 days', are checked against PostgreSQL in
        // tests/integration/test_bad_input.py.)
        let sign_of = |months, days, micros| total_micros(months, days, micros).cmp(&0);
        assert_eq!(sign_of(0, 0, 0), Equal);
        assert_eq!(sign_of(0, 0, -1), Less);
        assert_eq!(sign_of(0, 0, 1), Greater);
        assert_eq!(sign_of(0, -1, 0), Less);
        assert_eq!(sign_of(-1, 0, 0), Less);
        assert_eq!(sign_of(1, 0, 0), Greater);
        assert_eq!(sign_of(1, -30, 0), Equal);
    }

    #[test]
    fn converts_to_durations() {
        assert_eq!(as_duration(total_micros(0, 1, 500_000)), Some(Duration::from_micros(86_400_500_000)));
        assert_eq!(as_duration(total_micros(0, 0, -1)), None);
    }
}

//! Intervals as arguments: bounded in how far they may move the clock, judged by where they take
//! it, turned into durations (a month as 30 days, as PostgreSQL compares intervals), and shown
//! as PostgreSQL shows them (in error messages).

use crate::error::{or_raise, Name, OutboxError};
use crate::fmgr::sql_function;
use pgrx::datum::Interval;
use std::cmp::Ordering;
use std::time::Duration;

/// The farthest an interval argument may move the clock, either way: 10,000 years of 31-day
/// months. Far enough for any delay, lease, retry or retention, and well inside what a timestamp
/// holds (294,276 AD), so that the clock moved by it never overflows. An infinite interval
/// (PostgreSQL 17 and later) reaches beyond it.
pub const MAX_YEARS: i128 = 10_000;
const DAY_MICROS: i128 = 86_400_000_000;

/// An interval argument the clock is moved by (a delay, a lease, a retry, a retention, an
/// overlap): refused when it reaches beyond [`MAX_YEARS`], before anything adds it to the clock.
pub fn validate_reach(function: impl Into<Name>, argument: impl Into<Name>, value: &Interval) -> Result<(), OutboxError> {
    if within_reach(value.months(), value.days(), value.micros()) {
        Ok(())
    } else {
        Err(OutboxError::invalid(function, argument, format!("must be finite and at most {MAX_YEARS} years, got {}", shown(value))))
    }
}

// outbox_check_interval(function text, argument text, value interval) RETURNS void: raises the
// error the SQL-language functions owe their callers for an interval beyond reach (NULL passes:
// each function says what NULL means for it).
sql_function!(outbox_check_interval_wrapper, pg_finfo_outbox_check_interval_wrapper, |args| {
    if let Some(value) = args.interval(2) {
        or_raise(validate_reach(args.text(0).unwrap_or_default(), args.text(1).unwrap_or_default(), &value));
    }
    pgrx::pg_sys::Datum::from(0)
});

fn within_reach(months: i32, days: i32, micros: i64) -> bool {
    let reach = i128::from(months).abs() * 31 * DAY_MICROS + i128::from(days).abs() * DAY_MICROS + i128::from(micros).abs();
    reach <= MAX_YEARS * 12 * 31 * DAY_MICROS
}

/// Where adding `value` to the clock now takes it: ahead (Greater), nowhere, or back. A lease or
/// a delay is added to the clock, which counts a month as its calendar length: compared with
/// zero (a month as 30 days), '-1 year +361 days' is a day, but the clock goes back four or
/// five days with it, and a lease of it had run out when it was given.
///
/// An interval whose parts agree in sign moves the clock that way, however long its months: it
/// is judged without the clock, which it could carry before 4713 BC, where timestamps begin
/// ('-9000 years'). One whose parts disagree is within [`MAX_YEARS`] (checked first) of a small
/// move, and the clock can take it.
pub fn moves_clock(value: &Interval) -> Ordering {
    if let Some(direction) = one_direction(value.months(), value.days(), value.micros()) {
        return direction;
    }
    let now = pgrx::datum::clock_timestamp();
    (now + *value).into_inner().cmp(&now.into_inner())
}

/// The way an interval of these parts moves the clock when its parts agree (zero parts agree
/// with anything); `None` when they disagree.
fn one_direction(months: i32, days: i32, micros: i64) -> Option<Ordering> {
    let signs = [months.signum(), days.signum(), micros.signum() as i32];
    let ahead = signs.iter().any(|&s| s > 0);
    let back = signs.iter().any(|&s| s < 0);
    match (ahead, back) {
        (true, true) => None,
        (true, false) => Some(Ordering::Greater),
        (false, true) => Some(Ordering::Less),
        (false, false) => Some(Ordering::Equal),
    }
}

/// How far adding `value` to the clock now takes it ahead, as a duration (zero when it goes
/// back): a month counts its calendar length, as in a delay or a lease (not 30 days). Within
/// [`MAX_YEARS`] (checked first), the clock can take it.
pub fn clock_move(value: &Interval) -> Duration {
    let now = pgrx::datum::clock_timestamp();
    let ahead = (now + *value).into_inner() - now.into_inner();
    as_duration(ahead.into()).unwrap_or_default()
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
    fn an_interval_whose_parts_agree_moves_the_clock_their_way_without_it() {
        assert_eq!(one_direction(-9_000 * 12, 0, 0), Some(Less));
        assert_eq!(one_direction(0, -3, -1), Some(Less));
        assert_eq!(one_direction(120_000, 0, 5), Some(Greater));
        assert_eq!(one_direction(0, 0, 0), Some(Equal));
        assert_eq!(one_direction(-12, 361, 0), None);
        assert_eq!(one_direction(1, 0, -1), None);
    }

    #[test]
    fn reaches_ten_thousand_years_at_most() {
        assert!(within_reach(10_000 * 12, 0, 0));
        assert!(within_reach(-10_000 * 12, 0, 0));
        assert!(within_reach(0, 3_000_000, 0));
        assert!(!within_reach(1_000_000 * 12, 0, 0));
        assert!(!within_reach(0, 0, i64::MAX));
        // PostgreSQL 17's infinities: every field at its end.
        assert!(!within_reach(i32::MAX, i32::MAX, i64::MAX));
        assert!(!within_reach(i32::MIN, i32::MIN, i64::MIN));
    }

    #[test]
    fn converts_to_durations() {
        assert_eq!(as_duration(86_400_500_000), Some(Duration::from_micros(86_400_500_000)));
        assert_eq!(as_duration(-1), None);
    }
}

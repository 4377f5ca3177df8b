//! Intervals as arguments: bounded in how far they may move the clock, judged by where they take
//! it, turned into durations (a month as 30 days, as PostgreSQL compares intervals), and shown
//! as PostgreSQL shows them (in error messages).

use crate::error::{or_raise, Name, OutboxError};
use crate::fmgr::{required, sql_function};
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
    let function = required(args.text(0), "outbox_check_interval", "function");
    let argument = required(args.text(1), "outbox_check_interval", "argument");
    if let Some(value) = args.interval(2) {
        or_raise(validate_reach(function, argument, &value));
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
/// An interval whose move is clear without the clock (see [`sure_direction`]) is judged without
/// it: the clock could not take it before 4713 BC, where timestamps begin ('-9000 years', and
/// '-9999 years 1 day', whose parts disagree). Otherwise its move is within a few days per month
/// of none, and within [`MAX_YEARS`] (checked first): the clock can take it.
pub fn moves_clock(value: &Interval) -> Ordering {
    if let Some(direction) = sure_direction(value.months(), value.days(), value.micros()) {
        return direction;
    }
    let now = pgrx::datum::clock_timestamp();
    (now + *value).into_inner().cmp(&now.into_inner())
}

/// The way an interval of these parts moves the clock, where that does not depend on the date it
/// starts from: its parts agree in sign, or a month counted as short (28 days) or as long (31)
/// as suits the other parts still leaves it more than two days (a day of the calendar is 23 to
/// 25 hours across a change of the time zone's offset, a day more where a zone skipped a date)
/// one way. `None` when only the clock can tell.
fn sure_direction(months: i32, days: i32, micros: i64) -> Option<Ordering> {
    if let Some(direction) = one_direction(months, days, micros) {
        return Some(direction);
    }
    let (months, rest) = (i128::from(months), i128::from(days) * DAY_MICROS + i128::from(micros));
    let (shortest, longest) = if months < 0 { (31, 28) } else { (28, 31) };
    let (least, most) = (months * shortest * DAY_MICROS + rest, months * longest * DAY_MICROS + rest);
    if most < -2 * DAY_MICROS {
        Some(Ordering::Less)
    } else if least > 2 * DAY_MICROS {
        Some(Ordering::Greater)
    } else {
        None
    }
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
/// back): a month counts its calendar length, as in a delay or a lease (not 30 days). For an
/// interval within [`MAX_YEARS`] that [`moves_clock`] does not find going back: the clock can
/// take it (ahead, 10,000 years stay far inside what a timestamp holds).
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
    fn an_interval_far_one_way_moves_the_clock_that_way_without_it_whatever_its_parts() {
        const DAY: i64 = 86_400_000_000;
        // Back beyond 4713 BC, where the clock's arithmetic fails (PostgreSQL's 22008).
        assert_eq!(sure_direction(-9_999 * 12, 1, 0), Some(Less));
        assert_eq!(sure_direction(0, -3_000_000, 1), Some(Less));
        assert_eq!(sure_direction(1, -40, 0), Some(Less)); // a month is at most 31 days
        assert_eq!(sure_direction(-1, 34, 0), Some(Greater)); // ... and at least 28
        assert_eq!(sure_direction(0, 3, -DAY / 2), Some(Greater));
        assert_eq!(sure_direction(1, 0, -1), Some(Greater)); // a month less a microsecond

        // Near no move, the date it starts from decides: the clock is asked.
        assert_eq!(sure_direction(-12, 361, 0), None); // 4 or 5 days back
        assert_eq!(sure_direction(1, -27, 0), None); // 1 to 4 days ahead
        assert_eq!(sure_direction(0, 1, -DAY), None); // a day less a day: DST may tip it
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

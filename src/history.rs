//! The history of DONE messages (docs/storage.md): `outbox_history_N` and
//! `outbox_delivery_history_N`, N the UTC day of the completion modulo 32. `outbox_complete`
//! writes a message there directly (src/complete); `outbox_archive` (sql/operations.sql) moves
//! the rest; `outbox_purge` empties whole days.

use pgrx::pg_sys;

/// The days the history (and the attempt log) cycle through.
pub const DAYS: i64 = 32;

const MICROS_PER_DAY: i64 = 86_400_000_000;
/// Days between the Unix epoch and PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_DAYS: i64 = 10_957;

/// The slot N of the day of `timestamp`: the rule of `outbox_attempt_log_slot()` in
/// sql/schema.sql, which the SQL side uses (a `#[pg_test]` checks the two agree).
pub fn day_slot(timestamp: pg_sys::TimestampTz) -> u8 {
    let day = timestamp.div_euclid(MICROS_PER_DAY) + POSTGRES_EPOCH_DAYS;
    day.rem_euclid(DAYS) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = MICROS_PER_DAY;

    #[test]
    fn the_unix_epoch_is_slot_zero_and_each_utc_day_the_next() {
        let unix_epoch = -POSTGRES_EPOCH_DAYS * DAY;
        assert_eq!(day_slot(unix_epoch), 0);
        assert_eq!(day_slot(unix_epoch + DAY - 1), 0);
        assert_eq!(day_slot(unix_epoch + DAY), 1);
        assert_eq!(day_slot(unix_epoch - 1), 31);
        assert_eq!(day_slot(unix_epoch + 32 * DAY), 0);
    }

    #[test]
    fn the_postgres_epoch_is_day_10957() {
        assert_eq!(day_slot(0), (10_957 % 32) as u8);
        assert_eq!(day_slot(-1), (10_956 % 32) as u8);
    }
}

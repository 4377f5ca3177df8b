//! What a topic may look like: an event name such as `booking.created` or `invoice:paid`.
//!
//! One definition serves the argument checks of the API (`outbox_check_topic`, and
//! `outbox_enqueue` directly) and the CHECK constraint of `outbox_subscription`
//! (`outbox_topic_is_valid`), so they can never disagree.

use crate::errors::null_argument;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;

/// The length of the `topic varchar(64)` column.
pub const MAX_TOPIC_CHARS: usize = 64;

#[derive(Debug, PartialEq, Eq)]
pub enum TopicProblem {
    Empty,
    TooLong(usize),
    IllFormed,
}

/// ASCII letters and digits, then also `_ . : -`; 1 to 64 characters.
pub fn check(topic: &str) -> Result<(), TopicProblem> {
    let chars = topic.chars().count();
    if chars == 0 {
        return Err(TopicProblem::Empty);
    }
    if chars > MAX_TOPIC_CHARS {
        return Err(TopicProblem::TooLong(chars));
    }
    let mut bytes = topic.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
    let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(TopicProblem::IllFormed)
    }
}

/// True when `topic` is a well-formed event name.
#[pg_extern(immutable, strict, parallel_safe)]
fn outbox_topic_is_valid(topic: &str) -> bool {
    check(topic).is_ok()
}

/// Raises the error a caller deserves for a bad topic argument, naming the function and the
/// argument; returns quietly for a good one.
#[pg_extern(immutable, parallel_safe)]
fn outbox_check_topic(function: &str, argument: &str, topic: Option<&str>) {
    require_valid(function, argument, topic);
}

/// The body of `outbox_check_topic`, for callers in Rust.
pub fn require_valid(function: &str, argument: &str, topic: Option<&str>) {
    let Some(topic) = topic else { null_argument(function, argument) };
    match check(topic) {
        Ok(()) => {}
        Err(TopicProblem::Empty) => {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{function}: {argument} must not be empty")
            );
        }
        Err(TopicProblem::TooLong(chars)) => {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_STRING_DATA_RIGHT_TRUNCATION,
                format!("{function}: {argument} is {chars} characters long, the limit is {MAX_TOPIC_CHARS}")
            );
        }
        Err(TopicProblem::IllFormed) => {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{function}: {argument} {topic:?} is not a valid event name"),
                "A topic starts with an ASCII letter or digit and continues with letters, digits, '_', '.', ':' or '-', e.g. 'booking.created'."
            );
        }
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn accepts_event_names() {
        for topic in ["booking.created", "invoice:paid", "user_signed-up.v2", "A", "9lives"] {
            assert_eq!(check(topic), Ok(()), "{topic}");
        }
        assert_eq!(check(&"a".repeat(64)), Ok(()));
    }

    #[test]
    fn refuses_empty_long_and_odd_names() {
        assert_eq!(check(""), Err(TopicProblem::Empty));
        assert_eq!(check(&"a".repeat(65)), Err(TopicProblem::TooLong(65)));
        for topic in [" booking", "booking created", ".hidden", "-x", "café.opened", "a\nb", "a;drop", "a\0b"] {
            assert_eq!(check(topic), Err(TopicProblem::IllFormed), "{topic:?}");
        }
    }

    #[test]
    fn counts_characters_not_bytes() {
        // 64 multi-byte characters are too ill-formed, but not "too long".
        assert_eq!(check(&"é".repeat(64)), Err(TopicProblem::IllFormed));
        assert_eq!(check(&"é".repeat(65)), Err(TopicProblem::TooLong(65)));
    }
}

//! What a topic may look like: an event name such as `booking.created` or `invoice:paid`.
//!
//! One definition serves every argument check (`outbox_enqueue`, `outbox_claim`, the
//! subscriptions, the dead-letter tools) and the CHECK constraint of `outbox_subscription`
//! (`outbox_topic_is_valid`), so they can never disagree.

use crate::error::{or_raise, Name, OutboxError};
use crate::fmgr::{required, sql_function};
use crate::spi::Statement;
use pgrx::datum::IntoDatum;
use pgrx::pg_sys;
use std::sync::OnceLock;

/// The length of the `topic varchar(64)` column.
pub const MAX_TOPIC_CHARS: usize = 64;

const TOPIC_HINT: &str =
    "A topic starts with an ASCII letter or digit and continues with letters, digits, '_', '.', ':' or '-', e.g. 'booking.created'.";

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

/// The error a caller deserves for a bad topic argument, naming the function and the argument.
pub fn validate(function: impl Into<Name>, argument: impl Into<Name>, topic: Option<&str>) -> Result<(), OutboxError> {
    let Some(topic) = topic else { return Err(OutboxError::null(function, argument)) };
    match check(topic) {
        Ok(()) => Ok(()),
        Err(TopicProblem::Empty) => Err(OutboxError::invalid(function, argument, "must not be empty")),
        Err(TopicProblem::TooLong(chars)) => {
            Err(OutboxError::too_long(function, argument, format!("is {chars} characters long, the limit is {MAX_TOPIC_CHARS}")))
        }
        Err(TopicProblem::IllFormed) => {
            Err(OutboxError::invalid(function, argument, format!("{topic:?} is not a valid event name")).with_hint(TOPIC_HINT))
        }
    }
}

/// [`validate`], raising the error.
pub fn require_valid(function: &'static str, argument: &'static str, topic: Option<&str>) {
    or_raise(validate(function, argument, topic));
}

/// The topic argument, valid (else the error, raised).
pub fn valid_argument(function: &'static str, argument: &'static str, topic: Option<String>) -> String {
    require_valid(function, argument, topic.as_deref());
    topic.unwrap_or_default() // (require_valid raised for NULL)
}

/// The topic filter of the statements that walk the ready queue in order (src/claim/lock.sql,
/// src/worker/pick_up.sql), as written there: a kept plan compares each row it walks past with
/// every topic in turn.
const TOPICS_MATCHED_IN_TURN: &str = "o.topic::pg_catalog.text OPERATOR(pg_catalog.=) ANY ($2)";
/// The same through a sub-select, which PostgreSQL hashes once per run (inside IS TRUE, so that
/// the planner keeps it a filter of the ordered walk rather than a join).
const TOPICS_MATCHED_BY_HASH: &str =
    "(o.topic::pg_catalog.text OPERATOR(pg_catalog.=) ANY (SELECT pg_catalog.unnest($2::pg_catalog.text[]))) IS TRUE";
/// From this many topics on, the statements match them by hash: per row walked past, comparing
/// with one or two topics costs less than a hash probe, and with four or more it costs more
/// (side runs, bench/README.md); with thousands, comparing made a claim take seconds.
const MANY_TOPICS: usize = 4;

/// `sql` (one of the statements above) with its topic filter matched by hash, for [`MANY_TOPICS`]
/// or more. Made once per process: the text is kept for good, as the statement's is.
fn with_topics_matched_by_hash(sql: &'static str) -> &'static str {
    assert_eq!(sql.matches(TOPICS_MATCHED_IN_TURN).count(), 1, "a statement with one topic filter");
    Box::leak(sql.replacen(TOPICS_MATCHED_IN_TURN, TOPICS_MATCHED_BY_HASH, 1).into_boxed_str())
}

/// A statement that walks the ready queue in order for a list of topics ($2), in the two forms
/// above: the one to run for a number of topics is [`WalkOfTopics::for_topics`].
pub struct WalkOfTopics {
    in_turn: Statement,
    by_hash: OnceLock<Statement>,
}

impl WalkOfTopics {
    pub const fn new(sql: &'static str, parameter_types: &'static [pg_sys::BuiltinOid]) -> Self {
        WalkOfTopics { in_turn: Statement::new(sql, parameter_types), by_hash: OnceLock::new() }
    }

    /// The form for `count` topics (0: all topics, no list).
    pub fn for_topics(&'static self, count: usize) -> &'static Statement {
        if count < MANY_TOPICS {
            return &self.in_turn;
        }
        self.by_hash.get_or_init(|| Statement::new(with_topics_matched_by_hash(self.in_turn.sql), self.in_turn.parameter_types))
    }
}

// The symbol names of these two are those pgrx gave them until 0.3.0: databases not yet
// updated (ALTER EXTENSION outbox_ext UPDATE) call them by those names.

// outbox_topic_is_valid(topic text) RETURNS boolean (STRICT): whether `topic` is well formed.
sql_function!(outbox_topic_is_valid_wrapper, pg_finfo_outbox_topic_is_valid_wrapper, |args| {
    let topic = required(args.text(0), "outbox_topic_is_valid", "topic");
    check(&topic).is_ok().into_datum().unwrap()
});

// outbox_check_topic(function text, argument text, topic text) RETURNS void: raises the error
// the SQL-language functions owe their callers for a bad topic.
sql_function!(outbox_check_topic_wrapper, pg_finfo_outbox_check_topic_wrapper, |args| {
    let function = required(args.text(0), "outbox_check_topic", "function");
    let argument = required(args.text(1), "outbox_check_topic", "argument");
    or_raise(validate(function, argument, args.text(2).as_deref()));
    pgrx::pg_sys::Datum::from(0)
});

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn the_ready_queues_walks_match_many_topics_by_hash() {
        for sql in [include_str!("claim/lock.sql"), include_str!("worker/pick_up.sql")] {
            let hashed = with_topics_matched_by_hash(sql);
            assert_eq!(hashed.matches(TOPICS_MATCHED_BY_HASH).count(), 1);
            assert!(!hashed.contains(TOPICS_MATCHED_IN_TURN));
            assert_eq!(hashed.replace(TOPICS_MATCHED_BY_HASH, TOPICS_MATCHED_IN_TURN), sql, "nothing else changed");
        }
    }

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

    #[test]
    fn errors_name_the_function_and_the_argument() {
        let error = validate("outbox_claim", "topics", Some("not a topic")).unwrap_err();
        assert_eq!(error.to_string(), "outbox_claim: topics \"not a topic\" is not a valid event name");
        assert!(matches!(error, OutboxError::InvalidArgument { .. }));
        assert!(matches!(validate("f", "topic", None).unwrap_err(), OutboxError::NullArgument { .. }));
        assert!(matches!(validate("f", "topic", Some(&"a".repeat(65))).unwrap_err(), OutboxError::TooLong { .. }));
    }
}

//! The extension's errors: each kind has one SQLSTATE, and every error is raised through
//! [`raise`], so a caller can tell bad input (class 22) from a fault of ours (XX000), and no
//! Rust backtrace ever reaches a client (see `lib.rs`).
//!
//! docs/api.md has the table of these errors; a unit test below keeps the two in step.

use crate::text;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgLogLevel;
use std::borrow::Cow;

/// A function's or an argument's name: usually a literal, sometimes passed in from SQL.
pub type Name = Cow<'static, str>;

/// What is wrong with a value, in words that complete "<function>: <argument> …" (checks that
/// know no function, such as a URL's or a setting's, return it; the caller makes it an
/// [`OutboxError::InvalidArgument`], or a setting's DETAIL).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Problem(pub String);

impl From<&str> for Problem {
    fn from(text: &str) -> Self {
        Problem(text.to_string())
    }
}

impl From<String> for Problem {
    fn from(text: String) -> Self {
        Problem(text)
    }
}

impl From<Problem> for String {
    fn from(problem: Problem) -> Self {
        problem.0
    }
}

/// What went wrong, with the function and the argument it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboxError {
    /// A required argument is NULL.
    #[error("{function}: {argument} must not be NULL")]
    NullArgument { function: Name, argument: Name, hint: Option<&'static str> },
    /// An array argument holds a NULL where every element needs a value.
    #[error("{function}: {argument} must not contain NULL")]
    NullElement { function: Name, argument: Name },
    /// An argument out of range or ill-formed.
    #[error("{function}: {argument} {problem}")]
    InvalidArgument { function: Name, argument: Name, problem: String, hint: Option<&'static str> },
    /// A string longer than its column allows.
    #[error("{function}: {argument} {problem}")]
    TooLong { function: Name, argument: Name, problem: String },
    /// A function that writes, called in a transaction that may not write (BEGIN READ ONLY,
    /// default_transaction_read_only, a hot standby).
    #[error("{function}: cannot run in a read-only transaction")]
    ReadOnlyTransaction { function: &'static str },
    /// The library was updated but this database's extension was not (yet).
    #[error("outbox_ext: this database has outbox_ext {installed} but the server runs its library {library}: run ALTER EXTENSION outbox_ext UPDATE")]
    WrongVersion { installed: String, library: String },
    /// A fault of the extension or of the server under it, not of the caller.
    #[error("outbox_ext: {0}")]
    Internal(String),
}

impl OutboxError {
    pub fn null(function: impl Into<Name>, argument: impl Into<Name>) -> Self {
        OutboxError::NullArgument { function: function.into(), argument: argument.into(), hint: None }
    }

    pub fn null_element(function: impl Into<Name>, argument: impl Into<Name>) -> Self {
        OutboxError::NullElement { function: function.into(), argument: argument.into() }
    }

    pub fn invalid(function: impl Into<Name>, argument: impl Into<Name>, problem: impl Into<String>) -> Self {
        OutboxError::InvalidArgument { function: function.into(), argument: argument.into(), problem: problem.into(), hint: None }
    }

    /// The same error, with a HINT for the person reading it.
    pub fn with_hint(self, text: &'static str) -> Self {
        match self {
            OutboxError::NullArgument { function, argument, .. } => OutboxError::NullArgument { function, argument, hint: Some(text) },
            OutboxError::InvalidArgument { function, argument, problem, .. } => {
                OutboxError::InvalidArgument { function, argument, problem, hint: Some(text) }
            }
            other => other,
        }
    }

    /// The SQL function the error concerns, for its LOCATION ("outbox_ext" when it is none or
    /// a name made at run time).
    fn function_name(&self) -> &'static str {
        match self {
            OutboxError::NullArgument { function: Cow::Borrowed(name), .. }
            | OutboxError::NullElement { function: Cow::Borrowed(name), .. }
            | OutboxError::InvalidArgument { function: Cow::Borrowed(name), .. }
            | OutboxError::TooLong { function: Cow::Borrowed(name), .. } => name,
            OutboxError::ReadOnlyTransaction { function } => function,
            _ => "outbox_ext",
        }
    }

    fn hint(&self) -> Option<&'static str> {
        match self {
            OutboxError::NullArgument { hint, .. } | OutboxError::InvalidArgument { hint, .. } => *hint,
            OutboxError::ReadOnlyTransaction { .. } => {
                Some("On a hot standby, call it on the primary; otherwise in a transaction that is not READ ONLY (see default_transaction_read_only).")
            }
            _ => None,
        }
    }

    pub fn too_long(function: impl Into<Name>, argument: impl Into<Name>, problem: impl Into<String>) -> Self {
        OutboxError::TooLong { function: function.into(), argument: argument.into(), problem: problem.into() }
    }

    /// The SQLSTATE of this kind of error, as PostgreSQL's code and as text.
    fn sqlstate(&self) -> (PgSqlErrorCode, &'static str) {
        match self {
            OutboxError::NullArgument { .. } | OutboxError::NullElement { .. } => (PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, "22004"),
            OutboxError::InvalidArgument { .. } => (PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, "22023"),
            OutboxError::TooLong { .. } => (PgSqlErrorCode::ERRCODE_STRING_DATA_RIGHT_TRUNCATION, "22001"),
            OutboxError::ReadOnlyTransaction { .. } => (PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION, "25006"),
            OutboxError::WrongVersion { .. } => (PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "55000"),
            OutboxError::Internal(_) => (PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "XX000"),
        }
    }
}

/// Raises `error` as a PostgreSQL ERROR: the current transaction (or subtransaction) aborts.
/// Its LOCATION (shown with `VERBOSITY verbose`) names the SQL function and the line of Rust
/// that raised it.
#[track_caller]
pub fn raise(error: OutboxError) -> ! {
    // The message may quote the caller's values; shown in a database that is not UTF-8, any
    // character outside ASCII is escaped rather than sent as bytes it does not hold.
    let message = text::for_server_message(&error.to_string()).into_owned();
    let mut report = ErrorReport::new(error.sqlstate().0, message, error.function_name());
    if let Some(hint) = error.hint() {
        report = report.set_hint(hint);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("an ERROR does not return")
}

/// Raises 25006 naming `function` when the transaction may not write (BEGIN READ ONLY,
/// default_transaction_read_only, a hot standby). PostgreSQL's own error named the first
/// statement of ours that wrote (`outbox_complete`: "cannot execute SELECT in a read-only
/// transaction"), not the function.
pub fn require_writable(function: &'static str) {
    // SAFETY: XactReadOnly is this backend's.
    if unsafe { pgrx::pg_sys::XactReadOnly } {
        raise(OutboxError::ReadOnlyTransaction { function });
    }
}

/// `result`'s value, or its error raised.
#[track_caller]
pub fn or_raise<T>(result: Result<T, OutboxError>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => raise(error),
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn messages_name_the_function_and_the_argument() {
        assert_eq!(OutboxError::null("outbox_claim", "batch_size").to_string(), "outbox_claim: batch_size must not be NULL");
        let with_hint = OutboxError::null("outbox_enqueue", "payload").with_hint("use '{}'");
        assert_eq!(with_hint.to_string(), "outbox_enqueue: payload must not be NULL");
        assert_eq!(with_hint.hint(), Some("use '{}'"));
        assert_eq!(
            OutboxError::invalid("outbox_claim", "lease", "must be positive, got 00:00:00").to_string(),
            "outbox_claim: lease must be positive, got 00:00:00"
        );
    }

    /// One of each kind of error.
    fn every_kind() -> Vec<OutboxError> {
        vec![
            OutboxError::null("f", "a"),
            OutboxError::null_element("f", "a"),
            OutboxError::invalid("f", "a", "x"),
            OutboxError::too_long("f", "a", "x"),
            OutboxError::ReadOnlyTransaction { function: "f" },
            OutboxError::WrongVersion { installed: "0.3.0".into(), library: "0.4.0".into() },
            OutboxError::Internal("x".into()),
        ]
    }

    #[test]
    fn each_kind_has_its_sqlstate() {
        let codes: Vec<&str> = every_kind().iter().map(|e| e.sqlstate().1).collect();
        assert_eq!(codes, ["22004", "22004", "22023", "22001", "25006", "55000", "XX000"]);
    }

    /// docs/api.md's table of errors names exactly the SQLSTATEs raised here.
    #[test]
    fn the_documented_table_matches() {
        let docs = include_str!("../docs/api.md");
        let table = docs.split("## Errors").nth(1).expect("docs/api.md has an Errors section");
        let documented: Vec<&str> = table
            .lines()
            .take_while(|line| !line.starts_with("## "))
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        let mut raised: Vec<&str> = every_kind().iter().map(|e| e.sqlstate().1).collect();
        raised.sort();
        raised.dedup();
        let mut listed = documented.clone();
        listed.sort();
        assert_eq!(listed, raised, "docs/api.md's error table and error.rs disagree");
    }
}

//! What differs between the PostgreSQL versions outbox_ext supports (15 to 18), in one place.

/// Flags for a background worker's connection. From PostgreSQL 17 a worker may connect as a
/// role without LOGIN (the worker's role is NOLOGIN there); before, it may not (sql/privileges.sql
/// gives the role LOGIN on 15 and 16, without a password).
#[cfg(any(feature = "pg15", feature = "pg16"))]
pub const BGWORKER_CONNECT_FLAGS: u32 = 0;
#[cfg(not(any(feature = "pg15", feature = "pg16")))]
pub const BGWORKER_CONNECT_FLAGS: u32 = pgrx::pg_sys::BGWORKER_BYPASS_ROLELOGINCHECK;

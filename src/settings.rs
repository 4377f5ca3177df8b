//! Settings (GUCs). All of them are `USERSET`: they can be set per session, per role
//! (`ALTER ROLE … SET`), per database (`ALTER DATABASE … SET`) or server-wide.

use crate::backoff::BackoffPolicy;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::time::Duration;

pub static MAX_ATTEMPTS: GucSetting<i32> = GucSetting::<i32>::new(8);
pub static BACKOFF_BASE_MS: GucSetting<i32> = GucSetting::<i32>::new(2_000);
pub static BACKOFF_MAX_MS: GucSetting<i32> = GucSetting::<i32>::new(3_600_000);
pub static BACKOFF_JITTER: GucSetting<f64> = GucSetting::<f64>::new(0.2);

pub fn register() {
    GucRegistry::define_int_guc(
        c"outbox.max_attempts",
        c"Deliveries of a message before it is dead-lettered.",
        c"A message whose delivery fails (or whose lease runs out) this many times becomes DEAD.",
        &MAX_ATTEMPTS,
        1,
        1_000,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"outbox.backoff_base",
        c"Delay before retrying after the first failed attempt.",
        c"The n-th failure waits backoff_base * 2^(n-1), capped by outbox.backoff_max, plus jitter.",
        &BACKOFF_BASE_MS,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"outbox.backoff_max",
        c"Longest delay between two attempts, before jitter.",
        c"Caps the exponential growth of outbox.backoff_base.",
        &BACKOFF_MAX_MS,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_float_guc(
        c"outbox.backoff_jitter",
        c"Random stretch of each retry delay, as a fraction of it (0 makes delays exact).",
        c"A delay d becomes a uniform random value in [d, d * (1 + jitter)).",
        &BACKOFF_JITTER,
        0.0,
        1.0,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// The retry policy as the current settings define it.
pub fn backoff_policy() -> BackoffPolicy {
    BackoffPolicy {
        base: Duration::from_millis(BACKOFF_BASE_MS.get() as u64),
        max: Duration::from_millis(BACKOFF_MAX_MS.get() as u64),
        jitter: BACKOFF_JITTER.get(),
    }
}

pub fn max_attempts() -> i32 {
    MAX_ATTEMPTS.get()
}

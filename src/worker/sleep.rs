//! Sleep, the worker's last step: wait until an answer comes back (the helper threads' socket),
//! the latch is set (a producer's commit, a signal, a request to leave) or the timeout passes.

use pgrx::pg_sys;
use std::os::fd::RawFd;
use std::time::Duration;

/// What ended the wait.
#[derive(Debug, PartialEq, Eq)]
pub struct Woken {
    pub by_answer: bool,
    pub by_latch: bool,
}

/// Waits on the latch and `answers` (if any) for at most `timeout`. Exits the process if the
/// postmaster died.
pub fn wait(answers: Option<RawFd>, timeout: Duration) -> Woken {
    let mut events = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    if answers.is_some() {
        events |= pg_sys::WL_SOCKET_READABLE;
    }
    let socket = answers.unwrap_or(pg_sys::PGINVALID_SOCKET);
    // (Rounded up: a wait of less than a millisecond would otherwise be none, and the loop
    // would spin until the moment it waits for.)
    let timeout_ms = i64::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(i64::MAX).max(0);
    // SAFETY: waits on this process's latch and (if any) an fd it owns; resets the latch it reports.
    let happened = unsafe {
        let happened = pg_sys::WaitLatchOrSocket(pg_sys::MyLatch, events as i32, socket, timeout_ms as _, pg_sys::PG_WAIT_EXTENSION);
        if happened & pg_sys::WL_LATCH_SET as i32 != 0 {
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        happened
    };
    Woken { by_answer: happened & pg_sys::WL_SOCKET_READABLE as i32 != 0, by_latch: happened & pg_sys::WL_LATCH_SET as i32 != 0 }
}

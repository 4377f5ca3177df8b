//! Every request ends by its timeout, whatever the receiver does.
//!
//! ureq bounds each blocking write by the time the request has left when the write starts. A
//! receiver that takes part of a large body and then stops makes the partial write return and
//! the next one wait that long again: a 5 MB payload with a 10 s timeout took 20 – 30 s, past
//! its lease, so the worker sent the delivery again while the first request was still out. So
//! every socket the agent opens is watched: while a request waits on it, a watchdog thread
//! holds the request's deadline, and shuts the socket down if the deadline passes (which ends
//! any blocked write or read at once). In the ordinary case ureq's own timeout fires first, a
//! moment before: [`GRACE`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};
use ureq::unversioned::transport::{Buffers, ConnectionDetails, Connector, Either, NextTimeout, ShutdownHandle, TcpConnector, Transport};

/// How long past its deadline a request may wait before the watchdog cuts it off.
const GRACE: Duration = Duration::from_millis(100);

/// A TCP connector whose transports are watched ([`Watched`]).
#[derive(Debug, Default)]
pub struct WatchedTcpConnector(TcpConnector);

impl<In: Transport> Connector<In> for WatchedTcpConnector {
    type Out = Either<In, Watched>;

    fn connect(&self, details: &ConnectionDetails, chained: Option<In>) -> Result<Option<Self::Out>, ureq::Error> {
        if let Some(transport) = chained {
            return Ok(Some(Either::A(transport)));
        }
        // The socket's shutdown handle, as the TCP connector registers it with the agent.
        let handle: Arc<Mutex<Option<Weak<dyn ShutdownHandle>>>> = Arc::default();
        let register_with_agent = Arc::clone(&details.register_shutdown);
        let kept = Arc::clone(&handle);
        let watched_details = ConnectionDetails {
            uri: details.uri,
            addrs: details.addrs.clone(),
            config: details.config,
            request_level: details.request_level,
            resolver: details.resolver,
            now: details.now,
            timeout: details.timeout,
            current_time: Arc::clone(&details.current_time),
            run_connector: Arc::clone(&details.run_connector),
            register_shutdown: Arc::new(move |socket: Weak<dyn ShutdownHandle>| {
                *kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(socket.clone());
                register_with_agent(socket)
            }),
        };
        let Some(transport) = Connector::<()>::connect(&self.0, &watched_details, None)? else {
            return Ok(None);
        };
        let socket = handle.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Either::B(tcp) = transport else { unreachable!("no transport was chained before") };
        Ok(Some(Either::B(Watched { inner: Box::new(tcp), socket })))
    }
}

/// A transport whose every wait is cut off by the watchdog at its deadline.
pub struct Watched {
    inner: Box<dyn Transport>,
    socket: Option<Weak<dyn ShutdownHandle>>,
}

impl fmt::Debug for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched").field("inner", &self.inner).finish()
    }
}

impl Watched {
    /// Arms the watchdog for a wait of at most `timeout` (none when it never times out).
    fn watch(&self, timeout: &NextTimeout) -> Option<Watch> {
        let after = timeout.not_zero()?;
        let socket = self.socket.clone()?;
        Some(watchdog().arm(Instant::now() + *after + GRACE, socket))
    }
}

impl Transport for Watched {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        let _armed = self.watch(&timeout);
        self.inner.transmit_output(amount, timeout)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        let _armed = self.watch(&timeout);
        self.inner.await_input(timeout)
    }

    fn is_open(&mut self) -> bool {
        self.inner.is_open()
    }
}

/// A wait's deadline, and the socket to shut down when it passes.
type Deadline = (Instant, Weak<dyn ShutdownHandle>);

/// The deadlines of the waits in progress, and the thread that enforces them.
struct Watchdog {
    state: Mutex<Armed>,
    changed: Condvar,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Armed {
    deadlines: BTreeMap<u64, Deadline>,
    /// Until when the watchdog thread sleeps (None: until woken). Only a deadline earlier than
    /// that wakes it: most requests arm one later than those already held, so arming one costs
    /// a lock and no thread switch.
    sleeping_until: Option<Instant>,
}

/// A wait the watchdog holds a deadline for, until this is dropped.
struct Watch {
    id: u64,
}

impl Drop for Watch {
    fn drop(&mut self) {
        watchdog().state.lock().unwrap_or_else(|e| e.into_inner()).deadlines.remove(&self.id);
    }
}

/// The process's watchdog, started by the first request. Requests run on the worker's helper
/// threads, which have every signal blocked (src/worker/deliver.rs): the watchdog thread
/// inherits that, so it never runs a PostgreSQL signal handler either.
fn watchdog() -> &'static Watchdog {
    static WATCHDOG: OnceLock<&'static Watchdog> = OnceLock::new();
    WATCHDOG.get_or_init(|| {
        let watchdog: &'static Watchdog =
            Box::leak(Box::new(Watchdog { state: Mutex::default(), changed: Condvar::new(), next_id: AtomicU64::new(0) }));
        std::thread::Builder::new()
            .name("outbox-watchdog".into())
            .spawn(move || watchdog.run())
            .expect("starting the requests' watchdog thread");
        watchdog
    })
}

impl Watchdog {
    fn arm(&self, deadline: Instant, socket: Weak<dyn ShutdownHandle>) -> Watch {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.deadlines.insert(id, (deadline, socket));
        if state.sleeping_until.is_none_or(|until| deadline < until) {
            state.sleeping_until = Some(deadline);
            self.changed.notify_one();
        }
        Watch { id }
    }

    /// Shuts down the socket of each wait whose deadline has passed; sleeps until the next.
    fn run(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            let overdue: Vec<u64> = state.deadlines.iter().filter(|(_, (deadline, _))| *deadline <= now).map(|(&id, _)| id).collect();
            for id in overdue {
                if let Some(socket) = state.deadlines.remove(&id).and_then(|(_, socket)| socket.upgrade()) {
                    socket.shutdown();
                }
            }
            state.sleeping_until = state.deadlines.values().map(|(deadline, _)| *deadline).min();
            state = match state.sleeping_until {
                Some(until) => self.changed.wait_timeout(state, until.saturating_duration_since(now)).unwrap_or_else(|e| e.into_inner()).0,
                None => self.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[derive(Default)]
    struct Socket {
        shut: AtomicBool,
    }

    impl ShutdownHandle for Socket {
        fn shutdown(&self) {
            self.shut.store(true, Ordering::SeqCst);
        }
    }

    fn handle(socket: &Arc<Socket>) -> Weak<dyn ShutdownHandle> {
        Arc::downgrade(socket) as Weak<dyn ShutdownHandle>
    }

    #[test]
    fn a_wait_past_its_deadline_has_its_socket_shut_down_and_one_that_ended_in_time_not() {
        let (overdue, in_time) = (Arc::new(Socket::default()), Arc::new(Socket::default()));
        let _still_waiting = watchdog().arm(Instant::now() + Duration::from_millis(50), handle(&overdue));
        drop(watchdog().arm(Instant::now() + Duration::from_millis(50), handle(&in_time)));
        let given_up_at = Instant::now() + Duration::from_secs(5);
        while !overdue.shut.load(Ordering::SeqCst) && Instant::now() < given_up_at {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(overdue.shut.load(Ordering::SeqCst), "the overdue wait's socket was not shut down");
        assert!(!in_time.shut.load(Ordering::SeqCst), "a wait that ended in time was cut off");
    }
}

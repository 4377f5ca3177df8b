//! Deliver, the worker's second step: requests in flight. A pool of helper threads sends the
//! claimed deliveries over HTTP, each request on its own (one slow endpoint holds only the
//! threads of its own requests). The threads never call into PostgreSQL: they hand each
//! answer back through a channel and wake the main thread through a socket it waits on beside
//! its latch.

use super::claim::Claimed;
use crate::webhook::{self, AllowedNetworks, Answer, Endpoint, Message};
use nix::sys::signal::{SigSet, SigmaskHow};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// One request to make.
struct Job {
    message_id: i64,
    subscription_id: i64,
    endpoint: Arc<Endpoint>,
    message: Arc<Message>,
}

/// One request made.
pub struct Finished {
    pub message_id: i64,
    pub subscription_id: i64,
    pub attempt: i32,
    pub started_at: SystemTime,
    pub duration: Duration,
    pub answer: Answer,
    /// The payload's size, released from the pool's byte count.
    body_bytes: usize,
}

pub struct Pool {
    jobs: Option<Sender<Job>>,
    results: Receiver<Finished>,
    /// A byte is written to `wake_writer` by a helper thread for each answer; the main thread
    /// waits on `wake_reader`. (A socket pair rather than an eventfd: the helpers hold the
    /// writing end, so it stays theirs until the last one is gone.)
    wake_reader: UnixStream,
    wake_writer: Arc<UnixStream>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// What a new helper thread needs: the shared queue, the way back, the HTTP client.
    queue: Arc<Mutex<Receiver<Job>>>,
    answers: Sender<Finished>,
    agent: ureq::Agent,
    in_flight: usize,
    /// Payload bytes of the requests in flight.
    bytes_in_flight: usize,
    /// When the last request in flight gives up at the latest.
    pub latest_deadline: Option<Instant>,
}

impl Pool {
    /// Starts `threads` helper threads sharing one HTTP client (connections kept alive) that
    /// connects only where `allowed_networks` lets it.
    pub fn start(threads: usize, allowed_networks: AllowedNetworks) -> Pool {
        let (wake_reader, wake_writer) = UnixStream::pair().expect("a socket pair for the helper threads' wake-ups");
        for end in [&wake_reader, &wake_writer] {
            end.set_nonblocking(true).expect("a non-blocking socket");
        }
        let (jobs, queue) = channel::<Job>();
        let (answers, results) = channel::<Finished>();
        let queue = Arc::new(Mutex::new(queue));
        let agent = webhook::new_agent(threads, allowed_networks);
        let mut pool = Pool {
            jobs: Some(jobs),
            results,
            wake_reader,
            wake_writer: Arc::new(wake_writer),
            threads: Vec::new(),
            queue,
            answers,
            agent,
            in_flight: 0,
            bytes_in_flight: 0,
            latest_deadline: None,
        };
        pool.grow_to(threads);
        pool
    }

    /// At least `threads` helper threads, one per request that may be in flight (a reload may
    /// raise outbox.max_in_flight): a leased delivery never waits in the queue, where its lease
    /// could run out before it is sent.
    pub fn grow_to(&mut self, threads: usize) {
        while self.threads.len() < threads {
            let (queue, answers, agent, wake) =
                (Arc::clone(&self.queue), self.answers.clone(), self.agent.clone(), Arc::clone(&self.wake_writer));
            self.threads.push(spawn_with_signals_blocked(move || helper(queue, answers, agent, wake)));
        }
    }

    pub fn wake_fd(&self) -> RawFd {
        self.wake_reader.as_raw_fd()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn bytes_in_flight(&self) -> usize {
        self.bytes_in_flight
    }

    /// Hands `claimed` deliveries to the helper threads.
    pub fn send(&mut self, claimed: Vec<Claimed>, endpoint_of: impl Fn(i64) -> Arc<Endpoint>) {
        let jobs = self.jobs.as_ref().expect("the pool is running");
        for delivery in claimed {
            let endpoint = endpoint_of(delivery.subscription_id);
            let deadline = Instant::now() + endpoint.timeout;
            self.latest_deadline = Some(self.latest_deadline.map_or(deadline, |d| d.max(deadline)));
            self.in_flight += 1;
            self.bytes_in_flight += delivery.message.body.len();
            let job =
                Job { message_id: delivery.message_id, subscription_id: delivery.subscription_id, endpoint, message: delivery.message };
            jobs.send(job).expect("the helper threads are running");
        }
    }

    /// The answers that have come back since the last call (never waits).
    pub fn take_finished(&mut self) -> Vec<Finished> {
        // Empty the wake-up socket (non-blocking: stops at WouldBlock).
        let mut bytes = [0u8; 256];
        while matches!((&self.wake_reader).read(&mut bytes), Ok(n) if n > 0) {}
        let finished: Vec<Finished> = self.results.try_iter().collect();
        for done in &finished {
            self.in_flight -= 1;
            self.bytes_in_flight = self.bytes_in_flight.saturating_sub(done.body_bytes);
        }
        if self.in_flight == 0 {
            self.latest_deadline = None;
            self.bytes_in_flight = 0;
        }
        finished
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Closing the queue ends the helpers once their requests are done; a worker that
        // leaves at once does not wait for them (the process exit ends them).
        self.jobs = None;
        self.threads.clear();
    }
}

fn helper(queue: Arc<Mutex<Receiver<Job>>>, answers: Sender<Finished>, agent: ureq::Agent, wake: Arc<UnixStream>) {
    loop {
        // One job at a time per thread; the lock is held only to take it.
        let job = match queue.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return, // the pool is gone
        };
        let started_at = SystemTime::now();
        let clock = Instant::now();
        let answer = webhook::send(&agent, &job.endpoint, &job.message);
        let finished = Finished {
            message_id: job.message_id,
            subscription_id: job.subscription_id,
            attempt: job.message.attempt,
            started_at,
            duration: clock.elapsed(),
            answer,
            body_bytes: job.message.body.len(),
        };
        if answers.send(finished).is_err() {
            return;
        }
        // A full socket (WouldBlock) has woken the main thread already; a closed one means it
        // has left.
        let _ = (&*wake).write(&[1]);
    }
}

/// Starts a thread that can never run a PostgreSQL signal handler (those belong to the main
/// thread): every signal is blocked in this thread before the new one starts, so it begins
/// life with them blocked, and this thread's mask is restored right after.
pub fn spawn_with_signals_blocked<F: FnOnce() + Send + 'static>(body: F) -> std::thread::JoinHandle<()> {
    let previous = SigSet::all().thread_swap_mask(SigmaskHow::SIG_BLOCK).expect("blocking every signal in this thread");
    let handle = std::thread::Builder::new().name("outbox-http".into()).spawn(body);
    previous.thread_set_mask().expect("restoring this thread's signal mask");
    handle.expect("starting a helper thread")
}

#[cfg(test)]
mod unit_tests {
    use super::*;
    use nix::sys::signal::Signal;

    /// Whether `signal` is blocked in the calling thread.
    fn blocked(signal: Signal) -> bool {
        SigSet::thread_get_mask().expect("reading this thread's signal mask").contains(signal)
    }

    #[test]
    fn a_helper_thread_starts_with_every_signal_blocked_and_the_parent_keeps_its_mask() {
        let parent_had_sigterm_blocked = blocked(Signal::SIGTERM);
        let (tell, told) = std::sync::mpsc::channel();
        spawn_with_signals_blocked(move || {
            let all = [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGINT, Signal::SIGALRM].into_iter().all(blocked);
            tell.send(all).unwrap();
        })
        .join()
        .unwrap();
        assert!(told.recv().unwrap(), "the helper thread could receive a signal");
        assert_eq!(blocked(Signal::SIGTERM), parent_had_sigterm_blocked);
    }
}

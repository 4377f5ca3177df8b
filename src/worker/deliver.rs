//! Deliver, the worker's second step: requests in flight. A pool of helper threads sends the
//! claimed deliveries over HTTP, each request on its own (one slow endpoint holds only the
//! threads of its own requests). After a success, a thread sends the endpoint's next queued
//! delivery in the same slot when the main thread allows it (queue.rs). The threads never call
//! into PostgreSQL: they hand each answer back through a channel and wake the main thread
//! through a socket it waits on beside its latch (once for the answers it has not yet taken:
//! it takes them all at once).

use super::claim::Claimed;
use super::queue::EndpointQueue;
use crate::webhook::{self, AllowedNetworks, Answer, Endpoint, Message};
use nix::sys::signal::{SigSet, SigmaskHow};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// One request to make.
struct Job {
    message_id: i64,
    subscription_id: i64,
    endpoint: Arc<Endpoint>,
    message: Arc<Message>,
    /// Where the next delivery to the endpoint waits.
    queue: Arc<EndpointQueue>,
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
    /// The thread went on with the endpoint's next queued delivery, in the same slot: its
    /// payload's size and when it gives up at the latest.
    pub continued_with: Option<(usize, Instant)>,
    /// The breaker has counted it (a step recorded it for the endpoint but could not for its
    /// delivery, which another transaction held: record.rs).
    pub breaker_has_seen: bool,
}

pub struct Pool {
    jobs: Option<Sender<Job>>,
    results: Receiver<Finished>,
    /// A byte is written to `wake_writer` by a helper thread for each answer; the main thread
    /// waits on `wake_reader`. (A socket pair rather than an eventfd: the helpers hold the
    /// writing end, so it stays theirs until the last one is gone.)
    wake_reader: UnixStream,
    wake_writer: Arc<UnixStream>,
    /// Answers sent and not yet taken by the main thread: only the first writes a wake-up.
    untaken: Arc<AtomicUsize>,
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
            untaken: Arc::default(),
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
            let way_back =
                WayBack { answers: self.answers.clone(), wake: Arc::clone(&self.wake_writer), untaken: Arc::clone(&self.untaken) };
            let (queue, agent) = (Arc::clone(&self.queue), self.agent.clone());
            self.threads.push(spawn_with_signals_blocked(move || helper(queue, way_back, agent)));
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

    /// Hands `claimed` deliveries to the helper threads; `queue_of` gives each one's endpoint
    /// queue (where its endpoint, as last read, and its next delivery are).
    pub fn send(&mut self, claimed: Vec<Claimed>, queue_of: impl Fn(i64) -> Arc<EndpointQueue>) {
        let jobs = self.jobs.as_ref().expect("the pool is running");
        for delivery in claimed {
            let queue = queue_of(delivery.subscription_id);
            let endpoint = queue.endpoint();
            let deadline = Instant::now() + endpoint.timeout;
            self.latest_deadline = Some(self.latest_deadline.map_or(deadline, |d| d.max(deadline)));
            self.in_flight += 1;
            self.bytes_in_flight += delivery.message.body.len();
            let job = Job {
                message_id: delivery.message_id,
                subscription_id: delivery.subscription_id,
                endpoint,
                message: delivery.message,
                queue,
            };
            jobs.send(job).expect("the helper threads are running");
        }
    }

    /// The answers that have come back since the last call (never waits).
    pub fn take_finished(&mut self) -> Vec<Finished> {
        // Empty the wake-up socket (non-blocking: stops at WouldBlock); then the next answer
        // sent writes a wake-up again (those sent before are taken below). In the other order,
        // a wake-up written in between would be read here and the next answer would write none.
        let mut bytes = [0u8; 256];
        while matches!((&self.wake_reader).read(&mut bytes), Ok(n) if n > 0) {}
        self.untaken.store(0, Ordering::SeqCst);
        let finished: Vec<Finished> = self.results.try_iter().collect();
        for done in &finished {
            self.bytes_in_flight = self.bytes_in_flight.saturating_sub(done.body_bytes);
            match done.continued_with {
                Some((bytes, deadline)) => {
                    self.bytes_in_flight += bytes;
                    self.latest_deadline = Some(self.latest_deadline.map_or(deadline, |d| d.max(deadline)));
                }
                None => self.in_flight -= 1,
            }
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

/// How a helper thread hands an answer back and wakes the main thread.
struct WayBack {
    answers: Sender<Finished>,
    wake: Arc<UnixStream>,
    untaken: Arc<AtomicUsize>,
}

impl WayBack {
    /// Whether the main thread is still there to take it.
    fn answer(&self, finished: Finished) -> bool {
        if self.answers.send(finished).is_err() {
            return false;
        }
        // The first answer the main thread has not taken wakes it; it takes the later ones
        // with it. A full socket (WouldBlock) has woken it already; a closed one means it has
        // left.
        if self.untaken.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = (&*self.wake).write(&[1]);
        }
        true
    }
}

fn helper(queue: Arc<Mutex<Receiver<Job>>>, way_back: WayBack, agent: ureq::Agent) {
    loop {
        // One job at a time per thread; the lock is held only to take it.
        let mut job = match queue.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return, // the pool is gone
        };
        loop {
            let started_at = SystemTime::now();
            let clock = Instant::now();
            let answer = webhook::send(&agent, &job.endpoint, &job.message);
            let duration = clock.elapsed();
            // After a success, the endpoint's next delivery goes out in this slot, if allowed.
            let next = match answer.outcome {
                webhook::Outcome::Delivered => job.queue.next_after_success(Instant::now()),
                webhook::Outcome::Failed { .. } => None,
            }
            .map(|queued| Job {
                message_id: queued.delivery.message_id,
                subscription_id: queued.delivery.subscription_id,
                endpoint: job.queue.endpoint(),
                message: queued.delivery.message,
                queue: Arc::clone(&job.queue),
            });
            let finished = Finished {
                message_id: job.message_id,
                subscription_id: job.subscription_id,
                attempt: job.message.attempt,
                started_at,
                duration,
                answer,
                body_bytes: job.message.body.len(),
                continued_with: next.as_ref().map(|next| (next.message.body.len(), Instant::now() + next.endpoint.timeout)),
                breaker_has_seen: false,
            };
            if !way_back.answer(finished) {
                return;
            }
            match next {
                Some(next) => job = next,
                None => break,
            }
        }
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
    use crate::worker::queue::Queued;
    use nix::sys::signal::Signal;
    use std::io::BufRead;
    use std::net::TcpListener;
    use std::os::fd::AsFd;
    use std::sync::RwLock;

    /// A receiver on 127.0.0.1 that answers each request on a kept-alive connection with the
    /// status `answer` gives for its webhook-id, and tells the test the ids in arrival order.
    fn receiver(answer: fn(&str) -> u16) -> (String, Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let (arrived, arrivals) = channel();
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                let arrived = arrived.clone();
                std::thread::spawn(move || {
                    let mut connection = std::io::BufReader::new(connection.unwrap());
                    loop {
                        let (mut id, mut length, mut line) = (String::new(), 0, String::new());
                        loop {
                            line.clear();
                            if connection.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            let lower = line.to_ascii_lowercase();
                            if let Some(value) = lower.strip_prefix("webhook-id:") {
                                id = value.trim().to_string();
                            } else if let Some(value) = lower.strip_prefix("content-length:") {
                                length = value.trim().parse().unwrap();
                            } else if line == "\r\n" {
                                break;
                            }
                        }
                        let mut body = vec![0; length];
                        connection.read_exact(&mut body).unwrap();
                        let status = answer(&id);
                        let _ = arrived.send(id);
                        let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                        connection.get_mut().write_all(reply.as_bytes()).unwrap();
                    }
                });
            }
        });
        (url, arrivals)
    }

    fn endpoint(url: &str) -> Arc<Endpoint> {
        Arc::new(Endpoint { url: url.into(), signing_key: None, previous_key: None, headers: vec![], timeout: Duration::from_secs(5) })
    }

    fn delivery(id: i64) -> Claimed {
        let message = Message { public_id: format!("m{id}"), topic: "t".into(), body: b"{}".to_vec(), attempt: 1, headers: vec![] };
        Claimed { message_id: id, subscription_id: 1, lease_until: 0, message: Arc::new(message) }
    }

    fn loopback_pool(threads: usize) -> Pool {
        let allowed = crate::webhook::destination::parse_allowed_networks("127.0.0.0/8").unwrap();
        Pool::start(threads, Arc::new(RwLock::new(allowed)))
    }

    /// Waits on the wake-up socket, as the main thread does, until `count` answers are taken;
    /// fails if a wake-up is missing (an answer sent and none written for it).
    fn take_answers(pool: &mut Pool, count: usize) -> Vec<Finished> {
        let mut taken = Vec::new();
        while taken.len() < count {
            let mut poll = [nix::poll::PollFd::new(pool.wake_reader.as_fd(), nix::poll::PollFlags::POLLIN)];
            let ready = nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(5000u16)).unwrap();
            assert!(ready > 0, "no wake-up for the answers after {} of {count}", taken.len());
            taken.extend(pool.take_finished());
        }
        taken
    }

    #[test]
    fn after_a_success_a_helper_sends_the_next_queued_delivery_in_its_slot_in_order() {
        let (url, arrivals) = receiver(|_| 200);
        let mut pool = loopback_pool(1);
        let queue = EndpointQueue::new(endpoint(&url));
        let start_by = Instant::now() + Duration::from_secs(60);
        for id in 2..=20 {
            queue.push_back(Queued { delivery: delivery(id), start_by, at_once: false });
        }
        queue.allow_continuing(true);
        pool.send(vec![delivery(1)], |_| Arc::clone(&queue));
        let answers = take_answers(&mut pool, 20);
        let ids: Vec<i64> = answers.iter().map(|f| f.message_id).collect();
        assert_eq!(ids, (1..=20).collect::<Vec<_>>());
        assert!(answers[..19].iter().all(|f| f.continued_with.is_some()), "each went on with the next");
        assert!(answers[19].continued_with.is_none(), "the last found the queue empty");
        assert_eq!(pool.in_flight(), 0, "one slot, given back once");
        assert_eq!(pool.bytes_in_flight(), 0);
        let arrived: Vec<String> = arrivals.try_iter().collect();
        assert_eq!(arrived, (1..=20).map(|id| format!("m{id}")).collect::<Vec<_>>());
    }

    #[test]
    fn an_endpoint_written_with_an_upper_case_scheme_is_reached() {
        // outbox_subscribe takes "HTTP://" (a scheme ignores case): the client must read it so.
        let (url, arrivals) = receiver(|_| 200);
        let mut pool = loopback_pool(1);
        let queue = EndpointQueue::new(endpoint(&url.replacen("http://", "HTTP://", 1)));
        pool.send(vec![delivery(1)], |_| Arc::clone(&queue));
        let answers = take_answers(&mut pool, 1);
        assert!(matches!(answers[0].answer.outcome, crate::webhook::Outcome::Delivered), "{:?}", answers[0].answer.outcome);
        assert_eq!(arrivals.try_iter().collect::<Vec<_>>(), vec!["m1".to_string()]);
    }

    #[test]
    fn a_failure_or_the_main_threads_no_stops_a_helper_from_going_on() {
        let (url, _arrivals) = receiver(|id| if id == "m3" { 503 } else { 200 });
        let mut pool = loopback_pool(1);
        let queue = EndpointQueue::new(endpoint(&url));
        let start_by = Instant::now() + Duration::from_secs(60);
        for id in 2..=5 {
            queue.push_back(Queued { delivery: delivery(id), start_by, at_once: false });
        }
        queue.allow_continuing(true);
        pool.send(vec![delivery(1)], |_| Arc::clone(&queue));
        let answers = take_answers(&mut pool, 3);
        assert_eq!(answers.iter().map(|f| f.message_id).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(answers[2].continued_with.is_none(), "503: the main thread decides what comes next");
        assert_eq!(queue.len(), 2);
        // Not allowed (the endpoint fails, the worker stops, …): one request, then back.
        queue.allow_continuing(false);
        pool.send(vec![queue.pop_front().unwrap().delivery], |_| Arc::clone(&queue));
        let answers = take_answers(&mut pool, 1);
        assert!(answers[0].continued_with.is_none());
        assert_eq!(queue.len(), 1);
        assert_eq!(pool.in_flight(), 0);
    }

    #[test]
    fn every_answer_of_many_helpers_is_taken_after_a_wake_up() {
        let (url, _arrivals) = receiver(|_| 200);
        let mut pool = loopback_pool(8);
        let queue = EndpointQueue::new(endpoint(&url));
        let start_by = Instant::now() + Duration::from_secs(60);
        for id in 9..=2000 {
            queue.push_back(Queued { delivery: delivery(id), start_by, at_once: false });
        }
        queue.allow_continuing(true);
        pool.send((1..=8).map(delivery).collect(), |_| Arc::clone(&queue));
        let answers = take_answers(&mut pool, 2000);
        assert_eq!(answers.len(), 2000);
        assert_eq!(pool.in_flight(), 0);
    }

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

//! A webhook: one message sent to one endpoint over HTTP with the Standard Webhooks headers, and
//! what the answer means.
//!
//! Nothing here touches Postgres: the worker runs `send` on its helper threads and records the
//! returned `Answer` from its main thread. Signing and the classification of answers are pure
//! functions with plain unit tests.

mod deadline;
pub mod destination;
mod interfaces;
mod resolver;

pub use resolver::AllowedNetworks;

use crate::error::Problem;
use crate::policy::MAX_RETRY_AFTER;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How much of a failing response's body is kept in `last_error`.
pub const ERROR_BODY_BYTES: usize = 256;
/// How much of any response's body is read. A body read to its end lets the connection go
/// back to the agent's pool for the next delivery (ureq reuses only those); a longer one is
/// dropped together with its connection.
const MAX_BODY_READ: u64 = 64 * 1024;

/// Where and how a topic's messages are sent.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub url: String,
    /// The decoded key of a `whsec_…` secret; `None` sends no signature.
    pub signing_key: Option<Vec<u8>>,
    /// The key before a rotation (`outbox_rotate_secret`), and until when it signs too.
    pub previous_key: Option<(Vec<u8>, SystemTime)>,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
}

/// What is sent: the parts of an outbox row a receiver sees. `body` is the payload as JSON in
/// UTF-8 (converted from the database's encoding by the query that read it).
#[derive(Debug, Clone)]
pub struct Message {
    pub public_id: String,
    pub topic: String,
    pub body: Vec<u8>,
    pub attempt: i32,
    /// The producer's headers for this message (`outbox_enqueue(…, headers => …)`).
    pub headers: Vec<(String, String)>,
}

/// What came back from one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub outcome: Outcome,
    /// The HTTP status, when an answer came at all.
    pub http_status: Option<u16>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Delivered,
    Failed { error: String, retry_after: Option<Duration> },
}

/// The Standard Webhooks signature: `v1,` + base64(HMAC-SHA256(key, "id.timestamp.body")).
pub fn sign(key: &[u8], message_id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(format!("{message_id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` header: the signature by the endpoint's key, then, while a rotation's
/// overlap lasts, the one by the previous key, space-separated (the spec's list of signatures:
/// a receiver holding either secret finds the one it can verify). `None` when unsigned.
pub fn signatures(endpoint: &Endpoint, message_id: &str, timestamp: u64, body: &[u8], now: SystemTime) -> Option<String> {
    let current = sign(endpoint.signing_key.as_deref()?, message_id, timestamp, body);
    Some(match &endpoint.previous_key {
        Some((key, until)) if now < *until => format!("{current} {}", sign(key, message_id, timestamp, body)),
        _ => current,
    })
}

/// The key inside a `whsec_<base64>` secret (Standard Webhooks' format).
pub fn decode_secret(secret: &str) -> Result<Vec<u8>, Problem> {
    let encoded =
        secret.strip_prefix("whsec_").ok_or_else(|| "must start with \"whsec_\" (the Standard Webhooks secret format)".to_string())?;
    let key = BASE64.decode(encoded).map_err(|_| "must be \"whsec_\" followed by base64".to_string())?;
    if !(24..=64).contains(&key.len()) {
        return Err(format!("must hold a key of 24 to 64 bytes, got {}", key.len()).into());
    }
    Ok(key)
}

/// A new random secret in the `whsec_` form: 32 bytes of key from the operating system's
/// cryptographic random source.
pub fn generate_secret() -> String {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).expect("the operating system's random source is available");
    format!("whsec_{}", BASE64.encode(key))
}

/// How the server log names an endpoint: its URL's scheme, host and port, nothing after, as
/// messages_to_settle.sql names it in a dead message's last_error. A URL's path or query often
/// carries a credential, and a server log is read (and shipped) more widely than the
/// subscriptions are. (outbox_subscribe refuses credentials before the host; a URL written into
/// the table by hand loses them here too.)
pub fn origin(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else { return String::new() };
    let scheme = &url[..scheme_end];
    if scheme.is_empty() || scheme.contains(['/', '?', '#']) {
        return String::new();
    }
    let rest = &url[scheme_end + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}")
}

/// What an HTTP answer means for the message: 2xx delivered; anything else failed, with the
/// endpoint's `Retry-After` (seconds or an HTTP date) honoured when it gives one.
pub fn classify_status(status: u16, retry_after: Option<&str>, body_start: &str, now: SystemTime) -> Outcome {
    if (200..300).contains(&status) {
        return Outcome::Delivered;
    }
    let body = printable(body_start.trim());
    let error = if body.is_empty() { format!("HTTP {status}") } else { format!("HTTP {status}: {body}") };
    Outcome::Failed { error, retry_after: retry_after.and_then(|value| parse_retry_after(value, now)) }
}

/// An endpoint's text as `last_error` keeps it: line breaks (U+2028 and U+2029 too) and tabs as
/// spaces, other control characters and the invisible ones that steer text as U+FFFD. (A NUL is
/// no character a PostgreSQL text may hold; an escape sequence would act on the terminal of an
/// operator reading the error in psql; a right-to-left override shows what follows reversed.)
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' | '\u{2028}' | '\u{2029}' => ' ',
            c if c.is_control() || steers_text_unseen(c) => char::REPLACEMENT_CHARACTER,
            c => c,
        })
        .collect()
}

/// Unicode's invisible format characters that change how the text around them shows: the
/// bidirectional marks, embeddings, overrides and isolates, and the zero-width ones.
fn steers_text_unseen(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// `Retry-After: 120` or `Retry-After: Wed, 21 Oct 2026 07:28:00 GMT`, capped at a day.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        // (Seconds past u64: longer than the cap, not unreadable.)
        Err(_) if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => MAX_RETRY_AFTER,
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            at.duration_since(now).unwrap_or(Duration::ZERO)
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// A short, stable description of a transport failure for `last_error`, after `elapsed` of the
/// request's `timeout`. A request cut off by the watchdog at its deadline (deadline.rs) sees
/// its socket shut down, whatever error that makes: it timed out.
pub fn describe_transport_error(error: &ureq::Error, timeout: Duration, elapsed: Duration) -> String {
    let timed_out = format!("timeout after {}", human_duration(timeout));
    if elapsed >= timeout {
        return timed_out;
    }
    match error {
        ureq::Error::Timeout(_) => timed_out,
        ureq::Error::HostNotFound => "host not found".to_string(),
        ureq::Error::ConnectionFailed => "connection failed".to_string(),
        ureq::Error::Other(inner) if inner.is::<destination::Refused>() => inner.to_string(),
        ureq::Error::Io(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
            std::io::ErrorKind::ConnectionReset => "connection reset".to_string(),
            std::io::ErrorKind::ConnectionAborted => "connection aborted".to_string(),
            std::io::ErrorKind::UnexpectedEof => "connection closed before the response was complete".to_string(),
            std::io::ErrorKind::TimedOut => timed_out,
            _ => format!("I/O error: {io}"),
        },
        other => other.to_string(),
    }
}

fn human_duration(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

/// One HTTP client for the worker's life: it keeps connections to endpoints alive between
/// deliveries. Redirects are not followed (an endpoint is an exact URL), no proxy is used
/// whatever the server's environment says (the guard judges the endpoint's own address), and
/// statuses are answers, not errors. It connects only where `allowed` lets it (destination.rs).
pub fn new_agent(pool_per_host: usize, allowed: AllowedNetworks) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(None)
        .user_agent(concat!("outbox_ext/", env!("CARGO_PKG_VERSION")))
        .max_idle_connections_per_host(pool_per_host.max(1))
        .max_idle_connections(pool_per_host.max(1) * 16)
        .build();
    // Plain TCP, then TLS for https: (no proxies), every socket watched (deadline.rs).
    use ureq::unversioned::transport::{Connector, RustlsConnector};
    let connector = ().chain(deadline::WatchedTcpConnector::default()).chain(RustlsConnector::default());
    ureq::Agent::with_parts(config, connector, resolver::RememberingResolver::new(allowed))
}

/// POSTs `message` to `endpoint` with the Standard Webhooks headers. Every wait is bounded by
/// the endpoint's timeout (connect, send, response and body together).
pub fn send(agent: &ureq::Agent, endpoint: &Endpoint, message: &Message) -> Answer {
    let started = std::time::Instant::now();
    let now = SystemTime::now();
    let timestamp = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut request = agent
        .post(&endpoint.url)
        .config()
        .timeout_global(Some(endpoint.timeout))
        .build()
        .header("content-type", "application/json")
        .header("webhook-id", &message.public_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("outbox-topic", &message.topic)
        .header("outbox-attempt", message.attempt.to_string());
    if let Some(signature) = signatures(endpoint, &message.public_id, timestamp, &message.body, now) {
        request = request.header("webhook-signature", signature);
    }
    for (name, value) in &endpoint.headers {
        request = request.header(name, value);
    }
    // The producer's headers, except those the subscription sets itself (its credentials, say,
    // are the administrator's, not a producer's to replace), and those a proxy routes by (a
    // message enqueued before 0.5.35 refused them may have them).
    for (name, value) in &message.headers {
        if !endpoint.headers.iter().any(|(own, _)| own.eq_ignore_ascii_case(name)) && !crate::subscriptions::routes_a_request(name) {
            request = request.header(name, value);
        }
    }
    match request.send(message.body.as_slice()) {
        Ok(mut response) => {
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let mut body = Vec::new();
            // A body that cannot be read (or is cut off) still leaves the status to report.
            let _ = response.body_mut().as_reader().take(MAX_BODY_READ).read_to_end(&mut body);
            let body_start = if (200..300).contains(&status) {
                String::new()
            } else {
                String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_BYTES)]).into_owned()
            };
            Answer { outcome: classify_status(status, retry_after.as_deref(), &body_start, now), http_status: Some(status) }
        }
        Err(error) => Answer {
            outcome: Outcome::Failed { error: describe_transport_error(&error, endpoint.timeout, started.elapsed()), retry_after: None },
            http_status: None,
        },
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn an_endpoint_is_named_by_its_origin_without_path_or_query() {
        assert_eq!(origin("https://hooks.example.com/in/abc?token=secret"), "https://hooks.example.com");
        assert_eq!(origin("http://u:pw@[::1]:8080?token=secret"), "http://[::1]:8080");
        assert_eq!(origin("http://127.0.0.1:9#frag"), "http://127.0.0.1:9");
        assert_eq!(origin("http://example.com"), "http://example.com");
        assert_eq!(origin("not a url/with?token=x://y"), "");
        assert_eq!(origin("://host/path"), "");
    }

    #[test]
    fn signs_like_the_standard_webhooks_reference() {
        // The example of the Standard Webhooks specification and its reference libraries.
        let key = decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signature = sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#);
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_rotated_endpoint_signs_with_both_keys_until_the_overlap_ends() {
        let (old, new) = (decode_secret(&generate_secret()).unwrap(), decode_secret(&generate_secret()).unwrap());
        let now = SystemTime::now();
        let endpoint = |previous_until: Option<SystemTime>| Endpoint {
            url: "http://e/".into(),
            signing_key: Some(new.clone()),
            previous_key: previous_until.map(|until| (old.clone(), until)),
            headers: vec![],
            timeout: Duration::from_secs(1),
        };
        let (by_new, by_old) = (sign(&new, "msg_1", 7, b"{}"), sign(&old, "msg_1", 7, b"{}"));
        let during = signatures(&endpoint(Some(now + Duration::from_secs(60))), "msg_1", 7, b"{}", now);
        assert_eq!(during, Some(format!("{by_new} {by_old}")));
        let after = signatures(&endpoint(Some(now - Duration::from_secs(1))), "msg_1", 7, b"{}", now);
        assert_eq!(after, Some(by_new));
        let unsigned = Endpoint { signing_key: None, ..endpoint(None) };
        assert_eq!(signatures(&unsigned, "msg_1", 7, b"{}", now), None);
    }

    #[test]
    fn refuses_secrets_not_in_the_whsec_form() {
        assert!(decode_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(decode_secret("whsec_not base64!").is_err());
        assert!(decode_secret("whsec_c2hvcnQ=").unwrap_err().0.contains("24 to 64 bytes"));
    }

    #[test]
    fn generated_secrets_decode() {
        let secret = generate_secret();
        assert_eq!(decode_secret(&secret).unwrap().len(), 32);
        assert_ne!(secret, generate_secret());
    }

    #[test]
    fn classifies_answers() {
        let now = SystemTime::now();
        assert_eq!(classify_status(200, None, "", now), Outcome::Delivered);
        assert_eq!(classify_status(204, Some("30"), "", now), Outcome::Delivered);
        assert_eq!(
            classify_status(503, None, "  upstream unavailable\n", now),
            Outcome::Failed { error: "HTTP 503: upstream unavailable".into(), retry_after: None }
        );
        assert_eq!(
            classify_status(429, Some("120"), "", now),
            Outcome::Failed { error: "HTTP 429".into(), retry_after: Some(Duration::from_secs(120)) }
        );
        assert!(matches!(classify_status(404, None, "", now), Outcome::Failed { .. }));
        assert!(matches!(classify_status(301, None, "", now), Outcome::Failed { .. }));
    }

    #[test]
    fn shows_a_failing_bodys_control_characters_as_no_terminal_or_database_would_take_them() {
        // A NUL, which no PostgreSQL text may hold; an escape sequence that clears an operator's
        // terminal when psql shows last_error; line breaks of an HTML page.
        let error = |body| match classify_status(500, None, body, SystemTime::now()) {
            Outcome::Failed { error, .. } => error,
            Outcome::Delivered => unreachable!(),
        };
        assert_eq!(error("no\0such\u{1b}[2Jthing"), "HTTP 500: no\u{fffd}such\u{fffd}[2Jthing");
        assert_eq!(error("<h1>Bad\r\n\tGateway</h1>\n"), "HTTP 500: <h1>Bad   Gateway</h1>");
        assert_eq!(error("\u{7f}\u{85}kept: é €"), "HTTP 500: \u{fffd}\u{fffd}kept: é €");
        // Characters that reverse or hide the text after them where it is shown (psql, a
        // dashboard), and line separators some viewers break lines at (stop 53's probe).
        assert_eq!(error("a\u{202e}lmth.exe\u{2066}b"), "HTTP 500: a\u{fffd}lmth.exe\u{fffd}b");
        assert_eq!(error("zero\u{200b}width\u{feff}\u{2060}"), "HTTP 500: zero\u{fffd}width\u{fffd}\u{fffd}");
        assert_eq!(error("one\u{2028}two\u{2029}three"), "HTTP 500: one two three");
    }

    #[test]
    fn parses_retry_after_in_both_forms() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        let in_ninety = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(parse_retry_after(&in_ninety, now), Some(Duration::from_secs(90)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("99999999", now), Some(MAX_RETRY_AFTER));
        // Past 64 bits: capped as well (until 0.5.34 ignored, the backoff applied instead).
        assert_eq!(parse_retry_after("1000000000000000000000000000000", now), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn describes_durations_for_people() {
        assert_eq!(human_duration(Duration::from_secs(5)), "5s");
        assert_eq!(human_duration(Duration::from_millis(1500)), "1500ms");
    }
}

//! Checks for what an administrator subscribes: endpoint URLs, secrets and extra headers. The
//! table and the functions that manage it are in `sql/subscriptions.sql`; these checks are the
//! one definition of a valid endpoint.

use crate::error::{or_raise, OutboxError, Problem};
use crate::fmgr::{required, sql_function, Args};
use crate::settings;
use crate::webhook::{self, destination};
use pgrx::pg_sys;

/// Headers that would describe a body other than the one the worker sends (always the
/// payload's JSON as stored, neither encoded nor partial): neither a subscription nor a message
/// may set them (in any case).
const DESCRIBING_ANOTHER_BODY: [&str; 2] = ["content-encoding", "content-range"];

/// Headers the worker sets itself, and hop-by-hop headers that belong to the connection: a
/// subscription may not set them (in any case).
pub const RESERVED_HEADERS: [&str; 17] = [
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "proxy-connection",
    "user-agent",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "outbox-topic",
    "outbox-attempt",
];

/// Headers a message may not set (a subscription may): those a proxy or a framework in front of a
/// receiver reads to route the request or change its method, which the signature does not
/// cover. A producer could send a delivery elsewhere behind the receiver's proxy (stop 58's
/// probe of privileges). And every `x-forwarded-…` header.
pub const ROUTING_HEADERS: [&str; 8] = [
    "forwarded",
    "x-real-ip",
    "proxy-authorization",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-original-url",
    "x-rewrite-url",
];

/// Whether a message may not set header `name` (in any case): one of [`ROUTING_HEADERS`] or an
/// `x-forwarded-…` header.
pub fn routes_a_request(name: &str) -> bool {
    let lowercase = name.to_ascii_lowercase();
    ROUTING_HEADERS.contains(&lowercase.as_str()) || lowercase.starts_with("x-forwarded-")
}

/// Whose headers: a subscription's (an operator's) or a message's (a producer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadersOf {
    Subscription,
    Message,
}

/// At most this many extra headers ...
pub const MAX_HEADERS: usize = 16;
/// ... of at most this many bytes, names and values together.
pub const MAX_HEADER_BYTES: usize = 8192;

/// An endpoint is an absolute `http` or `https` URL (in any case) with a host (and a port in
/// 1–65535, if given) and nothing else: no credentials in it, no fragment, no whitespace, ASCII only.
pub fn check_url(url: &str) -> Result<(), Problem> {
    if url.len() > 2048 {
        return Err("is longer than 2048 characters".into());
    }
    // The scheme ignores case (RFC 3986, 3.1), as the worker's client does.
    let scheme_ends = url.find("://").filter(|&end| ["http", "https"].iter().any(|scheme| url[..end].eq_ignore_ascii_case(scheme)));
    let rest = &url[scheme_ends.ok_or("must be an http:// or https:// URL")? + 3..];
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace or control characters".into());
    }
    if !url.is_ascii() {
        return Err("must be ASCII (write an international host name in its xn-- form)".into());
    }
    if url.contains('#') {
        return Err("must not have a fragment".into());
    }
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("must not carry credentials (use headers => '{\"authorization\": …}')".into());
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').ok_or(format!("has [{v6} without its closing bracket"))?;
            // Brackets hold an IPv6 address (RFC 3986's IP-literal), nothing else.
            if host.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("has [{host}] where an IPv6 address belongs").into());
            }
            // Then only a port: the worker read "[::1]evil.example" as [::1] and dropped the rest.
            if !after.is_empty() && !after.starts_with(':') {
                return Err(format!("has {after:?} after [{host}], where only :port belongs").into());
            }
            (host, after.strip_prefix(':'))
        }
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err("must name a host".into());
    }
    if !authority.starts_with('[') && !is_host_name(host) {
        return Err(format!(
            "has {host:?}, which is not a host name (labels of 1 to 63 letters, digits, hyphens or underscores, \
             separated by dots, 253 characters in all)"
        )
        .into());
    }
    // An empty port is the scheme's default (RFC 3986, 3.2.3).
    if let Some(port) = port.filter(|port| !port.is_empty()) {
        // Digits only (RFC 3986): Rust's parse takes a sign, and "+80" was stored and used as 80.
        match port.parse::<u32>() {
            Ok(1..=65535) if port.bytes().all(|b| b.is_ascii_digit()) => {}
            _ => return Err(format!("has port {port:?}; a port is between 1 and 65535").into()),
        }
    }
    url.parse::<ureq::http::Uri>().map_err(|e| format!("is not a valid URL: {e}"))?;
    Ok(())
}

/// Whether `host` can be looked up in DNS (RFC 1035's limits; underscores too, as resolvers
/// take them), with a final dot or without. A name that cannot fails every attempt, in DNS.
fn is_host_name(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host);
    let label_ok =
        |label: &str| (1..=63).contains(&label.len()) && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    name.len() <= 253 && name.split('.').all(label_ok)
}

/// Extra headers: a JSON object of at most 16 string values (8 KiB in all) with valid header
/// names the worker does not set itself (nor, for a message, [`ROUTING_HEADERS`]), and
/// printable ASCII values.
pub fn check_headers(headers: &serde_json::Value, of: HeadersOf) -> Result<(), Problem> {
    let object = headers.as_object().ok_or("must be a JSON object of header names to string values")?;
    if object.len() > MAX_HEADERS {
        return Err(format!("has {} headers; at most {MAX_HEADERS} are allowed", object.len()).into());
    }
    let mut bytes = 0;
    let mut names = std::collections::HashSet::new();
    for (name, value) in object {
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            return Err(format!("has an invalid header name {name:?}").into());
        }
        let lowercase = name.to_ascii_lowercase();
        if DESCRIBING_ANOTHER_BODY.contains(&lowercase.as_str()) {
            return Err(format!("may not set {name:?}: the body sent is the payload's JSON as stored").into());
        }
        if RESERVED_HEADERS.contains(&lowercase.as_str()) {
            return Err(format!("may not set {name:?}: the worker sets it").into());
        }
        if of == HeadersOf::Message && routes_a_request(name) {
            return Err(format!("of a message may not set {name:?}: a proxy in front of a receiver may route by it, unsigned").into());
        }
        // HTTP header names ignore case: both would be sent, and receivers keep one or the other.
        if !names.insert(lowercase) {
            return Err(format!("names {name:?} twice (header names ignore case)").into());
        }
        let Some(text) = value.as_str() else {
            return Err(format!("value of {name:?} must be a string").into());
        };
        if !text.chars().all(|c| c == '\t' || (' '..='~').contains(&c)) {
            return Err(format!("value of {name:?} must be printable ASCII (RFC 9110)").into());
        }
        bytes += name.len() + text.len();
    }
    if bytes > MAX_HEADER_BYTES {
        return Err(format!("hold {bytes} bytes; at most {MAX_HEADER_BYTES} are allowed").into());
    }
    Ok(())
}

/// The jsonb argument `n` of `function`, named `headers`: NULL for none, else what the extra
/// headers of `of` may be (else an ERROR).
pub fn check_headers_argument(function: &'static str, args: &Args, n: usize, of: HeadersOf) {
    if let Some(headers) = args.jsonb_text(n) {
        or_raise(check_headers_text(&headers, of).map_err(|why| OutboxError::invalid(function, "headers", why)));
    }
}

/// [`check_headers`] of jsonb's text. What serde cannot read (a number beyond a double, nesting
/// deeper than 128) is no object of string values either: say so, with why it was not read.
fn check_headers_text(headers: &str, of: HeadersOf) -> Result<(), Problem> {
    match serde_json::from_str::<serde_json::Value>(headers) {
        Ok(headers) => check_headers(&headers, of),
        Err(unread) => {
            Err(format!("must be a JSON object of header names to string values (this one holds a value that cannot be read: {unread})")
                .into())
        }
    }
}

// outbox_check_subscription(url text, secret text, headers jsonb) RETURNS void: raises the
// error outbox_subscribe owes its caller for a bad url, secret or headers. (Its symbol name is
// the one pgrx gave it until 0.3.0: databases not yet updated call it by that name.)
sql_function!(outbox_check_subscription_wrapper, pg_finfo_outbox_check_subscription_wrapper, |args| {
    const FUNCTION: &str = "outbox_subscribe";
    let url = required(args.text(0), FUNCTION, "url");
    or_raise(check_url(&url).map_err(|why| OutboxError::invalid(FUNCTION, "url", why)));
    if let Some(secret) = args.text(1) {
        or_raise(webhook::decode_secret(&secret).map(drop).map_err(|why| OutboxError::invalid(FUNCTION, "secret", why)));
    }
    check_headers_argument(FUNCTION, &args, 2, HeadersOf::Subscription);
    pg_sys::Datum::from(0)
});

// outbox_check_new_secret(secret text) RETURNS void: the error outbox_rotate_secret owes its
// caller for a new_secret not in the whsec_ form.
sql_function!(outbox_check_new_secret_c, pg_finfo_outbox_check_new_secret_c, |args| {
    const FUNCTION: &str = "outbox_rotate_secret";
    let secret = required(args.text(0), FUNCTION, "new_secret");
    or_raise(webhook::decode_secret(&secret).map(drop).map_err(|why| OutboxError::invalid(FUNCTION, "new_secret", why)));
    pg_sys::Datum::from(0)
});

// outbox_check_destination(url text) RETURNS void: a NOTICE when the URL's host is a literal
// address the delivery worker would refuse (webhook/destination.rs), so that whoever subscribes
// a local receiver learns about outbox.allowed_networks at once rather than from last_error.
sql_function!(outbox_check_destination_c, pg_finfo_outbox_check_destination_c, |args| {
    if let Some(address) = args.text(0).as_deref().and_then(literal_address) {
        if let Err(refused) = destination::check(address, &settings::allowed_networks()) {
            pgrx::notice!(
                "outbox_subscribe: {refused}: the delivery worker will not connect to it until outbox.allowed_networks includes it"
            );
        }
    }
    pg_sys::Datum::from(0)
});

/// The URL's host when it is a literal IP address (`[…]` for IPv6), in any form the worker's
/// resolver reads as one (`0xa9fea9fe`).
fn literal_address(url: &str) -> Option<std::net::IpAddr> {
    let uri: ureq::http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    host.parse().ok().or_else(|| destination::numeric_ipv4_host(host).map(std::net::IpAddr::V4))
}

// outbox_generate_secret() RETURNS text: a new random signing secret in the Standard Webhooks
// `whsec_` form. (Its symbol keeps the name pgrx gave it until 0.3.0.)
sql_function!(outbox_generate_secret_wrapper, pg_finfo_outbox_generate_secret_wrapper, |_args| {
    crate::text::to_datum(&webhook::generate_secret())
});

#[cfg(test)]
mod unit_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_literal_addresses_in_urls() {
        assert_eq!(literal_address("http://169.254.169.254/latest"), Some([169, 254, 169, 254].into()));
        assert_eq!(literal_address("https://[::1]:8443/hook"), Some(std::net::Ipv6Addr::LOCALHOST.into()));
        assert_eq!(literal_address("https://hooks.example.com/outbox"), None);
    }

    #[test]
    fn accepts_http_endpoints() {
        for url in [
            "http://127.0.0.1:8080/hooks",
            "https://hooks.example.com/outbox?team=7",
            "http://[::1]:9000/",
            "https://[2001:db8::1]/hooks",
            "https://example.com",
            "http://example.com:65535/",
        ] {
            assert_eq!(check_url(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn accepts_what_rfc_3986_allows_of_scheme_case_and_an_empty_port() {
        // A scheme ignores case, and an empty port is the scheme's default (RFC 3986, 3.1 and
        // 3.2.3): both were refused though the worker's client reads them as intended.
        for url in ["HTTP://127.0.0.1:8080/hooks", "Https://hooks.example.com/outbox", "http://example.com:/hooks", "https://[::1]:/"] {
            assert_eq!(check_url(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn refuses_other_schemes_and_malformed_urls() {
        for url in [
            "ftp://example.com/x",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "example.com/hook",
            "http://",
            "http:///path",
            "http://exa mple.com/",
            "https://user:pw@example.com/",
            "https://example.com/#frag",
            "http://127.0.0.1:99999/",
            "http://127.0.0.1:0/",
            "http://[::1]:70000/",
            "http://[zz]:80/",
            "http://[127.0.0.1]/",
            "http://[::1]evil.example/",
            "http://[::1/",
            "http://example.com:+80/",
            "http://example.com:http/",
            "http://bücher.example/",
            "",
        ] {
            assert!(check_url(url).is_err(), "{url}");
        }
        assert!(check_url(&format!("https://example.com/{}", "a".repeat(3000))).is_err());
    }

    #[test]
    fn refuses_hosts_no_resolver_can_look_up() {
        // Accepted before, each failed at every attempt, in DNS, until the message was dead.
        let label = "a".repeat(63);
        let long_name = [label.as_str(); 4].join("."); // 255 characters
        for url in ["http://a..b/", "http://.example.com/", "http://%65xample.com/", "http://exa$mple.com/", "http://example.com../"] {
            let why = check_url(url).unwrap_err().to_string();
            assert!(why.contains("is not a host name"), "{url}: {why}");
        }
        assert!(check_url(&format!("http://{label}a.example/")).is_err(), "a label of 64 characters");
        assert!(check_url(&format!("http://{long_name}/")).is_err(), "a name of 255 characters");
        for url in [
            format!("http://{label}.example/"),
            format!("http://{}/", &long_name[..253]),
            "http://my_service.internal:8080/".to_string(),
            "https://example.com./hooks".to_string(),
            "http://0xa9fea9fe/".to_string(), // (an address: the worker's resolver refuses it, not this check)
            "http://xn--bcher-kva.example/".to_string(),
        ] {
            assert_eq!(check_url(&url), Ok(()), "{url}");
        }
    }

    #[test]
    fn says_why_headers_it_cannot_read_are_refused() {
        let why = check_headers_text(r#"{"x": "1", "y": 1e400}"#, HeadersOf::Message).unwrap_err().to_string();
        assert!(why.contains("cannot be read: number out of range"), "{why}");
        assert_eq!(check_headers_text(r#"{"X-Team": "7"}"#, HeadersOf::Message), Ok(()));
    }

    #[test]
    fn checks_headers() {
        assert_eq!(check_headers(&json!({}), HeadersOf::Subscription), Ok(()));
        assert_eq!(check_headers(&json!({"Authorization": "Bearer x", "X-Team": "7"}), HeadersOf::Subscription), Ok(()));
        assert!(check_headers(&json!(["a"]), HeadersOf::Subscription).is_err());
        assert!(check_headers(&json!({"X-Count": 7}), HeadersOf::Subscription).is_err());
        assert!(check_headers(&json!({"bad name": "x"}), HeadersOf::Subscription).is_err());
        assert!(check_headers(&json!({"X-Evil": "a\r\nInjected: 1"}), HeadersOf::Subscription).is_err());
        assert!(check_headers(&json!({"X-Name": "Müller"}), HeadersOf::Subscription).is_err());
        assert!(check_headers(&json!({"X-Team": "7", "x-team": "8"}), HeadersOf::Subscription).is_err());
    }

    #[test]
    fn every_header_the_worker_sets_is_reserved_in_any_case() {
        for name in ["Webhook-Signature", "outbox-attempt", "OUTBOX-TOPIC", "User-Agent", "Connection", "Host"] {
            assert!(check_headers(&json!({ name: "x" }), HeadersOf::Subscription).is_err(), "{name}");
        }
    }

    #[test]
    fn a_message_may_not_set_the_headers_a_proxy_routes_by() {
        for name in ["Forwarded", "X-Forwarded-Host", "x-forwarded-for", "X-Real-IP", "Proxy-Authorization", "X-HTTP-Method-Override"] {
            assert!(check_headers(&json!({ name: "x" }), HeadersOf::Message).is_err(), "{name}");
            assert_eq!(check_headers(&json!({ name: "x" }), HeadersOf::Subscription), Ok(()), "{name}");
        }
        assert_eq!(check_headers(&json!({"Authorization": "Bearer x", "traceparent": "00-x"}), HeadersOf::Message), Ok(()));
    }

    #[test]
    fn headers_are_bounded() {
        let many: serde_json::Map<String, serde_json::Value> = (0..17).map(|n| (format!("X-H{n}"), json!("v"))).collect();
        assert!(check_headers(&serde_json::Value::Object(many), HeadersOf::Subscription).is_err());
        assert!(check_headers(&json!({"X-Big": "v".repeat(8193)}), HeadersOf::Subscription).is_err());
        assert_eq!(check_headers(&json!({"X-Big": "v".repeat(8000)}), HeadersOf::Subscription), Ok(()));
    }
}

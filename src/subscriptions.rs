//! Checks for what an administrator subscribes: endpoint URLs, secrets and extra headers.
//! The table and the functions that manage it are in `sql/subscriptions.sql`.

use crate::delivery;
use crate::errors::null_argument;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;
use pgrx::JsonB;

/// Headers the worker sets itself; a subscription may not override them.
const RESERVED_HEADERS: [&str; 8] = [
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "outbox-topic",
];

/// An endpoint is an absolute `http` or `https` URL with a host and nothing else: no
/// credentials in it, no fragment, no whitespace.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.len() > 2048 {
        return Err("is longer than 2048 characters".into());
    }
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must be an http:// or https:// URL")?;
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace or control characters".into());
    }
    if url.contains('#') {
        return Err("must not have a fragment".into());
    }
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("must not carry credentials (use headers => '{\"authorization\": …}')".into());
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    if host.is_empty() {
        return Err("must name a host".into());
    }
    url.parse::<ureq::http::Uri>().map_err(|e| format!("is not a valid URL: {e}"))?;
    Ok(())
}

/// Extra headers: a JSON object of string values with valid, non-reserved header names.
pub fn check_headers(headers: &serde_json::Value) -> Result<(), String> {
    let object = headers.as_object().ok_or("must be a JSON object of header names to string values")?;
    for (name, value) in object {
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            return Err(format!("has an invalid header name {name:?}"));
        }
        if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(format!("may not set {name:?}: the worker sets it"));
        }
        let Some(text) = value.as_str() else {
            return Err(format!("value of {name:?} must be a string"));
        };
        if text.chars().any(|c| c.is_control() && c != '\t') {
            return Err(format!("value of {name:?} must not contain control characters"));
        }
    }
    Ok(())
}

fn refuse(argument: &str, why: &str) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("outbox_subscribe: {argument} {why}")
    );
}

/// Raises the error `outbox_subscribe` owes its caller for a bad url, secret or headers.
#[pg_extern(immutable, parallel_safe)]
fn outbox_check_subscription(url: Option<&str>, secret: Option<&str>, headers: Option<JsonB>) {
    let Some(url) = url else { null_argument("outbox_subscribe", "url") };
    if let Err(why) = check_url(url) {
        refuse("url", &why);
    }
    if let Some(secret) = secret {
        if let Err(why) = delivery::decode_secret(secret) {
            refuse("secret", &why);
        }
    }
    if let Some(JsonB(headers)) = headers {
        if let Err(why) = check_headers(&headers) {
            refuse("headers", &why);
        }
    }
}

/// A new random signing secret in the Standard Webhooks `whsec_` form.
#[pg_extern(volatile, parallel_safe)]
fn outbox_generate_secret() -> String {
    delivery::generate_secret()
}

#[cfg(test)]
mod unit_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepts_http_endpoints() {
        for url in [
            "http://127.0.0.1:8080/hooks",
            "https://hooks.example.com/outbox?team=7",
            "http://[::1]:9000/",
            "https://example.com",
        ] {
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
            "",
        ] {
            assert!(check_url(url).is_err(), "{url}");
        }
        assert!(check_url(&format!("https://example.com/{}", "a".repeat(3000))).is_err());
    }

    #[test]
    fn checks_headers() {
        assert_eq!(check_headers(&json!({})), Ok(()));
        assert_eq!(check_headers(&json!({"Authorization": "Bearer x", "X-Team": "7"})), Ok(()));
        assert!(check_headers(&json!(["a"])).is_err());
        assert!(check_headers(&json!({"X-Count": 7})).is_err());
        assert!(check_headers(&json!({"bad name": "x"})).is_err());
        assert!(check_headers(&json!({"Webhook-Signature": "forged"})).is_err());
        assert!(check_headers(&json!({"X-Evil": "a\r\nInjected: 1"})).is_err());
    }
}

//! Name resolution for the worker's HTTP client, remembered for a few seconds.
//!
//! ureq resolves an endpoint's host before every request, even one that then goes out on a
//! pooled connection, and with a timeout set (ours always is) it does so on a thread of its
//! own: a thread started and ended per delivery. Endpoints are few and their addresses change
//! rarely, so an answer is kept for `REMEMBERED_FOR`; only connections opened within that time
//! use it. A failed lookup is not remembered.
//!
//! It is also where the SSRF guard (destination.rs) judges each address: the connection goes
//! only to addresses it allows, so what is checked is what is connected to.

use super::destination::{self, Network};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};
use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// How long an answer is used again. Short: an endpoint that moved is found by the first
/// connection opened after it.
const REMEMBERED_FOR: Duration = Duration::from_secs(5);

/// "scheme://authority" → when it was resolved, and to what.
type Answers = HashMap<String, (Instant, ResolvedSocketAddrs)>;

/// The networks `outbox.allowed_networks` opens, shared with the worker (which sets them at
/// each reload).
pub type AllowedNetworks = Arc<RwLock<Vec<Network>>>;

#[derive(Debug, Default)]
pub struct RememberingResolver {
    lookup: DefaultResolver,
    answers: Mutex<Answers>,
    allowed: AllowedNetworks,
}

impl Resolver for RememberingResolver {
    fn resolve(&self, uri: &Uri, config: &Config, timeout: NextTimeout) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let addresses = self.remembered_or_looked_up(uri, config, timeout)?;
        let allowed = self.allowed.read().unwrap_or_else(PoisonError::into_inner);
        let mut permitted = self.empty();
        let mut first_refused = None;
        for &address in addresses.iter() {
            match destination::check(address.ip(), &allowed) {
                Ok(()) => permitted.push(address),
                Err(refused) => first_refused = first_refused.or(Some(refused)),
            }
        }
        match first_refused {
            Some(refused) if permitted.is_empty() => Err(ureq::Error::Other(Box::new(refused))),
            _ => Ok(permitted),
        }
    }
}

impl RememberingResolver {
    pub fn new(allowed: AllowedNetworks) -> Self {
        RememberingResolver { allowed, ..Default::default() }
    }

    fn remembered_or_looked_up(&self, uri: &Uri, config: &Config, timeout: NextTimeout) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let key = format!("{}://{}", uri.scheme_str().unwrap_or_default(), uri.authority().map_or("", |a| a.as_str()));
        let fresh = |(at, _): &(Instant, ResolvedSocketAddrs)| at.elapsed() < REMEMBERED_FOR;
        if let Some((_, addresses)) = self.answers().get(&key).filter(|answer| fresh(answer)) {
            return Ok(addresses.clone());
        }
        let addresses = self.lookup.resolve(uri, config, timeout)?;
        let mut answers = self.answers();
        answers.retain(|_, answer| fresh(answer));
        answers.insert(key, (Instant::now(), addresses.clone()));
        Ok(addresses)
    }

    fn answers(&self) -> MutexGuard<'_, Answers> {
        // A helper thread that panicked while holding the lock left a usable map behind.
        self.answers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn timeout() -> NextTimeout {
        NextTimeout {
            after: ureq::unversioned::transport::time::Duration::Exact(Duration::from_secs(5)),
            reason: ureq::Timeout::Resolve,
            per_read: None,
            per_write: None,
        }
    }

    fn loopback() -> AllowedNetworks {
        Arc::new(RwLock::new(destination::parse_allowed_networks("127.0.0.0/8").unwrap()))
    }

    #[test]
    fn a_lookup_is_remembered_and_a_failure_is_not() {
        let resolver = RememberingResolver::new(loopback());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let uri: Uri = format!("http://{address}/hook").parse().unwrap();
        assert_eq!(resolver.resolve(&uri, &Config::default(), timeout()).unwrap().first(), Some(&address));
        assert!(resolver.answers().contains_key(&format!("http://{address}")));

        let unknown: Uri = "http://no-such-host.invalid/hook".parse().unwrap();
        assert!(resolver.resolve(&unknown, &Config::default(), timeout()).is_err());
        assert_eq!(resolver.answers().len(), 1, "a failed lookup is not kept");
    }

    #[test]
    fn an_empty_port_is_the_schemes_default() {
        // outbox_subscribe takes "http://host:/" (RFC 3986, 3.2.3): it goes to port 80 (443).
        let resolver = RememberingResolver::new(loopback());
        for (url, port) in [("http://127.0.0.1:/hook", 80), ("https://127.0.0.1:/hook", 443), ("HTTPS://127.0.0.1/", 443)] {
            let uri: Uri = url.parse().unwrap();
            let addresses = resolver.resolve(&uri, &Config::default(), timeout()).unwrap();
            assert_eq!(addresses.first().map(|a| a.port()), Some(port), "{url}");
        }
    }

    #[test]
    fn a_remembered_answer_is_used_until_it_is_too_old() {
        let resolver = RememberingResolver::new(loopback());
        let unknown: Uri = "http://no-such-host.invalid/hook".parse().unwrap();
        let mut remembered = resolver.empty();
        remembered.push("127.0.0.1:9".parse().unwrap());
        let key = "http://no-such-host.invalid".to_string();

        // Fresh: the answer is used, no lookup (which would fail) is made.
        resolver.answers().insert(key.clone(), (Instant::now(), remembered.clone()));
        assert_eq!(resolver.resolve(&unknown, &Config::default(), timeout()).unwrap().first(), remembered.first());

        // Too old: looked up again (and the name does not exist).
        let long_ago = Instant::now().checked_sub(REMEMBERED_FOR + Duration::from_secs(1)).unwrap();
        resolver.answers().insert(key, (long_ago, remembered));
        assert!(resolver.resolve(&unknown, &Config::default(), timeout()).is_err());
    }

    #[test]
    fn refused_addresses_are_never_returned_whatever_a_name_resolves_to() {
        let allowed: AllowedNetworks = Arc::default();
        let resolver = RememberingResolver::new(Arc::clone(&allowed));
        // "localhost" resolves to loopback: refused by default, whichever of its addresses.
        let local: Uri = "http://localhost:9/hook".parse().unwrap();
        let error = resolver.resolve(&local, &Config::default(), timeout()).unwrap_err().to_string();
        assert!(error.contains("is not allowed (outbox.allowed_networks)"), "{error}");
        let metadata: Uri = "http://169.254.169.254/latest/meta-data".parse().unwrap();
        let error = resolver.resolve(&metadata, &Config::default(), timeout()).unwrap_err().to_string();
        assert!(error.contains("destination 169.254.169.254 is not allowed"), "{error}");
        // Opened by the setting (read at each resolution: a reload applies at once).
        *allowed.write().unwrap() = destination::parse_allowed_networks("127.0.0.1/32").unwrap();
        let addresses = resolver.resolve(&local, &Config::default(), timeout()).unwrap();
        assert!(addresses.iter().all(|a| a.ip() == std::net::IpAddr::from([127, 0, 0, 1])), "{addresses:?}");
    }
}

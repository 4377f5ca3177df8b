//! This host's own addresses, those of its network interfaces. A service the database server's
//! host runs on every interface (0.0.0.0) answers on the host's public or private address as it
//! does on loopback, so the SSRF guard (destination.rs) refuses them alike.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a reading of the interfaces is used: addresses change rarely, and the guard is asked
/// before every request.
const READ_AGAIN_AFTER: Duration = Duration::from_secs(5);

static LAST_READING: Mutex<Option<(Instant, Vec<IpAddr>)>> = Mutex::new(None);

/// Whether `address` is one of this host's own.
pub fn is_this_hosts(address: IpAddr) -> bool {
    let mut reading = LAST_READING.lock().unwrap_or_else(PoisonError::into_inner);
    if reading.as_ref().is_none_or(|(at, _)| at.elapsed() >= READ_AGAIN_AFTER) {
        *reading = Some((Instant::now(), interface_addresses()));
    }
    reading.as_ref().is_some_and(|(_, addresses)| addresses.contains(&address))
}

/// The addresses of every network interface (none if they cannot be read).
pub(super) fn interface_addresses() -> Vec<IpAddr> {
    let mut addresses = Vec::new();
    let mut first: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `first` with a list that we walk (each entry's address, when
    // present, is a sockaddr of the family it names) and then free once.
    unsafe {
        if libc::getifaddrs(&mut first) != 0 {
            return addresses;
        }
        let mut entry = first;
        while !entry.is_null() {
            let address = (*entry).ifa_addr;
            if !address.is_null() {
                match i32::from((*address).sa_family) {
                    libc::AF_INET => {
                        let v4 = &*(address as *const libc::sockaddr_in);
                        addresses.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))));
                    }
                    libc::AF_INET6 => {
                        let v6 = &*(address as *const libc::sockaddr_in6);
                        addresses.push(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            entry = (*entry).ifa_next;
        }
        libc::freeifaddrs(first);
    }
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_this_hosts_and_a_public_address_is_not() {
        assert!(is_this_hosts("127.0.0.1".parse().unwrap()));
        assert!(!is_this_hosts("8.8.8.8".parse().unwrap()));
    }
}

//! The SSRF guard: which addresses the worker may connect to. A server inside a private network
//! must not become a proxy to its neighbours, so by default the worker refuses loopback,
//! private, link-local (cloud metadata services live there), unspecified, multicast and
//! broadcast addresses, the other special-purpose ranges that are not reachable on the
//! internet, and the host's own addresses (interfaces.rs); `outbox.allowed_networks` opens
//! chosen ranges. The check is made on the
//! *resolved* address the connection then uses (resolver.rs), so a host name that resolves to
//! a refused address (DNS rebinding included) is refused too.

use super::interfaces;
use crate::error::Problem;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// One network, such as `10.0.0.0/8`, `127.0.0.1/32` or `fd00::/8` (a bare address is the
/// network of that address alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    address: IpAddr,
    prefix: u8,
}

impl FromStr for Network {
    type Err = Problem;

    fn from_str(text: &str) -> Result<Self, Problem> {
        let text = text.trim();
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address.parse().map_err(|_| format!("\"{text}\" is not an IP address or a CIDR network"))?;
        let longest = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => longest,
            Some(digits) => match digits.parse::<u8>() {
                Ok(prefix) if prefix <= longest && !digits.starts_with('+') => prefix,
                _ => return Err(format!("\"{text}\" has a prefix length that is not 0 to {longest}").into()),
            },
        };
        Ok(Network { address, prefix })
    }
}

impl Network {
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.address, address) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(network) & mask == u32::from(address) & mask
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(network) & mask == u128::from(address) & mask
            }
            _ => false,
        }
    }
}

/// The value of `outbox.allowed_networks`: comma-separated networks (empty: none).
pub fn parse_allowed_networks(list: &str) -> Result<Vec<Network>, Problem> {
    list.split(',').filter(|item| !item.trim().is_empty()).map(str::parse).collect()
}

/// A refused destination: the error the attempt records (and counts like any failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub IpAddr);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "destination {} is not allowed (outbox.allowed_networks)", self.0)
    }
}

impl std::error::Error for Refused {}

/// Whether the worker may connect to `address`: an address outside the ranges refused by
/// default, or one inside `allowed`.
pub fn check(address: IpAddr, allowed: &[Network]) -> Result<(), Refused> {
    // An IPv4 address written as IPv6 (::ffff:10.0.0.1) is the IPv4 address.
    let address = match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    };
    let refused = refused_by_default(address) || interfaces::is_this_hosts(address);
    if !refused || allowed.iter().any(|network| network.contains(address)) {
        Ok(())
    } else {
        Err(Refused(address))
    }
}

fn refused_by_default(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(address: Ipv4Addr) -> bool {
    let [a, b, c, _] = address.octets();
    address.is_loopback()             // 127.0.0.0/8
        || address.is_private()       // 10/8, 172.16/12, 192.168/16 (RFC 1918)
        || address.is_link_local()    // 169.254/16: cloud metadata services
        || address.is_unspecified()
        || a == 0                     // 0.0.0.0/8, "this network": reaches the host itself
        || address.is_multicast()
        || a >= 240                   // 240/4, reserved, and the broadcast address
        || (a == 100 && b & 0xc0 == 64) // 100.64/10, carrier NAT
        // Special-purpose ranges no one reaches on the internet (IANA's registry), which a
        // private network may use as its own: protocol assignments (192.0.0/24), the
        // documentation networks, benchmarking (198.18/15), the old 6to4 relay (192.88.99/24).
        || (a, b, c) == (192, 0, 0)
        || (a, b, c) == (192, 0, 2)
        || (a, b, c) == (198, 51, 100)
        || (a, b, c) == (203, 0, 113)
        || (a == 198 && b & 0xfe == 18)
        || (a, b, c) == (192, 88, 99)
}

fn refused_v6(address: Ipv6Addr) -> bool {
    let first = address.segments()[0];
    address.is_loopback()
        || address.is_unspecified()
        || address.is_multicast()
        || first & 0xfe00 == 0xfc00   // fc00::/7, unique local (the private ranges of IPv6)
        || first & 0xffc0 == 0xfe80   // fe80::/10, link-local
        || first & 0xffc0 == 0xfec0   // fec0::/10, the old site-local (private) range
        // Special-purpose ranges no one reaches on the internet: discard-only (100::/64), Teredo
        // (2001::/32), benchmarking (2001:2::/48), documentation (2001:db8::/32, 3fff::/20).
        || address.segments()[..4] == [0x100, 0, 0, 0]
        || address.segments()[..2] == [0x2001, 0]
        || address.segments()[..3] == [0x2001, 2, 0]
        || address.segments()[..2] == [0x2001, 0xdb8]
        || first == 0x3fff && address.segments()[1] < 0x1000
        // Local-use NAT64 (64:ff9b:1::/48): translated to whatever the site's NAT64 maps it to.
        || address.segments()[..3] == [0x64, 0xff9b, 1]
        // NAT64 (64:ff9b::/96), IPv4-compatible and IPv4-translated (::ffff:0:0/96) addresses
        // carry an IPv4 address: judge that one.
        || (address.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
            || address.segments()[..6] == [0; 6]
            || address.segments()[..6] == [0, 0, 0, 0, 0xffff, 0])
            && refused_v4(Ipv4Addr::from((u128::from(address) as u32).to_be_bytes()))
        // 6to4 (2002::/16) carries one in its bits 16 to 47.
        || first == 0x2002 && refused_v4(Ipv4Addr::from(((u128::from(address) >> 80) as u32).to_be_bytes()))
}

/// A host that names an IPv4 address the way the C library's `inet_aton` reads one, and so the
/// worker's resolver: besides `a.b.c.d`, one to three parts whose last fills the remaining bits
/// (`127.1`, `2852039166`), each part decimal, octal (a leading `0`) or hex (`0x`). Such a host
/// is an address, not a name: `0xa9fea9fe` is 169.254.169.254.
pub fn numeric_ipv4_host(host: &str) -> Option<Ipv4Addr> {
    let parts: Vec<u32> = host.split('.').map(numeric_part).collect::<Option<_>>()?;
    let (last, leading) = parts.split_last()?;
    if leading.len() > 3 || leading.iter().any(|&part| part > 0xff) {
        return None;
    }
    let last_bits = 32 - 8 * leading.len() as u32;
    if last_bits < 32 && *last >> last_bits != 0 {
        return None;
    }
    let high = leading.iter().fold(0u32, |address, &part| (address << 8) | part);
    Some(Ipv4Addr::from(if leading.is_empty() { *last } else { (high << last_bits) | last }))
}

/// One part of [`numeric_ipv4_host`]: at most 32 bits.
fn numeric_part(part: &str) -> Option<u32> {
    let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
        None => (part, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_the_resolver_reads_as_ipv4_addresses_are_addresses() {
        let metadata = Some(Ipv4Addr::new(169, 254, 169, 254));
        for host in ["169.254.169.254", "0xa9fea9fe", "0XA9FEA9FE", "2852039166", "0251.0376.0251.0376", "169.254.43518", "169.16689662"] {
            assert_eq!(numeric_ipv4_host(host), metadata, "{host}");
        }
        assert_eq!(numeric_ipv4_host("127.1"), Some(Ipv4Addr::new(127, 0, 0, 1)));
        assert_eq!(numeric_ipv4_host("0"), Some(Ipv4Addr::UNSPECIFIED));
        for name in [
            "",
            ".",
            "1.2.3.4.5",
            "256.1.1.1",
            "1.2.3.256",
            "1.2.65536",
            "4294967296",
            "0x",
            "08",
            "0x1g",
            "a.b.c.d",
            "hooks.example.test",
            "1..2",
            "1.2.3.4.",
            "-1",
            "+1",
        ] {
            assert_eq!(numeric_ipv4_host(name), None, "{name}");
        }
    }

    fn allowed(list: &str) -> Vec<Network> {
        parse_allowed_networks(list).unwrap()
    }

    fn verdict(address: &str, list: &str) -> Result<(), Problem> {
        check(address.parse().unwrap(), &allowed(list)).map_err(|refused| Problem(refused.to_string()))
    }

    #[test]
    fn public_addresses_are_allowed() {
        for address in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:2800:220:1:248:1893:25c8:1946",
            "172.32.0.1",
            "100.128.0.1",
            "2002:5db8:d822::1",
            "192.0.3.1",
            "198.20.0.1",
            "2001:4860:4860::8888",
            "4000::1",
            "3fff:1000::1",
        ] {
            assert_eq!(verdict(address, ""), Ok(()), "{address}");
        }
    }

    #[test]
    fn internal_addresses_are_refused_by_default() {
        for address in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "100.64.0.1",
            "::1",
            "::",
            "fd00::1",
            "fc12::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::",
            "::7f00:1",
            // IPv4-translated (RFC 2765's ::ffff:0:0/96): where a translator takes it, the IPv4 address.
            "::ffff:0:7f00:1",
            "::ffff:0:a9fe:a9fe",
            // Special-purpose ranges.
            "192.0.0.8",
            "192.0.2.2",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "198.19.255.255",
            "240.0.0.1",
            "192.88.99.1",
            "fec0::1",
            "100::1",
            "2001::1",
            "2001:2::1",
            "2001:db8::1",
            "3fff:0fff::1",
        ] {
            assert!(verdict(address, "").is_err(), "{address}");
        }
        assert_eq!(verdict("169.254.169.254", ""), Err("destination 169.254.169.254 is not allowed (outbox.allowed_networks)".into()));
        assert_eq!(verdict("::ffff:10.0.0.1", ""), Err("destination 10.0.0.1 is not allowed (outbox.allowed_networks)".into()));
    }

    #[test]
    fn the_hosts_own_addresses_are_refused_whatever_their_range() {
        // (stop 48's security review reached a service on 0.0.0.0 through the host's own
        // 192.0.2.2, which the ranges did not refuse then.)
        let own = interfaces::interface_addresses();
        assert!(own.iter().any(|address| address.is_loopback()), "the interfaces were read: {own:?}");
        for address in own {
            assert!(verdict(&address.to_string(), "").is_err(), "{address}");
        }
    }

    #[test]
    fn allowed_networks_open_chosen_ranges_only() {
        assert_eq!(verdict("127.0.0.1", "127.0.0.1/32"), Ok(()));
        assert!(verdict("127.0.0.2", "127.0.0.1/32").is_err());
        assert_eq!(verdict("10.20.30.40", " 192.168.0.0/16 , 10.0.0.0/8"), Ok(()));
        assert_eq!(verdict("::ffff:127.0.0.1", "127.0.0.1"), Ok(()));
        assert_eq!(verdict("fd00::5", "fd00::/8"), Ok(()));
        assert!(verdict("::1", "127.0.0.1/32").is_err(), "an IPv4 network does not open IPv6 loopback");
        assert_eq!(verdict("169.254.169.254", "0.0.0.0/0"), Ok(()), "everything, if asked for");
    }

    #[test]
    fn networks_that_do_not_parse_are_named() {
        assert_eq!(parse_allowed_networks(""), Ok(vec![]));
        assert_eq!(parse_allowed_networks("10.0.0.0/33"), Err("\"10.0.0.0/33\" has a prefix length that is not 0 to 32".into()));
        assert_eq!(parse_allowed_networks("10.0.0.0/8,example.com"), Err("\"example.com\" is not an IP address or a CIDR network".into()));
        assert!(parse_allowed_networks("10.0.0.0/+8").is_err());
        assert!(parse_allowed_networks("::/129").is_err());
    }
}

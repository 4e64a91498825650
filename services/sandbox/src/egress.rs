//! Where a clone may connect: the repository host is resolved once, every
//! address is classified, and git is pinned to one accepted address before it
//! starts (issue 14, item 3: SSRF from the clone).
//!
//! [`refused_range`] is the pure classifier: loopback, unspecified,
//! private, shared (CGNAT), link-local (the cloud metadata address
//! 169.254.169.254 included), unique-local, multicast, broadcast,
//! documentation, benchmarking and other reserved ranges are refused, and
//! IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64, 6to4)
//! are judged by that address. Only public unicast addresses pass.
//!
//! [`Egress`] adds the operator's allowlist ([`AllowedHost`]: a host name or
//! an IP address, optionally with a port) for self-hosted git servers on
//! internal addresses, and [`Egress::pin`] resolves a host and returns the
//! address git must use ([`Pin`]), so a DNS answer that changes between the
//! check and the connection (rebinding) cannot move git elsewhere.
//!
//! Invariants: nothing here connects anywhere; a refusal never says which
//! range the address fell in to the user (callers report one generic
//! "could not be reached"), only to the operator's log.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// Longest a host name resolution may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most entries of an allowlist.
pub const ALLOWED_HOSTS_MAX: usize = 256;

/// A special-purpose address range a clone never connects to unless the
/// operator allowed the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// `0.0.0.0/8` ("this network"), `::`.
    Unspecified,
    /// `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// `100.64.0.0/10` (carrier-grade NAT, also used by cluster networks).
    Shared,
    /// `169.254.0.0/16` except the metadata address, `fe80::/10`.
    LinkLocal,
    /// `169.254.169.254` (and `fd00:ec2::254`): cloud instance metadata.
    Metadata,
    /// `fc00::/7` (unique local), `fec0::/10` (deprecated site local).
    UniqueLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`.
    Benchmarking,
    /// Other reserved or non-global ranges: `192.0.0.0/24`, `192.88.99.0/24`,
    /// `240.0.0.0/4`, `100::/64`, `2001::/23` (Teredo, ORCHID, ...),
    /// `64:ff9b:1::/48`, and everything outside `2000::/3`.
    Reserved,
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Loopback => "loopback",
            Self::Unspecified => "unspecified",
            Self::Private => "private",
            Self::Shared => "shared (CGNAT)",
            Self::LinkLocal => "link-local",
            Self::Metadata => "cloud metadata",
            Self::UniqueLocal => "unique-local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Documentation => "documentation",
            Self::Benchmarking => "benchmarking",
            Self::Reserved => "reserved",
        })
    }
}

/// The special range `address` falls in, or `None` for a public unicast
/// address a clone may connect to.
pub fn refused_range(address: IpAddr) -> Option<Range> {
    match address {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(address: Ipv4Addr) -> Option<Range> {
    let [a, b, c, _] = address.octets();
    let range = match (a, b, c) {
        _ if address == Ipv4Addr::new(169, 254, 169, 254) => Range::Metadata,
        _ if address.is_broadcast() => Range::Broadcast,
        (0, _, _) => Range::Unspecified,
        (127, _, _) => Range::Loopback,
        (10, _, _) | (172, 16..=31, _) | (192, 168, _) => Range::Private,
        (100, 64..=127, _) => Range::Shared,
        (169, 254, _) => Range::LinkLocal,
        (224..=239, _, _) => Range::Multicast,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => Range::Documentation,
        (198, 18..=19, _) => Range::Benchmarking,
        (192, 0, 0) | (192, 88, 99) | (240..=255, _, _) => Range::Reserved,
        _ => return None,
    };
    Some(range)
}

fn refused_v6(address: Ipv6Addr) -> Option<Range> {
    let segments = address.segments();
    let embedded_v4 = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    if address.is_loopback() {
        return Some(Range::Loopback);
    }
    if address.is_unspecified() {
        return Some(Range::Unspecified);
    }
    let embedded = embedded_v4(segments[6], segments[7]);
    // IPv4-mapped (::ffff:a.b.c.d): the kernel connects to the IPv4 address.
    if segments[..6] == [0, 0, 0, 0, 0, 0xffff] {
        return refused_v4(embedded);
    }
    // IPv4-compatible (::a.b.c.d, deprecated): never a real destination.
    if segments[..6] == [0; 6] {
        return Some(refused_v4(embedded).unwrap_or(Range::Reserved));
    }
    // NAT64 well-known prefix 64:ff9b::/96: judged by the IPv4 address.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return refused_v4(embedded);
    }
    // 6to4 2002::/16 carries the IPv4 address in bits 16..48.
    if segments[0] == 0x2002 {
        return refused_v4(embedded_v4(segments[1], segments[2]));
    }
    if address == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254) {
        return Some(Range::Metadata);
    }
    let range = match segments[0] {
        0xff00..=0xffff => Range::Multicast,
        0xfe80..=0xfebf => Range::LinkLocal,
        0xfec0..=0xfeff | 0xfc00..=0xfdff => Range::UniqueLocal,
        0x2001 if segments[1] == 0x0db8 => Range::Documentation,
        0x2001 if segments[1] == 0x0002 && segments[2] == 0 => Range::Benchmarking,
        // 2001::/23: IETF protocol assignments (Teredo, ORCHID, AMT, ...).
        0x2001 if segments[1] < 0x0200 => Range::Reserved,
        0x0064 if segments[1] == 0xff9b && segments[2] == 1 => Range::Reserved,
        0x2000..=0x3fff => return None,
        _ => Range::Reserved,
    };
    Some(range)
}

/// What was wrong with an allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{entry}' is not a host name or IP address with an optional port: {reason}")]
pub struct AllowedHostError {
    /// The entry as configured (operator input, not user input).
    pub entry: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// One allowlist entry: a host name or an IP address, optionally with a
/// port (`git.internal`, `git.internal:8443`, `10.0.0.5`, `[fd00::5]:443`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    host: HostPattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// Lowercase host name, without a trailing dot.
    Name(String),
    Address(IpAddr),
}

impl AllowedHost {
    /// Parses one configured entry.
    pub fn parse(entry: &str) -> Result<Self, AllowedHostError> {
        let error = |reason| AllowedHostError {
            entry: entry.to_owned(),
            reason,
        };
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (address, after) = rest
                .split_once(']')
                .ok_or_else(|| error("an IPv6 address opened with '[' must close with ']'"))?;
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| error("expected ':<port>' after ']'"))?,
                ),
            };
            let address: Ipv6Addr = address
                .parse()
                .map_err(|_| error("not an IPv6 address between '[' and ']'"))?;
            (HostPattern::Address(IpAddr::V6(address)), port)
        } else if let Ok(address) = entry.parse::<IpAddr>() {
            (HostPattern::Address(address), None)
        } else {
            let (host, port) = match entry.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (entry, None),
            };
            let host = if let Ok(address) = host.parse::<Ipv4Addr>() {
                HostPattern::Address(IpAddr::V4(address))
            } else {
                let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
                if !is_host_name(&name) {
                    return Err(error(
                        "a host name is 1-253 characters of letters, digits, '-' and '.'",
                    ));
                }
                HostPattern::Name(name)
            };
            (host, port)
        };
        let port = match port {
            None => None,
            Some(port) => Some(
                port.parse::<u16>()
                    .ok()
                    .filter(|port| *port != 0)
                    .ok_or_else(|| error("the port must be a number from 1 to 65535"))?,
            ),
        };
        Ok(Self { host, port })
    }

    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|allowed| allowed == port)
    }
}

fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
        // A name whose last label is numeric would be read as an address.
        && !name
            .rsplit('.')
            .next()
            .is_some_and(|last| last.chars().all(|c| c.is_ascii_digit()))
}

/// Why a host was not connected to. Only the operator's log sees the
/// difference; users get one generic "could not be reached".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The name did not resolve (or resolution timed out).
    #[error("the host name did not resolve")]
    Unresolved,
    /// Every address is in a special range and the host is not allowed.
    #[error("the host resolves only to {0} addresses and is not in the allowlist")]
    Refused(Range),
}

/// The address git is pinned to for one host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// The host as it appears in the URL (lowercase).
    pub host: String,
    /// The port git connects to.
    pub port: u16,
    /// The accepted address.
    pub address: IpAddr,
}

impl Pin {
    /// The value of git's `http.curloptResolve` (curl's `CURLOPT_RESOLVE`):
    /// `host:port:address`, IPv6 addresses in brackets.
    pub fn curl_resolve(&self) -> String {
        match self.address {
            IpAddr::V4(address) => format!("{}:{}:{address}", self.host, self.port),
            IpAddr::V6(address) => format!("{}:{}:[{address}]", self.host, self.port),
        }
    }
}

/// The clone's egress policy: public addresses, plus the allowlisted hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Egress {
    allowed: Vec<AllowedHost>,
}

impl Egress {
    /// A policy with the given allowlist entries (validated).
    pub fn new<S: AsRef<str>>(allowed: &[S]) -> Result<Self, AllowedHostError> {
        if allowed.len() > ALLOWED_HOSTS_MAX {
            return Err(AllowedHostError {
                entry: format!("{} entries", allowed.len()),
                reason: "too many entries (at most 256)",
            });
        }
        let allowed = allowed
            .iter()
            .map(|entry| AllowedHost::parse(entry.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self { allowed })
    }

    /// Pure decision: the first of `addresses` (resolved from `host`) that
    /// `host:port` may connect to. An address passes when it is public, when
    /// the host name itself is allowlisted, or when the address is.
    pub fn choose(&self, host: &str, port: u16, addresses: &[IpAddr]) -> Result<IpAddr, Refusal> {
        let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        let name_allowed = self.allowed.iter().any(|allowed| {
            allowed.port_matches(port)
                && matches!(&allowed.host, HostPattern::Name(n) if *n == name)
        });
        let address_allowed = |address: &IpAddr| {
            self.allowed.iter().any(|allowed| {
                allowed.port_matches(port)
                    && matches!(allowed.host, HostPattern::Address(a) if canonical(a) == canonical(*address))
            })
        };
        let mut refused = None;
        for address in addresses {
            match refused_range(*address) {
                None => return Ok(*address),
                Some(_) if name_allowed || address_allowed(address) => return Ok(*address),
                Some(range) => refused = refused.or(Some(range)),
            }
        }
        Err(refused.map_or(Refusal::Unresolved, Refusal::Refused))
    }

    /// Resolves `host` (an IP literal resolves to itself, without DNS) and
    /// chooses the address git is pinned to. Connects nowhere.
    pub async fn pin(&self, host: &str, port: u16) -> Result<Pin, Refusal> {
        let addresses: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(address) => vec![address],
            Err(_) => {
                let lookup = tokio::net::lookup_host((host, port));
                match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
                    Ok(Ok(found)) => found.map(|address| address.ip()).collect(),
                    Ok(Err(_)) | Err(_) => return Err(Refusal::Unresolved),
                }
            }
        };
        let address = self.choose(host, port, &addresses)?;
        Ok(Pin {
            host: host.to_ascii_lowercase(),
            port,
            address,
        })
    }
}

/// An IPv4-mapped IPv6 address as its IPv4 address, so allowlisting
/// `10.0.0.5` also covers `::ffff:10.0.0.5`.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn special_ranges_are_refused_by_name() {
        let cases = [
            ("127.0.0.1", Range::Loopback),
            ("127.255.255.254", Range::Loopback),
            ("::1", Range::Loopback),
            ("0.0.0.0", Range::Unspecified),
            ("0.1.2.3", Range::Unspecified),
            ("::", Range::Unspecified),
            ("10.0.0.1", Range::Private),
            ("172.16.0.1", Range::Private),
            ("172.31.255.255", Range::Private),
            ("192.168.1.1", Range::Private),
            ("100.64.0.1", Range::Shared),
            ("100.127.255.255", Range::Shared),
            ("100.100.100.200", Range::Shared),
            ("169.254.169.254", Range::Metadata),
            ("fd00:ec2::254", Range::Metadata),
            ("169.254.0.1", Range::LinkLocal),
            ("fe80::1", Range::LinkLocal),
            ("fc00::1", Range::UniqueLocal),
            ("fd12:3456::1", Range::UniqueLocal),
            ("fec0::1", Range::UniqueLocal),
            ("224.0.0.1", Range::Multicast),
            ("239.255.255.250", Range::Multicast),
            ("ff02::1", Range::Multicast),
            ("255.255.255.255", Range::Broadcast),
            ("192.0.2.1", Range::Documentation),
            ("198.51.100.1", Range::Documentation),
            ("203.0.113.1", Range::Documentation),
            ("2001:db8::1", Range::Documentation),
            ("198.18.0.1", Range::Benchmarking),
            ("2001:2::1", Range::Benchmarking),
            ("192.0.0.1", Range::Reserved),
            ("240.0.0.1", Range::Reserved),
            ("2001::1", Range::Reserved),
            ("100::1", Range::Reserved),
            ("64:ff9b:1::1", Range::Reserved),
            // IPv4 hidden in IPv6 is judged by the IPv4 address.
            ("::ffff:127.0.0.1", Range::Loopback),
            ("::ffff:169.254.169.254", Range::Metadata),
            ("::ffff:10.1.2.3", Range::Private),
            ("::127.0.0.1", Range::Loopback),
            ("64:ff9b::a9fe:a9fe", Range::Metadata),
            ("64:ff9b::7f00:1", Range::Loopback),
            ("2002:a00:1::1", Range::Private),
            ("2002:7f00:1::", Range::Loopback),
        ];
        for (text, expected) in cases {
            assert_eq!(refused_range(ip(text)), Some(expected), "{text}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for text in [
            "1.1.1.1",
            "8.8.8.8",
            "140.82.112.3",
            "172.15.255.255",
            "172.32.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "169.253.255.255",
            "223.255.255.255",
            "2606:4700::1111",
            "2a00:1450::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert_eq!(refused_range(ip(text)), None, "{text}");
        }
    }

    proptest! {
        #[test]
        fn mapped_ipv6_is_judged_like_its_ipv4(octets in any::<[u8; 4]>()) {
            let v4 = Ipv4Addr::from(octets);
            let mapped = IpAddr::V6(v4.to_ipv6_mapped());
            prop_assert_eq!(refused_range(mapped), refused_range(IpAddr::V4(v4)));
            let nat64 = {
                let [a, b, c, d] = octets;
                IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d])))
            };
            prop_assert_eq!(refused_range(nat64), refused_range(IpAddr::V4(v4)));
        }

        #[test]
        fn every_private_loopback_and_link_local_v4_is_refused(host in any::<u32>(), which in 0usize..5) {
            let (base, bits): (u32, u32) = [
                (0x7f00_0000, 8),  // 127/8
                (0x0a00_0000, 8),  // 10/8
                (0xac10_0000, 12), // 172.16/12
                (0xc0a8_0000, 16), // 192.168/16
                (0xa9fe_0000, 16), // 169.254/16
            ][which];
            let address = Ipv4Addr::from(base | (host >> bits));
            prop_assert!(refused_range(IpAddr::V4(address)).is_some(), "{}", address);
        }

        #[test]
        fn every_ula_link_local_and_multicast_v6_is_refused(rest in any::<u128>(), which in 0usize..3) {
            let (base, bits): (u128, u32) = [
                (0xfc00 << 112, 7),
                (0xfe80 << 112, 10),
                (0xff00 << 112, 8),
            ][which];
            let address = Ipv6Addr::from(base | (rest >> bits));
            prop_assert!(refused_range(IpAddr::V6(address)).is_some(), "{}", address);
        }

        #[test]
        fn without_an_allowlist_a_refused_address_is_never_chosen(addresses in proptest::collection::vec(any::<IpAddr>(), 0..6)) {
            match Egress::default().choose("repo.example", 443, &addresses) {
                Ok(chosen) => prop_assert_eq!(refused_range(chosen), None),
                Err(_) => prop_assert!(addresses.iter().all(|a| refused_range(*a).is_some())),
            }
        }
    }

    #[test]
    fn the_allowlist_admits_named_hosts_and_addresses_with_their_ports() {
        let egress =
            Egress::new(&["git.internal", "10.0.0.5:8443", "[fd00::5]", "127.0.0.1"]).unwrap();
        let private = [ip("10.9.9.9")];
        assert_eq!(
            egress.choose("GIT.internal.", 443, &private),
            Ok(ip("10.9.9.9"))
        );
        assert_eq!(
            egress.choose("other.internal", 443, &private),
            Err(Refusal::Refused(Range::Private))
        );
        assert_eq!(
            egress.choose("10.0.0.5", 8443, &[ip("10.0.0.5")]),
            Ok(ip("10.0.0.5"))
        );
        assert_eq!(
            egress.choose("10.0.0.5", 443, &[ip("10.0.0.5")]),
            Err(Refusal::Refused(Range::Private))
        );
        assert_eq!(egress.choose("x", 1, &[ip("fd00::5")]), Ok(ip("fd00::5")));
        assert_eq!(
            egress.choose("x", 1, &[ip("::ffff:127.0.0.1")]),
            Ok(ip("::ffff:127.0.0.1"))
        );
        // A name resolving to a private and a public address is pinned to the public one.
        assert_eq!(
            Egress::default().choose("mixed", 443, &[ip("10.0.0.1"), ip("1.1.1.1")]),
            Ok(ip("1.1.1.1"))
        );
        assert_eq!(
            Egress::default().choose("none", 443, &[]),
            Err(Refusal::Unresolved)
        );
    }

    #[test]
    fn bad_allowlist_entries_are_named() {
        for bad in [
            "",
            "a b",
            "host:0",
            "host:99999",
            "[::1",
            "[::1]x",
            "[zz]",
            "-x.com",
            "1.2.3",
            "http://x",
        ] {
            let error = AllowedHost::parse(bad).unwrap_err();
            assert_eq!(error.entry, bad);
        }
        assert!(Egress::new(&vec!["x"; ALLOWED_HOSTS_MAX + 1]).is_err());
    }

    #[test]
    fn pins_name_the_host_port_and_address_for_curl() {
        let pin = Pin {
            host: "git.internal".into(),
            port: 443,
            address: ip("10.0.0.5"),
        };
        assert_eq!(pin.curl_resolve(), "git.internal:443:10.0.0.5");
        let pin = Pin {
            address: ip("fd00::5"),
            ..pin
        };
        assert_eq!(pin.curl_resolve(), "git.internal:443:[fd00::5]");
    }

    #[tokio::test]
    async fn literal_addresses_are_judged_without_dns() {
        assert_eq!(
            Egress::default().pin("127.0.0.1", 443).await,
            Err(Refusal::Refused(Range::Loopback))
        );
        let allowed = Egress::new(&["127.0.0.1"]).unwrap();
        assert_eq!(
            allowed.pin("127.0.0.1", 443).await.unwrap().address,
            ip("127.0.0.1")
        );
    }
}

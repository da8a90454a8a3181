//! Which addresses the gateway may not connect out to unless an operator
//! allows it: its own machine, its networks, a cloud's metadata service.
//! The one predicate behind both outgoing guards: notification targets
//! (`crate::notify::guard`) and remote agents (`crate::acp::remote`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether the gateway must not send to `ip` (unless allowed).
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4);
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // fc00::/7 unique local (fd00:ec2::254, the EC2 metadata
                // service, among them)
                || (s[0] & 0xfe00) == 0xfc00
                // fe80::/10 link-local
                || (s[0] & 0xffc0) == 0xfe80
                // ::a.b.c.d (deprecated IPv4-compatible) and 64:ff9b::/96
                // (NAT64) carry an IPv4 address that may be private
                || (s[0..6] == [0, 0, 0, 0, 0, 0])
                || (s[0] == 0x64 && s[1] == 0xff9b && forbidden_v4(embedded_v4(v6)))
        }
    }
}

fn embedded_v4(v6: Ipv6Addr) -> Ipv4Addr {
    let o = v6.octets();
    Ipv4Addr::new(o[12], o[13], o[14], o[15])
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // 169.254/16, the metadata address among them
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast()
        || o[0] == 0 // "this network"
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64/10, CGNAT
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // 192.0.0/24, IETF
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // 198.18/15, benchmarking
        || o[0] >= 240 // reserved
}

//! Which address a rank tells others to reach it at, and which ranks share a host.

use std::net::{IpAddr, Ipv4Addr};

use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;

/// An interface filter in NCCL_SOCKET_IFNAME's syntax: comma-separated prefixes, `^` to
/// exclude, `=` for exact names.
fn matches(filter: &str, name: &str) -> bool {
    let (exclude, list) = match filter.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, filter),
    };
    let (exact, list) = match list.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let hit = list.split(',').map(str::trim).filter(|p| !p.is_empty()).any(|p| {
        if exact {
            name == p
        } else {
            name.starts_with(p)
        }
    });
    hit != exclude
}

/// The interface filter from `TOPOCCL_SOCKET_IFNAME` or `NCCL_SOCKET_IFNAME`.
pub(crate) fn interface_filter() -> Option<String> {
    crate::env::var("TOPOCCL_SOCKET_IFNAME").or_else(|| crate::env::var("NCCL_SOCKET_IFNAME"))
}

/// An IPv4 address of an up interface: the first accepted by the filter, or without a
/// filter the first that is not loopback.
pub(crate) fn interface_ip(filter: Option<&str>) -> Option<IpAddr> {
    let addrs = getifaddrs().ok()?;
    let mut loopback = None;
    for a in addrs {
        if !a.flags.contains(InterfaceFlags::IFF_UP) {
            continue;
        }
        let Some(ip) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()).map(|s| IpAddr::V4(s.ip())) else {
            continue;
        };
        match filter {
            Some(f) if matches(f, &a.interface_name) => return Some(ip),
            Some(_) => {}
            None if a.flags.contains(InterfaceFlags::IFF_LOOPBACK) => loopback = loopback.or(Some(ip)),
            None => return Some(ip),
        }
    }
    if filter.is_some() {
        None
    } else {
        loopback.or(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)))
    }
}

/// Identifies the shared-memory domain of this process: host name, boot, and network
/// namespace (ranks in different namespaces, as in emulated topologies, count as different
/// hosts, so they talk over their shaped links). `TOPOCCL_HOSTID` (or NCCL's `NCCL_HOSTID`)
/// stands in for the host name: processes given different ones count as different hosts
/// (how tests run cross-host transports on one machine).
pub(crate) fn host_id() -> u64 {
    let host = crate::env::var("TOPOCCL_HOSTID")
        .or_else(|| crate::env::var("NCCL_HOSTID"))
        .unwrap_or_else(|| nix::unistd::gethostname().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
    topoccl_synth::hash::fnv64(format!("{host}\n{boot}\n{netns}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_follow_nccl_syntax() {
        assert!(matches("eth,ib", "eth0"));
        assert!(matches("eth,ib", "ib1"));
        assert!(!matches("eth", "lo"));
        assert!(matches("^docker,lo", "eth0"));
        assert!(!matches("^docker,lo", "docker0"));
        assert!(matches("=eth0", "eth0"));
        assert!(!matches("=eth0", "eth01"));
    }

    #[test]
    fn some_address_is_always_found() {
        assert!(interface_ip(None).is_some());
        assert!(interface_ip(Some("=no-such-interface")).is_none());
        assert_eq!(host_id(), host_id());
    }
}

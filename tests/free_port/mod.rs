//! A port for a rendezvous that the ranks' own listeners cannot take: a free one below the
//! kernel's ephemeral range. (A port from `bind(0)` is released before rank 0 binds it again,
//! and meanwhile any rank's data listener, itself bound to port 0, may be given it: every rank
//! then fails to start.)

use std::net::TcpListener;
use std::time::{SystemTime, UNIX_EPOCH};

/// The first port the kernel hands out for `bind(0)` (Linux's default when unreadable).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// A port no one listens on now, outside the ephemeral range.
pub fn free_port() -> u16 {
    let top = ephemeral_start().max(12_000);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let mut x = u64::from(nanos) ^ (u64::from(std::process::id()) << 32);
    for _ in 0..1000 {
        // xorshift: spreads concurrent callers over the range.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = 10_000 + (x % u64::from(top - 10_000)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below {top}");
}

//! How ranks find each other: NCCL's model. One process creates a [`UniqueId`] (the address of
//! a small rendezvous service it starts, plus a random 128-bit secret), the id travels to every
//! rank out of band, and each rank reports its own data address and host to the service, which
//! answers with everyone's once all `nranks` have arrived. A connection that does not present
//! the secret is dropped.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use topoccl_transports::ipc::DeviceId;

use crate::error::{Error, Result};
use crate::greet::{Greeter, HELLO_DEADLINE, MAX_UNGREETED};

/// Bytes of a serialised [`UniqueId`] (NCCL's `NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;
const ID_MAGIC: &[u8; 8] = b"TOPOCCL1";
pub(crate) const HELLO_MAGIC: &[u8; 4] = b"TCHI";

/// Identifies one communicator being created: where its rendezvous runs and its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    root: SocketAddr,
    secret: [u8; 16],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("UniqueId").field("root", &self.root).finish_non_exhaustive()
    }
}

/// A rank's entry in the rendezvous table (NCCL's peer info): where it listens, and what the
/// transports judge a pair by — its host, process and GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    pub addr: SocketAddr,
    pub host: u64,
    /// The port of the process's watch service ([`crate::diag`]), on `addr`'s address.
    pub watch_port: u16,
    pub pid: u32,
    /// The GPU the rank drives, known at init (`Config::cuda_device`, or the context current
    /// on the thread that joined).
    pub device: Option<DeviceId>,
    /// Whether the rank has an RDMA port its verbs transport opened.
    pub rdma: bool,
}

impl PeerInfo {
    /// Where the rank's process answers progress queries.
    pub(crate) fn watch_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr.ip(), self.watch_port)
    }
}

pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::io("reading /dev/urandom", e))?;
    Ok(b)
}

fn encode_addr(a: SocketAddr, out: &mut Vec<u8>) {
    let ip = match a.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    out.extend_from_slice(&ip.octets());
    out.extend_from_slice(&a.port().to_le_bytes());
}

fn decode_addr(b: &[u8]) -> SocketAddr {
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&b[..16]);
    let ip6 = Ipv6Addr::from(ip);
    let ip = ip6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(ip6));
    SocketAddr::new(ip, u16::from_le_bytes([b[16], b[17]]))
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

/// Most ranks a communicator may have: a hello's rank count is checked against it before the
/// service sizes its table.
pub(crate) const MAX_RANKS: u32 = 1 << 20;

const ADDR_BYTES: usize = 18;
/// The layout of an entry, its first byte: ranks of another layout are refused by name.
const ENTRY_VERSION: u8 = 3;
/// Version, address, host, watch port, pid, whether a device follows, its UUID, PCI bus id and
/// ordinal, and whether the rank has an RDMA port.
const ENTRY_BYTES: usize = 1 + ADDR_BYTES + 8 + 2 + 4 + 1 + 16 + 8 + 4 + 1;
pub(crate) const HELLO_BYTES: usize = 4 + 16 + 4 + 4 + ENTRY_BYTES;

impl UniqueId {
    /// Starts a rendezvous service on an ephemeral port of this host and returns its id, as
    /// `ncclGetUniqueId` does. The service answers one communicator's ranks, then exits.
    pub fn new() -> Result<UniqueId> {
        let ip = super::netif::interface_ip(super::netif::interface_filter().as_deref())
            .ok_or_else(|| Error::Bootstrap("no network interface matches TOPOCCL_SOCKET_IFNAME".into()))?;
        UniqueId::serve(SocketAddr::new(ip, 0), random_bytes()?, super::Config::from_env()?.timeout)
    }

    /// Starts the rendezvous service on `addr` (binding all interfaces on its port) with a
    /// known secret; used by launch-environment initialisation, where rank 0 runs it.
    pub(crate) fn serve(addr: SocketAddr, secret: [u8; 16], timeout: Duration) -> Result<UniqueId> {
        let bind = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), addr.port());
        let listener = TcpListener::bind(bind)
            .map_err(|e| Error::Bootstrap(format!("cannot listen on port {} for the rendezvous: {e}", addr.port())))?;
        let port = listener.local_addr().map_err(|e| Error::io("rendezvous address", e))?.port();
        std::thread::Builder::new()
            .name("topoccl-rendezvous".into())
            .spawn(move || serve_rendezvous(listener, secret, timeout))
            .map_err(|e| Error::io("starting the rendezvous thread", e))?;
        Ok(UniqueId { root: SocketAddr::new(addr.ip(), port), secret })
    }

    /// An id naming an existing service (the other ranks' side of launch-environment init).
    pub(crate) fn remote(root: SocketAddr, secret: [u8; 16]) -> UniqueId {
        UniqueId { root, secret }
    }

    pub fn root_addr(&self) -> SocketAddr {
        self.root
    }

    pub(crate) fn secret(&self) -> [u8; 16] {
        self.secret
    }

    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut v = Vec::with_capacity(UNIQUE_ID_BYTES);
        v.extend_from_slice(ID_MAGIC);
        encode_addr(self.root, &mut v);
        v.extend_from_slice(&self.secret);
        let mut out = [0u8; UNIQUE_ID_BYTES];
        out[..v.len()].copy_from_slice(&v);
        out
    }

    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        if b.len() < 8 + ADDR_BYTES + 16 || &b[..8] != ID_MAGIC {
            return Err(Error::InvalidArgument("not a topoccl unique id (was it made by UniqueId::new?)".into()));
        }
        let mut secret = [0u8; 16];
        secret.copy_from_slice(&b[8 + ADDR_BYTES..8 + ADDR_BYTES + 16]);
        Ok(UniqueId { root: decode_addr(&b[8..8 + ADDR_BYTES]), secret })
    }
}

/// The rendezvous service: collects `nranks` hellos that carry the secret, then answers each.
fn serve_rendezvous(listener: TcpListener, secret: [u8; 16], timeout: Duration) {
    // Give up a little before the ranks do, so they hear who is missing.
    let deadline = Instant::now() + timeout.mul_f64(0.9);
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let mut nranks: Option<u32> = None;
    let mut entries: Vec<Option<(TcpStream, [u8; ENTRY_BYTES])>> = Vec::new();
    let mut problem: Option<String> = None;
    let mut greeter = Greeter::<HELLO_BYTES>::new(HELLO_DEADLINE, MAX_UNGREETED);
    let mut prefix = [0u8; 20];
    prefix[..4].copy_from_slice(HELLO_MAGIC);
    prefix[4..].copy_from_slice(&secret);
    let mut greeted = Vec::new();
    while Instant::now() < deadline {
        if greeted.is_empty() {
            match greeter.poll(&listener, &prefix, &mut greeted) {
                Ok(true) => {}
                Ok(false) | Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
        let Some((mut s, hello)) = greeted.pop() else { continue };
        // Answers go out within the hello's deadline too: a rank that stops reading cannot
        // hold the service up.
        let _ = s.set_write_timeout(Some(HELLO_DEADLINE));
        let (rank, n) = (u32_at(&hello, 20), u32_at(&hello, 24));
        if n == 0 || n > MAX_RANKS {
            let _ = reply_error(&mut s, &format!("rank {rank} says there are {n} ranks (1 to {MAX_RANKS} supported)"));
            continue;
        }
        let expected = *nranks.get_or_insert(n);
        if n != expected {
            problem = Some(format!("rank {rank} says there are {n} ranks, an earlier rank said {expected}"));
        } else if rank >= n {
            problem = Some(format!("rank {rank} is out of range for {n} ranks"));
        }
        entries.resize_with(expected as usize, || None);
        let mut entry = [0u8; ENTRY_BYTES];
        entry.copy_from_slice(&hello[28..28 + ENTRY_BYTES]);
        if entry[0] != ENTRY_VERSION {
            problem = Some(format!(
                "rank {rank} sent a v{} bootstrap record, this rendezvous speaks v{ENTRY_VERSION} (mixed topoccl versions?)",
                entry[0]
            ));
        }
        if let Some(slot) = entries.get_mut(rank as usize) {
            if slot.is_some() {
                problem = Some(format!("two processes claim rank {rank}"));
            }
            *slot = Some((s, entry));
        } else {
            let _ = reply_error(&mut s, problem.as_deref().unwrap_or("bad rank"));
        }
        if let Some(p) = &problem {
            for (st, _) in entries.iter_mut().flatten() {
                let _ = reply_error(st, p);
            }
            return;
        }
        if entries.iter().all(Option::is_some) {
            let mut table = vec![0u8];
            for (_, e) in entries.iter().flatten() {
                table.extend_from_slice(e);
            }
            for (st, _) in entries.iter_mut().flatten() {
                let _ = st.write_all(&table);
            }
            return;
        }
    }
    let missing: Vec<String> =
        entries.iter().enumerate().filter(|(_, e)| e.is_none()).map(|(r, _)| r.to_string()).collect();
    let message = format!(
        "rank(s) {} of {} never reached the rendezvous within {:.1} s (TOPOCCL_TIMEOUT)",
        missing.join(", "),
        entries.len(),
        timeout.as_secs_f64()
    );
    for (st, _) in entries.iter_mut().flatten() {
        let _ = reply_error(st, &message);
    }
}

fn reply_error(s: &mut TcpStream, message: &str) -> std::io::Result<()> {
    let mut v = vec![1u8];
    v.extend_from_slice(&(message.len() as u32).to_le_bytes());
    v.extend_from_slice(message.as_bytes());
    s.write_all(&v)
}

/// Connects to `addr`, retrying until `deadline` (the service may not be up yet).
pub(crate) fn connect_retry(addr: SocketAddr, deadline: Instant, what: &str) -> Result<TcpStream> {
    let mut last = None;
    while Instant::now() < deadline {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(Error::Bootstrap(format!(
        "could not reach {what} at {addr} before the deadline (TOPOCCL_TIMEOUT){}",
        last.map(|e| format!(": {e}")).unwrap_or_default()
    )))
}

/// Reports `me` as `rank` of `nranks` and returns every rank's entry.
pub(crate) fn rendezvous(
    id: &UniqueId,
    rank: u32,
    nranks: u32,
    me: PeerInfo,
    deadline: Instant,
) -> Result<Vec<PeerInfo>> {
    let mut s = connect_retry(id.root, deadline, "the rendezvous (is rank 0 running?)")?;
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(HELLO_MAGIC);
    hello.extend_from_slice(&id.secret);
    hello.extend_from_slice(&rank.to_le_bytes());
    hello.extend_from_slice(&nranks.to_le_bytes());
    encode_peer(&me, &mut hello);
    s.write_all(&hello).map_err(|e| Error::io("sending to the rendezvous", e))?;
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).map_err(|e| Error::io("rendezvous socket", e))?;
    let lost = |e: std::io::Error| {
        Error::Bootstrap(format!("the rendezvous at {} did not answer with all {nranks} ranks in time: {e}", id.root))
    };
    let mut status = [0u8; 1];
    s.read_exact(&mut status).map_err(lost)?;
    if status[0] != 0 {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).map_err(lost)?;
        let mut msg = vec![0u8; u32::from_le_bytes(len).min(4096) as usize];
        s.read_exact(&mut msg).map_err(lost)?;
        return Err(Error::Bootstrap(String::from_utf8_lossy(&msg).into_owned()));
    }
    let mut table = vec![0u8; nranks as usize * ENTRY_BYTES];
    s.read_exact(&mut table).map_err(lost)?;
    Ok(table.chunks_exact(ENTRY_BYTES).map(decode_peer).collect())
}

pub(crate) fn encode_peer(p: &PeerInfo, out: &mut Vec<u8>) {
    out.push(ENTRY_VERSION);
    encode_addr(p.addr, out);
    out.extend_from_slice(&p.host.to_le_bytes());
    out.extend_from_slice(&p.watch_port.to_le_bytes());
    out.extend_from_slice(&p.pid.to_le_bytes());
    let d = p.device.unwrap_or(DeviceId { uuid: [0; 16], pci_bus: 0, ordinal: 0 });
    out.push(u8::from(p.device.is_some()));
    out.extend_from_slice(&d.uuid);
    out.extend_from_slice(&d.pci_bus.to_le_bytes());
    out.extend_from_slice(&d.ordinal.to_le_bytes());
    out.push(u8::from(p.rdma));
}

/// The entry in `b` (at least [`PEER_BYTES`] long; its version checked by the rendezvous).
pub(crate) fn decode_peer(b: &[u8]) -> PeerInfo {
    let at = 1 + ADDR_BYTES;
    let dev = at + 8 + 2 + 4;
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&b[dev + 1..dev + 17]);
    PeerInfo {
        addr: decode_addr(&b[1..at]),
        host: u64_at(b, at),
        watch_port: u16::from_le_bytes([b[at + 8], b[at + 9]]),
        pid: u32_at(b, at + 10),
        device: (b[dev] == 1).then(|| DeviceId { uuid, pci_bus: u64_at(b, dev + 17), ordinal: u32_at(b, dev + 25) }),
        rdma: b[dev + 29] == 1,
    }
}

pub(crate) const PEER_BYTES: usize = ENTRY_BYTES;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_bytes() {
        let id = UniqueId::remote("10.1.2.3:29500".parse().unwrap(), [7; 16]);
        let b = id.to_bytes();
        assert_eq!(UniqueId::from_bytes(&b).unwrap(), id);
        assert!(UniqueId::from_bytes(&[0; 128]).is_err());
        let v6 = UniqueId::remote("[fe80::1]:5".parse().unwrap(), [1; 16]);
        assert_eq!(UniqueId::from_bytes(&v6.to_bytes()).unwrap(), v6);
        assert!(!format!("{id:?}").contains("7, 7"));
    }

    #[test]
    fn the_rendezvous_ignores_strangers_and_answers_everyone() {
        let id = UniqueId::serve("127.0.0.1:0".parse().unwrap(), [3; 16], Duration::from_secs(20)).unwrap();
        // A stranger without the secret.
        let mut s = TcpStream::connect(id.root).unwrap();
        s.write_all(&[0u8; HELLO_BYTES]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let tables: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..3u32)
                .map(|r| {
                    let id = id.clone();
                    sc.spawn(move || {
                        let me = PeerInfo {
                            addr: SocketAddr::new("127.0.0.1".parse().unwrap(), 1000 + r as u16),
                            host: 9,
                            watch_port: 7,
                            pid: r,
                            device: None,
                            rdma: false,
                        };
                        rendezvous(&id, r, 3, me, deadline).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for t in &tables {
            assert_eq!(t.iter().map(|p| p.addr.port()).collect::<Vec<_>>(), [1000, 1001, 1002]);
        }
        let wrong = UniqueId::remote(id.root, [4; 16]);
        let me = PeerInfo {
            addr: "127.0.0.1:1".parse().unwrap(),
            host: 0,
            watch_port: 0,
            pid: 0,
            device: None,
            rdma: false,
        };
        assert!(rendezvous(&wrong, 0, 1, me, Instant::now() + Duration::from_millis(300)).is_err());
    }

    /// Idle connections (a port scanner, a health check) opened before the ranks arrive must
    /// not hold them up: the service once read one hello at a time, 5 s each.
    #[test]
    fn idle_strangers_do_not_hold_up_the_rendezvous() {
        let id = UniqueId::serve("127.0.0.1:0".parse().unwrap(), [5; 16], Duration::from_secs(60)).unwrap();
        let idle: Vec<_> = (0..6).map(|_| TcpStream::connect(id.root).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(50));
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(8);
        std::thread::scope(|sc| {
            for r in 0..2u32 {
                let id = id.clone();
                sc.spawn(move || {
                    let me = PeerInfo {
                        addr: SocketAddr::new("127.0.0.1".parse().unwrap(), 2000 + r as u16),
                        host: 1,
                        watch_port: 3,
                        pid: 0,
                        device: None,
                        rdma: r == 1,
                    };
                    let table = rendezvous(&id, r, 2, me, deadline).unwrap();
                    assert_eq!(table.iter().map(|p| p.rdma).collect::<Vec<_>>(), [false, true]);
                });
            }
        });
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        drop(idle);
    }

    #[test]
    fn an_absurd_rank_count_is_refused_before_the_table_is_sized() {
        let id = UniqueId::serve("127.0.0.1:0".parse().unwrap(), [6; 16], Duration::from_secs(20)).unwrap();
        let me = PeerInfo {
            addr: "127.0.0.1:1".parse().unwrap(),
            host: 0,
            watch_port: 0,
            pid: 0,
            device: None,
            rdma: false,
        };
        let e = rendezvous(&id, 0, u32::MAX, me, Instant::now() + Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("4294967295 ranks"), "{e}");
    }
}

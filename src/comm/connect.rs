//! Building a communicator's data connections once every rank's address is known.
//!
//! The higher rank of each pair dials the lower one's listener and presents the secret and
//! the communicator id; the lower rank accepts and drops anything else. Each pair's backend
//! comes from the transport table ([`TransportTable`]: the user's transports, then shared
//! memory within a host and TCP, as `TOPOCCL_TRANSPORT` allows), asked in order whether it can
//! connect the two; both sides decide alike from the same table and localities, and the first
//! backend's stream count is how many sockets the pair opens. Set-up handshakes run pair by
//! pair in one global order (lexicographic by (lower, higher) rank), which every rank follows,
//! so they cannot wait on each other in a cycle.

use std::collections::HashMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use topoccl_transports::ipc::{DeviceId, IpcTransport};
use topoccl_transports::shm::ShmTransport;
use topoccl_transports::tcp::TcpTransport;
use topoccl_transports::verbs::{PortChoice, VerbsTransport};
use topoccl_transports::{Connection, Locality, PeerSetup, Transport, TransportTable};

use super::bootstrap::{connect_retry, PeerInfo};
use super::config::{Config, TransportPolicy};
use super::rdma;
use crate::error::{Error, Result};
use crate::greet::{Greeter, HELLO_DEADLINE, MAX_UNGREETED};

const DIAL_MAGIC: &[u8; 4] = b"TCDL";
const DIAL_BYTES: usize = 4 + 16 + 16 + 4 + 4;

/// A rank's connections, by peer (`None` at the rank itself).
type Links = Vec<Option<Box<dyn Connection>>>;

/// The built-in transports whose counters a communicator reports.
#[derive(Default, Clone)]
pub(crate) struct Counted {
    pub ipc: Option<Arc<IpcTransport>>,
    pub verbs: Option<Arc<VerbsTransport>>,
}

/// What authenticates a data connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Auth {
    pub secret: [u8; 16],
    pub comm_id: [u8; 16],
}

/// Which of a host's RDMA ports a rank uses: the nearest its GPU on the PCI tree, round robin
/// by the GPU's ordinal among equally near ones, so ranks of one host spread over its NICs.
pub(crate) fn nic_choice(device: Option<DeviceId>) -> PortChoice {
    PortChoice { index: device.map_or(0, |d| d.ordinal as usize), gpu_pci: device.map(|d| d.pci_bus) }
}

/// The table a communicator connects with: the user's transports first, then the built-in
/// ones `TOPOCCL_TRANSPORT` allows — CUDA IPC first where this rank drives a GPU (`me`; the
/// IPC transport is returned too, for its counters), RDMA verbs ahead of TCP where this rank
/// has a port (returned too).
pub(crate) fn table(cfg: &Config, me: &PeerInfo) -> Result<(TransportTable, Counted)> {
    let shm = ShmTransport { ring_bytes: cfg.shm_ring_bytes, direct: cfg.shm_direct };
    let tcp = Arc::new(TcpTransport { sockets: cfg.sockets.max(1) });
    let mut table = TransportTable::new();
    let mut ipc = None;
    if let (TransportPolicy::Auto, Some(device)) = (cfg.transport, me.device) {
        // A device this process cannot open for IPC leaves the pair to shared memory.
        if let Ok(access) = crate::cuda::ipc_access(device) {
            let t = Arc::new(IpcTransport::new(
                access,
                cfg.ipc_window_bytes.max(cfg.slice_bytes.next_multiple_of(256)),
                ShmTransport { direct: false, ..shm },
            ));
            table = table.try_with(t.clone()).map_err(|e| Error::Internal(format!("a built-in transport: {e}")))?;
            ipc = Some(t);
        }
    }
    let shm = Arc::new(shm);
    let verbs = match me.rdma {
        true => rdma::transport(cfg, nic_choice(me.device))?,
        false => None,
    };
    // This communicator's own counters, on the process's port.
    let verbs = verbs.map(|v| {
        let every_pair = cfg.transport == TransportPolicy::Ib;
        // Receives into this rank's GPU memory go straight there where the port and the driver
        // allow it (dma-buf); a device that cannot be opened leaves them to host staging.
        let device = me.device.and_then(|d| crate::cuda::ipc_access(d).ok());
        // Under auto, a pair that declines goes on to TCP with the streams it opened.
        Arc::new(v.for_pairs(every_pair, if every_pair { 1 } else { tcp.streams() }).with_device(device))
    });
    let counted = Counted { ipc, verbs: verbs.clone() };
    let builtin = match (cfg.transport, verbs) {
        (TransportPolicy::Auto, Some(v)) => {
            table.try_with(shm).and_then(|t| t.try_with(v)).and_then(|t| t.try_with(tcp))
        }
        (TransportPolicy::Auto, None) => table.try_with(shm).and_then(|t| t.try_with(tcp)),
        (TransportPolicy::Tcp, _) => table.try_with(tcp),
        (TransportPolicy::Shm, _) => table.try_with(shm),
        (TransportPolicy::Ib, Some(v)) => table.try_with(v),
        (TransportPolicy::Ib, None) => {
            return Err(Error::InvalidArgument("TOPOCCL_TRANSPORT=ib, but this rank has no RDMA port".into()))
        }
    }
    .map_err(|e| Error::Internal(format!("a built-in transport: {e}")))?;
    Ok((cfg.transports.clone().then(&builtin), counted))
}

fn locality(p: &PeerInfo) -> Locality {
    Locality { host: p.host, pid: p.pid, device: p.device, rdma: p.rdma }
}

/// Connections to every other rank (`None` at `rank`).
pub(crate) fn connect_all(
    rank: u32,
    peers: &[PeerInfo],
    listener: &TcpListener,
    auth: Auth,
    cfg: &Config,
    deadline: Instant,
) -> Result<(Links, Counted)> {
    let me = peers[rank as usize];
    let (table, counted) = table(cfg, &me)?;
    let mut sockets_to = Vec::with_capacity(peers.len());
    for (p, info) in peers.iter().enumerate() {
        match table.select(&locality(&me), &locality(info)) {
            Some(t) => sockets_to.push(t.streams().max(1)),
            None if p == rank as usize => sockets_to.push(0),
            None => {
                return Err(Error::InvalidArgument(format!(
                    "no transport connects rank {rank} to rank {p} (on {} host; transports: {}{})",
                    if info.host == me.host { "the same" } else { "another" },
                    table.names().join(", "),
                    match cfg.transport {
                        TransportPolicy::Shm => "; TOPOCCL_TRANSPORT=shm",
                        TransportPolicy::Ib if !info.rdma => "; TOPOCCL_TRANSPORT=ib, and that rank has no RDMA port",
                        _ => "",
                    }
                )))
            }
        }
    }
    let sockets = |p: usize| sockets_to[p];
    let mut streams: HashMap<u32, Vec<Option<TcpStream>>> = HashMap::new();
    // Dial the lower ranks.
    for (p, info) in peers.iter().enumerate().take(rank as usize) {
        let mut v = Vec::new();
        for i in 0..sockets(p) {
            let mut s = connect_retry(info.addr, deadline, &format!("rank {p}"))?;
            let mut hello = Vec::with_capacity(DIAL_BYTES);
            hello.extend_from_slice(DIAL_MAGIC);
            hello.extend_from_slice(&auth.secret);
            hello.extend_from_slice(&auth.comm_id);
            hello.extend_from_slice(&rank.to_le_bytes());
            hello.extend_from_slice(&(i as u32).to_le_bytes());
            s.write_all(&hello).map_err(|e| Error::io(format!("greeting rank {p}"), e))?;
            v.push(Some(s));
        }
        streams.insert(p as u32, v);
    }
    // Accept the higher ranks.
    let mut missing: usize = (rank as usize + 1..peers.len()).map(sockets).sum();
    listener.set_nonblocking(true).map_err(|e| Error::io("data listener", e))?;
    let mut greeter = Greeter::<DIAL_BYTES>::new(HELLO_DEADLINE, MAX_UNGREETED);
    let mut prefix = [0u8; 36];
    prefix[..4].copy_from_slice(DIAL_MAGIC);
    prefix[4..20].copy_from_slice(&auth.secret);
    prefix[20..].copy_from_slice(&auth.comm_id);
    let mut greeted = Vec::new();
    while missing > 0 {
        if Instant::now() >= deadline {
            let absent: Vec<String> = (rank as usize + 1..peers.len())
                .filter(|&p| streams.get(&(p as u32)).map_or(0, |v| v.iter().flatten().count()) < sockets(p))
                .map(|p| p.to_string())
                .collect();
            return Err(Error::Bootstrap(format!(
                "rank {rank}: ranks {} never connected before the deadline (TOPOCCL_TIMEOUT){}",
                absent.join(", "),
                if greeter.dropped > 0 {
                    format!("; {} connections without this communicator's secret were dropped", greeter.dropped)
                } else {
                    String::new()
                }
            )));
        }
        if greeted.is_empty()
            && !greeter.poll(listener, &prefix, &mut greeted).map_err(|e| Error::io("accepting a peer", e))?
        {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let Some((s, hello)) = greeted.pop() else { continue };
        let from = u32::from_le_bytes([hello[36], hello[37], hello[38], hello[39]]);
        let index = u32::from_le_bytes([hello[40], hello[41], hello[42], hello[43]]) as usize;
        if from <= rank || from as usize >= peers.len() || index >= sockets(from as usize) {
            continue;
        }
        let v = streams.entry(from).or_insert_with(|| (0..sockets(from as usize)).map(|_| None).collect());
        if v[index].is_none() {
            v[index] = Some(s);
            missing -= 1;
        }
    }
    // Build each pair's connection, in the global pair order.
    let mut links: Vec<Option<Box<dyn Connection>>> = (0..peers.len()).map(|_| None).collect();
    for p in 0..peers.len() as u32 {
        if p == rank {
            continue;
        }
        let v = streams.remove(&p).unwrap_or_default();
        let streams: Vec<TcpStream> = v.into_iter().flatten().collect();
        let timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let setup = PeerSetup { streams, creator: rank < p, rank: p, peer: format!("rank {p}"), timeout };
        let conn = table.connect(&locality(&me), &locality(&peers[p as usize]), setup);
        links[p as usize] = Some(conn.map_err(|e| Error::Transport { peer: p, source: e })?);
    }
    Ok((links, counted))
}

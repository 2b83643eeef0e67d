//! RDMA verbs (InfiniBand, RoCE) between ranks on different hosts: libibverbs opened at run
//! time as NCCL opens it ([`library`], over our own declarations of its structures, [`sys`]),
//! objects owned safely ([`device`]), the device and port chosen by NCCL's settings
//! ([`select`]). A pair's queue pair is connected by exchanging its address over the TCP
//! stream the bootstrap opened, which then stays open as the liveness line (as shared memory
//! keeps it): a peer whose process dies is noticed in milliseconds, not after the ~30 s of
//! retransmissions NCCL's default `NCCL_IB_TIMEOUT`/`NCCL_IB_RETRY_CNT` allow.
//!
//! Data goes by RDMA write into a ring the receiver owns, with credits (`stream`'s byte
//! stream under the framing every backend shares), or, where the receiver offered its buffer,
//! straight into it (`regions`: host memory on demand, device memory through dma-buf, so a
//! GPU buffer receives without a copy through host memory), striped over the connection's
//! extra queue pairs where it has some (`lanes`). A send from GPU memory is read by the NIC
//! itself only into such an offer (the ring is host memory whose frames the CPU parses); the
//! executor stages it through host memory otherwise (`connection`).
//!
//! Both sides of a pair must pick this backend alike: a rank says in its bootstrap record
//! whether it has a usable port ([`Locality::rdma`]), and a pair whose set-up fails on either
//! side (a port the peer cannot reach: InfiniBand against RoCE) declines together and goes on
//! to TCP.

mod connection;
pub mod device;
mod lanes;
pub mod library;
mod regions;
pub mod select;
mod stream;
pub mod sys;

use std::io::{Read, Write};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::framing::Framed;
use crate::ipc::DeviceAccess;
use crate::{Connected, Locality, PeerSetup, Transport};
pub use connection::{VerbsConnection, VerbsCounts, VerbsStats, DIRECT_MIN_BYTES};
use device::{CompletionQueue, Endpoint, QueuePair};
use lanes::Lanes;
pub use lanes::MAX_QPS;
pub use select::{HcaFilter, Nic, PortChoice, VerbsSettings};
use stream::{Registered, RemoteRing, VerbsByteStream, MAX_RING_BYTES, RECV_DEPTH, SEND_DEPTH};
use sys::ibv_gid;

const HANDSHAKE_MAGIC: &[u8; 4] = b"TIBV";
const HANDSHAKE_VERSION: u8 = 4;
/// Magic, version, ok, then the endpoint (qpn, lid, gid, link layer, mtu), the ring (address,
/// rkey, length), what the side registers ([`Record`]'s flags), and its lanes (a count, then
/// room for every lane's queue pair number).
const RECORD_BYTES: usize = 4 + 1 + 1 + 4 + 2 + 16 + 1 + 4 + 8 + 4 + 8 + 1 + 1 + 4 * (MAX_QPS as usize - 1);
/// The smallest ring a peer may announce.
const MIN_RING_BYTES: usize = 64 << 10;

/// The verbs backend: one port of one device, shared by every connection it makes.
#[derive(Clone)]
pub struct VerbsTransport {
    nic: Arc<Nic>,
    ring_bytes: usize,
    stats: Arc<VerbsStats>,
    /// Every pair, the same host's too (`TOPOCCL_TRANSPORT=ib`); otherwise pairs on
    /// different hosts only.
    every_pair: bool,
    /// Streams the bootstrap opens per pair: the next transport's count, so that a pair that
    /// declines leaves it all it needs (only the first is used here).
    streams: usize,
    /// The GPU this rank drives, whose memory receives through dma-buf where the port and the
    /// driver allow it.
    device: Option<Arc<dyn DeviceAccess>>,
    /// Queue pairs per connection (`NCCL_IB_QPS_PER_CONNECTION`): the first and its lanes.
    qps: u8,
}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("nic", &self.nic.describe())
            .field("every_pair", &self.every_pair)
            .finish()
    }
}

impl VerbsTransport {
    /// Loads the library and opens the port `settings` allow and `choice` picks (near the
    /// rank's GPU, round robin among equals); why not where there is no library, no device or
    /// no active port.
    pub fn open(
        settings: &VerbsSettings,
        choice: impl Into<PortChoice>,
        every_pair: bool,
    ) -> std::result::Result<VerbsTransport, String> {
        let verbs = Arc::new(library::open(&library::candidates(settings.library.as_deref()))?);
        let nic = Nic::open(verbs, settings, choice.into())?;
        let ring_bytes = settings.ring_bytes.clamp(MIN_RING_BYTES, MAX_RING_BYTES);
        Ok(VerbsTransport {
            nic: Arc::new(nic),
            ring_bytes,
            every_pair,
            streams: 1,
            stats: Arc::default(),
            device: None,
            qps: settings.qps_per_connection.clamp(1, MAX_QPS),
        })
    }

    /// The same port, connecting every pair (the same host's too) or only pairs on different
    /// hosts, over `streams` bootstrap streams per pair (those the transport after it in the
    /// table uses, where a pair may decline to it). Its counters start from zero (a
    /// communicator's own).
    pub fn for_pairs(&self, every_pair: bool, streams: usize) -> VerbsTransport {
        VerbsTransport { every_pair, streams: streams.max(1), stats: Arc::default(), ..self.clone() }
    }

    /// The same, for a rank that drives `device`: receives into its memory are offered where
    /// the port registers dma-bufs and the driver exports them.
    pub fn with_device(self, device: Option<Arc<dyn DeviceAccess>>) -> VerbsTransport {
        VerbsTransport { device, ..self }
    }

    /// Whether receives into this rank's device memory can be offered: the port registers
    /// dma-bufs (probed when it opened) and the rank drives a GPU.
    fn device_offers(&self) -> bool {
        self.device.is_some() && self.nic.dmabuf.is_ok()
    }

    /// What this transport's connections have done so far.
    pub fn counts(&self) -> VerbsCounts {
        VerbsCounts {
            registrations: self.nic.regions.len() as u64,
            device_registrations: self.nic.regions.device_len() as u64,
            ..self.stats.counts()
        }
    }

    /// The port in use: `mlx5_0:1 (RoCE, GID 1, MTU 4096)`, and the library.
    pub fn describe(&self) -> String {
        let qps = match self.qps {
            1 => String::new(),
            n => format!(", {n} queue pairs per connection"),
        };
        format!("{}{qps} via {}", self.nic.describe(), self.nic.pd.ctx.verbs.path)
    }

    /// This side's queue pair, ring, completion queue and lanes, the queue pairs in INIT.
    fn prepare(&self) -> Result<(QueuePair, Registered, Vec<QueuePair>)> {
        let cq = CompletionQueue::new(self.nic.pd.ctx.clone(), (SEND_DEPTH + RECV_DEPTH + 16) as usize)?;
        let qp = QueuePair::new(self.nic.pd.clone(), Arc::new(cq), SEND_DEPTH, RECV_DEPTH)?;
        qp.init(&self.nic.path)?;
        let rx = Registered::new(self.nic.pd.clone(), self.ring_bytes, true)?;
        let lanes = lanes::prepare(&self.nic.pd, &self.nic.path, usize::from(self.qps) - 1)?;
        Ok((qp, rx, lanes))
    }
}

/// What one side tells the other at set-up.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    endpoint: Endpoint,
    ring: RemoteRing,
    /// Whether the port registers host memory on demand (so host receives may be offered, and
    /// host sources written from).
    odp: bool,
    /// Whether the side offers receives into its GPU's memory (dma-buf).
    device: bool,
    /// The queue pair numbers of its lanes (a pair uses as many as the side with fewer has).
    lanes: Vec<u32>,
}

fn encode(r: Option<&Record>) -> [u8; RECORD_BYTES] {
    let mut b = [0u8; RECORD_BYTES];
    b[..4].copy_from_slice(HANDSHAKE_MAGIC);
    b[4] = HANDSHAKE_VERSION;
    if let Some(r) = r {
        b[5] = 1;
        let e = &r.endpoint;
        b[6..10].copy_from_slice(&e.qpn.to_le_bytes());
        b[10..12].copy_from_slice(&e.lid.to_le_bytes());
        b[12..28].copy_from_slice(&e.gid.raw);
        b[28] = e.link_layer;
        b[29..33].copy_from_slice(&e.mtu.to_le_bytes());
        b[33..41].copy_from_slice(&r.ring.addr.to_le_bytes());
        b[41..45].copy_from_slice(&r.ring.rkey.to_le_bytes());
        b[45..53].copy_from_slice(&(r.ring.len as u64).to_le_bytes());
        b[53] = u8::from(r.odp) | u8::from(r.device) << 1;
        let lanes = &r.lanes[..r.lanes.len().min(MAX_QPS as usize - 1)];
        b[54] = lanes.len() as u8;
        for (i, qpn) in lanes.iter().enumerate() {
            b[55 + 4 * i..59 + 4 * i].copy_from_slice(&qpn.to_le_bytes());
        }
    }
    b
}

/// The peer's record (`None`: it could not set up its side), checked.
fn decode(b: &[u8; RECORD_BYTES], peer: &str) -> Result<Option<Record>> {
    if &b[..4] != HANDSHAKE_MAGIC || b[4] != HANDSHAKE_VERSION {
        return Err(Error::Protocol(format!("{peer} did not start an RDMA handshake of version {HANDSHAKE_VERSION}")));
    }
    if b[5] != 1 {
        return Ok(None);
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| {
        let mut q = [0u8; 8];
        q.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(q)
    };
    let mut gid = ibv_gid::default();
    gid.raw.copy_from_slice(&b[12..28]);
    let len = u64_at(45);
    if !(MIN_RING_BYTES as u64..=MAX_RING_BYTES as u64).contains(&len) {
        return Err(Error::Protocol(format!("{peer} announced an RDMA ring of {len} bytes")));
    }
    Ok(Some(Record {
        endpoint: Endpoint {
            qpn: u32_at(6),
            lid: u16::from_le_bytes([b[10], b[11]]),
            gid,
            link_layer: b[28],
            mtu: u32_at(29),
        },
        ring: RemoteRing { addr: u64_at(33), rkey: u32_at(41), len: len as usize },
        odp: b[53] & 1 != 0,
        device: b[53] & 2 != 0,
        lanes: (0..usize::from(b[54]).min(MAX_QPS as usize - 1)).map(|i| u32_at(55 + 4 * i)).collect(),
    }))
}

fn hs(peer: &str, e: std::io::Error) -> Error {
    Error::io(format!("RDMA handshake with {peer}"), e)
}

impl Transport for VerbsTransport {
    fn name(&self) -> &'static str {
        "ib"
    }

    fn can_connect(&self, me: &Locality, peer: &Locality) -> bool {
        me.rdma && peer.rdma && (self.every_pair || me.host != peer.host)
    }

    fn streams(&self) -> usize {
        self.streams
    }

    fn connect(&self, mut setup: PeerSetup) -> Result<Connected> {
        let peer = setup.peer.clone();
        let Some(control) = setup.streams.first_mut() else {
            return Err(Error::Protocol(format!("no stream to {peer} for the RDMA handshake")));
        };
        control.set_read_timeout(Some(setup.timeout)).map_err(|e| hs(&peer, e))?;
        let prepared = self.prepare();
        let mine = match &prepared {
            Ok((qp, rx, lanes)) => Some(Record {
                endpoint: self.nic.endpoint(qp.qpn),
                ring: RemoteRing { addr: rx.buf.addr() as u64, rkey: rx.mr.rkey, len: rx.buf.len() },
                odp: self.nic.odp.is_ok(),
                device: self.device_offers(),
                lanes: lanes.iter().map(|l| l.qpn).collect(),
            }),
            Err(_) => None,
        };
        control.write_all(&encode(mine.as_ref())).map_err(|e| hs(&peer, e))?;
        let mut theirs = [0u8; RECORD_BYTES];
        control.read_exact(&mut theirs).map_err(|e| hs(&peer, e))?;
        let theirs = decode(&theirs, &peer)?;
        let (qp, rx, mut lane_qps, mine, theirs) = match (prepared, mine, theirs) {
            (Ok((qp, rx, l)), Some(m), Some(t)) if m.endpoint.link_layer == t.endpoint.link_layer => (qp, rx, l, m, t),
            (Ok(_), Some(m), Some(t)) => {
                let why =
                    format!("link layers differ ({} here, {} at {peer})", m.endpoint.link_layer, t.endpoint.link_layer);
                return Ok(Connected::Declined { setup, why });
            }
            (Err(e), _, _) => {
                return Ok(Connected::Declined { setup, why: format!("this side could not set up: {e}") })
            }
            _ => return Ok(Connected::Declined { setup, why: format!("{peer} could not set up its side") }),
        };
        // The rest can still fail on either side (an address that does not resolve, memory
        // that does not register): both say whether they are ready, and decline together.
        let built = (|| -> Result<(VerbsByteStream, Lanes)> {
            qp.connect(&self.nic.path, &mine.endpoint, &theirs.endpoint)?;
            lane_qps.truncate(theirs.lanes.len());
            let lanes = Lanes::connect(lane_qps, &theirs.lanes, &self.nic.path, &mine.endpoint, &theirs.endpoint)?;
            let tx = Registered::new(self.nic.pd.clone(), theirs.ring.len, false)?;
            let liveness = setup.streams[0].try_clone().map_err(|e| hs(&peer, e))?;
            Ok((VerbsByteStream::new(qp, rx, tx, theirs.ring, liveness, peer.clone())?, lanes))
        })();
        // Both queue pairs are ready to receive before either writes.
        let control = &mut setup.streams[0];
        control.write_all(&[u8::from(built.is_ok())]).map_err(|e| hs(&peer, e))?;
        let mut ready = [0u8; 1];
        control.read_exact(&mut ready).map_err(|e| hs(&peer, e))?;
        let (stream, lanes) = match (built, ready[0]) {
            (Ok(built), 1) => built,
            (Err(e), _) => return Ok(Connected::Declined { setup, why: format!("this side could not connect: {e}") }),
            (Ok(_), 0) => return Ok(Connected::Declined { setup, why: format!("{peer} could not connect its side") }),
            (Ok(_), b) => return Err(Error::Protocol(format!("{peer} sent {b} instead of its RDMA ready byte"))),
        };
        control.set_nonblocking(true).map_err(|e| hs(&peer, e))?;
        control.set_read_timeout(None).map_err(|e| hs(&peer, e))?;
        // An offer is used where the sender can register its source (host memory: on demand)
        // and the receiver its destination (host memory on demand, device memory by dma-buf).
        let host_offers = mine.odp && theirs.odp;
        let device = self.device.clone().filter(|_| mine.device && theirs.odp);
        let writes = mine.odp && (theirs.odp || theirs.device);
        Ok(Connected::Connection(Box::new(VerbsConnection::new(
            Framed::new(stream),
            lanes,
            self.nic.clone(),
            connection::Offers {
                host: host_offers,
                device,
                writes,
                sources: self.device.clone().filter(|_| mine.device),
            },
            self.stats.clone(),
        ))))
    }
}

#[cfg(test)]
mod tests;

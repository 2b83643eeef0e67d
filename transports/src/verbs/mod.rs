//! RDMA verbs (InfiniBand, RoCE) between ranks on different hosts: libibverbs opened at run
//! time as NCCL opens it ([`library`], over our own declarations of its structures, [`sys`]),
//! objects owned safely ([`device`]), the device and port chosen by NCCL's settings
//! ([`select`]). A pair's queue pair is connected by exchanging its address over the TCP
//! stream the bootstrap opened, which then stays open as the liveness line (as shared memory
//! keeps it): a peer whose process dies is noticed in milliseconds, not after the ~30 s of
//! retransmissions NCCL's default `NCCL_IB_TIMEOUT`/`NCCL_IB_RETRY_CNT` allow.
//!
//! Data goes by RDMA write into a ring the receiver owns, with credits ([`stream`]'s byte
//! stream under the framing every backend shares), or, where the receiver offered its buffer,
//! straight into it ([`regions`]: host memory on demand, device memory through dma-buf, so a
//! GPU buffer receives without a copy through host memory). Sends read host memory only: the
//! executor stages a device buffer's bytes through host memory before sending them.
//!
//! Both sides of a pair must pick this backend alike: a rank says in its bootstrap record
//! whether it has a usable port ([`Locality::rdma`]), and a pair whose set-up fails on either
//! side (a port the peer cannot reach: InfiniBand against RoCE) declines together and goes on
//! to TCP.

pub mod device;
pub mod library;
mod regions;
pub mod select;
mod stream;
pub mod sys;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::framing::{Framed, HEADER_BYTES};
use crate::ipc::DeviceAccess;
use crate::numbered::{decode_offer, encode_offer, reserved, Numbered, DIRECT_BIT, OFFER_TAG};
use crate::{
    Connected, Connection, Locality, MemSpace, Meta, PeerSetup, Region, Ticket, Transport, WaitFd, MAX_MESSAGE_BYTES,
};
use device::{CompletionQueue, Endpoint, QueuePair};
use regions::Access;
pub use select::{HcaFilter, Nic, VerbsSettings};
use std::sync::atomic::{AtomicU64, Ordering};
use stream::{Registered, RemoteRing, VerbsByteStream, MAX_RING_BYTES, RECV_DEPTH, SEND_DEPTH};
use sys::ibv_gid;

const HANDSHAKE_MAGIC: &[u8; 4] = b"TIBV";
const HANDSHAKE_VERSION: u8 = 3;
/// Magic, version, ok, then the endpoint (qpn, lid, gid, link layer, mtu), the ring (address,
/// rkey, length) and what the side registers ([`Record`]'s flags).
const RECORD_BYTES: usize = 4 + 1 + 1 + 4 + 2 + 16 + 1 + 4 + 8 + 4 + 8 + 1;
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
    /// Loads the library and opens the port `settings` choose (the `choice`-th usable one,
    /// round robin); why not where there is no library, no device or no active port.
    pub fn open(
        settings: &VerbsSettings,
        choice: usize,
        every_pair: bool,
    ) -> std::result::Result<VerbsTransport, String> {
        let verbs = Arc::new(library::open(&library::candidates(settings.library.as_deref()))?);
        let nic = Nic::open(verbs, settings, choice)?;
        let ring_bytes = settings.ring_bytes.clamp(MIN_RING_BYTES, MAX_RING_BYTES);
        Ok(VerbsTransport {
            nic: Arc::new(nic),
            ring_bytes,
            every_pair,
            streams: 1,
            stats: Arc::default(),
            device: None,
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
            ring_messages: self.stats.ring_messages.load(Ordering::Relaxed),
            direct_messages: self.stats.direct_messages.load(Ordering::Relaxed),
            offers: self.stats.offers.load(Ordering::Relaxed),
            registrations: self.nic.regions.len() as u64,
            device_registrations: self.nic.regions.device_len() as u64,
        }
    }

    /// The port in use: `mlx5_0:1 (RoCE, GID 1, MTU 4096)`, and the library.
    pub fn describe(&self) -> String {
        format!("{} via {}", self.nic.describe(), self.nic.pd.ctx.verbs.path)
    }

    /// This side's queue pair, ring and completion queue, the queue pair in INIT.
    fn prepare(&self) -> Result<(QueuePair, Registered)> {
        let cq = CompletionQueue::new(self.nic.pd.ctx.clone(), (SEND_DEPTH + RECV_DEPTH + 16) as usize)?;
        let qp = QueuePair::new(self.nic.pd.clone(), Arc::new(cq), SEND_DEPTH, RECV_DEPTH)?;
        qp.init(&self.nic.path)?;
        let rx = Registered::new(self.nic.pd.clone(), self.ring_bytes, true)?;
        Ok((qp, rx))
    }
}

/// What one side tells the other at set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    endpoint: Endpoint,
    ring: RemoteRing,
    /// Whether the port registers host memory on demand (so host receives may be offered, and
    /// host sources written from).
    odp: bool,
    /// Whether the side offers receives into its GPU's memory (dma-buf).
    device: bool,
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
            Ok((qp, rx)) => Some(Record {
                endpoint: self.nic.endpoint(qp.qpn),
                ring: RemoteRing { addr: rx.buf.addr() as u64, rkey: rx.mr.rkey, len: rx.buf.len() },
                odp: self.nic.odp.is_ok(),
                device: self.device_offers(),
            }),
            Err(_) => None,
        };
        control.write_all(&encode(mine.as_ref())).map_err(|e| hs(&peer, e))?;
        let mut theirs = [0u8; RECORD_BYTES];
        control.read_exact(&mut theirs).map_err(|e| hs(&peer, e))?;
        let theirs = decode(&theirs, &peer)?;
        let (qp, rx, mine, theirs) = match (prepared, mine, theirs) {
            (Ok((qp, rx)), Some(m), Some(t)) if m.endpoint.link_layer == t.endpoint.link_layer => (qp, rx, m, t),
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
        let built = (|| -> Result<VerbsByteStream> {
            qp.connect(&self.nic.path, &mine.endpoint, &theirs.endpoint)?;
            let tx = Registered::new(self.nic.pd.clone(), theirs.ring.len, false)?;
            let liveness = setup.streams[0].try_clone().map_err(|e| hs(&peer, e))?;
            VerbsByteStream::new(qp, rx, tx, theirs.ring, liveness, peer.clone())
        })();
        // Both queue pairs are ready to receive before either writes.
        let control = &mut setup.streams[0];
        control.write_all(&[u8::from(built.is_ok())]).map_err(|e| hs(&peer, e))?;
        let mut ready = [0u8; 1];
        control.read_exact(&mut ready).map_err(|e| hs(&peer, e))?;
        let stream = match (built, ready[0]) {
            (Ok(stream), 1) => stream,
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
        Ok(Connected::Connection(Box::new(VerbsConnection {
            framed: Framed::new(stream),
            nic: self.nic.clone(),
            host_offers,
            device,
            writes: mine.odp && (theirs.odp || theirs.device),
            offer_ends: VecDeque::new(),
            numbered: Numbered::default(),
            stats: self.stats.clone(),
        })))
    }
}

/// A connection over RDMA verbs.
pub struct VerbsConnection {
    framed: Framed<VerbsByteStream>,
    nic: Arc<Nic>,
    /// Whether host memory receives are offered and written in place (both ports register on
    /// demand).
    host_offers: bool,
    /// The GPU whose memory receives are offered (this port registers its dma-bufs, the peer's
    /// sources on demand).
    device: Option<Arc<dyn DeviceAccess>>,
    /// Whether this side writes into the peer's offers (it registers its sources on demand,
    /// and the peer makes offers).
    writes: bool,
    /// Where each offer frame not yet acknowledged ends in the stream (not part of the backlog).
    offer_ends: VecDeque<u64>,
    /// Messages numbered per tag, and the offers made each way: the peer's name where its
    /// memory is (address, length, rkey), this side's keep the registration alive.
    numbered: Numbered<Offered>,
    stats: Arc<VerbsStats>,
}

/// One side of an offer.
#[derive(Clone)]
struct Offered {
    /// Where the message goes (in the receiver's address space).
    dst: Region,
    rkey: u32,
    /// The receiver's own registration of `dst`, held until the message is in.
    _registration: Option<Arc<device::MemoryRegion>>,
}

/// Tickets of one-sided writes (numbered by the stream), apart from the framing's.
const DIRECT_TICKET: u64 = 1 << 63;
/// Receives smaller than this always take the ring (an offer costs a frame each way).
pub const DIRECT_MIN_BYTES: usize = 64 << 10;

/// What the verbs connections of a transport have done (cumulative).
#[derive(Debug, Default)]
pub struct VerbsStats {
    ring_messages: AtomicU64,
    direct_messages: AtomicU64,
    offers: AtomicU64,
}

/// A snapshot of [`VerbsStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VerbsCounts {
    /// Messages through the receiver's ring, and written straight into an offered buffer.
    pub ring_messages: u64,
    pub direct_messages: u64,
    /// Receives this side offered.
    pub offers: u64,
    /// Host memory registrations cached for one-sided writes.
    pub registrations: u64,
    /// Device memory registrations (dma-buf) cached for offers.
    pub device_registrations: u64,
}

impl VerbsConnection {
    /// Takes the offers that have arrived (never spilling a frame left in the ring for the
    /// executor: an offer stuck behind one is used late or not at all).
    fn take_offers(&mut self) {
        let numbered = &mut self.numbered;
        while self.framed.recv_queued(OFFER_TAG, &mut |m, _| {
            let (tag, message, dst, rkey) = decode_offer(m);
            numbered.peer_offered(tag, message, Offered { dst, rkey, _registration: None });
        }) {}
    }

    /// Writes `data` straight into the peer's offer for the next message of `tag`, if it made
    /// one in time and there is room to post; the write's ticket.
    fn put(&mut self, tag: u32, data: Region) -> Result<Option<Ticket>> {
        let message = self.numbered.next_sent(tag);
        if !self.writes {
            return Ok(None);
        }
        // Offers for this message or earlier ones are used here or never.
        self.take_offers();
        if data.len < DIRECT_MIN_BYTES || data.space != MemSpace::Host || !self.framed.stream.direct_room(data.len) {
            self.numbered.take_offer(tag, message, |_| false);
            return Ok(None);
        }
        let Ok(source) = self.nic.regions.cover(&self.nic.pd, data.addr, data.len, Access::Read) else {
            self.numbered.take_offer(tag, message, |_| false);
            return Ok(None);
        };
        let Some(to) = self.numbered.take_offer(tag, message, |o| o.dst.len == data.len) else { return Ok(None) };
        // SAFETY: host memory valid and unchanged until the ticket is done (`send`'s contract),
        // inside `source`; the destination is the peer's offer of exactly this length.
        let number =
            unsafe { self.framed.stream.write_direct(data.addr, data.len, &source, to.dst.addr as u64, to.rkey)? };
        Ok(number.map(|n| Ticket(DIRECT_TICKET | n)))
    }
}

impl Connection for VerbsConnection {
    fn transport(&self) -> &'static str {
        "ib"
    }

    unsafe fn send(&mut self, tag: u32, meta: &Meta, data: Region) -> Result<Ticket> {
        reserved(tag)?;
        if let Some(why) = self.framed.closed() {
            return Err(Error::PeerClosed(why.to_string()));
        }
        if let Some(ticket) = self.put(tag, data)? {
            // Written in place at the peer: the frame, behind the write on the same queue
            // pair, only says so (it lands after the data).
            // SAFETY: an empty region.
            unsafe { self.framed.send(tag | DIRECT_BIT, meta, Region::EMPTY)? };
            self.stats.direct_messages.fetch_add(1, Ordering::Relaxed);
            return Ok(ticket);
        }
        self.stats.ring_messages.fetch_add(1, Ordering::Relaxed);
        // SAFETY: host memory valid and unchanged until the ticket is done (this fn's contract,
        // passed on).
        let seq = unsafe { self.framed.send(tag, meta, data)? };
        Ok(if seq == 0 { Ticket::DONE } else { Ticket(seq) })
    }

    fn sent(&self, t: Ticket) -> bool {
        match t {
            Ticket::DONE => true,
            Ticket(n) if n & DIRECT_TICKET != 0 => self.framed.stream.write_done(n & !DIRECT_TICKET),
            Ticket(seq) => self.framed.sent(seq),
        }
    }

    /// What waits to be written, and what was written but not yet acknowledged (the call
    /// that wrote it ends only once it is, as NCCL's does on its send completions) — less the
    /// offers: a peer that finished may close before an offer of this side reaches it (the
    /// message offered for had landed, unseen yet), and an offer needs no delivery.
    fn backlog(&self) -> usize {
        let pending = self.framed.backlog() + self.framed.stream.unacked();
        let acked = self.framed.stream.acked();
        let offers: u64 = self.offer_ends.iter().map(|&end| end.saturating_sub(acked).min(HEADER_BYTES as u64)).sum();
        pending.saturating_sub(offers as usize)
    }

    fn progress(&mut self) -> Result<bool> {
        let acked = self.framed.stream.acked();
        while self.offer_ends.front().is_some_and(|&end| end <= acked) {
            self.offer_ends.pop_front();
        }
        self.framed.progress()
    }

    fn recv_with(&mut self, tag: u32, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool> {
        reserved(tag)?;
        let device = &self.device;
        let mut flushed = Ok(());
        let got = self.numbered.recv(&mut self.framed, tag, |o| o.dst, &mut |m, r| {
            // Written by the NIC into GPU memory: visible to the device's next work only once
            // flushed, where the device does not order such writes itself.
            if let (MemSpace::Device(_), Some(d)) = (r.space, device) {
                flushed = d.flush_rdma_writes();
                if flushed.is_err() {
                    return;
                }
            }
            f(m, r)
        })?;
        flushed?;
        Ok(got)
    }

    unsafe fn offer(&mut self, tag: u32, dst: Region) -> Result<()> {
        reserved(tag)?;
        if !(DIRECT_MIN_BYTES..=MAX_MESSAGE_BYTES).contains(&dst.len) || !self.offers_into(dst.space) {
            return Ok(());
        }
        let registration = match (dst.space, &self.device) {
            (MemSpace::Host, _) => self.nic.regions.cover(&self.nic.pd, dst.addr, dst.len, Access::Write).ok(),
            (MemSpace::Device(_), Some(device)) => {
                // Memory the driver cannot export (or a failed registration): the message comes
                // through the ring instead.
                let r = self.nic.regions.cover_device(&self.nic.pd, device.as_ref(), dst.addr, dst.len, Access::Write);
                r.ok().flatten()
            }
            (MemSpace::Device(_), None) => None,
        };
        let Some(registration) = registration else { return Ok(()) };
        let rkey = registration.rkey;
        let Some(message) = self.numbered.offer(tag, Offered { dst, rkey, _registration: Some(registration) }) else {
            return Ok(());
        };
        self.stats.offers.fetch_add(1, Ordering::Relaxed);
        // SAFETY: an empty region.
        unsafe { self.framed.send(OFFER_TAG, &encode_offer(tag, message, dst, rkey), Region::EMPTY)? };
        self.offer_ends.push_back(self.framed.accepted());
        Ok(())
    }

    fn one_sided(&self) -> bool {
        self.host_offers || self.device.is_some()
    }

    fn offers_into(&self, space: MemSpace) -> bool {
        match space {
            MemSpace::Host => self.host_offers,
            MemSpace::Device(d) => self.device.as_ref().is_some_and(|g| g.device().ordinal == d),
        }
    }

    fn closed(&self) -> Option<&str> {
        self.framed.closed()
    }

    fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        if self.framed.closed().is_none() {
            out.push(WaitFd { fd: self.framed.stream.control.as_raw_fd(), write: false });
        }
    }

    fn needs_spin(&self) -> bool {
        self.framed.closed().is_none()
    }

    fn close(&mut self) {
        // No write of the peer's lands in memory this side offered once this returns.
        self.framed.stream.stop();
        self.numbered.clear_offered();
        let _ = self.framed.stream.control.shutdown(Shutdown::Both);
        self.framed.mark_closed("closed locally".to_string());
    }
}

#[cfg(test)]
mod tests;

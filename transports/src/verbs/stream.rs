//! The eager path: a byte stream over RDMA writes into a ring the receiver owns (the framing
//! every byte-stream backend shares runs on top, as it does on TCP and shared memory).
//!
//! Each side registers a receive ring and gives the peer its address and rkey. A sender copies
//! bytes into a staging ring of its own (registered, the same size as the peer's ring, at the
//! same offsets) and RDMA-writes them to the peer's ring, the last write of each batch
//! carrying an immediate: `DATA | bytes`. Completions are the only signal: the receiver learns
//! of landed bytes from the receive completion that the immediate consumes (every write before
//! it on the queue pair has landed by then), never by watching memory, so bytes landing out of
//! order within a write cannot be misread. Credits flow back the same way, a zero-length write
//! with `CREDIT | bytes` once the receiver has consumed a quarter of the ring (or all of it).
//!
//! A staging byte is only overwritten once the write that carried it has completed here and
//! the peer has consumed it: a NIC reads its source after `post_send` returns, and again if it
//! must retransmit, until the write's completion.
//!
//! Queues are bounded by construction: at most [`SEND_DEPTH`] writes in flight, and at most
//! 4 × [`RECV_DEPTH`] completions in the queue. Each immediate consumes one of the peer's
//! [`RECV_DEPTH`] posted receives, reposted as the peer polls; a peer that does not poll this
//! connection for long enough to use them all up makes the writes wait (RNR retries, without
//! end: `rnr_retry` 7) until it does, as a full ring makes a sender wait.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read};
use std::net::TcpStream;
use std::sync::Arc;

use super::device::{MemoryRegion, ProtectionDomain, QueuePair};
use super::sys::*;
use crate::error::{Error, Result};
use crate::framing::{ByteStream, Peeked};

/// Send work requests in flight per queue pair (one kept back for credits).
pub(crate) const SEND_DEPTH: u32 = 128;
/// Receives kept posted.
pub(crate) const RECV_DEPTH: u32 = 2 * SEND_DEPTH;
/// `wr_id` of this stream's send work requests (a completion in error carries no valid
/// opcode: the id tells sends from receives, which are posted with 0).
const SEND_WR_ID: u64 = 1;
/// Completions polled at a time.
const POLL_BATCH: usize = 32;
/// The largest batch one write carries, so credits come back while later batches fly.
const MAX_WRITE: usize = 1 << 20;
const KIND_SHIFT: u32 = 30;
const VALUE_MASK: u32 = (1 << KIND_SHIFT) - 1;
const KIND_DATA: u32 = 0;
const KIND_CREDIT: u32 = 1;
/// The largest ring: a batch's length must fit an immediate's 30 value bits.
pub(crate) const MAX_RING_BYTES: usize = 1 << 29;
/// The largest one-sided write (a port's `max_msg_sz` is 1 GiB or more).
const MAX_DIRECT_WRITE: usize = 1 << 30;
/// How many empty reads between two checks of the liveness line.
const LIVENESS_EVERY: u32 = 512;

/// Page-aligned zeroed host memory the NIC may read or write.
pub(crate) struct HostBuffer {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: plain memory; who reads and writes it is governed by the stream's protocol.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    pub(crate) fn new(len: usize) -> Result<HostBuffer> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| Error::Unsupported(format!("a buffer of {len} bytes")))?;
        // SAFETY: a layout of non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).ok_or_else(|| Error::Unsupported(format!("out of memory ({len} B)")))?;
        Ok(HostBuffer { ptr, layout })
    }

    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Host memory and its registration (the registration is dropped first).
pub(crate) struct Registered {
    pub(crate) mr: MemoryRegion,
    pub(crate) buf: HostBuffer,
}

impl Registered {
    pub(crate) fn new(pd: Arc<ProtectionDomain>, len: usize, remote_write: bool) -> Result<Registered> {
        let buf = HostBuffer::new(len)?;
        let access = if remote_write { ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE } else { ACCESS_LOCAL_WRITE };
        // SAFETY: the buffer outlives the region (field order) and is only written by the
        // NIC where the protocol says it may be.
        let mr = unsafe { MemoryRegion::register(pd, buf.addr(), len, access)? };
        Ok(Registered { mr, buf })
    }
}

/// The peer's receive ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RemoteRing {
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
    pub(crate) len: usize,
}

/// A write in flight.
struct Write {
    len: usize,
    /// Whether it carries ring bytes (staged), rather than a one-sided payload.
    ring: bool,
    /// The registration a one-sided write reads from, kept until the write is done.
    _source: Option<Arc<MemoryRegion>>,
}

pub(crate) struct VerbsByteStream {
    /// First: destroyed before the memory it writes and reads is deregistered and freed.
    qp: QueuePair,
    rx: Registered,
    tx: Registered,
    remote: RemoteRing,
    /// Bytes landed in `rx` (from DATA immediates), consumed, and credited back.
    rx_head: u64,
    rx_tail: u64,
    rx_credited: u64,
    /// Bytes written to the peer's ring, and consumed there as its credits say.
    tx_written: u64,
    tx_credit: u64,
    /// Ring bytes whose writes have completed here.
    tx_acked: u64,
    /// Each write posted and not yet completed, in posting order (a queue pair completes its
    /// sends in order); their sum; how many writes have completed.
    writes_in_flight: VecDeque<Write>,
    unacked: usize,
    writes_completed: u64,
    pub(crate) control: TcpStream,
    pub(crate) peer: String,
    failed: Option<Error>,
    idle: u32,
    wcs: Vec<ibv_wc>,
}

fn imm(kind: u32, value: usize) -> u32 {
    debug_assert!(value <= VALUE_MASK as usize);
    ((kind << KIND_SHIFT) | value as u32).to_be()
}

impl VerbsByteStream {
    /// A stream over a connected `qp` whose receives are not yet posted.
    pub(crate) fn new(
        qp: QueuePair,
        rx: Registered,
        tx: Registered,
        remote: RemoteRing,
        control: TcpStream,
        peer: String,
    ) -> Result<VerbsByteStream> {
        let mut s = VerbsByteStream {
            qp,
            rx,
            tx,
            remote,
            rx_head: 0,
            rx_tail: 0,
            rx_credited: 0,
            tx_written: 0,
            tx_credit: 0,
            tx_acked: 0,
            writes_in_flight: VecDeque::new(),
            unacked: 0,
            writes_completed: 0,
            control,
            peer,
            failed: None,
            idle: 0,
            wcs: vec![ibv_wc::default(); POLL_BATCH],
        };
        for _ in 0..RECV_DEPTH {
            s.post_recv()?;
        }
        Ok(s)
    }

    /// Posts a receive for one immediate (the first ones before the peer is told it may write).
    fn post_recv(&mut self) -> Result<()> {
        let mut wr = ibv_recv_wr::default();
        // SAFETY: no gather element: the immediate's write lands where its sender aims, in
        // `rx`, which lives as long as the queue pair.
        unsafe { self.qp.post_recv(&mut wr) }
    }

    fn rx_len(&self) -> u64 {
        self.rx.buf.len() as u64
    }

    /// Records the first failure; every later use reports it.
    fn fail(&mut self, e: Error) -> Error {
        self.failed.get_or_insert(e).clone()
    }

    /// Takes completions: frees send slots, advances the ring from immediates, reposts
    /// receives. Whether anything completed.
    fn pump(&mut self) -> Result<bool> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let mut any = false;
        loop {
            let n = match self.qp.cq.poll(&mut self.wcs) {
                Ok(n) => n,
                Err(e) => return Err(self.fail(e)),
            };
            for i in 0..n {
                let wc = self.wcs[i];
                if let Err(e) = self.complete(&wc) {
                    self.fail(e);
                }
            }
            any |= n > 0;
            if n < POLL_BATCH {
                break;
            }
        }
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if any {
            self.credit()?;
        }
        Ok(any)
    }

    /// The oldest write in flight is done (or flushed): its slot, bytes and source go.
    fn write_finished(&mut self) -> Result<()> {
        let w = self
            .writes_in_flight
            .pop_front()
            .ok_or_else(|| Error::Protocol(format!("a write completion for {} with no write in flight", self.peer)))?;
        self.unacked -= w.len;
        if w.ring {
            self.tx_acked += w.len as u64;
        }
        self.writes_completed += 1;
        Ok(())
    }

    fn complete(&mut self, wc: &ibv_wc) -> Result<()> {
        if wc.status != WC_SUCCESS {
            let send = wc.wr_id == SEND_WR_ID;
            if send {
                // Done with its source, if not delivered: one-sided tickets become done.
                self.write_finished()?;
            }
            let what = if send { "an RDMA write to" } else { "a receive from" };
            let why = format!("{what} {} failed: {} (status {})", self.peer, wc_status_name(wc.status), wc.status);
            let e = match wc.status {
                WC_RETRY_EXC_ERR | WC_RNR_RETRY_EXC_ERR | WC_WR_FLUSH_ERR => Error::PeerClosed(why),
                _ => Error::Protocol(why),
            };
            // The first failure is the one reported; flushes after it only free their writes.
            self.fail(e);
            return Ok(());
        }
        match wc.opcode {
            WC_RDMA_WRITE => self.write_finished(),
            WC_RECV_RDMA_WITH_IMM if wc.wc_flags & WC_WITH_IMM != 0 => {
                self.post_recv()?;
                let imm = u32::from_be(wc.imm_data);
                let value = u64::from(imm & VALUE_MASK);
                match imm >> KIND_SHIFT {
                    KIND_DATA if self.rx_head + value - self.rx_tail <= self.rx_len() => {
                        self.rx_head += value;
                        Ok(())
                    }
                    KIND_CREDIT if self.tx_credit + value <= self.tx_written => {
                        self.tx_credit += value;
                        Ok(())
                    }
                    kind => Err(Error::Protocol(format!(
                        "{} signalled {value} bytes of kind {kind}, beyond what the ring holds",
                        self.peer
                    ))),
                }
            }
            op => Err(Error::Protocol(format!("an unexpected completion (opcode {op}) from {}", self.peer))),
        }
    }

    /// Posts one write of `len` staged bytes at ring offset `off`, with the immediate `imm`
    /// if given.
    fn post_write(&mut self, off: usize, len: usize, imm_data: Option<u32>) -> Result<()> {
        let (addr, lkey) = ((self.tx.buf.addr() + off) as u64, self.tx.mr.lkey);
        let (raddr, rkey) = (self.remote.addr + off as u64, self.remote.rkey);
        // SAFETY: the gather element lies inside `tx`, registered, whose bytes at these offsets
        // are not rewritten until the peer credits them back (after they landed).
        unsafe { self.post(addr, lkey, len, raddr, rkey, imm_data, None) }
    }

    /// Posts a write of `len` bytes at `addr` (registration `lkey`) to the peer's `raddr`
    /// (`rkey`); `source` is kept until the write is done.
    ///
    /// # Safety
    /// The bytes must stay unchanged until the write is done.
    #[allow(clippy::too_many_arguments)]
    unsafe fn post(
        &mut self,
        addr: u64,
        lkey: u32,
        len: usize,
        raddr: u64,
        rkey: u32,
        imm_data: Option<u32>,
        source: Option<Arc<MemoryRegion>>,
    ) -> Result<()> {
        let mut sge = ibv_sge { addr, length: len as u32, lkey };
        let mut wr = ibv_send_wr {
            wr_id: SEND_WR_ID,
            sg_list: &mut sge,
            num_sge: i32::from(len > 0),
            opcode: if imm_data.is_some() { WR_RDMA_WRITE_WITH_IMM } else { WR_RDMA_WRITE },
            send_flags: SEND_SIGNALED,
            imm_data: imm_data.unwrap_or(0),
            ..Default::default()
        };
        wr.wr.remote_addr = raddr;
        wr.wr.rkey = rkey;
        // SAFETY: the caller's promise for the source; the chain is this one request.
        if let Err(e) = unsafe { self.qp.post_send(&mut wr) } {
            return Err(self.fail(e));
        }
        self.writes_in_flight.push_back(Write { len, ring: source.is_none(), _source: source });
        self.unacked += len;
        Ok(())
    }

    /// Writes `len` bytes at `addr`, inside `source`, straight to the peer's `raddr` (`rkey`:
    /// memory the peer offered), in writes of at most [`MAX_DIRECT_WRITE`]; the number to ask
    /// [`VerbsByteStream::write_done`] about, or `None` when the send queue has no room now.
    ///
    /// # Safety
    /// The bytes must stay unchanged until `write_done` says so.
    pub(crate) unsafe fn write_direct(
        &mut self,
        addr: usize,
        len: usize,
        source: &Arc<MemoryRegion>,
        raddr: u64,
        rkey: u32,
    ) -> Result<Option<u64>> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let writes = len.div_ceil(MAX_DIRECT_WRITE).max(1);
        // Room for these and for a ring batch (two writes) and a credit after them.
        if self.writes_in_flight.len() + writes + 3 > SEND_DEPTH as usize {
            return Ok(None);
        }
        let mut done = 0;
        while done < len || done == 0 {
            let n = (len - done).min(MAX_DIRECT_WRITE);
            // SAFETY: inside `source` (the caller's registration covering the range), unchanged
            // until the write is done (this fn's contract).
            unsafe {
                self.post((addr + done) as u64, source.lkey, n, raddr + done as u64, rkey, None, Some(source.clone()))?
            };
            done += n;
            if n == 0 {
                break;
            }
        }
        Ok(Some(self.writes_completed + self.writes_in_flight.len() as u64))
    }

    /// Whether a one-sided write of `len` bytes could be posted now.
    pub(crate) fn direct_room(&self, len: usize) -> bool {
        self.failed.is_none()
            && self.writes_in_flight.len() + len.div_ceil(MAX_DIRECT_WRITE).max(1) + 3 <= SEND_DEPTH as usize
    }

    /// Whether write number `number` (from [`VerbsByteStream::write_direct`]) is done.
    pub(crate) fn write_done(&self, number: u64) -> bool {
        self.writes_completed >= number
    }

    /// Returns the consumed bytes to the peer once there are enough of them, or the ring is
    /// drained.
    fn credit(&mut self) -> Result<()> {
        let owed = self.rx_tail - self.rx_credited;
        if owed == 0
            || (owed < self.rx_len() / 4 && self.rx_tail != self.rx_head)
            || self.writes_in_flight.len() >= SEND_DEPTH as usize
        {
            return Ok(());
        }
        self.post_write(0, 0, Some(imm(KIND_CREDIT, owed as usize)))?;
        self.rx_credited = self.rx_tail;
        Ok(())
    }

    fn check_peer(&mut self) -> Result<()> {
        self.idle += 1;
        if self.idle < LIVENESS_EVERY {
            return Ok(());
        }
        self.idle = 0;
        let mut byte = [0u8; 1];
        let e = match self.control.read(&mut byte) {
            Ok(0) => Error::PeerClosed(format!("{} is gone (its liveness socket closed)", self.peer)),
            Ok(_) => Error::Protocol(format!("unexpected byte from {} on the liveness socket", self.peer)),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => return Ok(()),
            Err(e) => Error::PeerClosed(format!("{} is gone: {e}", self.peer)),
        };
        Err(self.fail(e))
    }

    /// Moves the queue pair to the error state: nothing the peer writes lands in this side's
    /// memory after this returns (its writes fail), and this side's own are flushed.
    pub(crate) fn stop(&mut self) {
        if let Err(e) = self.qp.to_error() {
            self.fail(e);
        }
        // The writes still queued are flushed: wait (briefly) for their completions, so that
        // no one-sided source is read after the connection is closed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while !self.writes_in_flight.is_empty() && std::time::Instant::now() < deadline {
            match self.qp.cq.poll(&mut self.wcs) {
                Ok(n) => {
                    for i in 0..n {
                        let wc = self.wcs[i];
                        let _ = self.complete(&wc);
                    }
                    if n == 0 {
                        std::thread::yield_now();
                    }
                }
                Err(_) => break,
            }
        }
    }

    /// Bytes written to the peer whose writes have not completed yet (the peer's NIC has not
    /// acknowledged them): a process that ended now could lose them, so a call is not over
    /// until they are.
    pub(crate) fn unacked(&self) -> usize {
        self.unacked
    }

    /// Ring bytes whose writes have completed: the stream position the peer's NIC has
    /// acknowledged.
    pub(crate) fn acked(&self) -> u64 {
        self.tx_acked
    }

    /// The received bytes at the read position that lie contiguously, and how many there are
    /// in all.
    fn readable(&self) -> (usize, usize) {
        let len = self.rx_len();
        let avail = (self.rx_head - self.rx_tail) as usize;
        let at = (self.rx_tail % len) as usize;
        (at, avail)
    }
}

impl ByteStream for VerbsByteStream {
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        self.pump()?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let len = self.remote.len;
        // Staged bytes are free once consumed by the peer and their write is done here.
        let space = len - (self.tx_written - self.tx_credit.min(self.tx_acked)) as usize;
        // Two writes at most (a batch that wraps), one slot kept for credits.
        if total == 0 || space == 0 || self.writes_in_flight.len() + 3 > SEND_DEPTH as usize {
            if total > 0 {
                self.check_peer()?;
            }
            return Ok(0);
        }
        let n = total.min(space).min(MAX_WRITE);
        let start = (self.tx_written % len as u64) as usize;
        // Stage the bytes at the offsets they will have in the peer's ring.
        let mut copied = 0;
        for b in bufs {
            if copied == n {
                break;
            }
            let take = b.len().min(n - copied);
            let mut src = &b[..take];
            while !src.is_empty() {
                let at = (start + copied) % len;
                let piece = src.len().min(len - at);
                // SAFETY: `at + piece <= len` inside the staging buffer, whose bytes there the
                // NIC has finished reading (the peer credited them back).
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), (self.tx.buf.addr() + at) as *mut u8, piece);
                }
                copied += piece;
                src = &src[piece..];
            }
        }
        let first = n.min(len - start);
        if first < n {
            self.post_write(start, first, None)?;
            self.post_write(0, n - first, Some(imm(KIND_DATA, n)))?;
        } else {
            self.post_write(start, n, Some(imm(KIND_DATA, n)))?;
        }
        self.tx_written += n as u64;
        self.idle = 0;
        Ok(n)
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        // Bytes that landed before a failure (a peer that finished and closed while this side
        // still wrote to it) are read first; the failure is reported once none are left.
        let pumped = self.pump();
        let (at, avail) = self.readable();
        let n = avail.min(buf.len());
        if n == 0 {
            pumped?;
            if !buf.is_empty() {
                self.check_peer()?;
            }
            return Ok(0);
        }
        let len = self.rx.buf.len();
        let first = n.min(len - at);
        // SAFETY: `[tail, tail + n)` has landed (an immediate said so) and the peer does not
        // write it again before this side credits it back.
        unsafe {
            std::ptr::copy_nonoverlapping((self.rx.buf.addr() + at) as *const u8, buf.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.rx.buf.addr() as *const u8, buf.as_mut_ptr().add(first), n - first);
        }
        self.rx_tail += n as u64;
        self.idle = 0;
        if self.failed.is_none() {
            self.credit()?;
        }
        Ok(n)
    }

    fn peek(&mut self, _want: usize) -> Option<Peeked<'_>> {
        // Landed bytes stay valid after a failure, which the next read or write reports.
        let _ = self.pump();
        let (at, avail) = self.readable();
        let len = self.rx.buf.len();
        let contiguous = avail.min(len - at);
        // SAFETY: as in `read`: landed bytes the peer leaves alone until credited back; the
        // view lives no longer than `&mut self`, and crediting needs `&mut self`.
        let bytes = unsafe { std::slice::from_raw_parts((self.rx.buf.addr() + at) as *const u8, contiguous) };
        Some(Peeked { bytes, buffered: avail, until_end: len - at, capacity: len })
    }

    fn consume(&mut self, n: usize) {
        let (_, avail) = self.readable();
        self.rx_tail += n.min(avail) as u64;
        self.idle = 0;
        let _ = self.credit();
    }

    fn check_alive(&mut self) -> Result<()> {
        self.pump()?;
        self.check_peer()
    }

    fn coalesce_below(&self) -> usize {
        // Each batch costs a work request and a completion on both sides.
        4096
    }
}

//! A CUDA IPC connection: device payloads go GPU to GPU, copied by this side's device queue
//! into a window of device memory the receiver exposed (opened here by its IPC handle, or used
//! as it is when both ranks share a process); everything else — host payloads, and a small
//! descriptor per device message — goes through a shared-memory connection beside it.
//!
//! **Signals without a host round trip.** The copy and a write of the message's number into a
//! `landed` word of a small shared host page are queued together on the device; the descriptor
//! is written to the ring at once. The receiver hands the message over once `landed` has
//! reached its number, and the sender's ticket is done at the same moment: neither host waits
//! on the other or on an event before doing its part.
//!
//! **Order.** Descriptors travel under the message's tag with [`DEVICE_BIT`] set, in the one
//! ring every frame of the pair shares, so "whichever of the two tags comes first" is the next
//! message of a tag, device or host. A send that finds no room in the window waits in a queue,
//! and every later send waits behind it.
//!
//! **Or no window at all.** A receiver that knows where a message must go offers that
//! destination first (see [`offers`](super::offers)); the sender then copies the payload
//! straight into it, and the descriptor only says so.
//!
//! **The window is lent.** A device message stays in the window after `recv_with` returns,
//! while the receiver's own device operations read it ([`Connection::lends`]); the executor
//! releases each message once they are done, and the window's space comes back to the sender
//! in the order it was handed out (a `released` byte count in the shared page), whatever order
//! the tags were received in.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::sync::Arc;

use super::device::{DeviceQueue, ExportedMemory, ImportedMemory};
use super::offers::{Announced, Control, Imports, Offer, CONTROL_TAG, DIRECT_MIN_BYTES};
use super::resident::{DevicePeer, Kept};
use super::stats::Counter;
use super::wire::{reached, Descriptor, Signals, REVOKED_AT, WINDOW_ALIGN, WRITING_AT};
use super::{Shared, DEVICE_BIT};
use crate::error::{Error, Result};
use crate::numbered::count;
use crate::registration::RegistrationKey;
use crate::shm::ShmConnection;
use crate::{Connection, MemSpace, Meta, Region, Ticket, WaitFd};

/// How long a closing receiver waits for copies into its offers to land (one copy of one
/// message; a peer stopped in the middle is given up on).
const REVOKE_WAIT: Duration = Duration::from_secs(2);
/// Frames an offer may be moved past in the ring (descriptors, registrations, offers; not
/// host payloads, which the executor takes where they lie).
const SMALL_FRAME_BYTES: usize = 128;
/// Tickets of this connection's own sends (shared memory's pass through below it).
const OWN_TICKETS: u64 = 1 << 62;

/// The peer's window, as this side writes into it.
pub(crate) struct PeerWindow {
    /// Mapped here by its handle (kept open while the connection lives); `None` when the peer
    /// shares this process.
    pub(crate) mapping: Option<Arc<Kept<dyn ImportedMemory>>>,
    pub(crate) base: u64,
    pub(crate) cap: usize,
}

/// This side's receiving half: its window (the connection's `cap` bytes, then the resident
/// window) and the pair's resident side.
pub(crate) struct Receiving {
    pub(crate) window: Arc<Kept<dyn ExportedMemory>>,
    pub(crate) cap: usize,
    pub(crate) resident: Option<Arc<DevicePeer>>,
}

/// A send not yet handed on: no room in the window, or behind one that has none.
struct Pending {
    ticket: u64,
    tag: u32,
    /// Its number among the messages of its tag (offers name it).
    message: u32,
    meta: Meta,
    data: Region,
}

/// Where one of this connection's tickets stands.
#[derive(Clone, Copy)]
enum Track {
    /// Waiting in `pending`.
    Queued,
    /// Copied into the window once `landed` reaches this number.
    Copy(u64),
    /// Handed to shared memory with this ticket.
    Shm(Ticket),
}

/// A device message whose descriptor came before its bytes landed.
struct Arrived {
    tag: u32,
    meta: Meta,
    descriptor: Descriptor,
    /// Where it lands: the window, or the destination offered for it.
    at: Region,
}

/// A CUDA IPC connection. See the module documentation.
pub struct IpcConnection {
    // Dropped first: waits for the copies queued into the peer's window before it is closed.
    queue: Box<dyn DeviceQueue>,
    tx: PeerWindow,
    /// This side's window (its first `rx_cap` bytes; the rest is the resident one), at `rx_addr`.
    _rx: Arc<Kept<dyn ExportedMemory>>,
    rx_addr: u64,
    rx_cap: usize,
    /// The pair's resident side (`None` when the device has none to lend).
    resident: Option<Arc<DevicePeer>>,
    signals: Signals,
    shm: ShmConnection,
    /// The peer's registrations opened here: closed after the queue has finished.
    imports: Imports,
    shared: Shared,
    announced: Announced,
    /// Messages sent and received so far, per tag (offers name them).
    sent: Vec<(u32, u32)>,
    received: Vec<(u32, u32)>,
    /// Destinations this side offered for messages not yet received: (tag, message, region).
    offered: Vec<(u32, u32, Region)>,
    /// This side has closed and taken its offers back.
    revoked: bool,
    ordinal: u32,
    peer: String,
    /// Window bytes handed out so far (the sender's head), and copies queued.
    head: u64,
    copies: u64,
    pending: VecDeque<Pending>,
    tracks: VecDeque<(u64, Track)>,
    next_ticket: u64,
    arrived: Vec<Arrived>,
    /// What each message `recv_with` handed over holds of the window until released, in order.
    lent: VecDeque<Option<(u64, u64)>>,
    /// Released messages waiting for those before them in the window: seq → bytes.
    released_early: BTreeMap<u64, u64>,
    next_release: u64,
    released: u64,
    /// The `landed` words as last seen (a change is progress).
    seen: (u32, u32),
}

impl IpcConnection {
    pub(crate) fn new(
        shm: ShmConnection,
        queue: Box<dyn DeviceQueue>,
        tx: PeerWindow,
        rx: Receiving,
        signals: Signals,
        shared: Shared,
        peer: String,
    ) -> IpcConnection {
        let Receiving { window: rx, cap: rx_cap, resident } = rx;
        let rx_addr = rx.0.lock().map_or(0, |m| m.addr());
        IpcConnection {
            queue,
            tx,
            _rx: rx,
            rx_addr,
            rx_cap,
            resident,
            signals,
            shm,
            imports: Imports::default(),
            ordinal: shared.access.device().ordinal,
            shared,
            announced: Announced::default(),
            sent: Vec::new(),
            received: Vec::new(),
            offered: Vec::new(),
            revoked: false,
            peer,
            head: 0,
            copies: 0,
            pending: VecDeque::new(),
            tracks: VecDeque::new(),
            next_ticket: OWN_TICKETS,
            arrived: Vec::new(),
            lent: VecDeque::new(),
            released_early: BTreeMap::new(),
            next_release: 1,
            released: 0,
            seen: (0, 0),
        }
    }

    fn rx_direction(&self) -> usize {
        1 - self.signals.tx
    }

    /// Where a message of `len` bytes goes in the peer's window, and the window bytes it uses,
    /// if there is room now.
    fn place(&self, len: usize) -> Option<(u64, u64)> {
        let cap = self.tx.cap as u64;
        let rounded = len.next_multiple_of(WINDOW_ALIGN) as u64;
        let at = self.head % cap;
        let pad = if at + rounded > cap { cap - at } else { 0 };
        let used = self.head - self.signals.released(self.signals.tx).load(Ordering::Acquire).min(self.head);
        (used + pad + rounded <= cap).then_some(((at + pad) % cap, pad + rounded))
    }

    /// Hands `p` on if it can go now; whether it went.
    fn post(&mut self, p: &Pending) -> Result<Option<Track>> {
        if p.data.space == MemSpace::Host {
            // SAFETY: valid host memory until the ticket is done (`send`'s contract).
            let t = unsafe { self.shm.send(p.tag, &p.meta, p.data)? };
            return Ok(Some(Track::Shm(t)));
        }
        if p.data.len >= DIRECT_MIN_BYTES {
            self.take_control()?;
            if let Some(dst) = self.imports.take(p.tag, p.message, p.data.len, &self.peer)? {
                if let Some(track) = self.post_direct(p, dst)? {
                    return Ok(Some(track));
                }
            }
        }
        let Some((offset, consumed)) = self.place(p.data.len) else { return Ok(None) };
        let seq = self.copies + 1;
        // SAFETY: the source is device memory of this rank's device, valid and unchanged until
        // the ticket is done (`send`'s contract); the destination is window space the peer has
        // released, inside its window (`place`), which no other copy writes until this one's
        // bytes are released again.
        unsafe {
            self.queue.copy(self.tx.base + offset, p.data.addr as u64, p.data.len)?;
            self.queue.write_value(self.signals.landed_device_addr(), seq as u32)?;
        }
        self.copies = seq;
        self.head += consumed;
        let d = Descriptor { offset, len: p.data.len as u64, consumed, seq, direct: false };
        let bytes = d.encode();
        // SAFETY: a small payload, copied by the framing before `send_reserved` returns.
        unsafe { self.shm.send_reserved(p.tag | DEVICE_BIT, &p.meta, Region::of(&bytes))? };
        self.shared.stats.add(Counter::Window);
        Ok(Some(Track::Copy(seq)))
    }

    /// Copies `p` straight into `dst`, the destination the peer offered for it (its address
    /// here), unless the peer has taken its offers back; whether it did.
    ///
    /// Dekker's protocol on the direction's `writing` and `revoked` flags (sequentially
    /// consistent): this side raises `writing`, then queues the copy only if `revoked` is
    /// clear; a closing receiver raises `revoked`, then waits while `writing` is up and for the
    /// copy numbered in `direct` to land. One of the two always sees the other's flag.
    fn post_direct(&mut self, p: &Pending, dst: u64) -> Result<Option<Track>> {
        let tx = self.signals.tx;
        let writing = self.signals.flag(tx, WRITING_AT);
        writing.store(1, Ordering::SeqCst);
        if self.signals.flag(tx, REVOKED_AT).load(Ordering::SeqCst) != 0 {
            writing.store(0, Ordering::SeqCst);
            return Ok(None);
        }
        let seq = self.copies + 1;
        // SAFETY: the source is device memory of this rank's device, valid and unchanged until
        // the ticket is done (`send`'s contract); the destination lies inside a registration
        // the peer announced and has not revoked (bounds checked by `Imports::take`), offered
        // for this very message, which nothing on the peer's side touches until it has landed.
        let queued = unsafe {
            self.queue
                .copy(dst, p.data.addr as u64, p.data.len)
                .and_then(|()| self.queue.write_value(self.signals.landed_device_addr(), seq as u32))
        };
        if queued.is_ok() {
            self.signals.direct(tx).store(seq, Ordering::SeqCst);
        }
        self.signals.flag(tx, WRITING_AT).store(0, Ordering::SeqCst);
        queued?;
        self.copies = seq;
        let d = Descriptor { offset: 0, len: p.data.len as u64, consumed: 0, seq, direct: true };
        let bytes = d.encode();
        // SAFETY: a small payload, copied by the framing before `send_reserved` returns.
        unsafe { self.shm.send_reserved(p.tag | DEVICE_BIT, &p.meta, Region::of(&bytes))? };
        self.shared.stats.add(Counter::Direct);
        Ok(Some(Track::Copy(seq)))
    }

    /// Acts on the registrations, revocations and offers the peer has sent.
    fn take_control(&mut self) -> Result<()> {
        let mut frames = Vec::new();
        let peer = &self.peer;
        // Descriptors and other offers may be moved out of the way; a host payload stays.
        while self.shm.recv_reserved(CONTROL_TAG, SMALL_FRAME_BYTES, &mut |m, r| {
            // SAFETY: `recv_reserved` hands over host memory valid for the call.
            frames.push(Control::decode(m, unsafe { r.bytes() }, peer))
        })? {}
        for f in frames {
            // A peer in this process (no window mapping) has its registrations used by address.
            let same_process = self.tx.mapping.is_none();
            self.imports.apply(f?, &*self.shared.access, same_process, self.copies, &self.shared.stats);
        }
        Ok(())
    }

    /// Counts a message of `tag` received (handed over); its offer, if any, is used up.
    fn received(&mut self, tag: u32) {
        let n = count(&mut self.received, tag);
        let message = *n;
        *n = n.wrapping_add(1);
        self.offered.retain(|o| o.0 != tag || o.1 != message);
    }

    /// Where a device message lands here: the window, or the destination this side offered
    /// for it.
    fn landing(&mut self, tag: u32, d: &Descriptor) -> Result<Region> {
        if !d.direct {
            return Ok(self.region(d));
        }
        let message = *count(&mut self.received, tag);
        match self.offered.iter().find(|o| o.0 == tag && o.1 == message) {
            Some(o) if o.2.len as u64 == d.len => Ok(o.2),
            _ => Err(Error::Protocol(format!(
                "{} copied message {message} of tag {tag} into a destination this side did not offer",
                self.peer
            ))),
        }
    }

    /// Takes every offer back: no copy of the peer's writes this side's memory once this
    /// returns (or the peer has been given up on). See [`IpcConnection::post_direct`].
    fn revoke_offers(&mut self) {
        if std::mem::replace(&mut self.revoked, true) {
            return;
        }
        let rx = self.rx_direction();
        self.signals.flag(rx, REVOKED_AT).store(1, Ordering::SeqCst);
        let deadline = Instant::now() + REVOKE_WAIT;
        while self.signals.flag(rx, WRITING_AT).load(Ordering::SeqCst) != 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let last = self.signals.direct(rx).load(Ordering::SeqCst);
        while !reached(self.signals.landed(rx), last) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Hands on the queued sends that can go now, in order; whether any went.
    fn post_pending(&mut self) -> Result<bool> {
        let mut moved = false;
        while let Some(p) = self.pending.pop_front() {
            match self.post(&p)? {
                Some(track) => {
                    if let Some(t) = self.tracks.iter_mut().find(|t| t.0 == p.ticket) {
                        t.1 = track;
                    }
                    moved = true;
                }
                None => {
                    self.pending.push_front(p);
                    break;
                }
            }
        }
        Ok(moved)
    }

    fn track_done(&self, t: Track) -> bool {
        match t {
            Track::Queued => false,
            Track::Copy(seq) => reached(self.signals.landed(self.signals.tx), seq),
            Track::Shm(t) => self.shm.sent(t),
        }
    }

    /// The message in `d` as the executor gets it: this side's window.
    fn region(&self, d: &Descriptor) -> Region {
        Region::new(MemSpace::Device(self.ordinal), (self.rx_addr + d.offset) as usize, d.len as usize)
    }

    fn landed(&self, d: &Descriptor) -> bool {
        reached(self.signals.landed(self.rx_direction()), d.seq)
    }
}

fn reserved(tag: u32) -> Result<()> {
    if tag & (DEVICE_BIT | (1 << 31)) != 0 {
        return Err(Error::Unsupported(format!("tag {tag:#x}: tags with bit 29 or 31 set are reserved")));
    }
    Ok(())
}

impl Connection for IpcConnection {
    fn transport(&self) -> &'static str {
        "cuda-ipc"
    }

    fn reaches(&self, space: MemSpace) -> bool {
        space == MemSpace::Host || space == MemSpace::Device(self.ordinal)
    }

    unsafe fn send(&mut self, tag: u32, meta: &Meta, data: Region) -> Result<Ticket> {
        reserved(tag)?;
        if !self.reaches(data.space) {
            return Err(Error::Unsupported(format!(
                "{} cannot be sent over CUDA IPC from device {}",
                data.space, self.ordinal
            )));
        }
        if data.space != MemSpace::Host && data.len > self.tx.cap {
            return Err(Error::Unsupported(format!(
                "a {}-byte device message does not fit the {}-byte IPC window (TOPOCCL_IPC_BYTES)",
                data.len, self.tx.cap
            )));
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let n = count(&mut self.sent, tag);
        let message = *n;
        *n = n.wrapping_add(1);
        let p = Pending { ticket, tag, message, meta: *meta, data };
        let track = if self.pending.is_empty() { self.post(&p)? } else { None };
        match track {
            Some(Track::Shm(t)) if t == Ticket::DONE => return Ok(Ticket::DONE),
            Some(track) => self.tracks.push_back((ticket, track)),
            None => {
                self.tracks.push_back((ticket, Track::Queued));
                self.pending.push_back(p);
            }
        }
        Ok(Ticket(ticket))
    }

    fn sent(&self, t: Ticket) -> bool {
        if t == Ticket::DONE {
            return true;
        }
        self.tracks.iter().find(|k| k.0 == t.0).map_or(true, |k| self.track_done(k.1))
    }

    fn backlog(&self) -> usize {
        self.shm.backlog() + self.pending.iter().map(|p| p.data.len).sum::<usize>()
    }

    fn progress(&mut self) -> Result<bool> {
        let mut moved = if self.pending.is_empty() { false } else { self.post_pending()? };
        while let Some(&(_, t)) = self.tracks.front() {
            if !self.track_done(t) {
                break;
            }
            self.tracks.pop_front();
        }
        moved |= self.shm.progress()?;
        let (landed, stats) = (self.signals.landed(self.signals.tx), &self.shared.stats);
        self.imports.reap(|n| reached(landed, n), stats);
        if !self.pending.is_empty() || !self.arrived.is_empty() {
            // Waiting for the peer to free window space or for its copies to land: nothing in
            // the ring tells when it dies, so the liveness line must.
            self.shm.check_alive();
        }
        let seen = (self.signals.landed(0), self.signals.landed(1));
        moved |= seen != self.seen;
        self.seen = seen;
        Ok(moved)
    }

    fn recv_with(&mut self, tag: u32, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool> {
        reserved(tag)?;
        if let Some(i) = self.arrived.iter().position(|a| a.tag == tag) {
            if !self.landed(&self.arrived[i].descriptor) {
                return Ok(false);
            }
            let a = self.arrived.remove(i);
            f(&a.meta, a.at);
            self.lent.push_back(Some((a.descriptor.seq, a.descriptor.consumed)));
            self.received(tag);
            return Ok(true);
        }
        let (cap, peer) = (self.rx_cap, &self.peer);
        let mut device: Option<Result<(Meta, Descriptor)>> = None;
        let got = self.shm.recv_either(tag, tag | DEVICE_BIT, &mut |is_device, meta, r| {
            if is_device {
                // SAFETY: `recv_either` hands over host memory valid for this call.
                device = Some(Descriptor::decode(unsafe { r.bytes() }, cap, peer).map(|d| (*meta, d)));
            } else {
                f(meta, r);
            }
        })?;
        if !got {
            return Ok(false);
        }
        let Some(device) = device else {
            self.lent.push_back(None);
            self.received(tag);
            return Ok(true);
        };
        let (meta, descriptor) = device?;
        let at = self.landing(tag, &descriptor)?;
        if !self.landed(&descriptor) {
            self.arrived.push(Arrived { tag, meta, descriptor, at });
            return Ok(false);
        }
        f(&meta, at);
        self.lent.push_back(Some((descriptor.seq, descriptor.consumed)));
        self.received(tag);
        Ok(true)
    }

    /// Offers `dst` for the next message of `tag` when it is device memory of this rank's
    /// device, large enough to be worth it, inside an allocation that has an IPC handle
    /// (`cuMemAlloc` memory; pool memory has none). Anything else is declined silently: the
    /// message then comes through the window.
    unsafe fn offer(&mut self, tag: u32, dst: Region) -> Result<()> {
        reserved(tag)?;
        if self.revoked
            || dst.space != MemSpace::Device(self.ordinal)
            || dst.len < DIRECT_MIN_BYTES
            || self.arrived.iter().any(|a| a.tag == tag)
        {
            return Ok(());
        }
        let message = *count(&mut self.received, tag);
        if self.offered.iter().any(|o| o.0 == tag && o.1 == message) {
            return Ok(());
        }
        let access = &*self.shared.access;
        let Ok(Some(allocation)) = access.allocation(dst.addr as u64) else { return Ok(()) };
        let Some(offset) = (dst.addr as u64).checked_sub(allocation.base) else { return Ok(()) };
        if offset.saturating_add(dst.len as u64) > allocation.len {
            return Ok(());
        }
        let registration = {
            let mut cache =
                self.shared.registrations.lock().map_err(|_| Error::Unsupported("a poisoned lock".into()))?;
            cache.get_or_register(allocation, || {
                Ok(access.export(allocation.base).ok().flatten().map(RegistrationKey::CudaIpc))
            })?
        };
        let Some(registration) = registration else { return Ok(()) };
        let mut frames = Vec::new();
        self.announced.announce(&registration, &mut frames);
        frames.push(Control::Offer(Offer { tag, message, id: registration.id, offset, len: dst.len as u64 }));
        for c in &frames {
            self.shared.stats.add(match c {
                Control::Register { .. } => Counter::Announced,
                Control::Revoke { .. } => Counter::Revoked,
                Control::Offer(_) => Counter::Offer,
            });
            let (meta, bytes) = c.encode();
            // SAFETY: a small payload, copied by the framing before `send_reserved` returns.
            unsafe { self.shm.send_reserved(CONTROL_TAG, &meta, Region::of(&bytes))? };
        }
        self.offered.retain(|o| o.0 != tag);
        self.offered.push((tag, message, dst));
        Ok(())
    }

    fn one_sided(&self) -> bool {
        true
    }

    fn lends(&self) -> bool {
        true
    }

    fn release(&mut self) {
        let Some(Some((seq, bytes))) = self.lent.pop_front() else { return };
        self.released_early.insert(seq, bytes);
        while let Some(bytes) = self.released_early.remove(&self.next_release) {
            self.released += bytes;
            self.next_release += 1;
        }
        self.signals.released(self.rx_direction()).store(self.released, Ordering::Release);
    }

    fn backlog_limit(&self) -> Option<usize> {
        Some(1)
    }

    fn closed(&self) -> Option<&str> {
        self.shm.closed()
    }

    fn device_peer(&self) -> Option<Arc<DevicePeer>> {
        self.resident.clone()
    }

    fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        self.shm.wait_fds(out)
    }

    fn needs_spin(&self) -> bool {
        self.shm.needs_spin()
    }

    fn close(&mut self) {
        self.pending.clear();
        self.revoke_offers();
        // Copies already queued still read their sources: none may once this returns. A device
        // that cannot finish them has failed for good (a sticky error), and reads no more.
        let _ = self.queue.finish();
        self.imports.clear(&self.shared.stats);
        self.shm.close();
    }
}

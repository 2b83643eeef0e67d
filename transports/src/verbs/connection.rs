//! A connection over RDMA verbs: the framing over the ring stream, offers each way, and the
//! one-sided writes into the peer's offers — striped over the connection's lanes where it has
//! any ([`lanes`](super::lanes)), the frame that says "written" held back until every lane's
//! part has landed, and the sends of the same tag held behind it (the peer numbers a tag's
//! messages in the order their frames come).

use std::collections::VecDeque;
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::device;
use super::lanes::{self, Lanes};
use super::regions::Access;
use super::select::Nic;
use super::stream::VerbsByteStream;
use crate::error::{Error, Result};
use crate::framing::{Framed, HEADER_BYTES};
use crate::ipc::DeviceAccess;
use crate::numbered::{decode_offer, encode_offer, reserved, Numbered, DIRECT_BIT, OFFER_TAG};
use crate::{Connection, MemSpace, Meta, Region, Ticket, WaitFd, MAX_MESSAGE_BYTES};

/// What each side of a connection offers and writes, as the two records allow.
pub(super) struct Offers {
    /// Host memory receives are offered (both ports register on demand).
    pub(super) host: bool,
    /// The GPU whose memory receives are offered (this port registers its dma-bufs, the
    /// peer's sources on demand).
    pub(super) device: Option<Arc<dyn DeviceAccess>>,
    /// This side writes into the peer's offers (it registers its sources on demand, and the
    /// peer makes offers).
    pub(super) writes: bool,
    /// The GPU whose memory this side's writes may read (dma-buf), wherever it writes.
    pub(super) sources: Option<Arc<dyn DeviceAccess>>,
}

/// A connection over RDMA verbs.
pub struct VerbsConnection {
    framed: Framed<VerbsByteStream>,
    nic: Arc<Nic>,
    /// What this side offers, and writes from and into.
    offers: Offers,
    /// Where each offer frame not yet acknowledged ends in the stream (not part of the backlog).
    offer_ends: VecDeque<u64>,
    /// Messages numbered per tag, and the offers made each way: the peer's name where its
    /// memory is (address, length, rkey), this side's keep the registration alive.
    numbered: Numbered<Offered>,
    stats: Arc<VerbsStats>,
    /// The extra queue pairs one-sided writes are striped over.
    lanes: Lanes,
    /// Sends not handed to the stream yet, in order: a striped message's frame waiting for its
    /// lanes, a send from device memory waiting for room to post, and the sends of their tag
    /// behind them.
    held: VecDeque<Held>,
    /// What each held send became once handed over, by its id (until that is done).
    released: Vec<(u64, Ticket)>,
    next_held: u64,
}

/// A send held back (see [`VerbsConnection::held`]).
struct Held {
    id: u64,
    tag: u32,
    meta: Meta,
    data: Region,
    /// For a striped message's frame: the lane marks it waits for, and the ticket of its part
    /// on the first queue pair.
    waits: Option<(Vec<u64>, Ticket)>,
}

/// How a send went out.
enum Sent {
    /// Handed to the stream: done when the ticket is.
    Now(Ticket),
    /// Written in place over the lanes and the first queue pair: the frame waits for the
    /// lanes' marks.
    Waits(Vec<u64>, Ticket),
    /// Not yet: a send from device memory waits for room to post its writes.
    Later,
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
/// Tickets of held sends (numbered by the connection).
const HELD_TICKET: u64 = 1 << 62;
/// Receives smaller than this always take the ring (an offer costs a frame each way).
pub const DIRECT_MIN_BYTES: usize = 64 << 10;

/// What the verbs connections of a transport have done (cumulative).
#[derive(Debug, Default)]
pub struct VerbsStats {
    ring_messages: AtomicU64,
    direct_messages: AtomicU64,
    striped_messages: AtomicU64,
    device_sends: AtomicU64,
    offers: AtomicU64,
}

impl VerbsStats {
    pub(super) fn counts(&self) -> VerbsCounts {
        VerbsCounts {
            ring_messages: self.ring_messages.load(Ordering::Relaxed),
            direct_messages: self.direct_messages.load(Ordering::Relaxed),
            striped_messages: self.striped_messages.load(Ordering::Relaxed),
            device_sends: self.device_sends.load(Ordering::Relaxed),
            offers: self.offers.load(Ordering::Relaxed),
            ..VerbsCounts::default()
        }
    }
}

/// A snapshot of [`VerbsStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VerbsCounts {
    /// Messages through the receiver's ring, and written straight into an offered buffer.
    pub ring_messages: u64,
    pub direct_messages: u64,
    /// Of the direct messages, those striped over more than one queue pair, and those read
    /// straight from device memory (dma-buf).
    pub striped_messages: u64,
    pub device_sends: u64,
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

    pub(super) fn new(
        framed: Framed<VerbsByteStream>,
        lanes: Lanes,
        nic: Arc<Nic>,
        offers: Offers,
        stats: Arc<VerbsStats>,
    ) -> VerbsConnection {
        VerbsConnection {
            framed,
            nic,
            offers,
            offer_ends: VecDeque::new(),
            numbered: Numbered::default(),
            stats,
            lanes,
            held: VecDeque::new(),
            released: Vec::new(),
            next_held: 0,
        }
    }

    /// Writes `data` straight into the peer's offer for the next message of `tag`, if it made
    /// one in time and there is room to post (striped over the lanes where it is large
    /// enough); `None` where it goes through the ring. Device memory goes only this way (the
    /// executor asked [`Connection::sends_from`] first): without room it is [`Sent::Later`],
    /// with nothing used up.
    fn put(&mut self, tag: u32, data: Region) -> Result<Option<Sent>> {
        let message = self.numbered.next_to_send(tag);
        let from_device = data.space != MemSpace::Host;
        let promised = || Error::Protocol(format!("a send from {} without the offer it was promised", data.space));
        if !self.offers.writes {
            if from_device {
                return Err(promised());
            }
            self.numbered.next_sent(tag);
            return Ok(None);
        }
        // Offers for this message or earlier ones are used here or never.
        self.take_offers();
        let (part, parts) = lanes::split(data.len, self.lanes.len());
        let room = self.framed.stream.direct_room(part) && self.lanes.room(parts - 1);
        let source = if from_device {
            if !room {
                return Ok(Some(Sent::Later));
            }
            let device = self.device_source(data.space).ok_or_else(promised)?;
            let covered =
                self.nic.regions.cover_device(&self.nic.pd, device.as_ref(), data.addr, data.len, Access::Read);
            covered?.ok_or_else(promised)?
        } else {
            let source = (data.len >= DIRECT_MIN_BYTES && room)
                .then(|| self.nic.regions.cover(&self.nic.pd, data.addr, data.len, Access::Read).ok())
                .flatten();
            match source {
                Some(s) => s,
                None => {
                    self.numbered.next_sent(tag);
                    self.numbered.take_offer(tag, message, |_| false);
                    return Ok(None);
                }
            }
        };
        self.numbered.next_sent(tag);
        let Some(to) = self.numbered.take_offer(tag, message, |o| o.dst.len == data.len) else {
            return if from_device { Err(promised()) } else { Ok(None) };
        };
        // The first part on the first queue pair (its frame follows it there), the others on
        // the lanes.
        let first = part.min(data.len);
        // SAFETY: inside `data` (memory valid and unchanged until the ticket is done: `send`'s
        // contract) and `source`; the destination is inside the peer's offer.
        let number =
            unsafe { self.framed.stream.write_direct(data.addr, first, &source, to.dst.addr as u64, to.rkey)? };
        let number = number.ok_or_else(|| Error::Protocol("no room for a write checked to fit".into()))?;
        let mut marks = Vec::with_capacity(parts - 1);
        for k in 1..parts {
            let off = k * part;
            let n = part.min(data.len - off);
            // SAFETY: as above, for part `k`.
            let mark =
                unsafe { self.lanes.write(k - 1, data.addr + off, n, &source, (to.dst.addr + off) as u64, to.rkey)? };
            marks.push(mark);
        }
        let ticket = Ticket(DIRECT_TICKET | number);
        self.stats.direct_messages.fetch_add(1, Ordering::Relaxed);
        if from_device {
            self.stats.device_sends.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(if marks.is_empty() {
            Sent::Now(ticket)
        } else {
            self.stats.striped_messages.fetch_add(1, Ordering::Relaxed);
            Sent::Waits(marks, ticket)
        }))
    }

    /// The GPU whose memory of `space` this side's writes read through dma-buf, if it has one.
    fn device_source(&self, space: MemSpace) -> Option<Arc<dyn DeviceAccess>> {
        let d = self.offers.sources.as_ref()?;
        (space == MemSpace::Device(d.device().ordinal)).then(|| d.clone())
    }

    /// Sends now: in place where the peer offered (the frame sent too unless it must wait for
    /// the lanes), else through the ring.
    ///
    /// # Safety
    /// As for [`Connection::send`].
    unsafe fn send_now(&mut self, tag: u32, meta: &Meta, data: Region) -> Result<Sent> {
        match self.put(tag, data)? {
            Some(Sent::Now(ticket)) => {
                // Written in place at the peer: the frame, behind the write on the same queue
                // pair, only says so (it lands after the data).
                // SAFETY: an empty region.
                unsafe { self.framed.send(tag | DIRECT_BIT, meta, Region::EMPTY)? };
                Ok(Sent::Now(ticket))
            }
            Some(other) => Ok(other),
            None => {
                self.stats.ring_messages.fetch_add(1, Ordering::Relaxed);
                // SAFETY: host memory valid and unchanged until the ticket is done (this fn's
                // contract, passed on).
                let seq = unsafe { self.framed.send(tag, meta, data)? };
                Ok(Sent::Now(if seq == 0 { Ticket::DONE } else { Ticket(seq) }))
            }
        }
    }

    fn hold(&mut self, tag: u32, meta: &Meta, data: Region, waits: Option<(Vec<u64>, Ticket)>) -> Ticket {
        let id = self.next_held;
        self.next_held += 1;
        self.held.push_back(Held { id, tag, meta: *meta, data, waits });
        Ticket(HELD_TICKET | id)
    }

    /// Hands over what is held, in order, as far as the lanes allow.
    fn release(&mut self) -> Result<()> {
        // A closed connection hands nothing over (its closing is what `closed` reports).
        if self.framed.closed().is_some() {
            return Ok(());
        }
        if let Err(why) = self.lanes.poll() {
            self.framed.mark_closed(why);
            return Ok(());
        }
        while let Some(front) = self.held.front() {
            if let Some((marks, _)) = &front.waits {
                if !self.lanes.done(marks) {
                    break;
                }
            }
            let Some(h) = self.held.pop_front() else { break };
            match h.waits {
                Some((_, ticket)) => {
                    // Every part has landed: the frame says so.
                    // SAFETY: an empty region.
                    unsafe { self.framed.send(h.tag | DIRECT_BIT, &h.meta, Region::EMPTY)? };
                    self.released.push((h.id, ticket));
                }
                // SAFETY: the caller's memory, valid and unchanged until the held ticket is done
                // (`send`'s contract), which it is not before this.
                None => match unsafe { self.send_now(h.tag, &h.meta, h.data)? } {
                    Sent::Now(ticket) => self.released.push((h.id, ticket)),
                    Sent::Waits(marks, ticket) => {
                        self.held.push_front(Held { waits: Some((marks, ticket)), data: Region::EMPTY, ..h })
                    }
                    Sent::Later => {
                        self.held.push_front(h);
                        break;
                    }
                },
            }
        }
        let framed = &self.framed;
        self.released.retain(|(_, t)| !done(framed, *t));
        Ok(())
    }
}

/// Whether a ticket the stream or the framing gave is done.
fn done(framed: &Framed<VerbsByteStream>, t: Ticket) -> bool {
    match t {
        Ticket::DONE => true,
        Ticket(n) if n & DIRECT_TICKET != 0 => framed.stream.write_done(n & !DIRECT_TICKET),
        Ticket(seq) => framed.sent(seq),
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
        if self.held.iter().any(|h| h.tag == tag) {
            return Ok(self.hold(tag, meta, data, None));
        }
        // SAFETY: this fn's contract, passed on.
        Ok(match unsafe { self.send_now(tag, meta, data)? } {
            Sent::Now(ticket) => ticket,
            Sent::Waits(marks, ticket) => self.hold(tag, meta, Region::EMPTY, Some((marks, ticket))),
            Sent::Later => self.hold(tag, meta, data, None),
        })
    }

    fn sent(&self, t: Ticket) -> bool {
        match t {
            Ticket(n) if n != Ticket::DONE.0 && n & DIRECT_TICKET == 0 && n & HELD_TICKET != 0 => {
                let id = n & !HELD_TICKET;
                !self.held.iter().any(|h| h.id == id)
                    && self.released.iter().find(|(i, _)| *i == id).map_or(true, |(_, t)| done(&self.framed, *t))
            }
            t => done(&self.framed, t),
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
        let held: usize = self.held.iter().map(|h| HEADER_BYTES + h.data.len).sum();
        pending.saturating_sub(offers as usize) + held + self.lanes.unacked()
    }

    fn progress(&mut self) -> Result<bool> {
        let acked = self.framed.stream.acked();
        while self.offer_ends.front().is_some_and(|&end| end <= acked) {
            self.offer_ends.pop_front();
        }
        self.release()?;
        self.framed.progress()
    }

    fn recv_with(&mut self, tag: u32, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool> {
        reserved(tag)?;
        let device = &self.offers.device;
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
        let registration = match (dst.space, &self.offers.device) {
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
        self.offers.host || self.offers.device.is_some()
    }

    fn sends_from(&mut self, tag: u32, data: Region, ahead: u32) -> bool {
        if data.space == MemSpace::Host {
            return true;
        }
        // From device memory only into the peer's offer for this very message: the tag's next
        // after the sends held here unnumbered and the `ahead` the caller has yet to hand over.
        let Some(device) = self.device_source(data.space).filter(|_| self.offers.writes) else { return false };
        // Offers that came since the last progress are read first.
        if self.framed.progress().is_err() || self.framed.closed().is_some() {
            return false;
        }
        self.take_offers();
        let held = self.held.iter().filter(|h| h.tag == tag && h.waits.is_none()).count() as u32;
        let message = self.numbered.next_to_send(tag).wrapping_add(held).wrapping_add(ahead);
        self.numbered.has_offer(tag, message, |o| o.dst.len == data.len)
            && matches!(
                self.nic.regions.cover_device(&self.nic.pd, device.as_ref(), data.addr, data.len, Access::Read),
                Ok(Some(_))
            )
    }

    fn offers_into(&self, space: MemSpace) -> bool {
        match space {
            MemSpace::Host => self.offers.host,
            MemSpace::Device(d) => self.offers.device.as_ref().is_some_and(|g| g.device().ordinal == d),
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
        // No write of the peer's lands in memory this side offered once this returns, and no
        // write of this side's reads a source after it.
        self.lanes.stop();
        self.framed.stream.stop();
        self.held.clear();
        self.released.clear();
        self.numbered.clear_offered();
        let _ = self.framed.stream.control.shutdown(Shutdown::Both);
        self.framed.mark_closed("closed locally".to_string());
    }
}

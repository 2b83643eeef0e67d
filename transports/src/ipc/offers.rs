//! One-sided device messages over CUDA IPC: a receiver whose destination is known before the
//! message comes offers it ([`Connection::offer`](crate::Connection::offer)), and the sender's
//! copy engine writes the payload straight there instead of into the window (one copy instead
//! of two: into the window, and out again).
//!
//! An offer names a [`Registration`] (the allocation's IPC handle) and an offset, announced to
//! the peer once per registration: the receiver's side keeps what it has announced
//! ([`Announced`]) and revokes a registration at the peer when its buffer turns out freed (the
//! cache found it stale) or to bound how many the peer keeps open. The sender's side opens each
//! announced registration once ([`Imports`]) and closes it on revocation, after the copies
//! already queued into it have landed.
//!
//! All of it travels in the pair's ring under [`CONTROL_TAG`], in order, so a revocation is
//! always seen before any offer made after it.

use std::collections::VecDeque;

use super::device::{DeviceAccess, ImportedMemory, IPC_HANDLE_BYTES};
use super::stats::{Counter, IpcStats};
use super::DEVICE_BIT;
use crate::error::{Error, Result};
use crate::registration::{Allocation, Registration, RegistrationKey};
use crate::{Meta, META_BYTES};

/// The tag registrations, revocations and offers travel under (reserved: bit 31 and bit 29).
pub(crate) const CONTROL_TAG: u32 = (1 << 31) | DEVICE_BIT;
/// Device messages at least this large are offered (below, the offer costs more than the copy
/// it saves).
pub(crate) const DIRECT_MIN_BYTES: usize = 64 << 10;
/// Registrations a connection keeps announced at its peer (each is a mapping there).
const MAX_ANNOUNCED: usize = 32;

const REGISTER: u8 = 1;
const REVOKE: u8 = 2;
const OFFER: u8 = 3;

/// Where the next message `message` of `tag` may be written: `len` bytes at `offset` of
/// registration `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    pub(crate) tag: u32,
    pub(crate) message: u32,
    pub(crate) id: u64,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Control {
    Register { id: u64, base: u64, len: u64, handle: [u8; IPC_HANDLE_BYTES] },
    Revoke { id: u64 },
    Offer(Offer),
}

fn put(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

impl Control {
    /// The frame's meta (its kind) and payload.
    pub(crate) fn encode(&self) -> (Meta, Vec<u8>) {
        let mut meta = [0u8; META_BYTES];
        let mut b = Vec::with_capacity(32 + IPC_HANDLE_BYTES);
        match self {
            Control::Register { id, base, len, handle } => {
                meta[0] = REGISTER;
                for v in [*id, *base, *len] {
                    put(&mut b, v);
                }
                b.extend_from_slice(handle);
            }
            Control::Revoke { id } => {
                meta[0] = REVOKE;
                put(&mut b, *id);
            }
            Control::Offer(o) => {
                meta[0] = OFFER;
                put(&mut b, u64::from(o.tag) | u64::from(o.message) << 32);
                for v in [o.id, o.offset, o.len] {
                    put(&mut b, v);
                }
            }
        }
        (meta, b)
    }

    /// The frame `meta` + `b` from `peer`, checked for shape (offsets are checked against the
    /// registration when used).
    pub(crate) fn decode(meta: &Meta, b: &[u8], peer: &str) -> Result<Control> {
        let bad = |why: &str| Error::Protocol(format!("{peer} sent a bad CUDA IPC offer frame: {why}"));
        let q = |i: usize| -> u64 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        match meta[0] {
            REGISTER if b.len() == 24 + IPC_HANDLE_BYTES => {
                let mut handle = [0u8; IPC_HANDLE_BYTES];
                handle.copy_from_slice(&b[24..]);
                let (id, base, len) = (q(0), q(1), q(2));
                if len == 0 || base.checked_add(len).is_none() {
                    return Err(bad("an impossible registration"));
                }
                Ok(Control::Register { id, base, len, handle })
            }
            REVOKE if b.len() == 8 => Ok(Control::Revoke { id: q(0) }),
            OFFER if b.len() == 32 => {
                let tm = q(0);
                let o = Offer { tag: tm as u32, message: (tm >> 32) as u32, id: q(1), offset: q(2), len: q(3) };
                if o.tag & (DEVICE_BIT | 1 << 31) != 0 || o.offset.checked_add(o.len).is_none() {
                    return Err(bad("an impossible offer"));
                }
                Ok(Control::Offer(o))
            }
            REGISTER | REVOKE | OFFER => Err(bad("wrong length")),
            k => Err(bad(&format!("unknown kind {k}"))),
        }
    }
}

/// The receiving side: the registrations its peer knows, oldest use first.
#[derive(Default)]
pub(crate) struct Announced {
    live: VecDeque<(u64, Allocation)>,
}

impl Announced {
    /// Appends to `out` what makes `reg` known at the peer: revocations of the announced
    /// registrations over the same memory (their buffer was freed) and of the least recently
    /// used when too many are announced, then `reg` itself; nothing if the peer knows it.
    pub(crate) fn announce(&mut self, reg: &Registration, out: &mut Vec<Control>) {
        if let Some(i) = self.live.iter().position(|(id, _)| *id == reg.id) {
            if let Some(e) = self.live.remove(i) {
                self.live.push_back(e);
            }
            return;
        }
        let a = reg.allocation;
        self.live.retain(|(id, b)| {
            let replaced = b.overlaps(a.base, a.len);
            if replaced {
                out.push(Control::Revoke { id: *id });
            }
            !replaced
        });
        while self.live.len() >= MAX_ANNOUNCED {
            if let Some((id, _)) = self.live.pop_front() {
                out.push(Control::Revoke { id });
            }
        }
        let RegistrationKey::CudaIpc(handle) = reg.key;
        out.push(Control::Register { id: reg.id, base: a.base, len: a.len, handle });
        self.live.push_back((reg.id, a));
    }
}

/// A peer's registration as this side writes into it.
struct Import {
    id: u64,
    /// Its address here (the peer's own address when both share a process).
    base: u64,
    len: u64,
    /// Closed on drop; `None` when both ranks share a process.
    mapping: Option<Box<dyn ImportedMemory>>,
}

/// The sending side: the peer's registrations opened here, and the offers not yet used.
#[derive(Default)]
pub(crate) struct Imports {
    open: Vec<Import>,
    /// Revoked mappings, closed once the copies queued before the revocation (up to this copy
    /// number) have landed.
    closing: Vec<(u64, Box<dyn ImportedMemory>)>,
    offers: Vec<Offer>,
}

impl Imports {
    /// Acts on a frame from the peer; `copies`: the copies this side has queued so far.
    pub(crate) fn apply(
        &mut self,
        c: Control,
        access: &dyn DeviceAccess,
        same_process: bool,
        copies: u64,
        stats: &IpcStats,
    ) {
        match c {
            Control::Register { id, base, len, handle } => {
                self.revoke(id, copies);
                let import = if same_process {
                    Some(Import { id, base, len, mapping: None })
                } else {
                    // A handle this side cannot open leaves the offers into it unused: those
                    // messages go through the window.
                    access.open(&handle).ok().map(|m| {
                        stats.add(Counter::Opened);
                        Import { id, base: m.addr(), len, mapping: Some(m) }
                    })
                };
                self.open.extend(import);
            }
            Control::Revoke { id } => self.revoke(id, copies),
            Control::Offer(o) => self.offers.push(o),
        }
    }

    fn revoke(&mut self, id: u64, copies: u64) {
        self.offers.retain(|o| o.id != id);
        if let Some(i) = self.open.iter().position(|m| m.id == id) {
            if let Some(m) = self.open.swap_remove(i).mapping {
                self.closing.push((copies, m));
            }
        }
    }

    /// Where message `message` of `tag`, `len` bytes, goes if the peer offered a destination
    /// for it (older offers of the tag are dropped: their messages went the window's way).
    pub(crate) fn take(&mut self, tag: u32, message: u32, len: usize, peer: &str) -> Result<Option<u64>> {
        self.offers.retain(|o| o.tag != tag || (o.message.wrapping_sub(message) as i32) >= 0);
        let Some(i) = self.offers.iter().position(|o| o.tag == tag && o.message == message) else { return Ok(None) };
        let o = self.offers.swap_remove(i);
        if o.len != len as u64 {
            return Ok(None);
        }
        let Some(m) = self.open.iter().find(|m| m.id == o.id) else { return Ok(None) };
        match o.offset.checked_add(o.len) {
            Some(end) if end <= m.len => Ok(Some(m.base + o.offset)),
            _ => Err(Error::Protocol(format!(
                "{peer} offered bytes {}..+{} of a {}-byte registration",
                o.offset, o.len, m.len
            ))),
        }
    }

    /// Closes the revoked mappings whose copies have landed (`landed(n)`: copy `n` has).
    ///
    /// Not on this thread: unmapping may wait for the whole device (CUDA synchronises there),
    /// and the device may be waiting for this thread (a user's stream held until the call that
    /// the progress thread runs completes).
    pub(crate) fn reap(&mut self, landed: impl Fn(u64) -> bool, stats: &IpcStats) {
        if self.closing.is_empty() {
            return;
        }
        let (done, waiting): (Vec<_>, Vec<_>) = self.closing.drain(..).partition(|(n, _)| landed(*n));
        self.closing = waiting;
        for (_, m) in done {
            stats.add(Counter::Closed);
            // Should no thread start, the mapping is closed here after all.
            let _ = std::thread::Builder::new().name("topoccl-ipc-close".into()).spawn(move || drop(m));
        }
    }

    /// Closes everything (the connection's copies have all finished).
    pub(crate) fn clear(&mut self, stats: &IpcStats) {
        for _ in self.closing.drain(..).map(|(_, m)| m).chain(self.open.drain(..).filter_map(|m| m.mapping)) {
            stats.add(Counter::Closed);
        }
        self.offers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let frames = [
            Control::Register { id: 3, base: 1 << 40, len: 1 << 20, handle: [7; IPC_HANDLE_BYTES] },
            Control::Revoke { id: 3 },
            Control::Offer(Offer { tag: 5, message: u32::MAX, id: 4, offset: 4096, len: 65536 }),
        ];
        for f in frames {
            let (m, b) = f.encode();
            assert_eq!(Control::decode(&m, &b, "rank 1").unwrap(), f);
            assert!(Control::decode(&m, &b[1..], "rank 1").is_err(), "short frame");
        }
        let (mut m, b) = Control::Revoke { id: 1 }.encode();
        m[0] = 9;
        assert!(Control::decode(&m, &b, "rank 1").is_err());
        let (m, b) = Control::Offer(Offer { tag: 1 << 29, message: 0, id: 1, offset: 0, len: 1 }).encode();
        assert!(Control::decode(&m, &b, "rank 1").is_err(), "a reserved tag");
    }

    fn reg(id: u64, base: u64, len: u64, buffer_id: u64) -> Registration {
        Registration {
            id,
            allocation: Allocation { base, len, buffer_id },
            key: RegistrationKey::CudaIpc([id as u8; IPC_HANDLE_BYTES]),
        }
    }

    #[test]
    fn announcing_revokes_what_a_new_registration_replaces() {
        let mut a = Announced::default();
        let mut out = Vec::new();
        a.announce(&reg(1, 4096, 8192, 1), &mut out);
        assert!(matches!(out[..], [Control::Register { id: 1, .. }]));
        out.clear();
        a.announce(&reg(1, 4096, 8192, 1), &mut out);
        assert!(out.is_empty(), "announced once");
        a.announce(&reg(2, 4096, 8192, 2), &mut out);
        assert!(matches!(out[..], [Control::Revoke { id: 1 }, Control::Register { id: 2, .. }]), "{out:?}");
    }

    #[test]
    fn at_most_so_many_registrations_stay_announced() {
        let mut a = Announced::default();
        let mut out = Vec::new();
        for i in 0..MAX_ANNOUNCED as u64 + 3 {
            a.announce(&reg(i + 1, (i + 1) << 20, 4096, i), &mut out);
        }
        let revoked: Vec<u64> =
            out.iter().filter_map(|c| if let Control::Revoke { id } = c { Some(*id) } else { None }).collect();
        assert_eq!(revoked, [1, 2, 3]);
    }

    #[test]
    fn offers_are_bounds_checked_and_stale_ones_dropped() {
        let host = super::super::device::host::HostDevice::new(super::super::DeviceId {
            uuid: [1; 16],
            pci_bus: 0,
            ordinal: 0,
        });
        let stats = IpcStats::default();
        let mut im = Imports::default();
        im.apply(Control::Register { id: 1, base: 1 << 20, len: 8192, handle: [0; 64] }, &host, true, 0, &stats);
        let offer = |message, offset, len| Control::Offer(Offer { tag: 2, message, id: 1, offset, len });
        im.apply(offer(0, 0, 4096), &host, true, 0, &stats);
        im.apply(offer(1, 4096, 4096), &host, true, 0, &stats);
        // Message 0 went through the window: its offer is dropped when message 1 is sent.
        assert_eq!(im.take(2, 1, 4096, "p").unwrap(), Some((1 << 20) + 4096));
        assert_eq!(im.take(2, 0, 4096, "p").unwrap(), None);
        im.apply(offer(2, 8000, 4096), &host, true, 0, &stats);
        assert!(im.take(2, 2, 4096, "p").is_err(), "past the registration's end");
        // A revoked registration's offers go with it.
        im.apply(offer(3, 0, 4096), &host, true, 0, &stats);
        im.apply(Control::Revoke { id: 1 }, &host, true, 0, &stats);
        assert_eq!(im.take(2, 3, 4096, "p").unwrap(), None);
    }
}

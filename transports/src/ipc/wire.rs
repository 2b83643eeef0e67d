//! What the two sides of a CUDA IPC pair share besides the ring: the signal page (per
//! direction, the words copies and releases are counted in, and the flags offers are revoked
//! with) and the descriptor each device message's frame carries.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::device::RegisteredHost;
use super::resident::Kept;
use crate::error::{Error, Result};
use crate::shm::segment::Segment;

/// Window offsets and lengths are rounded to this (any datatype's alignment, and a device's
/// preferred copy alignment).
pub(crate) const WINDOW_ALIGN: usize = 256;
/// Bytes of a device message's descriptor (its payload in the ring).
pub(crate) const DESCRIPTOR_BYTES: usize = 40;
/// Where each direction's words lie in the shared page: `landed` (u32) at the start,
/// `released` (u64) a cache line later, then the revocation flags: `writing` (u32, the sender
/// is queueing a copy into an offer), `revoked` (u32, the receiver takes its offers back) and
/// `direct` (u64, the number of the last copy queued into an offer).
pub(crate) const DIRECTION_BYTES: usize = 128;
pub(crate) const RELEASED_AT: usize = 64;
pub(crate) const WRITING_AT: usize = 72;
pub(crate) const REVOKED_AT: usize = 76;
pub(crate) const DIRECT_AT: usize = 80;

/// The shared page of a pair: two directions of signal words.
pub(crate) struct Signals {
    pub(crate) page: Arc<Segment>,
    /// The page as the device sees it (this side's registration, shared with the pair's
    /// resident side), and its first byte's device address.
    pub(crate) _registered: Arc<Kept<dyn RegisteredHost>>,
    pub(crate) device_base: u64,
    /// The direction this side sends in (0 or 1); the other is the one it receives in.
    pub(crate) tx: usize,
}

impl Signals {
    pub(crate) fn word(&self, direction: usize, at: usize) -> *const u8 {
        // SAFETY: the page holds two directions of DIRECTION_BYTES (checked at set-up), and
        // `at` is inside one.
        unsafe { self.page.base().as_ptr().add(direction * DIRECTION_BYTES + at) }
    }

    pub(crate) fn landed(&self, direction: usize) -> u32 {
        // SAFETY: an aligned word of the live shared page; only atomics touch it.
        unsafe { &*self.word(direction, 0).cast::<AtomicU32>() }.load(Ordering::Acquire)
    }

    pub(crate) fn released(&self, direction: usize) -> &AtomicU64 {
        // SAFETY: an aligned word of the live shared page; only atomics touch it.
        unsafe { &*self.word(direction, RELEASED_AT).cast::<AtomicU64>() }
    }

    pub(crate) fn flag(&self, direction: usize, at: usize) -> &AtomicU32 {
        // SAFETY: an aligned word of the live shared page; only atomics touch it.
        unsafe { &*self.word(direction, at).cast::<AtomicU32>() }
    }

    pub(crate) fn direct(&self, direction: usize) -> &AtomicU64 {
        // SAFETY: an aligned word of the live shared page; only atomics touch it.
        unsafe { &*self.word(direction, DIRECT_AT).cast::<AtomicU64>() }
    }

    /// The device address of this side's `landed` word.
    pub(crate) fn landed_device_addr(&self) -> u64 {
        self.device_base + (self.tx * DIRECTION_BYTES) as u64
    }
}

/// Whether counter `now` has reached `seq` (both wrap).
pub(crate) fn reached(now: u32, seq: u64) -> bool {
    (now.wrapping_sub(seq as u32) as i32) >= 0
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Descriptor {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// Window bytes it used, the padding before it included (none when `direct`).
    pub(crate) consumed: u64,
    pub(crate) seq: u64,
    /// Copied into the destination the receiver offered, not the window.
    pub(crate) direct: bool,
}

impl Descriptor {
    pub(crate) fn encode(&self) -> [u8; DESCRIPTOR_BYTES] {
        let mut b = [0u8; DESCRIPTOR_BYTES];
        let fields = [self.offset, self.len, self.consumed, self.seq, u64::from(self.direct)];
        for (i, v) in fields.into_iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// The descriptor in `b`, checked against a window of `cap` bytes.
    pub(crate) fn decode(b: &[u8], cap: usize, peer: &str) -> Result<Descriptor> {
        let bad = |why: &str| Error::Protocol(format!("{peer} sent a bad device-message descriptor: {why}"));
        if b.len() != DESCRIPTOR_BYTES {
            return Err(bad("wrong length"));
        }
        let q = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let direct = match q(4) {
            0 => false,
            1 => true,
            _ => return Err(bad("unknown kind")),
        };
        let d = Descriptor { offset: q(0), len: q(1), consumed: q(2), seq: q(3), direct };
        let cap = cap as u64;
        if direct {
            return if d.offset == 0 && d.consumed == 0 && d.len <= cap {
                Ok(d)
            } else {
                Err(bad("impossible direct copy"))
            };
        }
        if d.offset % WINDOW_ALIGN as u64 != 0 || d.offset.checked_add(d.len).map_or(true, |end| end > cap) {
            return Err(bad("outside the window"));
        }
        if d.consumed < d.len || d.consumed > cap {
            return Err(bad("impossible window use"));
        }
        Ok(d)
    }
}

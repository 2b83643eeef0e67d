//! The NIC's DMA: reading source bytes from, and placing arriving bytes into, this process's
//! memory, while the process's own threads may be touching it.
//!
//! Placement goes in **64-byte units** (aligned on the destination address; the first and last
//! may be partial) **in a random order**, and every 8-byte-aligned word inside a unit is
//! written with one aligned 8-byte store, so it lands whole, as PCIe writes land on a host.
//! Bytes outside whole aligned words (an unaligned head or tail) are stored one by one.
//!
//! Before touching a range the NIC checks that it is still mapped (`mincore`), so memory that
//! was unmapped under a live MR gives an error completion here instead of a crash (on hardware
//! the pinned pages would still be written, unseen).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::RwLock;

use crate::util::{self, Rng};

/// A test hook: called with the address and length of every unit as it is placed, in
/// placement order (tests observe the shuffle with it deterministically).
pub type PlaceHook = fn(u64, usize);

static PLACE_HOOK: RwLock<Option<PlaceHook>> = RwLock::new(None);

/// Installs (or removes) the placement hook of this process.
#[doc(hidden)]
pub fn set_place_hook(hook: Option<PlaceHook>) {
    *util::write(&PLACE_HOOK) = hook;
}

/// Placement unit, bytes.
pub const UNIT: u64 = 64;

/// Whether every page of `[addr, addr + len)` is mapped.
pub fn mapped(addr: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let page = 4096u64;
    let Some(end) = addr.checked_add(len) else { return false };
    let start = addr & !(page - 1);
    let pages = (end - start).div_ceil(page) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only inspects the address range (it never dereferences it) and writes
    // one byte per page into `vec`, which has exactly that many.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, (end - start) as usize, vec.as_mut_ptr()) };
    rc == 0
}

/// Whether `[addr, addr + len)` is mapped readable (and writable when `writable`), as
/// pinning it for an MR needs (read from `/proc/self/maps`).
pub fn mapped_with(addr: u64, len: u64, writable: bool) -> bool {
    let Some(end) = addr.checked_add(len) else { return false };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return mapped(addr, len) };
    let mut cur = addr;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        let Some((s, e)) = range.split_once('-') else { continue };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else { continue };
        if e <= cur {
            continue;
        }
        if s > cur {
            return false;
        }
        let p = perms.as_bytes();
        if p.first() != Some(&b'r') || (writable && p.get(1) != Some(&b'w')) {
            return false;
        }
        cur = e;
        if cur >= end {
            return true;
        }
    }
    false
}

/// Appends `len` bytes read at `addr` to `out`: whole aligned words with one 8-byte load each,
/// the rest bytewise. False if the range is not mapped.
pub fn read_into(addr: u64, len: u64, out: &mut Vec<u8>) -> bool {
    if !mapped(addr, len) {
        return false;
    }
    out.reserve(len as usize);
    let end = addr + len;
    let mut a = addr;
    while a < end {
        if a % 8 == 0 && a + 8 <= end {
            // SAFETY: `a` is 8-byte aligned, inside the range just checked to be mapped, which
            // the caller keeps registered (it holds the MR's live lock); an atomic load
            // tolerates the process's own threads writing there concurrently, as DMA does.
            let v = unsafe { AtomicU64::from_ptr(a as *mut u64) }.load(Ordering::Relaxed);
            out.extend_from_slice(&v.to_ne_bytes());
            a += 8;
        } else {
            // SAFETY: as above, for one byte.
            out.push(unsafe { AtomicU8::from_ptr(a as *mut u8) }.load(Ordering::Relaxed));
            a += 1;
        }
    }
    true
}

/// A piece of a placement: `len` bytes of the payload from `src` go to address `dst`.
#[derive(Clone, Copy, Debug)]
struct Unit {
    dst: u64,
    src: usize,
    len: usize,
}

/// Places `data` into the destination segments `(addr, len)` (filled in order, their total at
/// least `data.len()`), in 64-byte units in a random order. False if a segment is unmapped
/// (nothing is written then).
pub fn place(segments: &[(u64, u64)], data: &[u8], rng: &mut Rng) -> bool {
    let mut units = Vec::with_capacity(data.len() / UNIT as usize + 2 * segments.len());
    let mut src = 0usize;
    for &(addr, len) in segments {
        let take = (len as usize).min(data.len() - src);
        if !mapped(addr, take as u64) {
            return false;
        }
        let end = addr + take as u64;
        let mut a = addr;
        while a < end {
            let next = ((a / UNIT) + 1) * UNIT;
            let n = (next.min(end) - a) as usize;
            units.push(Unit { dst: a, src, len: n });
            src += n;
            a += n as u64;
        }
        if src == data.len() {
            break;
        }
    }
    rng.shuffle(&mut units);
    let hook = *util::read(&PLACE_HOOK);
    for u in &units {
        store(u.dst, &data[u.src..u.src + u.len]);
        if let Some(h) = hook {
            h(u.dst, u.len);
        }
    }
    std::sync::atomic::fence(Ordering::Release);
    true
}

/// Stores `bytes` at `dst`: whole aligned words with one 8-byte store each, the rest bytewise.
fn store(dst: u64, bytes: &[u8]) {
    let end = dst + bytes.len() as u64;
    let mut a = dst;
    while a < end {
        let i = (a - dst) as usize;
        if a % 8 == 0 && a + 8 <= end {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            // SAFETY: `a` is 8-byte aligned and inside a destination range the caller checked
            // to be mapped and keeps registered (it holds the MR's live lock). The process's
            // threads may read it concurrently: they see the old word or the new one, as with
            // a DMA write.
            unsafe { AtomicU64::from_ptr(a as *mut u64) }.store(u64::from_ne_bytes(w), Ordering::Relaxed);
            a += 8;
        } else {
            // SAFETY: as above, for one byte.
            unsafe { AtomicU8::from_ptr(a as *mut u8) }.store(bytes[i], Ordering::Relaxed);
            a += 1;
        }
    }
}

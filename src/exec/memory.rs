//! The buffers a collective reads and writes, held as raw address ranges.
//!
//! A call's buffers may alias (in place, the input is the output; through the C ABI anything
//! goes), so the executor cannot hold Rust references to all of them at once. It holds
//! [`Region`]s and borrows a slice only for the duration of one step, through [`Memory`], which
//! checks bounds and hands out aliasing-safe views: when a step reads one range and writes
//! another, the ranges are compared by address, and a step whose source is its destination gets
//! one mutable slice instead of two overlapping ones.

use std::marker::PhantomData;

use crate::error::{Error, Result};

/// Which buffer a span lies in: `INPUT`, `OUTPUT`, `SCRATCH`, then any extra buffers (grouped
/// point-to-point calls).
pub(crate) type MemId = u16;
pub(crate) const INPUT: MemId = 0;
pub(crate) const OUTPUT: MemId = 1;
pub(crate) const SCRATCH: MemId = 2;

/// A byte range of one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub mem: MemId,
    pub off: usize,
    pub len: usize,
}

impl Span {
    pub(crate) fn new(mem: MemId, off: usize, len: usize) -> Span {
        Span { mem, off, len }
    }
    /// The sub-range `[at, at + len)` of this span.
    pub(crate) fn slice(self, at: usize, len: usize) -> Span {
        Span { mem: self.mem, off: self.off + at, len }
    }
}

#[derive(Debug, Clone, Copy)]
struct Region {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

/// Regions held inline (input, output, scratch); extra buffers of grouped calls go to the heap.
const INLINE_REGIONS: usize = 3;

const NO_REGION: Region = Region { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0, writable: false };

/// The regions of one call, valid for `'a`.
pub(crate) struct Memory<'a> {
    inline: [Region; INLINE_REGIONS],
    extra: Vec<Region>,
    _borrow: PhantomData<&'a mut [u8]>,
}

/// A read range and a write range, as one step sees them.
pub(crate) enum Pair<'m> {
    /// Source and destination are the same bytes.
    Same(&'m mut [u8]),
    Distinct(&'m [u8], &'m mut [u8]),
}

impl<'a> Memory<'a> {
    pub(crate) fn new() -> Memory<'a> {
        Memory { inline: [NO_REGION; INLINE_REGIONS], extra: Vec::new(), _borrow: PhantomData }
    }

    fn set(&mut self, id: MemId, r: Region) {
        let i = usize::from(id);
        if let Some(slot) = self.inline.get_mut(i) {
            *slot = r;
            return;
        }
        let i = i - INLINE_REGIONS;
        if self.extra.len() <= i {
            self.extra.resize(i + 1, NO_REGION);
        }
        self.extra[i] = r;
    }

    fn get(&self, id: MemId) -> Option<Region> {
        let i = usize::from(id);
        match self.inline.get(i) {
            Some(r) => Some(*r),
            None => self.extra.get(i - INLINE_REGIONS).copied(),
        }
    }

    /// Registers a read-only buffer.
    pub(crate) fn readable(&mut self, id: MemId, buf: &'a [u8]) {
        self.set(id, Region { ptr: buf.as_ptr().cast_mut(), len: buf.len(), writable: false });
    }

    /// Registers a writable buffer. The same buffer may be registered under several ids (an
    /// in-place call registers it as input and output) by passing its raw form.
    pub(crate) fn writable(&mut self, id: MemId, buf: &'a mut [u8]) {
        self.set(id, Region { ptr: buf.as_mut_ptr(), len: buf.len(), writable: true });
    }

    /// Registers raw memory.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be valid for reads (and for writes when `writable`) for `'a`,
    /// and not be accessed through anything but this `Memory` meanwhile, except by other
    /// regions of this same `Memory`.
    pub(crate) unsafe fn raw(&mut self, id: MemId, ptr: *mut u8, len: usize, writable: bool) {
        let ptr = if len == 0 { std::ptr::NonNull::dangling().as_ptr() } else { ptr };
        self.set(id, Region { ptr, len, writable });
    }

    fn region(&self, s: Span, write: bool) -> Result<Region> {
        let r = self.get(s.mem).ok_or_else(|| bad(s, "no such buffer"))?;
        if s.off.checked_add(s.len).map_or(true, |end| end > r.len) {
            return Err(bad(s, &format!("out of bounds of a {}-byte buffer", r.len)));
        }
        if write && !r.writable {
            return Err(bad(s, "the buffer is read-only"));
        }
        Ok(r)
    }

    fn addr(&self, s: Span, write: bool) -> Result<*mut u8> {
        let r = self.region(s, write)?;
        // SAFETY: `off + len <= r.len` was checked, so the result stays inside the region.
        Ok(unsafe { r.ptr.add(s.off) })
    }

    pub(crate) fn read(&self, s: Span) -> Result<&[u8]> {
        let p = self.addr(s, false)?;
        // SAFETY: in bounds and valid for `'a` (the constructor's contract); no mutable view
        // exists now because every mutable view borrows `self` mutably.
        Ok(unsafe { std::slice::from_raw_parts(p, s.len) })
    }

    pub(crate) fn write(&mut self, s: Span) -> Result<&mut [u8]> {
        let p = self.addr(s, true)?;
        // SAFETY: in bounds, writable, and exclusive: `&mut self` rules out any other view.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, s.len) })
    }

    /// Views for a step reading `src` and writing `dst` (equal lengths). Partially
    /// overlapping ranges, which no verified schedule produces, are an error.
    pub(crate) fn pair(&mut self, src: Span, dst: Span) -> Result<Pair<'_>> {
        let s = self.addr(src, false)?;
        let d = self.addr(dst, true)?;
        if s == d && src.len == dst.len {
            // SAFETY: as in `write`; the one slice stands for both ranges.
            return Ok(Pair::Same(unsafe { std::slice::from_raw_parts_mut(d, dst.len) }));
        }
        let (s0, d0) = (s as usize, d as usize);
        if s0 < d0 + dst.len && d0 < s0 + src.len {
            return Err(Error::Internal(format!("step reads {src:?} and writes {dst:?}, which partly overlap")));
        }
        // SAFETY: both in bounds and disjoint (checked above), so a shared and a mutable view
        // can coexist; `&mut self` rules out any other view.
        unsafe {
            Ok(Pair::Distinct(std::slice::from_raw_parts(s, src.len), std::slice::from_raw_parts_mut(d, dst.len)))
        }
    }
}

fn bad(s: Span, why: &str) -> Error {
    Error::Internal(format!("schedule step touches bytes {}..{} of buffer {}: {why}", s.off, s.off + s.len, s.mem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliasing_is_recognised_and_bounds_are_checked() {
        let mut buf = vec![0u8; 16];
        let p = buf.as_mut_ptr();
        let mut m = Memory::new();
        // SAFETY: `buf` outlives `m` and is only used through it.
        unsafe {
            m.raw(INPUT, p, 16, false);
            m.raw(OUTPUT, p, 16, true);
        }
        assert!(matches!(m.pair(Span::new(INPUT, 4, 4), Span::new(OUTPUT, 4, 4)).unwrap(), Pair::Same(_)));
        assert!(matches!(m.pair(Span::new(INPUT, 0, 4), Span::new(OUTPUT, 8, 4)).unwrap(), Pair::Distinct(..)));
        assert!(m.pair(Span::new(INPUT, 0, 8), Span::new(OUTPUT, 4, 8)).is_err());
        assert!(m.write(Span::new(INPUT, 0, 1)).is_err());
        assert!(m.read(Span::new(OUTPUT, 10, 7)).is_err());
        assert!(m.read(Span::new(SCRATCH, 0, 1)).is_err());
        m.write(Span::new(OUTPUT, 15, 1)).unwrap()[0] = 9;
        assert_eq!(m.read(Span::new(INPUT, 15, 1)).unwrap(), [9]);
    }
}

//! The buffers one run reads and writes, as [`Region`]s named by a [`MemId`].
//!
//! A call's buffers may alias (in place, the input is the output; through the C ABI anything
//! goes) and may lie in device memory, so the executor never holds them as Rust slices: it
//! turns a schedule's spans into regions here, bounds-checked, and hands them to the local
//! operations and the connections, which are the only code that touches the bytes.

use topoccl_transports::Region;

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
struct Entry {
    region: Region,
    writable: bool,
    /// Where the buffer's blocks lie in `region`, when not end to end.
    blocks: Option<Blocks>,
}

/// A buffer seen as `count` blocks of `len` bytes, the first at byte `first` of its region
/// and each next one `stride` bytes further: one element range of every block of a call's
/// buffer (a piece of a call too large to run whole, `crate::comm::resident`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocks {
    pub first: usize,
    pub len: usize,
    pub stride: usize,
    pub count: usize,
}

/// Buffers held inline (input, output, scratch); extra buffers of grouped calls go to the heap.
const INLINE_BUFFERS: usize = 3;

const NONE: Entry = Entry { region: Region::EMPTY, writable: false, blocks: None };

/// The buffers of one run.
///
/// Building one is safe (a region is an address); the promise that the regions are valid
/// memory is made by whoever hands them to the executor, through the `unsafe` entry points
/// that accept caller memory.
#[derive(Debug, Clone)]
pub(crate) struct Memory {
    inline: [Entry; INLINE_BUFFERS],
    extra: Vec<Entry>,
}

impl Memory {
    pub(crate) fn new() -> Memory {
        Memory { inline: [NONE; INLINE_BUFFERS], extra: Vec::new() }
    }

    fn set(&mut self, id: MemId, e: Entry) {
        let i = usize::from(id);
        if let Some(slot) = self.inline.get_mut(i) {
            *slot = e;
            return;
        }
        let i = i - INLINE_BUFFERS;
        if self.extra.len() <= i {
            self.extra.resize(i + 1, NONE);
        }
        self.extra[i] = e;
    }

    #[inline]
    fn get(&self, id: MemId) -> Option<Entry> {
        let i = usize::from(id);
        match self.inline.get(i) {
            Some(e) => Some(*e),
            None => self.extra.get(i - INLINE_BUFFERS).copied(),
        }
    }

    /// Registers a buffer that steps only read.
    pub(crate) fn readable(&mut self, id: MemId, region: Region) {
        self.set(id, Entry { region, writable: false, blocks: None });
    }

    /// Registers a buffer that steps may write. The same bytes may be registered under several
    /// ids (an in-place call registers one buffer as input and output).
    pub(crate) fn writable(&mut self, id: MemId, region: Region) {
        self.set(id, Entry { region, writable: true, blocks: None });
    }

    /// Registers `blocks` of `region` as one buffer, the blocks end to end (read-only unless
    /// `writable`). Its spans are read with [`Memory::segment`].
    pub(crate) fn blocks(&mut self, id: MemId, region: Region, blocks: Blocks, writable: bool) {
        self.set(id, Entry { region, writable, blocks: Some(blocks) });
    }

    /// The region of `s`, checked against its buffer's bounds (and writability, to write).
    /// A span of a buffer registered as blocks must lie in one block.
    #[inline]
    pub(crate) fn span(&self, s: Span, write: bool) -> Result<Region> {
        let r = self.segment(s, 0, write)?;
        if r.len == s.len {
            Ok(r)
        } else {
            Err(bad(s, "it crosses a block of a piece"))
        }
    }

    /// The longest run of bytes of `s`, from its byte `at` on, that lies end to end in memory
    /// (all the rest of `s` unless its buffer is registered as blocks), checked as `span`.
    #[inline]
    pub(crate) fn segment(&self, s: Span, at: usize, write: bool) -> Result<Region> {
        let e = match self.get(s.mem) {
            Some(e) if !write || e.writable => e,
            Some(_) => return Err(bad(s, "the buffer is read-only")),
            None => return Err(bad(s, "no such buffer")),
        };
        let rest = s.len.saturating_sub(at);
        let (off, len) = match e.blocks {
            None => (s.off + at, rest),
            Some(b) => {
                let o = s.off + at;
                let (block, within) = (o / b.len.max(1), o % b.len.max(1));
                if s.off + s.len > b.len * b.count {
                    return Err(bad(s, &format!("out of bounds of {} blocks of {} bytes", b.count, b.len)));
                }
                (b.first + block * b.stride + within, rest.min(b.len - within))
            }
        };
        match e.region.sub(off, len) {
            Some(r) => Ok(r),
            None => Err(bad(s, &format!("out of bounds of a {}-byte buffer", e.region.len))),
        }
    }
}

#[cold]
#[inline(never)]
fn bad(s: Span, why: &str) -> Error {
    Error::Internal(format!("schedule step touches bytes {}..{} of buffer {}: {why}", s.off, s.off + s.len, s.mem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_bounds_and_write_checked() {
        let mut m = Memory::new();
        m.readable(INPUT, Region::host(1000, 16));
        m.writable(OUTPUT, Region::host(1000, 16));
        m.writable(7, Region::host(5000, 4));
        assert_eq!(m.span(Span::new(INPUT, 4, 4), false).unwrap(), Region::host(1004, 4));
        assert!(m.span(Span::new(INPUT, 0, 1), true).is_err());
        assert!(m.span(Span::new(OUTPUT, 10, 7), false).is_err());
        assert!(m.span(Span::new(SCRATCH, 0, 1), false).is_err());
        assert_eq!(m.span(Span::new(7, 0, 4), true).unwrap(), Region::host(5000, 4));
        assert!(m.span(Span::new(6, 0, 1), false).is_err());
    }

    #[test]
    fn a_buffer_of_blocks_is_read_block_by_block() {
        let mut m = Memory::new();
        // Bytes 4..8 of each of three 10-byte blocks of a 30-byte buffer.
        let b = Blocks { first: 4, len: 4, stride: 10, count: 3 };
        m.blocks(OUTPUT, Region::host(1000, 30), b, true);
        assert_eq!(m.span(Span::new(OUTPUT, 5, 3), true).unwrap(), Region::host(1015, 3));
        assert!(m.span(Span::new(OUTPUT, 2, 4), true).is_err(), "crosses blocks 0 and 1");
        let s = Span::new(OUTPUT, 2, 8);
        assert_eq!(m.segment(s, 0, true).unwrap(), Region::host(1006, 2));
        assert_eq!(m.segment(s, 2, true).unwrap(), Region::host(1014, 4));
        assert_eq!(m.segment(s, 6, true).unwrap(), Region::host(1024, 2));
        assert!(m.segment(Span::new(OUTPUT, 10, 3), 0, false).is_err(), "past the third block");
        m.blocks(INPUT, Region::host(1000, 30), b, false);
        assert!(m.segment(Span::new(INPUT, 0, 1), 0, true).is_err(), "read-only");
        // Blocks past the region's end are refused too.
        m.blocks(SCRATCH, Region::host(1000, 20), b, true);
        assert!(m.segment(Span::new(SCRATCH, 8, 4), 0, false).is_err());
    }
}

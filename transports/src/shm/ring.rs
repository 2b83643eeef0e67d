//! A single-producer single-consumer byte ring in shared memory.
//!
//! Layout: a header of two 128-byte lines (the producer's `head` and the consumer's `tail`, apart
//! so the two processes do not bounce one cache line), a `closed` flag and the direct-write
//! flags of this direction (`writing`, raised by the producer, and `revoked`, by the consumer;
//! see `direct`), then `capacity` bytes of data. `head` and `tail` count bytes ever written and read; the data region holds
//! `head - tail` bytes. The producer publishes with a release store of `head` after copying;
//! the consumer acquires `head` before copying out and releases `tail` after.

use std::io::IoSlice;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::segment::Segment;
use crate::framing::Peeked;

/// Bytes of the ring header.
pub(crate) const RING_HEADER_BYTES: usize = 256;
const HEAD_OFFSET: usize = 0;
const TAIL_OFFSET: usize = 128;
const CLOSED_OFFSET: usize = 192;
const WRITING_OFFSET: usize = 196;
const REVOKED_OFFSET: usize = 200;

/// One direction of a shared-memory connection.
pub(crate) struct Ring {
    /// Keeps the mapping alive.
    _segment: Arc<Segment>,
    header: NonNull<u8>,
    data: NonNull<u8>,
    capacity: usize,
    /// The other side's position as last read: the producer's view of `tail`, the consumer's
    /// of `head`. Reading the other side's cache line costs a miss whenever it moved, so each
    /// side reads it only when what it last saw is not enough.
    seen: u64,
}

// SAFETY: the ring points into a shared mapping kept alive by `_segment`; each side of a ring
// is used by one thread at a time (it sits behind `&mut` in the connection), and cross-process
// access is ordered by the atomics.
unsafe impl Send for Ring {}

impl Ring {
    /// The ring at `offset` of `segment`, with `capacity` data bytes.
    pub(crate) fn new(segment: Arc<Segment>, offset: usize, capacity: usize) -> Option<Ring> {
        if offset % 128 != 0 || offset + RING_HEADER_BYTES + capacity > segment.len() {
            return None;
        }
        // SAFETY: in bounds of the mapping (checked above); the mapping is page-aligned, so
        // `offset` keeps 128-byte alignment for the atomics.
        let header = unsafe { NonNull::new_unchecked(segment.base().as_ptr().add(offset)) };
        // SAFETY: as above.
        let data = unsafe { NonNull::new_unchecked(header.as_ptr().add(RING_HEADER_BYTES)) };
        // Positions start at 0 and only grow: a stale `seen` underestimates, never overstates.
        Some(Ring { _segment: segment, header, data, capacity, seen: 0 })
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offsets 0 and 128 of the header are 8-aligned, in the mapping, and only ever
        // accessed atomically by both processes.
        unsafe { &*(self.header.as_ptr().add(offset) as *const AtomicU64) }
    }

    fn flag(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: offsets 192, 196 and 200 of the header are 4-aligned, in the mapping, and only
        // ever accessed atomically by both processes.
        unsafe { &*(self.header.as_ptr().add(offset) as *const AtomicU32) }
    }

    fn closed_flag(&self) -> &AtomicU32 {
        self.flag(CLOSED_OFFSET)
    }

    /// This direction's direct-write flags.
    pub(crate) fn direct_flags(&self) -> super::direct::Flags<'_> {
        super::direct::Flags { writing: self.flag(WRITING_OFFSET), revoked: self.flag(REVOKED_OFFSET) }
    }

    pub(crate) fn close(&self) {
        self.closed_flag().store(1, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed_flag().load(Ordering::Acquire) != 0
    }

    /// Producer: copies as much of `bufs` as fits; returns the bytes taken.
    pub(crate) fn write(&mut self, bufs: &[IoSlice<'_>]) -> usize {
        let head = self.word(HEAD_OFFSET).load(Ordering::Relaxed);
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        if self.capacity - ((head - self.seen) as usize) < want {
            // Only now read the consumer's line (a cache miss when it has moved).
            self.seen = self.word(TAIL_OFFSET).load(Ordering::Acquire);
        }
        let mut free = self.capacity - (head - self.seen) as usize;
        let mut pos = head;
        for b in bufs {
            if free == 0 {
                break;
            }
            let n = b.len().min(free);
            self.copy_in(pos, &b[..n]);
            pos += n as u64;
            free -= n;
            if n < b.len() {
                break;
            }
        }
        if pos != head {
            self.word(HEAD_OFFSET).store(pos, Ordering::Release);
        }
        (pos - head) as usize
    }

    /// Consumer: bytes known to be readable, reading the producer's line only when fewer than
    /// `want` are known.
    fn readable(&mut self, tail: u64, want: usize) -> usize {
        if ((self.seen - tail) as usize) < want {
            self.seen = self.word(HEAD_OFFSET).load(Ordering::Acquire);
        }
        (self.seen - tail) as usize
    }

    /// Consumer: copies out up to `buf.len()` available bytes.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> usize {
        let tail = self.word(TAIL_OFFSET).load(Ordering::Relaxed);
        let n = self.readable(tail, 1).min(buf.len());
        if n == 0 {
            return 0;
        }
        self.copy_out(tail, &mut buf[..n]);
        self.word(TAIL_OFFSET).store(tail + n as u64, Ordering::Release);
        n
    }

    /// Consumer: the received bytes at the read position that lie contiguously in the data
    /// region (up to its end), without copying them; with how many bytes the ring holds in all
    /// and how many lie between the read position and the end of the data region. The
    /// producer's position is re-read when fewer than `want` bytes are known to be there
    /// (`usize::MAX`: always).
    pub(crate) fn peek(&mut self, want: usize) -> Peeked<'_> {
        let tail = self.word(TAIL_OFFSET).load(Ordering::Relaxed);
        let buffered = self.readable(tail, want);
        let start = (tail % self.capacity as u64) as usize;
        let until_end = self.capacity - start;
        let n = buffered.min(until_end);
        // SAFETY: [start, start + n) lies in the data region below the acquired `head`: the
        // producer has finished writing it and will not touch it until `tail` moves past it,
        // which only `consume` (through `&mut self`, so not while this borrow lives) does.
        let bytes = unsafe { std::slice::from_raw_parts(self.data.as_ptr().add(start), n) };
        Peeked { bytes, buffered, until_end, capacity: self.capacity }
    }

    /// Consumer: releases `n` bytes at the read position (at most what [`Ring::peek`] showed).
    pub(crate) fn consume(&mut self, n: usize) {
        let tail = self.word(TAIL_OFFSET).load(Ordering::Relaxed);
        self.word(TAIL_OFFSET).store(tail + n as u64, Ordering::Release);
    }

    fn copy_in(&self, pos: u64, src: &[u8]) {
        let start = (pos % self.capacity as u64) as usize;
        let first = src.len().min(self.capacity - start);
        // SAFETY: [start, start+first) and [0, len-first) lie in the data region; the producer
        // owns the free part of the ring (the consumer reads only below `head`), so no one
        // reads these bytes concurrently; `src` is private memory, not overlapping.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.as_ptr().add(start), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data.as_ptr(), src.len() - first);
        }
    }

    fn copy_out(&self, pos: u64, dst: &mut [u8]) {
        let start = (pos % self.capacity as u64) as usize;
        let first = dst.len().min(self.capacity - start);
        // SAFETY: the bytes lie in the data region below the acquired `head`, so the producer
        // has finished writing them and will not touch them until `tail` moves past.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data.as_ptr().add(start), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.data.as_ptr(), dst.as_mut_ptr().add(first), dst.len() - first);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_around_and_keeps_order() {
        let seg = Arc::new(Segment::create(RING_HEADER_BYTES + 1000).unwrap());
        let mut tx = Ring::new(seg.clone(), 0, 1000).unwrap();
        let mut rx = Ring::new(seg, 0, 1000).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        let mut sent = 0;
        let mut got = Vec::new();
        let mut buf = [0u8; 333];
        while got.len() < data.len() {
            sent += tx.write(&[IoSlice::new(&data[sent..(sent + 777).min(data.len())])]);
            let n = rx.read(&mut buf);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, data);
        assert_eq!(rx.read(&mut buf), 0);
    }
}

//! A single-producer single-consumer byte ring in shared memory.
//!
//! Layout: a header of two 128-byte lines (the producer's `head` and the consumer's `tail`, apart
//! so the two processes do not bounce one cache line), a `closed` flag and the direct-write
//! flags of this direction (`writing`, raised by the producer, and `revoked`, by the consumer;
//! see `direct`), then `capacity` bytes of data. `head` and `tail` count bytes ever written and read; the data region holds
//! `head - tail` bytes. The producer publishes with a release store of `head` after copying;
//! the consumer acquires `head` before copying out and releases `tail` after.
//!
//! The other process is not trusted with this process's memory: each side keeps its own
//! position privately (the shared copy is only published, never read back), and the other
//! side's position is checked before use: the consumer's `tail` must lie between what it said
//! before and the producer's `head`, the producer's `head` between what it said before and
//! `tail + capacity`. A position out of that range is [`Corrupt`], which the connection reports
//! as a protocol error naming the peer; nothing is copied with it.

use std::io::IoSlice;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::segment::Segment;
use crate::framing::Peeked;

/// Bytes of the ring header.
pub(crate) const RING_HEADER_BYTES: usize = 256;
pub(crate) const HEAD_OFFSET: usize = 0;
pub(crate) const TAIL_OFFSET: usize = 128;
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
    /// This side's own position (the producer's `head`, the consumer's `tail`), kept here so
    /// that a peer scribbling on the shared copy cannot move it.
    mine: u64,
}

/// The peer published a position no honest peer could: the ring cannot be read or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Corrupt {
    pub what: &'static str,
    pub got: u64,
    pub low: u64,
    pub high: u64,
}

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "its ring {} is {}, outside the possible {}..={}", self.what, self.got, self.low, self.high)
    }
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
        Some(Ring { _segment: segment, header, data, capacity, seen: 0, mine: 0 })
    }

    pub(crate) fn word(&self, offset: usize) -> &AtomicU64 {
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

    /// The peer's position, checked to lie in `[self.seen, high]` (positions only grow).
    fn peer_position(&mut self, offset: usize, what: &'static str, high: u64) -> Result<u64, Corrupt> {
        let got = self.word(offset).load(Ordering::Acquire);
        if got < self.seen || got > high {
            return Err(Corrupt { what, got, low: self.seen, high });
        }
        self.seen = got;
        Ok(got)
    }

    /// Producer: copies as much of `bufs` as fits; returns the bytes taken.
    pub(crate) fn write(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, Corrupt> {
        let head = self.mine;
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        // `seen <= head` and `head - seen <= capacity` hold: `seen` only takes checked values.
        if self.capacity - ((head - self.seen) as usize) < want {
            // Only now read the consumer's line (a cache miss when it has moved).
            self.peer_position(TAIL_OFFSET, "tail", head)?;
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
            self.mine = pos;
            self.word(HEAD_OFFSET).store(pos, Ordering::Release);
        }
        Ok((pos - head) as usize)
    }

    /// Consumer: bytes known to be readable (at most `capacity`), reading the producer's line
    /// only when fewer than `want` are known.
    pub(crate) fn readable(&mut self, want: usize) -> Result<usize, Corrupt> {
        let tail = self.mine;
        if ((self.seen - tail) as usize) < want {
            self.peer_position(HEAD_OFFSET, "head", tail + self.capacity as u64)?;
        }
        Ok((self.seen - tail) as usize)
    }

    /// Consumer: copies out up to `buf.len()` available bytes.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> Result<usize, Corrupt> {
        let tail = self.mine;
        let n = self.readable(1)?.min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        self.copy_out(tail, &mut buf[..n]);
        self.publish_tail(tail + n as u64);
        Ok(n)
    }

    fn publish_tail(&mut self, tail: u64) {
        self.mine = tail;
        self.word(TAIL_OFFSET).store(tail, Ordering::Release);
    }

    /// Consumer: the received bytes at the read position that lie contiguously in the data
    /// region (up to its end), without copying them; with how many bytes the ring holds in all
    /// and how many lie between the read position and the end of the data region. The
    /// producer's position is re-read when fewer than `want` bytes are known to be there
    /// (`usize::MAX`: always).
    pub(crate) fn peek(&mut self, want: usize) -> Result<Peeked<'_>, Corrupt> {
        let tail = self.mine;
        let buffered = self.readable(want)?;
        let start = (tail % self.capacity as u64) as usize;
        let until_end = self.capacity - start;
        let n = buffered.min(until_end);
        // SAFETY: [start, start + n) lies in the data region below the acquired `head`: the
        // producer has finished writing it and will not touch it until `tail` moves past it,
        // which only `consume` (through `&mut self`, so not while this borrow lives) does.
        let bytes = unsafe { std::slice::from_raw_parts(self.data.as_ptr().add(start), n) };
        Ok(Peeked { bytes, buffered, until_end, capacity: self.capacity })
    }

    /// Consumer: releases `n` bytes at the read position (at most what [`Ring::peek`] showed;
    /// more is clamped to what has arrived).
    pub(crate) fn consume(&mut self, n: usize) {
        let n = n.min((self.seen - self.mine) as usize);
        self.publish_tail(self.mine + n as u64);
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
            sent += tx.write(&[IoSlice::new(&data[sent..(sent + 777).min(data.len())])]).unwrap();
            let n = rx.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, data);
        assert_eq!(rx.read(&mut buf), Ok(0));
    }

    /// A peer that publishes an impossible position is an error, and nothing is copied with it
    /// (before, the consumer copied `head - tail` bytes whatever they were, past the ring).
    #[test]
    fn impossible_peer_positions_are_errors() {
        let seg = Arc::new(Segment::create(RING_HEADER_BYTES + 1000).unwrap());
        let mut tx = Ring::new(seg.clone(), 0, 1000).unwrap();
        let mut rx = Ring::new(seg, 0, 1000).unwrap();
        let mut buf = vec![0u8; 5000];
        assert_eq!(tx.write(&[IoSlice::new(&[1u8; 600])]), Ok(600));
        assert_eq!(rx.read(&mut buf), Ok(600));
        // The producer claims more than the ring holds ...
        tx.word(HEAD_OFFSET).store(600 + 1001, Ordering::Release);
        let e = rx.read(&mut buf).unwrap_err();
        assert_eq!((e.what, e.got, e.low, e.high), ("head", 1601, 600, 1600));
        assert!(rx.peek(1).is_err());
        // ... or moves backwards.
        tx.word(HEAD_OFFSET).store(599, Ordering::Release);
        assert_eq!(rx.read(&mut buf).unwrap_err().what, "head");
        // Honest again: what is published is read.
        assert_eq!(tx.write(&[IoSlice::new(&[2u8; 300])]), Ok(300));
        assert_eq!(rx.read(&mut buf), Ok(300));
        // The consumer claims to have read what was never written.
        rx.word(TAIL_OFFSET).store(10_000, Ordering::Release);
        let e = tx.write(&[IoSlice::new(&[2u8; 900])]).unwrap_err();
        assert_eq!((e.what, e.got, e.high), ("tail", 10_000, 900));
        // A scribble on a side's own shared position does not move it: it is kept privately.
        rx.word(TAIL_OFFSET).store(900, Ordering::Release);
        tx.word(HEAD_OFFSET).store(5, Ordering::Release);
        assert_eq!(tx.write(&[IoSlice::new(&[3u8; 10])]), Ok(10));
        assert_eq!(rx.read(&mut buf), Ok(10));
        assert_eq!(&buf[..10], &[3u8; 10]);
    }
}

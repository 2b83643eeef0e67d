//! A single-producer single-consumer byte ring in shared memory.
//!
//! Layout: a header of two 128-byte lines (the producer's `head` and the consumer's `tail`, apart
//! so the two processes do not bounce one cache line), a `closed` flag, then `capacity` bytes of
//! data. `head` and `tail` count bytes ever written and read; the data region holds
//! `head - tail` bytes. The producer publishes with a release store of `head` after copying;
//! the consumer acquires `head` before copying out and releases `tail` after.

use std::io::IoSlice;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::segment::Segment;

/// Bytes of the ring header.
pub(crate) const RING_HEADER_BYTES: usize = 256;
const HEAD_OFFSET: usize = 0;
const TAIL_OFFSET: usize = 128;
const CLOSED_OFFSET: usize = 192;

/// One direction of a shared-memory connection.
pub(crate) struct Ring {
    /// Keeps the mapping alive.
    _segment: Arc<Segment>,
    header: NonNull<u8>,
    data: NonNull<u8>,
    capacity: usize,
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
        Some(Ring { _segment: segment, header, data, capacity })
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offsets 0 and 128 of the header are 8-aligned, in the mapping, and only ever
        // accessed atomically by both processes.
        unsafe { &*(self.header.as_ptr().add(offset) as *const AtomicU64) }
    }

    fn closed_flag(&self) -> &AtomicU32 {
        // SAFETY: as for `word`; offset 192 is 4-aligned.
        unsafe { &*(self.header.as_ptr().add(CLOSED_OFFSET) as *const AtomicU32) }
    }

    pub(crate) fn close(&self) {
        self.closed_flag().store(1, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed_flag().load(Ordering::Acquire) != 0
    }

    /// Producer: copies as much of `bufs` as fits; returns the bytes taken.
    pub(crate) fn write(&self, bufs: &[IoSlice<'_>]) -> usize {
        let head = self.word(HEAD_OFFSET).load(Ordering::Relaxed);
        let tail = self.word(TAIL_OFFSET).load(Ordering::Acquire);
        let mut free = self.capacity - (head - tail) as usize;
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

    /// Consumer: copies out up to `buf.len()` available bytes.
    pub(crate) fn read(&self, buf: &mut [u8]) -> usize {
        let tail = self.word(TAIL_OFFSET).load(Ordering::Relaxed);
        let head = self.word(HEAD_OFFSET).load(Ordering::Acquire);
        let n = ((head - tail) as usize).min(buf.len());
        if n == 0 {
            return 0;
        }
        self.copy_out(tail, &mut buf[..n]);
        self.word(TAIL_OFFSET).store(tail + n as u64, Ordering::Release);
        n
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
        let tx = Ring::new(seg.clone(), 0, 1000).unwrap();
        let rx = Ring::new(seg, 0, 1000).unwrap();
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

//! The wire format shared by every byte-stream backend: a 32-byte header (tag, payload length,
//! meta) before each payload; an outgoing queue for what the stream cannot take yet; incoming
//! frames parsed into per-tag queues of pooled buffers.
//!
//! A large payload the stream cannot take at once stays where the caller has it: the queue
//! holds its region and writes from it as the stream drains, and the send's [`Ticket`] is done
//! once its last byte is written (no pending copy). Small payloads are copied into the queue
//! (their ticket is done at once), where they are cheaper to batch than to track.
//!
//! Small frames are read through a staging buffer (many frames per system call); the payload
//! of a large frame is read straight into its message buffer (no extra copy).
//!
//! One file per side: [`send`] (the outgoing queue), [`recv`] (the frame parser and per-tag
//! queues), [`in_place`] (shared memory's leave-in-place hand-over); this file has the frame,
//! the stream trait and what joins the sides.

mod in_place;
mod recv;
mod send;

use std::collections::VecDeque;
use std::io::IoSlice;

use crate::error::{Error, Result};
use crate::pool::BufferPool;
use crate::{Message, Meta, META_BYTES};
use in_place::InPlace;
use recv::Partial;
use send::Outgoing;

/// Payloads smaller than this are copied into the outgoing queue when they must wait; larger
/// ones are written from the caller's memory.
const COPY_BELOW: usize = 64 << 10;

pub(crate) const HEADER_BYTES: usize = 8 + META_BYTES;
const STAGING_BYTES: usize = 64 << 10;
/// A payload remainder at least this large is read directly into its buffer.
const DIRECT_READ_BYTES: usize = 16 << 10;
/// Buffers up to this capacity are pooled as small ones (see [`BufferPool`]).
const SMALL_BUFFER_BYTES: usize = COPY_BELOW + HEADER_BYTES;
/// A frame's buffer is allocated whole up to this length; a longer one grows as its payload
/// arrives (a peer's header is not trusted to size an allocation).
const EAGER_FRAME_BYTES: usize = 16 << 20;
/// Queued frames handed to the stream per system call.
const WRITE_BATCH: usize = 64;

/// Payloads at least this large are handed over where they arrived when the stream allows it:
/// every non-empty one (a small message handed over in place skips two copies, a buffer from
/// the pool and a queue, which on shared memory is most of its receive path).
const IN_PLACE_MIN_BYTES: usize = 1;

/// A non-blocking byte stream. `Ok(0)` means "nothing now"; a closed peer is
/// `Err(Error::PeerClosed)`.
pub(crate) trait ByteStream: Send {
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize>;
    fn read(&mut self, buf: &mut [u8]) -> Result<usize>;
    /// Received bytes viewed where they lie, without copying (shared memory); `None` where
    /// the stream cannot (TCP).
    /// `want`: how many bytes the caller needs (the stream may look again for more).
    fn peek(&mut self, _want: usize) -> Option<Peeked<'_>> {
        None
    }
    /// Releases `n` bytes seen through [`ByteStream::peek`].
    fn consume(&mut self, _n: usize) {}
    /// Called while waiting on bytes that were peeked at but not read: an error once the peer
    /// is gone (a stream that reads nothing notices that in `read`).
    fn check_alive(&mut self) -> Result<()> {
        Ok(())
    }
    /// Messages smaller than this are queued and written together at the next progress
    /// (0: every message is written at once). A socket pays per system call and per packet,
    /// so many small messages written one by one cost far more than their bytes.
    fn coalesce_below(&self) -> usize {
        0
    }
}

/// Received bytes where they lie in a stream's buffer.
pub(crate) struct Peeked<'a> {
    /// The bytes at the read position that lie contiguously in memory.
    pub bytes: &'a [u8],
    /// Bytes the stream holds in all (`bytes` and those past a wrap).
    pub buffered: usize,
    /// Bytes from the read position to the end of the buffer (where a frame would wrap).
    pub until_end: usize,
    pub capacity: usize,
}

impl Peeked<'_> {
    /// The stream is filling up: frames must move out of it so the sender never waits.
    fn pressed(&self) -> bool {
        self.buffered * 4 >= self.capacity * 3
    }
}

/// Framing over one byte stream.
pub(crate) struct Framed<S> {
    pub(crate) stream: S,
    pending: VecDeque<Outgoing>,
    /// Bytes of `pending[0]` already written.
    pending_off: usize,
    backlog: usize,
    /// Bytes of every frame ever queued or written (headers and payloads): the stream
    /// position at which the last frame sent so far ends.
    accepted: u64,
    /// Frames that borrowed caller memory so far, and how many of them are fully written
    /// (frames leave in order, so a send is done once this passes its sequence number).
    borrowed: u64,
    written: u64,
    staging: Vec<u8>,
    st_start: usize,
    st_end: usize,
    partial: Option<Partial>,
    /// The frame at the stream's read position, left there to be handed over without a copy
    /// (only while the staging buffer is empty and no frame is partly read, so it is the
    /// newest frame known).
    in_place: Option<InPlace>,
    /// Arrived messages per tag (few tags, so a list beats hashing).
    /// Each message with its place in the stream (`arrived`), so the first of several tags can
    /// be found.
    queues: Vec<(u32, VecDeque<(u64, Message)>)>,
    arrived: u64,
    pool: BufferPool,
    closed: Option<String>,
}

fn encode_header(tag: u32, len: u32, meta: &Meta) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&tag.to_le_bytes());
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..].copy_from_slice(meta);
    h
}

fn decode_header(h: &[u8]) -> (u32, usize, Meta) {
    let mut word = [0u8; 4];
    word.copy_from_slice(&h[0..4]);
    let tag = u32::from_le_bytes(word);
    word.copy_from_slice(&h[4..8]);
    let len = u32::from_le_bytes(word) as usize;
    let mut meta = [0u8; META_BYTES];
    meta.copy_from_slice(&h[8..HEADER_BYTES]);
    (tag, len, meta)
}

impl<S: ByteStream> Framed<S> {
    pub(crate) fn new(stream: S) -> Framed<S> {
        Framed {
            stream,
            pending: VecDeque::new(),
            pending_off: 0,
            backlog: 0,
            accepted: 0,
            borrowed: 0,
            written: 0,
            staging: vec![0; STAGING_BYTES],
            st_start: 0,
            st_end: 0,
            partial: None,
            in_place: None,
            queues: Vec::new(),
            arrived: 0,
            pool: BufferPool::new(SMALL_BUFFER_BYTES),
            closed: None,
        }
    }

    /// A buffer of exactly `len` bytes, reused when possible. Contents are unspecified.
    fn buffer(&mut self, len: usize) -> Vec<u8> {
        self.pool.take(len)
    }

    pub(crate) fn recycle(&mut self, data: Vec<u8>) {
        self.pool.give(data);
    }

    pub(crate) fn closed(&self) -> Option<&str> {
        self.closed.as_deref()
    }

    pub(crate) fn mark_closed(&mut self, why: String) {
        if self.closed.is_none() {
            self.closed = Some(why);
        }
        // Nothing more is written: the queue lets go of the callers' memory (the backlog stays,
        // so a run that still counted on it learns that it never left).
        self.pending_off = 0;
        self.pending.clear();
    }

    /// Reads what has arrived, recording a peer that closed.
    fn read_side(&mut self) -> Result<bool> {
        match self.progress_read() {
            Ok(m) => Ok(m),
            Err(Error::PeerClosed(why)) => {
                self.mark_closed(why);
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn progress(&mut self) -> Result<bool> {
        if self.closed.is_some() {
            return Ok(false);
        }
        let wrote = self.progress_write()?;
        let read = self.read_side()?;
        Ok(wrote || read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Region;

    /// An in-memory stream that moves at most `limit` bytes per call, to exercise partial
    /// reads and writes.
    struct Pipe {
        out: Vec<u8>,
        input: Vec<u8>,
        pos: usize,
        limit: usize,
        room: usize,
    }

    impl ByteStream for Pipe {
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize> {
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.limit - n).min(self.room);
                self.out.extend_from_slice(&b[..take]);
                self.room -= take;
                n += take;
                if take < b.len() {
                    break;
                }
            }
            Ok(n)
        }
        fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
            let n = buf.len().min(self.limit).min(self.input.len() - self.pos);
            buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    #[test]
    fn frames_survive_partial_writes_and_reads() {
        let sizes = [0usize, 1, 31, 32, 33, 1000, 20_000, 70_000, 200_000, 3];
        for limit in [7usize, 100, 4096, 1 << 20] {
            let sender = Pipe { out: Vec::new(), input: Vec::new(), pos: 0, limit, room: 50_000 };
            let mut tx = Framed::new(sender);
            let payloads: Vec<Vec<u8>> =
                sizes.iter().enumerate().map(|(i, &n)| (0..n).map(|b| (b * 7 + i) as u8).collect()).collect();
            for (i, p) in payloads.iter().enumerate() {
                let meta = [i as u8; META_BYTES];
                // SAFETY: `payloads` outlives the sender.
                unsafe { tx.send((i % 3) as u32, &meta, Region::of(p)) }.unwrap();
            }
            while tx.backlog() > 0 {
                tx.stream.room = 50_000;
                tx.progress().unwrap();
            }
            let wire = std::mem::take(&mut tx.stream.out);
            let mut rx = Framed::new(Pipe { out: Vec::new(), input: wire, pos: 0, limit, room: 0 });
            while rx.progress().unwrap() {}
            for (i, p) in payloads.iter().enumerate() {
                let m = rx.recv((i % 3) as u32).expect("message");
                assert_eq!(m.meta, [i as u8; META_BYTES]);
                assert_eq!(&m.data, p, "payload {i} with limit {limit}");
                rx.recycle(m.data);
            }
            assert!(rx.recv(0).is_none());
        }
    }

    /// Message buffers come back to the pool and serve the next call's messages: none is
    /// dropped while a call's worth of them is queued, and headers never take them.
    #[test]
    fn message_buffers_are_reused_across_calls() {
        const N: usize = 100;
        const LEN: usize = 512 << 10;
        let payload = vec![7u8; LEN];
        let mut wire = Vec::new();
        for i in 0..N {
            wire.extend_from_slice(&encode_header(0, LEN as u32, &[i as u8; META_BYTES]));
            wire.extend_from_slice(&payload);
        }
        let mut rx = Framed::new(Pipe { out: Vec::new(), input: Vec::new(), pos: 0, limit: 1 << 20, room: 1 << 20 });
        let mut addresses = std::collections::HashSet::new();
        for call in 0..2 {
            rx.stream.input = wire.clone();
            rx.stream.pos = 0;
            while rx.progress().unwrap() {}
            // Every message was queued before any was received (a peer that sent ahead).
            for i in 0..N {
                let got = rx.recv_queued(0, &mut |meta, data| {
                    assert_eq!((meta[0] as usize, data.len), (i, LEN));
                    addresses.insert(data.addr);
                });
                assert!(got, "call {call}: message {i}");
            }
            // Sending uses small buffers only.
            // SAFETY: `payload` outlives the stream.
            unsafe { rx.send(1, &[0; META_BYTES], Region::of(&payload[..100])) }.unwrap();
            while rx.backlog() > 0 {
                rx.progress().unwrap();
            }
            assert_eq!(rx.pool.counts(), (N, true), "call {call}");
        }
        assert_eq!(addresses.len(), N, "the second call's messages landed in the first call's buffers");
    }

    /// A header may announce up to 4 GiB: the buffer grows with the payload that actually
    /// arrives (before, the announced length was allocated at once, whatever followed), and a
    /// large payload that does arrive is received whole.
    #[test]
    fn an_announced_length_is_not_allocated_before_the_payload_comes() {
        let mut wire = encode_header(3, u32::MAX, &[1; META_BYTES]).to_vec();
        wire.extend_from_slice(&[9u8; 1000]);
        let mut rx = Framed::new(Pipe { out: Vec::new(), input: wire, pos: 0, limit: 1 << 20, room: 0 });
        while rx.progress().unwrap() {}
        let p = rx.partial.as_ref().expect("a frame in progress");
        assert_eq!((p.got, p.len), (1000, u32::MAX as usize));
        assert!(p.data.capacity() <= EAGER_FRAME_BYTES, "{} bytes allocated", p.data.capacity());

        let len = 3 * EAGER_FRAME_BYTES + 5;
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut wire = encode_header(3, len as u32, &[2; META_BYTES]).to_vec();
        wire.extend_from_slice(&payload);
        let mut rx = Framed::new(Pipe { out: Vec::new(), input: wire, pos: 0, limit: 1 << 20, room: 0 });
        while rx.progress().unwrap() {}
        assert_eq!(rx.recv(3).expect("the large message").data, payload);
    }
}

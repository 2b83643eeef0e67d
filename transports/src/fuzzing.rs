//! Entry points for the fuzz targets in `fuzz/` (hidden: no part of the API, changed at will).
//!
//! Each takes bytes as a peer could send them and runs them through this crate's own code: the
//! framing every byte-stream backend shares (over an in-memory stream that hands the bytes out
//! as a socket would, and over a real shared-memory ring, where frames may be left in place),
//! and the ring's checks of the positions the other process publishes. Nothing here decodes
//! anything itself; the wrappers only feed, drain and check invariants.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};
use crate::framing::{ByteStream, Framed};
use crate::shm::connection::ShmByteStream;
use crate::shm::ring::{Ring, HEAD_OFFSET, RING_HEADER_BYTES, TAIL_OFFSET};
use crate::shm::segment::Segment;
use crate::{Meta, Region};

/// Rounds of progress a drain may take before it counts as stuck: far more than any input the
/// fuzzer makes needs (every round that moves consumes a byte or completes a frame).
const MAX_ROUNDS: usize = 1 << 22;
const PAGE: usize = 4096;

/// The fuzzer's bytes, read front to back; zeros once they run out.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn op(&mut self) -> Option<u8> {
        (!self.0.is_empty()).then(|| self.byte())
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

/// What a peer sent, handed out at most `limit` bytes per read, as a socket would; once it is
/// all read, the peer either closes or just sends nothing more.
struct Sent<'a> {
    bytes: &'a [u8],
    pos: usize,
    limit: usize,
    closes: bool,
}

impl ByteStream for Sent<'_> {
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        Ok(bufs.iter().map(|b| b.len()).sum())
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let n = buf.len().min(self.limit).min(self.bytes.len() - self.pos);
        if n == 0 && self.closes && !buf.is_empty() {
            return Err(Error::PeerClosed("the fuzzer's peer hung up".into()));
        }
        buf[..n].copy_from_slice(&self.bytes[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Takes every message of `tags` that can be had now, the ways the backends do (queued only,
/// one tag, the first of several); true when any came. Each payload is read through, so the
/// sanitizer sees a region that is not valid memory.
fn receive<S: ByteStream>(framed: &mut Framed<S>, tags: &[u32]) -> bool {
    let mut sink = 0u8;
    let mut look = |_: u32, _: &Meta, r: Region| {
        // SAFETY: the framing hands over host memory valid for the call, which this is.
        sink ^= unsafe { r.bytes() }.iter().fold(0, |a, b| a ^ b);
    };
    let mut any = false;
    for &tag in tags {
        while framed.recv_queued(tag, &mut |m, r| look(tag, m, r)) {
            any = true;
        }
        while matches!(framed.recv_with(tag, &mut |m, r| look(tag, m, r)), Ok(true)) {
            any = true;
        }
        while matches!(framed.recv_one(tag, &mut |m: &Meta, r| look(tag, m, r)), Ok(true)) {
            any = true;
        }
    }
    while matches!(framed.recv_first(tags, &mut look), Ok(true)) {
        any = true;
    }
    std::hint::black_box(sink);
    any
}

/// A connected loopback socket for the liveness line of a shared-memory stream (the peer end
/// is kept open and never writes, as a live peer's).
fn liveness_line() -> TcpStream {
    static PAIR: OnceLock<(TcpStream, TcpStream)> = OnceLock::new();
    let (ours, _theirs) = PAIR.get_or_init(|| {
        let l = TcpListener::bind("127.0.0.1:0").expect("loopback listener");
        let ours = TcpStream::connect(l.local_addr().expect("its address")).expect("loopback connect");
        let theirs = l.accept().expect("loopback accept").0;
        ours.set_nonblocking(true).expect("non-blocking");
        (ours, theirs)
    });
    ours.try_clone().expect("a second descriptor for the liveness socket")
}

/// Feeds `data` to the framing as what a peer sent on a stream and drains every message it
/// can: must never panic, never stall, never allocate more than the bytes warrant.
///
/// Layout: a flags byte (bit 0: a shared-memory ring instead of a socket-like stream; bit 1:
/// the socket-like peer closes at the end), a byte for the most bytes moved per call, a byte
/// for the ring's size in pages, a byte for how many tags to receive (0 to 4) and those tags
/// (4 bytes each), then the stream.
pub fn frame_stream(data: &[u8]) {
    let mut input = Input(data);
    let flags = input.byte();
    let limit = 1 + usize::from(input.byte()).pow(2);
    let pages = 1 + usize::from(input.byte() % 16);
    let ntags = usize::from(input.byte() % 5);
    let tags: Vec<u32> = (0..ntags).map(|_| input.u32()).collect();
    let bytes = input.rest();
    if flags & 1 == 0 {
        let mut framed = Framed::new(Sent { bytes, pos: 0, limit, closes: flags & 2 != 0 });
        let mut rounds = 0;
        while let Ok(moved) = framed.progress() {
            let got = receive(&mut framed, &tags);
            if !moved && !got {
                break;
            }
            rounds += 1;
            assert!(rounds < MAX_ROUNDS, "the framing keeps saying it moved");
        }
        if framed.closed().is_none() {
            assert_eq!(framed.stream.pos, bytes.len(), "the framing stopped reading a live stream");
        }
    } else {
        ring_stream(bytes, limit, pages, &tags);
    }
}

/// The framing over a shared-memory ring (the backend that leaves frames in place), with an
/// honest producer writing `bytes` into the ring `limit` at a time.
fn ring_stream(bytes: &[u8], limit: usize, pages: usize, tags: &[u32]) {
    let span = pages * PAGE;
    let capacity = span - RING_HEADER_BYTES;
    let segment = Arc::new(Segment::create(2 * span).expect("a shared segment"));
    let ring = |at: usize| Ring::new(segment.clone(), at, capacity).expect("a ring in the segment");
    let mut producer = ring(span);
    let stream = ShmByteStream {
        tx: ring(0),
        rx: ring(span),
        control: liveness_line(),
        peer: "the fuzzer".into(),
        idle: 0,
        corrupt: None,
    };
    let mut framed = Framed::new(stream);
    let mut fed = 0;
    let (mut rounds, mut idle) = (0, 0);
    loop {
        let mut wrote = false;
        if fed < bytes.len() {
            let end = bytes.len().min(fed + limit);
            let n = producer.write(&[IoSlice::new(&bytes[fed..end])]).expect("an honest consumer's tail");
            fed += n;
            wrote = n > 0;
        }
        let moved = framed.progress().unwrap_or_else(|e| panic!("an honest ring failed: {e}"));
        let got = receive(&mut framed, tags);
        assert!(framed.closed().is_none(), "an honest ring was reported closed: {:?}", framed.closed());
        if fed == bytes.len() && !moved && !got {
            break;
        }
        // A round in which nothing moves leaves everything as it was: the next one would not
        // move either.
        idle = if wrote || moved || got { 0 } else { idle + 1 };
        rounds += 1;
        assert!(
            idle < 4 && rounds < MAX_ROUNDS,
            "the sender waits: {} of {} bytes never fit in the ring",
            bytes.len() - fed,
            bytes.len()
        );
    }
}

/// Runs a script of ring operations with a producer and a consumer on one ring, where the
/// script may also scribble any value on either side's published position (a hostile
/// process). While nobody has scribbled, the consumer must read exactly what was written;
/// afterwards errors are expected, but no panic, no access outside the ring, and nothing that
/// breaks the ring's own bounds.
pub fn shm_ring(data: &[u8]) {
    let mut input = Input(data);
    let pages = 1 + usize::from(input.byte() % 4);
    // The ring ends where the mapping does: any read or write past it faults.
    let capacity = pages * PAGE - RING_HEADER_BYTES;
    let segment = Arc::new(Segment::create(pages * PAGE).expect("a shared segment"));
    let mut tx = Ring::new(segment.clone(), 0, capacity).expect("the producer's ring");
    let mut rx = Ring::new(segment, 0, capacity).expect("the consumer's ring");
    let mut honest = true;
    let mut model: VecDeque<u8> = VecDeque::new();
    let mut next = 0u8;
    let mut buf = vec![0u8; 2 * capacity];
    while let Some(op) = input.op() {
        match op % 7 {
            0 => {
                let n = usize::from(input.u16()) % (2 * capacity);
                let payload: Vec<u8> = (0..n).map(|i| next.wrapping_add(i as u8)).collect();
                match tx.write(&[IoSlice::new(&payload[..n / 2]), IoSlice::new(&payload[n / 2..])]) {
                    Ok(k) => {
                        assert!(k <= n, "wrote {k} of {n} bytes");
                        model.extend(&payload[..k]);
                        next = next.wrapping_add(k as u8);
                    }
                    Err(c) => assert!(!honest, "honest ring corrupt: {c}"),
                }
            }
            1 => {
                let n = usize::from(input.u16()) % (2 * capacity);
                match rx.read(&mut buf[..n]) {
                    Ok(k) => {
                        assert!(k <= n && k <= capacity, "read {k} bytes into {n}");
                        if honest {
                            let want: Vec<u8> = model.drain(..k).collect();
                            assert_eq!(&buf[..k], &want[..], "the ring changed the bytes");
                        }
                    }
                    Err(c) => assert!(!honest, "honest ring corrupt: {c}"),
                }
            }
            2 => {
                let want = usize::from(input.u16());
                match rx.peek(want) {
                    Ok(p) => {
                        assert!(p.buffered <= p.capacity && p.until_end <= p.capacity && p.capacity == capacity);
                        assert!(p.bytes.len() <= p.until_end && p.bytes.len() <= p.buffered);
                        let sum = p.bytes.iter().fold(0u8, |a, b| a ^ b);
                        std::hint::black_box(sum);
                        if honest {
                            assert!(p.buffered <= model.len(), "peek sees more than was written");
                            assert!(p.bytes.iter().eq(model.iter().take(p.bytes.len())), "peeked bytes differ");
                        }
                    }
                    Err(c) => assert!(!honest, "honest ring corrupt: {c}"),
                }
            }
            3 => {
                let n = usize::from(input.u16());
                match rx.readable(0) {
                    Ok(known) => {
                        rx.consume(n);
                        if honest {
                            model.drain(..n.min(known));
                        }
                    }
                    Err(c) => assert!(!honest, "honest ring corrupt: {c}"),
                }
            }
            4 => {
                let n = usize::from(input.u16());
                match rx.readable(n) {
                    Ok(k) => {
                        assert!(k <= capacity, "{k} bytes readable in a ring of {capacity}");
                        if honest {
                            assert!(k <= model.len());
                        }
                    }
                    Err(c) => assert!(!honest, "honest ring corrupt: {c}"),
                }
            }
            5 => {
                tx.word(HEAD_OFFSET).store(input.u64(), std::sync::atomic::Ordering::Release);
                honest = false;
            }
            _ => {
                rx.word(TAIL_OFFSET).store(input.u64(), std::sync::atomic::Ordering::Release);
                honest = false;
            }
        }
    }
}

/// Takes whatever is written; has nothing to read.
struct Capture(Vec<u8>);

impl ByteStream for Capture {
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        for b in bufs {
            self.0.extend_from_slice(b);
        }
        Ok(bufs.iter().map(|b| b.len()).sum())
    }

    fn read(&mut self, _: &mut [u8]) -> Result<usize> {
        Ok(0)
    }
}

/// The bytes the framing puts on the wire for `messages` (tag, meta byte, payload length).
fn wire(messages: &[(u32, u8, usize)]) -> Vec<u8> {
    let mut framed = Framed::new(Capture(Vec::new()));
    for &(tag, m, len) in messages {
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        // SAFETY: the capture takes every byte at once, so the payload is not needed after.
        let seq = unsafe { framed.send(tag, &[m; crate::META_BYTES], Region::of(&payload)) }.expect("a frame");
        assert_eq!(seq, 0, "the capture took the frame whole");
    }
    framed.stream.0
}

/// Seed inputs for [`frame_stream`], named.
pub fn frame_stream_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let seed = |flags: u8, limit: u8, pages: u8, tags: &[u32], messages: &[(u32, u8, usize)]| {
        let mut v = vec![flags, limit, pages, tags.len() as u8];
        for t in tags {
            v.extend_from_slice(&t.to_le_bytes());
        }
        v.extend_from_slice(&wire(messages));
        v
    };
    vec![
        ("stream-small", seed(0, 255, 0, &[0, 1], &[(0, 1, 10), (1, 2, 0), (0, 3, 100)])),
        ("stream-trickle-closes", seed(2, 2, 0, &[7], &[(7, 1, 33), (7, 2, 5), (8, 3, 1)])),
        ("stream-large-direct", seed(0, 200, 0, &[3], &[(3, 9, 17_000), (3, 1, 1)])),
        ("ring-in-place", seed(1, 40, 15, &[1, 2], &[(2, 1, 5000), (1, 2, 10), (2, 3, 4100)])),
        ("ring-small-wraps", seed(1, 9, 0, &[4], &[(4, 1, 1000), (4, 2, 3000), (4, 3, 2000)])),
    ]
}

/// Seed inputs for [`shm_ring`], named (see its `match` for the operations).
pub fn shm_ring_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let op = |v: &mut Vec<u8>, code: u8, arg: u16| {
        v.push(code);
        v.extend_from_slice(&arg.to_le_bytes());
    };
    let mut honest = vec![1];
    for (code, arg) in [(0, 1000), (1, 500), (2, 10), (3, 100), (4, 1), (0, 7000), (1, 8000), (0, 300), (2, 400)] {
        op(&mut honest, code, arg);
    }
    let mut hostile = vec![0];
    op(&mut hostile, 0, 600);
    op(&mut hostile, 1, 600);
    hostile.push(5);
    hostile.extend_from_slice(&1601u64.to_le_bytes());
    op(&mut hostile, 1, 3000);
    hostile.push(6);
    hostile.extend_from_slice(&10_000u64.to_le_bytes());
    op(&mut hostile, 0, 900);
    vec![("honest", honest), ("hostile", hostile)]
}

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

use std::collections::VecDeque;
use std::io::IoSlice;

use crate::error::{Error, Result};
use crate::pool::BufferPool;
use crate::{Message, Meta, Region, MAX_MESSAGE_BYTES, META_BYTES};

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

/// A frame left where it arrived (header read, payload still in the stream).
#[derive(Clone, Copy)]
struct InPlace {
    tag: u32,
    len: usize,
    meta: Meta,
}

struct Partial {
    tag: u32,
    meta: Meta,
    /// The payload so far: `len` bytes, or fewer while a large frame's buffer is still growing
    /// with what arrives ([`Partial::room`]).
    data: Vec<u8>,
    got: usize,
    /// The payload's length, as the header announced it.
    len: usize,
}

impl Partial {
    fn new(tag: u32, meta: Meta, data: Vec<u8>, len: usize) -> Partial {
        Partial { tag, meta, data, got: 0, len }
    }

    /// Room for the next bytes: the buffer grows (doubling, up to the announced length) only
    /// as the payload actually arrives, so a header announcing 4 GiB that no payload follows
    /// costs [`EAGER_FRAME_BYTES`], not 4 GiB.
    fn room(&mut self) -> usize {
        if self.got == self.data.len() && self.data.len() < self.len {
            let grown = self.data.len().saturating_mul(2).clamp(EAGER_FRAME_BYTES, self.len);
            self.data.resize(grown, 0);
        }
        self.data.len() - self.got
    }
}

/// A frame waiting to be written: bytes of its own (the header, and a copied payload), then
/// possibly a payload still in the caller's memory.
struct Outgoing {
    own: Vec<u8>,
    borrowed: Region,
    /// Its place among the frames that borrow (0: it borrows nothing).
    seq: u64,
}

impl Outgoing {
    fn len(&self) -> usize {
        self.own.len() + self.borrowed.len
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

    pub(crate) fn backlog(&self) -> usize {
        self.backlog
    }

    /// The stream position at which the frames sent so far end.
    pub(crate) fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Whether the send that [`Framed::send`] numbered `seq` no longer needs its memory.
    pub(crate) fn sent(&self, seq: u64) -> bool {
        seq <= self.written || self.closed.is_some()
    }

    /// Queues a frame. Returns 0 when the payload is free again at once (written, or copied),
    /// else the number [`Framed::sent`] takes.
    ///
    /// # Safety
    /// `data` must be host memory valid for reads, unchanged until `sent` says so (or the
    /// stream is closed or dropped).
    pub(crate) unsafe fn send(&mut self, tag: u32, meta: &Meta, data: Region) -> Result<u64> {
        if let Some(why) = &self.closed {
            return Err(Error::PeerClosed(why.clone()));
        }
        let len = u32::try_from(data.len)
            .map_err(|_| Error::Unsupported(format!("message of {} bytes exceeds {MAX_MESSAGE_BYTES}", data.len)))?;
        let header = encode_header(tag, len, meta);
        self.accepted += (HEADER_BYTES + data.len) as u64;
        // SAFETY: valid host memory for the call (this fn's contract).
        let bytes = unsafe { data.bytes() };
        let mut written = 0;
        if self.pending.is_empty() && data.len >= self.stream.coalesce_below() {
            match self.stream.write_vectored(&[IoSlice::new(&header), IoSlice::new(bytes)]) {
                Ok(n) => written = n,
                Err(Error::PeerClosed(why)) => {
                    self.mark_closed(why.clone());
                    return Err(Error::PeerClosed(why));
                }
                Err(e) => return Err(e),
            }
        }
        let total = HEADER_BYTES + data.len;
        if written == total {
            return Ok(0);
        }
        let mut own = self.buffer(0);
        let rest_of_payload = written.saturating_sub(HEADER_BYTES);
        if written < HEADER_BYTES {
            own.extend_from_slice(&header[written..]);
        }
        let payload = &bytes[rest_of_payload..];
        let frame = if payload.len() < COPY_BELOW {
            own.extend_from_slice(payload);
            Outgoing { own, borrowed: Region::EMPTY, seq: 0 }
        } else {
            self.borrowed += 1;
            let borrowed = Region::of(payload);
            Outgoing { own, borrowed, seq: self.borrowed }
        };
        let seq = frame.seq;
        self.backlog += frame.len();
        self.pending.push_back(frame);
        Ok(seq)
    }

    fn progress_write(&mut self) -> Result<bool> {
        let mut moved = false;
        while !self.pending.is_empty() && self.closed.is_none() {
            let n = {
                // On the stack: this runs on every progress with anything queued.
                let mut slices = [IoSlice::new(&[]); WRITE_BATCH];
                let mut count = 0;
                let mut skip = self.pending_off;
                for f in &self.pending {
                    if count + 2 > WRITE_BATCH {
                        break;
                    }
                    // SAFETY: a borrowed payload stays valid and unchanged until its frame is
                    // written (`send`'s contract), and it is not written yet.
                    let borrowed = unsafe { f.borrowed.bytes() };
                    for part in [&f.own[..], borrowed] {
                        let from = skip.min(part.len());
                        skip -= from;
                        if from < part.len() {
                            slices[count] = IoSlice::new(&part[from..]);
                            count += 1;
                        }
                    }
                }
                match self.stream.write_vectored(&slices[..count]) {
                    Ok(n) => n,
                    Err(Error::PeerClosed(why)) => {
                        // The peer closing is news the caller must see (as a read that finds
                        // it closed is): report it as movement.
                        self.mark_closed(why);
                        return Ok(true);
                    }
                    Err(e) => return Err(e),
                }
            };
            if n == 0 {
                break;
            }
            moved = true;
            self.backlog -= n;
            let mut left = n;
            while left > 0 {
                let Some(front) = self.pending.front() else { break };
                let remaining = front.len() - self.pending_off;
                if left >= remaining {
                    left -= remaining;
                    self.pending_off = 0;
                    if let Some(done) = self.pending.pop_front() {
                        if done.seq > 0 {
                            self.written = done.seq;
                        }
                        self.recycle(done.own);
                    }
                } else {
                    self.pending_off += left;
                    left = 0;
                }
            }
        }
        Ok(moved)
    }

    /// Reads into the staging buffer; false when nothing came.
    fn fill_staging(&mut self) -> Result<bool> {
        if self.st_start == self.st_end {
            self.st_start = 0;
            self.st_end = 0;
        } else if self.st_start > 0 && self.staging.len() - self.st_end < HEADER_BYTES {
            self.staging.copy_within(self.st_start..self.st_end, 0);
            self.st_end -= self.st_start;
            self.st_start = 0;
        }
        let n = self.stream.read(&mut self.staging[self.st_end..])?;
        self.st_end += n;
        Ok(n > 0)
    }

    fn complete(&mut self, p: Partial) {
        let m = (self.arrived, Message { tag: p.tag, meta: p.meta, data: p.data });
        self.arrived += 1;
        match self.queues.iter_mut().find(|(t, _)| *t == p.tag) {
            Some((_, q)) => q.push_back(m),
            None => self.queues.push((p.tag, VecDeque::from([m]))),
        }
    }

    fn progress_read(&mut self) -> Result<bool> {
        let mut moved = false;
        loop {
            if let Some(mut p) = self.partial.take() {
                let want = p.room();
                let staged = self.st_end - self.st_start;
                if staged > 0 {
                    let n = staged.min(want);
                    p.data[p.got..p.got + n].copy_from_slice(&self.staging[self.st_start..self.st_start + n]);
                    self.st_start += n;
                    p.got += n;
                } else if want >= DIRECT_READ_BYTES {
                    let n = self.stream.read(&mut p.data[p.got..p.got + want]);
                    match n {
                        Ok(0) => {
                            self.partial = Some(p);
                            return Ok(moved);
                        }
                        Ok(n) => p.got += n,
                        Err(e) => {
                            self.partial = Some(p);
                            return Err(e);
                        }
                    }
                } else {
                    self.partial = Some(p);
                    if !self.fill_staging()? {
                        return Ok(moved);
                    }
                    continue;
                }
                moved = true;
                if p.got == p.len {
                    self.complete(p);
                } else {
                    self.partial = Some(p);
                }
                continue;
            }
            if self.st_end - self.st_start >= HEADER_BYTES {
                let (tag, len, meta) = decode_header(&self.staging[self.st_start..self.st_start + HEADER_BYTES]);
                self.st_start += HEADER_BYTES;
                let data = self.buffer(len.min(EAGER_FRAME_BYTES));
                let p = Partial::new(tag, meta, data, len);
                moved = true;
                if len == 0 {
                    self.complete(p);
                } else {
                    self.partial = Some(p);
                }
                continue;
            }
            if self.st_start == self.st_end {
                if let Some(h) = self.in_place {
                    if !self.stream.peek(usize::MAX).is_some_and(|p| p.pressed()) {
                        return Ok(moved);
                    }
                    self.spill(h);
                    moved = true;
                    continue;
                }
                if self.leave_in_place() {
                    // A message has come (left where it lies): that is progress.
                    return Ok(true);
                }
            }
            if !self.fill_staging()? {
                return Ok(moved);
            }
        }
    }

    /// Leaves the frame at the read position where it is, if it can be handed over from there:
    /// large, contiguous (not wrapping), 8-byte aligned for the reduction kernels, at most half
    /// the buffer (so it always fits), and the buffer not filling up.
    fn leave_in_place(&mut self) -> bool {
        let Some(p) = self.stream.peek(HEADER_BYTES) else { return false };
        if p.bytes.len() < HEADER_BYTES || p.pressed() {
            return false;
        }
        let (tag, len, meta) = decode_header(&p.bytes[..HEADER_BYTES]);
        let frame = HEADER_BYTES + len;
        let aligned = (p.bytes.as_ptr() as usize + HEADER_BYTES) % 8 == 0;
        if len < IN_PLACE_MIN_BYTES || frame > p.until_end || frame * 2 > p.capacity || !aligned {
            return false;
        }
        self.in_place = Some(InPlace { tag, len, meta });
        true
    }

    /// Hands the frame left in place, complete, to `f` where it lies, and consumes it; false
    /// (nothing handed over or consumed) where the stream can no longer show it.
    #[inline]
    fn take_in_place<F: FnMut(&Meta, Region) + ?Sized>(&mut self, h: InPlace, f: &mut F) -> bool {
        let frame = HEADER_BYTES + h.len;
        match self.stream.peek(frame) {
            Some(p) if p.bytes.len() >= frame => f(&h.meta, Region::of(&p.bytes[HEADER_BYTES..frame])),
            _ => return false,
        }
        self.stream.consume(frame);
        self.in_place = None;
        true
    }

    /// Turns the frame left in place into an ordinary partly read one (copied out as it comes).
    fn spill(&mut self, h: InPlace) {
        self.in_place = None;
        self.stream.consume(HEADER_BYTES);
        let data = self.buffer(h.len);
        self.partial = Some(Partial::new(h.tag, h.meta, data, h.len));
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

    #[cfg(test)]
    fn queued(&mut self, tag: u32) -> Option<Message> {
        self.queued_first(&[tag])
    }

    /// The message that came first among those queued under any of `tags`.
    fn queued_first(&mut self, tags: &[u32]) -> Option<Message> {
        if let [tag] = tags {
            return self.queues.iter_mut().find(|(t, _)| t == tag).and_then(|(_, q)| q.pop_front()).map(|(_, m)| m);
        }
        let mut first: Option<(usize, u64)> = None;
        for (i, (t, q)) in self.queues.iter().enumerate() {
            if let (true, Some((at, _))) = (tags.contains(t), q.front()) {
                if first.map_or(true, |(_, f)| *at < f) {
                    first = Some((i, *at));
                }
            }
        }
        first.and_then(|(i, _)| self.queues[i].1.pop_front()).map(|(_, m)| m)
    }

    /// Hands the next message of `tag` to `f` if it has already been read from the stream
    /// (never looks further, and never moves a frame left in the stream); whether it did.
    pub(crate) fn recv_queued(&mut self, tag: u32, f: &mut dyn FnMut(&Meta, Region)) -> bool {
        match self.queued_first(&[tag]) {
            Some(m) => {
                f(&m.meta, Region::of(&m.data));
                self.recycle(m.data);
                true
            }
            None => false,
        }
    }

    /// Hands the next message of `tag` to `f` if it has arrived, moving small frames of other
    /// tags that are in the way (at most `small` bytes of payload each) out of the stream, but
    /// never a larger one; whether it did. For a backend's own small frames (the CUDA IPC
    /// connection's offers), which must not wait behind messages the executor takes later.
    pub(crate) fn recv_past_small(&mut self, tag: u32, small: usize, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool> {
        loop {
            if let Some(m) = self.queued_first(&[tag]) {
                f(&m.meta, Region::of(&m.data));
                self.recycle(m.data);
                return Ok(true);
            }
            let Some(h) = self.in_place else {
                // Frames behind one just taken may have come already (a peer that closed
                // counts as progress, but brings none).
                if self.closed.is_none() && self.read_side()? {
                    continue;
                }
                return Ok(false);
            };
            if h.tag != tag && h.len > small {
                return Ok(false);
            }
            let frame = HEADER_BYTES + h.len;
            let complete = self.stream.peek(frame).is_some_and(|p| p.bytes.len() >= frame);
            if h.tag == tag && complete {
                return Ok(self.take_in_place(h, f));
            }
            self.spill(h);
            if !self.read_side()? {
                return Ok(false);
            }
        }
    }

    /// The next message of `tag`, copied out of the stream if it was left there.
    #[cfg(test)]
    pub(crate) fn recv(&mut self, tag: u32) -> Option<Message> {
        if let Some(m) = self.queued(tag) {
            return Some(m);
        }
        self.in_place?;
        let mut data = self.buffer(0);
        let mut meta = None;
        // An error marks the connection closed, which the caller checks next.
        let _ = self.recv_with(tag, &mut |m, bytes| {
            // SAFETY: `recv_with` hands over host memory valid for this call.
            data.extend_from_slice(unsafe { bytes.bytes() });
            meta = Some(*m);
        });
        match meta {
            Some(meta) => Some(Message { tag, meta, data }),
            None => {
                self.recycle(data);
                None
            }
        }
    }

    /// Hands the next message of `tag` to `f`, where it lies when it was left in place; false
    /// when none has arrived.
    pub(crate) fn recv_with(&mut self, tag: u32, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool> {
        self.recv_first(&[tag], &mut |_, m, r| f(m, r))
    }

    /// [`Framed::recv_first`] for one tag, with `f` known to the compiler (the hot path of
    /// every receive: no closure wrapped around the caller's).
    #[inline]
    pub(crate) fn recv_one<F: FnMut(&Meta, Region) + ?Sized>(&mut self, tag: u32, f: &mut F) -> Result<bool> {
        self.recv_first(&[tag], &mut |_, m, r| f(m, r))
    }

    /// Hands the message that came first among those of any of `tags` to `f` (with its tag),
    /// where it lies when it was left in place; false when none has arrived.
    pub(crate) fn recv_first<F: FnMut(u32, &Meta, Region)>(&mut self, tags: &[u32], f: &mut F) -> Result<bool> {
        loop {
            // Queued messages came before the one left in place (it is the newest known).
            if let Some(m) = self.queued_first(tags) {
                f(m.tag, &m.meta, Region::of(&m.data));
                self.recycle(m.data);
                return Ok(true);
            }
            let Some(h) = self.in_place else { return Ok(false) };
            let frame = HEADER_BYTES + h.len;
            let complete = self.stream.peek(frame).is_some_and(|p| p.bytes.len() >= frame);
            let wanted = tags.contains(&h.tag);
            if wanted && !complete {
                if let Err(Error::PeerClosed(why)) = self.stream.check_alive() {
                    self.mark_closed(why);
                }
                return Ok(false);
            }
            if wanted {
                return Ok(self.take_in_place(h, &mut |m, r| f(h.tag, m, r)));
            }
            // Another tag's frame is in the way: queue it (it is wanted later) and look on.
            self.spill(h);
            if !self.read_side()? {
                return Ok(false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

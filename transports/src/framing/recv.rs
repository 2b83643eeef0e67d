//! The incoming side: frames parsed out of the stream (small ones through a staging buffer,
//! a large payload straight into its buffer) into per-tag queues, and the receives that take
//! from them.

use std::collections::VecDeque;

use super::{decode_header, ByteStream, Framed, DIRECT_READ_BYTES, EAGER_FRAME_BYTES, HEADER_BYTES};
use crate::error::{Error, Result};
use crate::{Message, Meta, Region};

pub(super) struct Partial {
    pub(super) tag: u32,
    pub(super) meta: Meta,
    /// The payload so far: `len` bytes, or fewer while a large frame's buffer is still growing
    /// with what arrives ([`Partial::room`]).
    pub(super) data: Vec<u8>,
    pub(super) got: usize,
    /// The payload's length, as the header announced it.
    pub(super) len: usize,
}

impl Partial {
    pub(super) fn new(tag: u32, meta: Meta, data: Vec<u8>, len: usize) -> Partial {
        Partial { tag, meta, data, got: 0, len }
    }

    /// Room for the next bytes: the buffer grows (doubling, up to the announced length) only
    /// as the payload actually arrives, so a header announcing 4 GiB that no payload follows
    /// costs [`EAGER_FRAME_BYTES`], not 4 GiB.
    pub(super) fn room(&mut self) -> usize {
        if self.got == self.data.len() && self.data.len() < self.len {
            let grown = self.data.len().saturating_mul(2).clamp(EAGER_FRAME_BYTES, self.len);
            self.data.resize(grown, 0);
        }
        self.data.len() - self.got
    }
}

impl<S: ByteStream> Framed<S> {
    /// Reads into the staging buffer; false when nothing came.
    pub(super) fn fill_staging(&mut self) -> Result<bool> {
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

    pub(super) fn complete(&mut self, p: Partial) {
        let m = (self.arrived, Message { tag: p.tag, meta: p.meta, data: p.data });
        self.arrived += 1;
        match self.queues.iter_mut().find(|(t, _)| *t == p.tag) {
            Some((_, q)) => q.push_back(m),
            None => self.queues.push((p.tag, VecDeque::from([m]))),
        }
    }

    pub(super) fn progress_read(&mut self) -> Result<bool> {
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

    #[cfg(test)]
    pub(super) fn queued(&mut self, tag: u32) -> Option<Message> {
        self.queued_first(&[tag])
    }

    /// The message that came first among those queued under any of `tags`.
    pub(super) fn queued_first(&mut self, tags: &[u32]) -> Option<Message> {
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
                    // The rest of the frame may have come after the peek, just before the
                    // peer closed: it is the peer's last word, not lost.
                    if self.stream.peek(frame).is_some_and(|p| p.bytes.len() >= frame) {
                        continue;
                    }
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

//! The outgoing side: frames queued while the stream cannot take them, large payloads written
//! from the caller's memory (their send's number tells when it is free again).

use std::io::IoSlice;

use super::{encode_header, ByteStream, Framed, COPY_BELOW, HEADER_BYTES, WRITE_BATCH};
use crate::error::{Error, Result};
use crate::{Meta, Region, MAX_MESSAGE_BYTES};

/// A frame waiting to be written: bytes of its own (the header, and a copied payload), then
/// possibly a payload still in the caller's memory.
pub(super) struct Outgoing {
    pub(super) own: Vec<u8>,
    pub(super) borrowed: Region,
    /// Its place among the frames that borrow (0: it borrows nothing).
    pub(super) seq: u64,
}

impl Outgoing {
    pub(super) fn len(&self) -> usize {
        self.own.len() + self.borrowed.len
    }
}

impl<S: ByteStream> Framed<S> {
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

    pub(super) fn progress_write(&mut self) -> Result<bool> {
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
}

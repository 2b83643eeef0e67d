//! Shared memory's hand-over in place: a frame left where it arrived in the stream's buffer
//! and handed to the receiver there (no copy), or spilled into an ordinary partly read frame
//! when the buffer fills or another tag's frame is in the way.

use super::recv::Partial;
use super::{decode_header, ByteStream, Framed, HEADER_BYTES, IN_PLACE_MIN_BYTES};
use crate::{Meta, Region};

/// A frame left where it arrived (header read, payload still in the stream).
#[derive(Clone, Copy)]
pub(super) struct InPlace {
    pub(super) tag: u32,
    pub(super) len: usize,
    pub(super) meta: Meta,
}

impl<S: ByteStream> Framed<S> {
    /// Leaves the frame at the read position where it is, if it can be handed over from there:
    /// large, contiguous (not wrapping), 8-byte aligned for the reduction kernels, at most half
    /// the buffer (so it always fits), and the buffer not filling up.
    pub(super) fn leave_in_place(&mut self) -> bool {
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
    pub(super) fn take_in_place<F: FnMut(&Meta, Region) + ?Sized>(&mut self, h: InPlace, f: &mut F) -> bool {
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
    pub(super) fn spill(&mut self, h: InPlace) {
        self.in_place = None;
        self.stream.consume(HEADER_BYTES);
        let data = self.buffer(h.len);
        self.partial = Some(Partial::new(h.tag, h.meta, data, h.len));
    }
}

//! The byte-level API: buffers as bytes with an explicit [`Dtype`](crate::Dtype), for callers
//! that choose the datatype at run time (`collbench`, tools). Same semantics as the typed API;
//! the checks are [`CollectiveCall::check`]'s, plus the slices' lengths.

use topoccl_synth::schedule::Collective;

use super::Communicator;
use crate::buffer::Buffer;
use crate::call::CollectiveCall;
use crate::error::{Error, Result};

fn length(which: &str, got: usize, want: usize, esize: usize) -> Error {
    Error::InvalidArgument(format!(
        "the {which} buffer holds {} elements, the call needs {}",
        got / esize.max(1),
        want / esize.max(1)
    ))
}

impl Communicator {
    /// The buffers of `call` on a separate send and receive slice (`send_len`, `recv_len`
    /// bytes at `send` and `recv`), after checking their lengths against the call (a buffer
    /// only a root uses may have any length elsewhere).
    pub(super) fn separate(
        &self,
        call: &CollectiveCall,
        (send, send_len): (Buffer, usize),
        (recv, recv_len): (Buffer, usize),
    ) -> Result<(Buffer, Buffer)> {
        let (_, in_bytes, out_bytes) = call.bytes(self.nranks)?;
        let esize = call.dtype.size();
        if call.collective.uses_input(self.rank) && send_len != in_bytes {
            return Err(length("send", send_len, in_bytes, esize));
        }
        if call.collective.uses_output(self.rank) && recv_len != out_bytes {
            return Err(length("receive", recv_len, out_bytes, esize));
        }
        Ok((send, recv))
    }

    /// The send and receive buffers of `call` run in place on the `len` bytes at `base`,
    /// aliased as NCCL aliases in-place calls (for reduce-scatter the output is this rank's
    /// block, for all-gather the input is), after checking the length.
    pub(super) fn in_place(&self, call: &CollectiveCall, base: Buffer, len: usize) -> Result<(Buffer, Buffer)> {
        let (block, in_bytes, out_bytes) = call.bytes(self.nranks)?;
        let whole = in_bytes.max(out_bytes);
        if len != whole {
            return Err(length("in-place", len, whole, call.dtype.size()));
        }
        let mine = base.offset(self.rank as usize * block).unwrap_or(base);
        Ok(match call.collective {
            Collective::AllGather => (mine, base),
            Collective::ReduceScatter => (base, mine),
            _ => (base, base),
        })
    }

    /// Runs `call` from `send` into `recv` (lengths as the call implies, in bytes; buffers only
    /// a root uses may be empty on other ranks).
    pub fn collective_bytes(&self, call: &CollectiveCall, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (s, r) = self.separate(
            call,
            (Buffer::host(send.as_ptr()), send.len()),
            (Buffer::host(recv.as_mut_ptr()), recv.len()),
        )?;
        // SAFETY: two live slices of the lengths the call implies, borrowed (the receive buffer
        // exclusively) until the call returns.
        unsafe { self.collective_raw(call, s, r) }
    }

    /// Runs `call` in place, on one buffer aliased as NCCL aliases in-place calls: for
    /// reduce-scatter the output is this rank's block of `buf`, for all-gather the input is.
    pub fn collective_bytes_in_place(&self, call: &CollectiveCall, buf: &mut [u8]) -> Result<()> {
        let (send, recv) = self.in_place(call, Buffer::host(buf.as_mut_ptr()), buf.len())?;
        // SAFETY: both lie in `buf` (its length was checked against the call), which is
        // borrowed exclusively until the call returns.
        unsafe { self.collective_raw(call, send, recv) }
    }
}

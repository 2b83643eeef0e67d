//! The byte-level API: buffers as bytes with an explicit [`Dtype`](crate::Dtype), for callers
//! that choose the datatype at run time (`collbench`, tools). Same semantics as the typed API;
//! the checks are [`CollectiveCall::check`]'s, plus the slices' lengths.

use topoccl_synth::schedule::Collective;

use super::call::CollectiveCall;
use super::Communicator;
use crate::buffer::Buffer;
use crate::error::{Error, Result};

fn length(which: &str, got: usize, want: usize, esize: usize) -> Error {
    Error::InvalidArgument(format!(
        "the {which} buffer holds {} elements, the call needs {}",
        got / esize.max(1),
        want / esize.max(1)
    ))
}

impl Communicator {
    /// Runs `call` from `send` into `recv` (lengths as the call implies, in bytes; buffers only
    /// a root uses may be empty on other ranks).
    pub fn collective_bytes(&self, call: &CollectiveCall, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (_, in_bytes, out_bytes) = call.bytes(self.nranks)?;
        let esize = call.dtype.size();
        if call.collective.uses_input(self.rank) && send.len() != in_bytes {
            return Err(length("send", send.len(), in_bytes, esize));
        }
        if call.collective.uses_output(self.rank) && recv.len() != out_bytes {
            return Err(length("receive", recv.len(), out_bytes, esize));
        }
        // SAFETY: two live slices of the lengths the call implies, borrowed (the receive buffer
        // exclusively) until the call returns.
        unsafe { self.collective_raw(call, Buffer::host(send.as_ptr()), Buffer::host(recv.as_mut_ptr())) }
    }

    /// Runs `call` in place, on one buffer aliased as NCCL aliases in-place calls: for
    /// reduce-scatter the output is this rank's block of `buf`, for all-gather the input is.
    pub fn collective_bytes_in_place(&self, call: &CollectiveCall, buf: &mut [u8]) -> Result<()> {
        let (block, in_bytes, out_bytes) = call.bytes(self.nranks)?;
        let whole = in_bytes.max(out_bytes);
        if buf.len() != whole {
            return Err(length("in-place", buf.len(), whole, call.dtype.size()));
        }
        let base = Buffer::host(buf.as_mut_ptr());
        let mine = base.offset(self.rank as usize * block).unwrap_or(base);
        let (send, recv) = match call.collective {
            Collective::AllGather => (mine, base),
            Collective::ReduceScatter => (base, mine),
            _ => (base, base),
        };
        // SAFETY: both lie in `buf` (its length was checked against the call), which is
        // borrowed exclusively until the call returns.
        unsafe { self.collective_raw(call, send, recv) }
    }
}

//! One collective call, described once ([`CollectiveCall`]) and validated once
//! ([`CollectiveCall::check`]), whichever API it came through: the typed slices, the byte-level
//! API, or the C ABI, which hands over raw pointers and leaves every check of counts, roots,
//! lengths, NULL buffers and placement to this module.
//!
//! Placement follows NCCL. A call is *in place* when its buffers alias the way NCCL's in-place
//! calls do (the same buffer; for all-gather the input is the rank's block of the output, for
//! reduce-scatter the output is the rank's block of the input). Any other overlap is legal in
//! the C API but no schedule is proven for it, so the executor stages the input first.

use topoccl_synth::schedule::Collective;
use topoccl_transports::{MemSpace, Region};

use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::types::{Dtype, ReduceOp, Reduction};

/// One collective call. `count` is NCCL's: elements per block (per rank for reduce-scatter's
/// output, all-gather's input and each peer's part of all-to-all); the reduction is ignored
/// where nothing is reduced, the root lives in the collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveCall {
    pub collective: Collective,
    pub dtype: Dtype,
    pub reduction: Reduction,
    pub count: usize,
}

impl CollectiveCall {
    /// `collective` of `count` elements of `dtype`, summed where it reduces.
    pub fn new(collective: Collective, dtype: Dtype, count: usize) -> CollectiveCall {
        CollectiveCall { collective, dtype, reduction: Reduction::Op(ReduceOp::Sum), count }
    }

    /// The same call with another reduction.
    pub fn reduced_with(self, reduction: impl Into<Reduction>) -> CollectiveCall {
        CollectiveCall { reduction: reduction.into(), ..self }
    }

    /// Bytes of one block (`count` elements), and of the input and the output on `nranks`.
    pub fn bytes(&self, nranks: u32) -> Result<(usize, usize, usize)> {
        let overflow = || Error::InvalidArgument(format!("count {} overflows the address space", self.count));
        let block = self.count.checked_mul(self.dtype.size()).ok_or_else(overflow)?;
        let (in_blocks, out_blocks) = self.collective.blocks(nranks);
        let input = block.checked_mul(in_blocks).ok_or_else(overflow)?;
        let output = block.checked_mul(out_blocks).ok_or_else(overflow)?;
        Ok((block, input, output))
    }

    /// Checks what the call asks of `nranks` ranks whatever its buffers: its root and counts;
    /// [`CollectiveCall::bytes`] then.
    pub(crate) fn check_shape(&self, nranks: u32) -> Result<(usize, usize, usize)> {
        self.collective.check_root(nranks as usize).map_err(Error::InvalidArgument)?;
        self.bytes(nranks)
    }

    /// Checks the call as `rank` of `nranks` runs it from `send` to `recv`: the root, the
    /// counts, buffers where this rank uses them (not NULL, inside the address space, in one
    /// memory space) and how they are placed.
    pub(crate) fn check(&self, rank: u32, nranks: u32, send: Buffer, recv: Buffer) -> Result<Checked> {
        let (block_bytes, in_bytes, out_bytes) = self.check_shape(nranks)?;
        let region = |b: Buffer, len: usize, used: bool, what: &str| -> Result<Region> {
            if !used || len == 0 {
                return Ok(Region::EMPTY);
            }
            if b.is_null() {
                return Err(Error::InvalidArgument(format!("the {what} buffer is NULL")));
            }
            let r = b.region(len);
            if r.end().is_none() {
                return Err(Error::InvalidArgument(format!(
                    "the {what} buffer of {len} bytes runs past the end of the address space"
                )));
            }
            Ok(r)
        };
        let input = region(send, in_bytes, self.collective.uses_input(rank), "send")?;
        let output = region(recv, out_bytes, self.collective.uses_output(rank), "receive")?;
        if !input.is_empty() && !output.is_empty() && input.space != output.space {
            return Err(Error::InvalidArgument(format!(
                "the send buffer is in {} and the receive buffer in {}",
                input.space, output.space
            )));
        }
        let space = if input.is_empty() { output.space } else { input.space };
        let mine = rank as usize * block_bytes;
        let in_place = match self.collective {
            Collective::AllGather => output.sub(mine, block_bytes) == Some(input),
            Collective::ReduceScatter => input.sub(mine, block_bytes) == Some(output),
            _ => input == output,
        };
        let placement = if in_place && !input.is_empty() {
            Placement::InPlace
        } else if input.overlaps(&output) {
            Placement::Overlapping
        } else {
            Placement::Apart
        };
        Ok(Checked { call: *self, block_bytes, input, output, placement, space })
    }
}

impl std::fmt::Display for CollectiveCall {
    /// `all_reduce of 1024 × float (sum)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} × {}", self.collective, self.count, self.dtype)?;
        if self.collective.reduces() {
            write!(f, " ({})", self.reduction)?;
        }
        Ok(())
    }
}

/// How a call's input and output lie relative to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// No byte in common.
    Apart,
    /// Aliased as NCCL's in-place calls are.
    InPlace,
    /// Overlapping otherwise: the input is staged before anything is written.
    Overlapping,
}

/// A call that passed [`CollectiveCall::check`]: its regions (empty where this rank does not
/// use a buffer) and their placement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checked {
    pub call: CollectiveCall,
    pub block_bytes: usize,
    pub input: Region,
    pub output: Region,
    pub placement: Placement,
    /// The memory space the call runs on (host for a call with no bytes here).
    pub space: MemSpace,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(c: Collective, count: usize) -> CollectiveCall {
        CollectiveCall::new(c, Dtype::Float32, count)
    }

    #[test]
    fn placement_follows_nccls_in_place_layouts() {
        let b = Buffer { space: crate::buffer::MemSpace::Host, addr: 4096 };
        let at = |off: usize| b.offset(off).unwrap();
        let ag = call(Collective::AllGather, 4).check(2, 4, at(32), b).unwrap();
        assert_eq!(ag.placement, Placement::InPlace);
        assert_eq!((ag.input.len, ag.output.len), (16, 64));
        let rs = call(Collective::ReduceScatter, 4).check(1, 4, b, at(16)).unwrap();
        assert_eq!(rs.placement, Placement::InPlace);
        assert_eq!(call(Collective::AllReduce, 4).check(0, 2, b, b).unwrap().placement, Placement::InPlace);
        assert_eq!(call(Collective::AllReduce, 4).check(0, 2, b, at(8)).unwrap().placement, Placement::Overlapping);
        assert_eq!(call(Collective::AllGather, 4).check(1, 4, at(32), b).unwrap().placement, Placement::Overlapping);
        assert_eq!(call(Collective::AllReduce, 4).check(0, 2, b, at(16)).unwrap().placement, Placement::Apart);
    }

    #[test]
    fn roots_nulls_and_counts_are_checked_where_used() {
        let b = Buffer::host(4096 as *const u8);
        let bad = |r: Result<Checked>| matches!(r, Err(Error::InvalidArgument(_)));
        assert!(bad(call(Collective::Broadcast { root: 4 }, 1).check(0, 4, b, b)));
        assert!(bad(call(Collective::AllReduce, 1).check(0, 4, Buffer::NULL, b)));
        assert!(bad(call(Collective::AllReduce, usize::MAX / 2).check(0, 4, b, b)));
        assert!(bad(call(Collective::AllReduce, 8).check(0, 4, Buffer::host(usize::MAX as *const u8), b)));
        // Only the root reads a broadcast's input, only the root writes a reduce's output.
        let bc = call(Collective::Broadcast { root: 1 }, 3).check(0, 2, Buffer::NULL, b).unwrap();
        assert!(bc.input.is_empty() && bc.output.len == 12);
        let r = call(Collective::Reduce { root: 1 }, 3).check(0, 2, b, Buffer::NULL).unwrap();
        assert!(r.output.is_empty() && r.input.len == 12);
        // Empty calls need no buffers.
        assert!(call(Collective::AllToAll, 0).check(0, 2, Buffer::NULL, Buffer::NULL).is_ok());
        let dev = Buffer { space: crate::buffer::MemSpace::Device(0), addr: 8192 };
        assert!(bad(call(Collective::AllReduce, 2).check(0, 2, b, dev)));
    }
}

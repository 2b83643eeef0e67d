//! The executor's local work — copy, reduce, PreMulSum's multiplication and the average's
//! division — behind one small trait, [`LocalOps`], so that the one executor runs on any
//! memory space: [`CpuOps`] for host memory, CUDA kernels on a stream for device memory
//! (`crate::cuda`; a second implementation, not a second executor). The executor never
//! touches a byte of user memory itself; it only hands [`Region`]s to these operations and to
//! the connections.
//!
//! Operations are **submitted**: each returns a [`Fence`] at once, and runs in submission
//! order (a later one never overtakes an earlier one), so the executor never waits for one
//! operation before submitting the next that uses its result. [`LocalOps::done`] says whether
//! a fence has been reached; only the host side ever needs to ask (before a connection reads
//! bytes an operation wrote). [`CpuOps`] completes everything before returning
//! ([`Fence::DONE`]).
//!
//! Host memory an implementation did not allocate itself is read before the call returns (the
//! transports lend received messages only for the call, and CUDA stages pageable memory at
//! call time); memory from [`LocalOps::alloc_host`] may be read or written until the fence.
//!
//! Every operation works on regions of equal length. Regions may alias exactly (a destination
//! that is also an operand: in place), never partly: a partial overlap is a bug in the caller,
//! reported as an error.

mod cpu;
mod reduce;

pub use cpu::CpuOps;

use std::any::Any;

use topoccl_transports::{MemSpace, Region};

use crate::error::Result;
use crate::types::{Dtype, ReduceOp};

/// Names the point an operation's submission reached, until it has completed
/// ([`LocalOps::done`]). Operations complete in submission order, so a fence that is done
/// means every operation submitted before it is done too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

impl Fence {
    /// An operation that was complete when it returned.
    pub const DONE: Fence = Fence(0);
}

/// Memory the executor keeps for a while (scratch chunks, staging copies, the slices a
/// receive-reduce-send step forwards), in the space of the operations that made it.
pub struct Workspace {
    region: Region,
    /// Whatever keeps the memory alive (host: a `Vec`); released on drop.
    _owner: Box<dyn Any + Send>,
}

impl Workspace {
    pub fn new(region: Region, owner: Box<dyn Any + Send>) -> Workspace {
        Workspace { region, _owner: owner }
    }

    pub fn region(&self) -> Region {
        self.region
    }
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace").field("region", &self.region).finish_non_exhaustive()
    }
}

/// Local work on one memory space. See the module documentation.
///
/// Every method that takes regions is `unsafe`: the caller promises that each region is
/// valid memory of a space the implementation [reaches](LocalOps::reaches), readable (and,
/// for destinations, writable), and used by nothing else while the call runs.
pub trait LocalOps: Send {
    fn name(&self) -> &'static str;
    /// Whether these operations work on memory of `space`.
    fn reaches(&self, space: MemSpace) -> bool;
    /// Submits `dst = src`.
    ///
    /// # Safety
    /// See the trait documentation; the regions must stay valid until the fence is done.
    unsafe fn copy(&mut self, dst: Region, src: Region) -> Result<Fence>;
    /// Submits `dst = a ⊕ b` with `op` on elements of `dtype` (`dst` may be `a` or `b`).
    ///
    /// # Safety
    /// As for [`LocalOps::copy`].
    unsafe fn reduce(&mut self, dtype: Dtype, op: ReduceOp, dst: Region, a: Region, b: Region) -> Result<Fence>;
    /// Submits `dst = src × scalar` (PreMulSum's multiplication; `scalar` is one element's
    /// bytes).
    ///
    /// # Safety
    /// As for [`LocalOps::copy`].
    unsafe fn scale(&mut self, dtype: Dtype, dst: Region, src: Region, scalar: &[u8]) -> Result<Fence>;
    /// Submits the division of every element of `data` by `n` (the end of an average).
    ///
    /// # Safety
    /// As for [`LocalOps::copy`].
    unsafe fn divide(&mut self, dtype: Dtype, data: Region, n: u32) -> Result<Fence>;
    /// Reads `out.len()` bytes at `src` into `out` once every operation submitted before has
    /// completed (a PreMulSum scalar kept in memory); returns with the bytes in `out`.
    ///
    /// # Safety
    /// See the trait documentation.
    unsafe fn read(&mut self, out: &mut [u8], src: Region) -> Result<()>;
    /// Whether the operation `fence` names, and so every one submitted before it, has completed.
    fn done(&mut self, fence: Fence) -> Result<bool>;
    /// A fence for everything queued on these operations so far, submitting nothing: for a run
    /// on a stream, the work before the call (a connection that reads device memory itself,
    /// from the host, waits for it). Operations that complete as they are submitted have
    /// nothing to wait for.
    fn mark(&mut self) -> Result<Fence> {
        Ok(Fence::DONE)
    }
    /// Memory of at least `bytes` bytes in this space, aligned for every element type.
    fn alloc(&mut self, bytes: usize) -> Result<Workspace>;
    /// Host memory of at least `bytes` bytes that these operations read and write
    /// asynchronously (pinned memory for a device): where the executor stages bytes a
    /// connection that cannot reach this space sends.
    fn alloc_host(&mut self, bytes: usize) -> Result<Workspace> {
        CpuOps.alloc(bytes)
    }
}

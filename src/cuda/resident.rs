//! A caller's stream as the device-resident executor's [`DeviceStream`]
//! (`crate::exec::resident`): copies (`cuMemcpyAsync`), the binding's reduction kernels, and
//! stream memory operations, all queued on the caller's own stream by the caller's thread.
//! Nothing here allocates, creates, loads or maps: the binding made all of that first.

use topoccl_transports::{MemSpace, Region};

use super::binding::{Binding, RESIDENT_WORKSPACE};
use super::kernels::{Kernel, KernelArgs};
use super::memory::copy_async;
use super::stream::StreamRef;
use crate::error::Result;
use crate::exec::resident::DeviceStream;
use crate::types::{Dtype, ReduceOp};

/// A caller's stream, with the binding's kernels, for one call of `dtype` and `op`.
pub struct CallerStream<'b> {
    binding: &'b Binding,
    stream: StreamRef,
    dtype: Dtype,
    op: ReduceOp,
    /// Operations queued so far (copies, kernels, stream memory operations).
    ops: u64,
}

impl Binding {
    /// The caller's `stream` for a device-resident call (the context must be current).
    pub fn caller_stream(&self, stream: StreamRef, dtype: Dtype, op: ReduceOp) -> CallerStream<'_> {
        CallerStream { binding: self, stream, dtype, op, ops: 0 }
    }

    /// The device-resident workspaces, made with the binding: scratch, then staging.
    pub fn resident_workspaces(&self) -> (Region, Region) {
        let space = MemSpace::Device(self.context().ordinal());
        let base = self.workspace.addr();
        (
            Region::new(space, base, RESIDENT_WORKSPACE),
            Region::new(space, base + RESIDENT_WORKSPACE, RESIDENT_WORKSPACE),
        )
    }
}

impl CallerStream<'_> {
    /// Operations queued on the stream through this so far.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// Launches the one-launch kernel of the call's datatype with `args`, `threads` wide.
    ///
    /// # Safety
    /// As [`super::kernels::Kernels::launch_ll`]'s (the context is current).
    pub(crate) unsafe fn launch_ll(&mut self, args: &crate::exec::resident::ll::LlArgs, threads: u32) -> Result<()> {
        self.ops += 1;
        // SAFETY: this fn's contract.
        unsafe { self.binding.kernels.launch_ll(self.dtype, args, threads, self.stream) }
    }

    pub(super) fn binding(&self) -> &Binding {
        self.binding
    }

    pub(super) fn stream_ref(&self) -> StreamRef {
        self.stream
    }

    /// `data /= n` (the average's division), elementwise.
    ///
    /// # Safety
    /// `data` must be device memory of the binding's device, valid until the stream has run it.
    pub unsafe fn divide(&mut self, data: Region, n: u32) -> Result<()> {
        // SAFETY: this fn's contract.
        unsafe { self.elementwise(Kernel::Divide(self.dtype), data, data, u64::from(n)) }
    }

    /// Launches `k` (divide, scale) over `dst` and `src` with the scalar `bits`.
    ///
    /// # Safety
    /// As for [`CallerStream::divide`], for both regions.
    unsafe fn elementwise(&mut self, k: Kernel, dst: Region, src: Region, bits: u64) -> Result<()> {
        let count = (dst.len / self.dtype.size()) as u64;
        let args =
            KernelArgs { dst: dst.addr as u64, a: src.addr as u64, count, scalar: bits, ..KernelArgs::default() };
        self.ops += 1;
        // SAFETY: this fn's contract; the context is current (the caller entered it).
        unsafe { self.binding.kernels.launch(k, args, self.stream) }
    }

    /// The stream waits until the call of `ticket` (queued earlier, on another stream) has
    /// ended: calls of one communicator share its workspaces, so they run one after another.
    pub fn after(&mut self, ticket: u32) -> Result<()> {
        self.ops += 1;
        // SAFETY: the binding's words live as long as it; the write this waits for was queued
        // before (an earlier call), so no queue holds this wait ahead of it.
        unsafe { self.stream.wait_value(self.binding.word_device_addr(ticket), ticket) }
    }

    /// `dst = src · scalar` (PreMulSum's multiplication), elementwise; `scalar` holds one
    /// element's bytes.
    ///
    /// # Safety
    /// As for [`CallerStream::divide`], for both regions.
    pub unsafe fn scale(&mut self, dst: Region, src: Region, scalar: &[u8]) -> Result<()> {
        let mut bits = [0u8; 8];
        let n = scalar.len().min(8);
        bits[..n].copy_from_slice(&scalar[..n]);
        // SAFETY: this fn's contract.
        unsafe { self.elementwise(Kernel::Scale(self.dtype), dst, src, u64::from_le_bytes(bits)) }
    }

    /// Writes `ticket` into the binding's word once the stream has run the call.
    pub fn finish(&mut self, ticket: u32) -> Result<()> {
        self.ops += 1;
        // SAFETY: the stream is the caller's, of the binding's context (checked at the call).
        unsafe { self.binding.complete_on(self.stream, ticket) }
    }
}

impl DeviceStream for CallerStream<'_> {
    unsafe fn copy(&mut self, dst: u64, src: u64, len: usize) -> Result<()> {
        self.ops += 1;
        // SAFETY: device memory valid until the copy has run (this fn's contract).
        unsafe { copy_async(dst as usize, src as usize, len, self.stream) }
    }

    unsafe fn reduce(&mut self, dst: u64, a: u64, b: u64, dst2: u64, len: usize) -> Result<()> {
        let args = KernelArgs { dst, dst2, a, b, count: (len / self.dtype.size()) as u64, scalar: 0 };
        self.ops += 1;
        // SAFETY: as for `copy`; the context is current.
        unsafe { self.binding.kernels.launch(Kernel::Reduce(self.dtype, self.op), args, self.stream) }
    }

    unsafe fn wait(&mut self, word: u64, value: u32) -> Result<()> {
        self.ops += 1;
        // SAFETY: a live device-mapped word (this fn's contract).
        unsafe { self.stream.wait_value(word, value) }
    }

    unsafe fn signal(&mut self, word: u64, value: u32) -> Result<()> {
        self.ops += 1;
        // SAFETY: as for `wait`.
        unsafe { self.stream.write_value(word, value) }
    }
}

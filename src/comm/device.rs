//! Device buffers through the Rust API: cudarc's slices and streams (any [`DevicePtr`]: a
//! `CudaSlice`, a `CudaView`). Calls are NCCL's kind — queued, ordered by the stream, returning
//! at once with a [`Work`] that ends when the host's part does; the data is there when the
//! stream has passed the call (`stream.synchronize()`, or any later work on it).
//!
//! cudarc's own ordering holds: the pointers are taken with the stream, so a slice written
//! on another stream is waited for first, and later uses of the slices wait for the call.
//! Raw device pointers with a stream go through [`Communicator::submit_on`].
//!
//! ```no_run
//! # fn f(comm: &topoccl::Communicator) -> Result<(), Box<dyn std::error::Error>> {
//! use cudarc::driver::CudaContext;
//! let stream = CudaContext::new(0)?.default_stream();
//! let send = stream.clone_htod(&vec![1.0f32; 1024])?;
//! let mut recv = stream.alloc_zeros::<f32>(1024)?;
//! comm.all_reduce_device(&send, &mut recv, topoccl::ReduceOp::Sum, &stream)?;
//! let sums = stream.clone_dtoh(&recv)?; // waits for the all-reduce
//! # Ok(()) }
//! ```

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use topoccl_synth::schedule::Collective;

use super::group::Group;
use super::work::Work;
use super::Communicator;
use crate::buffer::Buffer;
use crate::call::CollectiveCall;
use crate::cuda::StreamRef;
use crate::error::{Error, Result};
use crate::types::{Element, ReduceOp};

fn bytes<T>(len: usize) -> usize {
    len * std::mem::size_of::<T>()
}

fn typed<T: Element>(call: &CollectiveCall) -> Result<()> {
    if call.dtype != T::DTYPE {
        return Err(Error::InvalidArgument(format!("a call of {} on a buffer of {}", call.dtype, T::DTYPE)));
    }
    Ok(())
}

impl Communicator {
    /// Queues `call` from `send` to `recv` (device buffers of the lengths the call implies) on
    /// `stream`.
    pub fn submit_device<T: Element>(
        &self,
        call: &CollectiveCall,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<Work> {
        typed::<T>(call)?;
        let (s, _read) = send.device_ptr(stream);
        let send_len = bytes::<T>(send.len());
        let recv_len = bytes::<T>(recv.len());
        let (r, _written) = recv.device_ptr_mut(stream);
        let (s, r) =
            self.separate(call, (Buffer::at(s as *const u8), send_len), (Buffer::at(r as *const u8), recv_len))?;
        // SAFETY: both slices are device memory of the lengths the call implies; cudarc keeps
        // them alive and unwritten by others until the stream has passed the work enqueued
        // before the guards above record their events (after the call's wait).
        unsafe { self.submit_on(call, s, r, StreamRef(stream.cu_stream())) }
    }

    /// Queues `call` in place on one device buffer (aliased as NCCL aliases in-place calls).
    pub fn submit_device_in_place<T: Element>(
        &self,
        call: &CollectiveCall,
        buf: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<Work> {
        typed::<T>(call)?;
        let len = bytes::<T>(buf.len());
        let (p, _written) = buf.device_ptr_mut(stream);
        let (s, r) = self.in_place(call, Buffer::at(p as *const u8), len)?;
        // SAFETY: as in `submit_device`.
        unsafe { self.submit_on(call, s, r, StreamRef(stream.cu_stream())) }
    }

    /// All-reduce of device buffers on `stream`.
    pub fn all_reduce_device<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<Work> {
        let call = CollectiveCall::new(Collective::AllReduce, T::DTYPE, send.len()).reduced_with(op);
        self.submit_device(&call, send, recv, stream)
    }
}

impl Group<'_, '_> {
    /// Adds a send of a device buffer.
    ///
    /// # Safety
    /// The buffer must stay valid and unwritten until the stream the group is submitted on
    /// has passed it ([`Group::submit_on`]).
    pub unsafe fn send_device<T: Element>(
        &mut self,
        data: &impl DevicePtr<T>,
        peer: u32,
        stream: &CudaStream,
    ) -> Result<()> {
        let (p, _read) = data.device_ptr(stream);
        // SAFETY: this fn's contract.
        unsafe { self.send_raw(Buffer::at(p as *const u8), T::DTYPE, data.len(), peer) }
    }

    /// Adds a receive into a device buffer.
    ///
    /// # Safety
    /// As for [`Group::send_device`], and nothing else may use the buffer meanwhile.
    pub unsafe fn recv_device<T: Element>(
        &mut self,
        data: &mut impl DevicePtrMut<T>,
        peer: u32,
        stream: &CudaStream,
    ) -> Result<()> {
        let len = data.len();
        let (p, _written) = data.device_ptr_mut(stream);
        // SAFETY: this fn's contract.
        unsafe { self.recv_raw(Buffer::at(p as *const u8), T::DTYPE, len, peer) }
    }
}

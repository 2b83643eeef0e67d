//! Calls ordered by a CUDA stream, as NCCL's are: `ncclAllReduce(..., stream)` enqueues and
//! returns; the call starts after the work already on the stream, and the stream's later work
//! waits for its end (how, without a kernel of ours on the caller's stream, is
//! [`crate::cuda::Binding`]'s to tell). The buffers may be device memory (then the executor's
//! device operations run the call) or host memory (then it waits on the host for the
//! stream's earlier work).
//!
//! A communicator is bound to one CUDA context: the first call on a stream binds it to the
//! stream's context (for the legacy default stream, the context current on the calling
//! thread), or [`Config::cuda_device`](super::Config) binds it at init (the C ABI's
//! `ncclCommInitRank` sets it to the device current on the calling thread, as NCCL binds).

use std::sync::Arc;

use super::group::Group;
use super::work::{Task, Work};
use super::{CallState, Communicator};
use crate::buffer::Buffer;
use crate::call::CollectiveCall;
use crate::cuda::{Binding, Context, StreamRef};
use crate::error::{Error, Result};
use crate::exec::job::Job;

impl Communicator {
    /// The communicator's device binding, checked against `stream` (made from the stream's
    /// context by the first call).
    fn binding_for(calls: &mut CallState, stream: StreamRef) -> Result<Arc<Binding>> {
        if let Some(b) = &calls.binding {
            b.check_stream(stream)?;
            return Ok(b.clone());
        }
        crate::cuda::driver()?;
        // The binding allocates, registers and loads: allowed even inside the caller's capture.
        let _relaxed = crate::cuda::RelaxedCapture::enter()?;
        let raw = match stream.context()? {
            Some(c) => c,
            None => Context::current()?.ok_or_else(|| {
                Error::Cuda(
                    "no CUDA context: the legacy default stream was given and none is current on this thread".into(),
                )
            })?,
        };
        // SAFETY: the caller's context outlives the communicator (NCCL's contract: a
        // communicator is used with its device's context until destroyed).
        let ctx = unsafe { Context::adopt(raw) }?;
        let b = Binding::new(ctx)?;
        calls.binding = Some(b.clone());
        Ok(b)
    }

    /// Checks that calls on `stream` can run here (binding the communicator to the stream's
    /// context if it is not bound yet), queuing nothing.
    pub fn check_stream(&self, stream: StreamRef) -> Result<()> {
        let mut calls = self.calls();
        Communicator::binding_for(&mut calls, stream)?;
        stream.not_capturing()
    }

    /// The CUDA device this communicator runs device calls on (`ncclCommCuDevice`): the one it
    /// is bound to, else the device of the context current on this thread.
    pub fn cuda_device(&self) -> Result<u32> {
        if let Some(b) = &self.calls().binding {
            return Ok(b.context().ordinal());
        }
        let raw = Context::current()?.ok_or_else(|| {
            Error::Cuda("no CUDA device: the communicator has run no call on a stream and no context is current".into())
        })?;
        // SAFETY: the context is current on this thread, so alive for this call.
        Ok(unsafe { Context::borrowed(raw) }?.ordinal())
    }

    /// Queues `call` from `send` to `recv` ordered by `stream` (NCCL's collectives with a
    /// stream) and returns at once. The [`Work`] ends when the host's part does; the buffers
    /// are ready when the stream has passed the call.
    ///
    /// # Safety
    /// As for [`Communicator::collective_raw`], until the stream has passed the call; `stream`
    /// must be a live stream (or [`StreamRef::LEGACY`]) of the context this communicator uses.
    pub unsafe fn submit_on(
        &self,
        call: &CollectiveCall,
        send: Buffer,
        recv: Buffer,
        stream: StreamRef,
    ) -> Result<Work> {
        self.usable()?;
        let mut calls = self.calls();
        let binding = Communicator::binding_for(&mut calls, stream)?;
        let captured = stream.capturing()?;
        let Some(mut task) = self.prepare(&mut calls, call, send, recv)? else { return Ok(Work::done(&self.runner)) };
        if let Some(job) = self.resident_job(&mut calls, &binding, &task, stream, captured)? {
            return Ok(self.runner.submit(Task { job, refine: None, agreement: task.agreement.take() }));
        }
        if captured {
            // Every rank decides alike (the call, the plan, the agreed links), so every rank
            // refuses alike; the agreement is every rank's, whatever became of the call.
            if let Some(a) = task.agreement.take() {
                drop(self.runner.submit(*a));
            }
            return Err(Error::InvalidArgument(format!(
                "{call} cannot be captured into a CUDA graph: capturable calls run device-resident (device \
                 buffers, every rank a CUDA IPC peer) and, where ranks share one CUDA context, as one kernel \
                 (at most {} KiB, at most 8 ranks, TOPOCCL_DEVICE_LL=2)",
                super::resident::LL_CALL_BYTES >> 10
            )));
        }
        if let Job::Collective(c) = &task.job {
            if self.stages(&binding, c.checked.space) {
                return self.submit_staged(&mut calls, &binding, task, stream);
            }
        }
        let sync = match binding.attach(stream) {
            Ok(s) => s,
            Err(e) => {
                // The agreement is every rank's, whatever became of this rank's call.
                if let Some(a) = task.agreement.take() {
                    drop(self.runner.submit(*a));
                }
                return Err(e);
            }
        };
        if let Job::Collective(c) = &mut task.job {
            c.sync = Some(sync);
        }
        Ok(self.runner.submit(task))
    }
}

impl Group<'_, '_> {
    /// Queues every collected transfer ordered by `stream` (`ncclGroupEnd` after sends and
    /// receives with a stream) and returns at once.
    ///
    /// # Safety
    /// As for [`Group::submit`], until the stream has passed the transfers.
    pub unsafe fn submit_on(self, stream: StreamRef) -> Result<Work> {
        let comm = self.comm();
        let mut calls = comm.calls();
        let binding = Communicator::binding_for(&mut calls, stream)?;
        stream.not_capturing()?;
        let Some(mut job) = self.prepare(&mut calls)? else { return Ok(Work::done(&comm.runner)) };
        if let Job::Transfers(t) = job {
            if comm.stages(&binding, t.space()?) {
                return comm.submit_staged_transfers(&mut calls, &binding, t, stream);
            }
            job = Job::Transfers(t);
        }
        let sync = binding.attach(stream)?;
        if let Job::Transfers(t) = &mut job {
            t.sync = Some(sync);
        }
        Ok(comm.runner.submit(job.into()))
    }
}

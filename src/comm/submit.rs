//! Submitting calls: checked and planned under the communicator's `CallState` lock (so the queue's
//! order is the call order on every thread), then run on the caller's thread or queued
//! ([`super::work`]). The blocking calls of the typed and byte-level APIs come through
//! [`Communicator::collective_raw`]; [`Communicator::submit`] returns at once.
//!
//! The asynchronous calls either take raw buffers (`unsafe`: the caller keeps them valid until
//! the work completes, NCCL's contract) or own theirs ([`Pending`]): the buffers travel with
//! the work and come back from [`Pending::wait`], and a `Pending` dropped early waits for its
//! call first, so its memory is never freed while the executor still uses it.

use super::agree::Refine;
use super::work::{Task, Work};
use super::{CallState, Communicator};
use crate::buffer::Buffer;
use crate::call::CollectiveCall;
use crate::error::{Error, Result};
use crate::exec::job::{CollectiveJob, Job};
use crate::tuner::Choice;
use crate::types::Element;
use crate::wire::{reduction_code, CallHeader, Called};

impl Communicator {
    /// What this communicator runs `call` with: the algorithm and its knobs.
    pub fn algorithm_for(&self, call: &CollectiveCall) -> Result<Choice> {
        let block_bytes = call.count.saturating_mul(call.dtype.size());
        self.calls().planner.choice(call.collective, block_bytes)
    }

    /// What the tuner expects `call` to take on this communicator's topology, in
    /// microseconds: the simulated time of the schedule it would run (`ncclGroupSimulateEnd`).
    pub fn estimate_us(&self, call: &CollectiveCall) -> Result<f64> {
        call.check_shape(self.nranks)?;
        if call.count == 0 {
            return Ok(0.0);
        }
        let block_bytes = call.count.saturating_mul(call.dtype.size());
        self.calls().planner.estimate_us(call.collective, block_bytes)
    }

    /// Checks and plans `call` and numbers it, under the `CallState` lock (`calls`); `None` for an
    /// empty call (it only counts).
    pub(super) fn prepare(
        &self,
        calls: &mut CallState,
        call: &CollectiveCall,
        send: Buffer,
        recv: Buffer,
    ) -> Result<Option<Task>> {
        let checked = call.check(self.rank, self.nranks, send, recv)?;
        if call.count == 0 {
            calls.seq = calls.seq.wrapping_add(1);
            return Ok(None);
        }
        // Planning depends only on what every rank shares, so it fails alike everywhere and
        // leaves the ranks in step; so does a checkpoint (`super::agree`), which may put an
        // agreement ahead of this call.
        let mut agreement = self.checkpoint(calls)?;
        if calls.resident.is_some() {
            if let Some(a) = agreement.take() {
                // A device-resident call cannot have its schedule switched once it is on the
                // stream, so where calls may run so, every agreement runs before the call it
                // precedes is planned: every rank then plans this call, and the later ones,
                // alike (`super::resident`). Only checkpoints wait (for the calls before them).
                self.runner.submit(*a).wait()?;
            }
        }
        let (plan, quick) = calls.planner.plan(call.collective, call.dtype.size(), call.count)?;
        let header = call_header(call, calls.seq, plan.hash);
        calls.seq = calls.seq.wrapping_add(1);
        let refine = quick.map(|key| Box::new(Refine::Quick { key, refinements: calls.planner.tuner.refinements() }));
        let job = Job::Collective(CollectiveJob { checked, plan, header, sync: None });
        Ok(Some(Task { job, refine, agreement }))
    }

    /// Checks `call` from `send` to `recv` as it would run, queuing nothing: a group checks every
    /// call so before it queues any, so that a bad one fails the group whole (NCCL's rule).
    pub fn check_call(&self, call: &CollectiveCall, send: Buffer, recv: Buffer) -> Result<()> {
        self.usable()?;
        call.check(self.rank, self.nranks, send, recv).map(drop)
    }

    /// Runs `call` from `send` to `recv`, as NCCL's C API does: the lengths follow from the
    /// call, buffers only a root uses may be NULL elsewhere, and buffers may alias (NCCL's
    /// in-place layouts run in place; any other overlap is staged). Returns once the call is
    /// done.
    ///
    /// # Safety
    /// Where this rank uses them, `send` must be valid for reads and `recv` for writes of the
    /// bytes the call implies, in memory this communicator reaches, and nothing else may write
    /// either (or read `recv`) until the call returns.
    pub unsafe fn collective_raw(&self, call: &CollectiveCall, send: Buffer, recv: Buffer) -> Result<()> {
        self.usable()?;
        let mut calls = self.calls();
        match self.prepare(&mut calls, call, send, recv)? {
            Some(job) => self.runner.run_blocking(calls, job),
            None => Ok(()),
        }
    }

    /// Queues `call` from `send` to `recv` and returns at once; the [`Work`] says when it is
    /// done. Calls run in the order they were submitted, blocking ones included.
    ///
    /// # Safety
    /// As for [`Communicator::collective_raw`], until the work has completed (its `wait`
    /// returned, or its `test` said it is done) rather than until this returns.
    pub unsafe fn submit(&self, call: &CollectiveCall, send: Buffer, recv: Buffer) -> Result<Work> {
        self.usable()?;
        let mut calls = self.calls();
        Ok(match self.prepare(&mut calls, call, send, recv)? {
            Some(job) => self.runner.submit(job),
            None => Work::done(&self.runner),
        })
    }

    /// Queues `call` on buffers it owns until the call is done: `send` is read, `recv`
    /// written (lengths as [`Communicator::collective_bytes`] requires); both come back from
    /// [`Pending::wait`]. In place: pass an empty `send` and the one buffer as `recv`.
    pub fn submit_owned<T: Element>(
        &self,
        call: &CollectiveCall,
        send: Vec<T>,
        mut recv: Vec<T>,
    ) -> Result<Pending<(Vec<T>, Vec<T>)>> {
        if call.dtype != T::DTYPE {
            return Err(Error::InvalidArgument(format!("a call of {} on a buffer of {}", call.dtype, T::DTYPE)));
        }
        let (sent, recv_bytes) = (std::mem::size_of_val(&send[..]), std::mem::size_of_val(&recv[..]));
        let base = Buffer::host(recv.as_mut_ptr());
        let (s, r) = if send.is_empty() && call.count > 0 {
            self.in_place(call, base, recv_bytes)?
        } else {
            self.separate(call, (Buffer::host(send.as_ptr()), sent), (base, recv_bytes))?
        };
        // SAFETY: both vectors move into the `Pending`, which keeps their heap blocks alive
        // (moving a Vec does not move its elements) and waits for the call before handing them
        // back or dropping them.
        let work = unsafe { self.submit(call, s, r)? };
        Ok(Pending { work, buffers: Some((send, recv)) })
    }
}

/// The wire header of the collective call numbered `seq`, run with the schedule of
/// `schedule_hash`.
pub(super) fn call_header(call: &CollectiveCall, seq: u32, schedule_hash: u32) -> CallHeader {
    CallHeader {
        seq,
        called: Called::Collective(call.collective),
        dtype: call.dtype,
        op: reduction_code(call.reduction),
        count: call.count as u64,
        schedule: schedule_hash,
    }
}

/// A queued call that owns its buffers; see the module documentation.
#[must_use = "a pending call is waited for when dropped"]
pub struct Pending<B> {
    work: Work,
    buffers: Option<B>,
}

impl<B> Pending<B> {
    /// Waits for the call; its buffers back, or its error (the buffers are dropped then).
    pub fn wait(mut self) -> Result<B> {
        let r = self.work.wait();
        let b = self.buffers.take().ok_or_else(|| Error::Internal("buffers taken twice".into()))?;
        r.map(|()| b)
    }

    /// The call's handle (test, error, a wait with a timeout).
    pub fn work(&self) -> &Work {
        &self.work
    }
}

impl<B> Drop for Pending<B> {
    fn drop(&mut self) {
        if self.buffers.is_some() {
            // The executor may still use the buffers: wait before they are freed.
            let _ = self.work.wait();
        }
    }
}

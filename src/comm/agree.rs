//! Switching sizes from the tuner's quick choice to its full decision at the same call on every
//! rank, without a call waiting.
//!
//! A size's first call runs the quick choice while each rank's tuner decides the size in full
//! in the background ([`crate::tuner::Selector::decide`]), each rank at its own pace. A rank
//! that switched alone would run another schedule than its peers (its calls would fail as
//! mismatched), so the ranks agree first, in call order:
//!
//! - **Checkpoints** are counted in collective calls, which every rank makes alike: once some
//!   size ran a quick choice, after [`FIRST_INTERVAL`] calls, then at doubling intervals up to
//!   [`LONGEST_INTERVAL`], from the start again whenever another size runs a quick choice.
//! - At a checkpoint the submitting side queues an **agreement** ahead of the call (with it: the
//!   runner of the call runs the agreement first, [`super::work::Task::agreement`]): a one-byte-per-size
//!   all-reduce (minimum), over every size ever planned on a quick choice, of whether this rank
//!   has the size's decision. The bytes are filled when the executor reaches it, and its result
//!   switches the sizes every rank has ([`Refinements::switch`]) right there in the queue: every
//!   call after it in the queue runs them switched, on every rank, the calls planned before it
//!   included ([`before_run`] swaps their plans).
//! - An agreement that finds every size switched already, when the executor reaches it, does
//!   nothing (no message). That is safe to do alone: a size is switched only by an agreement,
//!   which all ranks ran at the same place in their queues, so where one rank's executor sees
//!   every size switched, every rank's does at that place. The agreement is queued all the same
//!   (the submitting side cannot know what the executor will see), numbered as a call of its own.
//!
//! Nothing waits: the submitting side reads no agreement's result, and the executor finds in
//! [`Refinements`] what the background thread made. An agreement that fails (a peer died) has
//! no caller: the next call fails with its error.

use std::sync::Arc;

use super::plan::plan_of;
use super::submit::call_header;
use super::work::Task;
use super::{CallState, Communicator};
use crate::buffer::Buffer;
use crate::call::CollectiveCall;
use crate::error::Result;
use crate::exec::job::{CollectiveJob, Job};
use crate::tuner::{DecisionKey, Refinements};
use crate::types::{Dtype, ReduceOp};
use topoccl_synth::schedule::Collective;

/// Calls from the first quick call of a size to the first checkpoint.
pub(super) const FIRST_INTERVAL: u32 = 4;
/// The longest interval between checkpoints: a size decided in the background runs its quick
/// choice for at most about this many calls more.
pub(super) const LONGEST_INTERVAL: u32 = 64;

/// What a collective job does about the tuner's background decisions.
pub(crate) enum Refine {
    /// It runs the quick choice of `key`: switched to the full decision if the ranks agreed on
    /// it after the job was planned.
    Quick { key: DecisionKey, refinements: Arc<Refinements> },
    /// It is an agreement on `keys`; `flags` is its buffer.
    Agreement { keys: Vec<DecisionKey>, refinements: Arc<Refinements>, flags: Vec<u8> },
}

/// The checkpoint count of one communicator's calls (in its `CallState`).
pub(super) struct Checkpoints {
    /// Sizes planned on a quick choice when counting last restarted.
    sizes: usize,
    since: u32,
    interval: u32,
}

impl Default for Checkpoints {
    fn default() -> Checkpoints {
        Checkpoints { sizes: 0, since: 0, interval: FIRST_INTERVAL }
    }
}

impl Communicator {
    /// Counts one collective call about to be planned, under the `CallState` lock; at a
    /// checkpoint, the agreement to run ahead of it (see the module documentation).
    pub(super) fn checkpoint(&self, calls: &mut CallState) -> Result<Option<Box<Task>>> {
        let sizes = calls.planner.quick.len();
        if sizes == 0 {
            return Ok(None);
        }
        let c = &mut calls.checkpoints;
        if c.sizes != sizes {
            *c = Checkpoints { sizes, ..Checkpoints::default() };
        }
        c.since += 1;
        if c.since < c.interval {
            return Ok(None);
        }
        c.since = 0;
        c.interval = (c.interval * 2).min(LONGEST_INTERVAL);
        let refinements = calls.planner.tuner.refinements();
        let keys = calls.planner.quick.clone();
        // Its buffer travels in the job; its result is read by the executor.
        Ok(Some(Box::new(self.agreement(calls, keys, refinements)?)))
    }

    /// The all-reduce (minimum) of one byte per size of `keys`, in place in its own buffer.
    fn agreement(&self, calls: &mut CallState, keys: Vec<DecisionKey>, refinements: Arc<Refinements>) -> Result<Task> {
        let mut flags = vec![0u8; keys.len()];
        let call = CollectiveCall::new(Collective::AllReduce, Dtype::Uint8, flags.len()).reduced_with(ReduceOp::Min);
        // The buffer moves into the job below; moving a Vec does not move its heap block, which
        // lives as long as the job.
        let (send, recv) = self.in_place(&call, Buffer::host(flags.as_mut_ptr()), flags.len())?;
        let checked = call.check(self.rank, self.nranks, send, recv)?;
        let plan = calls.planner.internal_plan(call.collective, 1, call.count)?;
        // Numbered as a call of its own, so that the diagnosis tells it from its neighbours.
        let header = call_header(&call, calls.seq, plan.hash);
        calls.seq = calls.seq.wrapping_add(1);
        Ok(Task {
            job: Job::Collective(CollectiveJob { checked, plan, header, sync: None }),
            refine: Some(Box::new(Refine::Agreement { keys, refinements, flags })),
            agreement: None,
        })
    }
}

/// Readies `job`, whose part is `refine`, just before the executor runs it, in queue order;
/// whether to run it (an agreement with nothing left to agree on is skipped). A quick call
/// whose size was switched since it was planned gets the full decision's plan; an agreement
/// gets this rank's answers.
pub(crate) fn before_run(refine: &mut Refine, job: &mut CollectiveJob, rank: u32) -> bool {
    match refine {
        Refine::Quick { key, refinements } => {
            if let Some((choice, schedule)) = refinements.switched(key) {
                let call = job.checked.call;
                let plan = plan_of(rank, &choice, schedule, call.dtype.size(), call.count);
                job.header.schedule = plan.hash;
                job.plan = Arc::new(plan);
            }
            true
        }
        Refine::Agreement { keys, refinements, flags } => {
            if refinements.all_switched(keys) {
                return false;
            }
            for (flag, key) in flags.iter_mut().zip(keys.iter()) {
                *flag = u8::from(refinements.made(key));
            }
            true
        }
    }
}

/// Whether `task` is one nobody waits for (an agreement).
pub(crate) fn unwaited(task: &Task) -> bool {
    matches!(task.refine.as_deref(), Some(Refine::Agreement { .. }))
}

/// After a job whose part is `refine` ran: an agreement switches the sizes every rank had.
pub(crate) fn after_run(refine: &Refine) {
    if let Refine::Agreement { keys, refinements, flags } = refine {
        for (key, _) in keys.iter().zip(flags).filter(|(_, &f)| f == 1) {
            // Every rank had it, this one included.
            let _ = refinements.switch(key);
        }
    }
}

//! The communicator's side of device-resident calls (`crate::exec::resident`): which calls
//! run so, and queueing them on the caller's stream from the caller's thread.
//!
//! A call runs device-resident when every rank of the communicator reaches every other by
//! CUDA IPC (agreed at init, so that all ranks decide alike), its buffers are device memory,
//! and it fits what the binding and the windows hold: its input within the binding's staging
//! workspace, its scratch within the scratch workspace, each peer's messages within the pair's
//! resident window. Everything else is staged through pinned host slots (`super::staged`):
//! PreMulSum with a scalar in device memory, schedules that need padded chunks, grouped
//! send/recv, calls larger than the workspaces or windows.
//!
//! Every rank decides from what all of them share (the call, the schedule, the agreed links),
//! never from what only it sees (its placement, its buffers' addresses), so the ranks of a call
//! always take the same path. The schedule is the one the call was planned with: a call on the
//! stream cannot be switched to the tuner's full decision later, as a queued host-driven call
//! is (`super::agree`), so on a communicator that runs calls device-resident every agreement
//! runs before the call it precedes is planned (`Communicator::prepare`), and all ranks plan
//! alike.

use std::sync::Arc;
use std::time::Instant;

use topoccl_transports::ipc::{DevicePeer, ResidentLink};
use topoccl_transports::MemSpace;

use super::work::Task;
use super::{CallState, Communicator};
use crate::call::Placement;
use crate::cuda::{Binding, Outstanding, StreamRef};
use crate::error::Result;
use crate::exec::job::{Job, ResidentJob};
use crate::exec::memory::{Memory, INPUT, OUTPUT, SCRATCH};
use crate::exec::resident::{emit, release_of, Counts, DeviceStream, Gate};
use crate::types::{ReduceOp, Reduction, Scalar};

/// The device-resident side of a communicator: a link per rank, and the counts its words
/// carry so far.
pub(crate) struct ResidentSide {
    links: Vec<Option<ResidentLink>>,
    counts: Vec<Counts>,
    /// Calls queued device-resident so far.
    queued: u64,
    /// Keep the windows and pages the links name alive.
    _peers: Vec<Arc<DevicePeer>>,
}

impl ResidentSide {
    /// The side over `peers` (one per rank, `None` for this rank), if every other rank is one.
    pub(crate) fn new(rank: u32, peers: Vec<Option<Arc<DevicePeer>>>) -> Option<ResidentSide> {
        let all = peers.iter().enumerate().all(|(r, p)| r as u32 == rank || p.is_some());
        if !all || peers.len() < 2 {
            return None;
        }
        let links = peers.iter().map(|p| p.as_ref().map(|p| p.link)).collect();
        let counts = vec![Counts::default(); peers.len()];
        Some(ResidentSide { links, counts, queued: 0, _peers: peers.into_iter().flatten().collect() })
    }
}

impl Communicator {
    /// How many calls ran device-resident (queued whole on their caller's stream) so far; `None`
    /// where none can (not every rank reaches every other by CUDA IPC, or
    /// `TOPOCCL_DEVICE_RESIDENT=0`).
    pub fn device_resident_calls(&self) -> Option<u64> {
        self.calls().resident.as_ref().map(|s| s.queued)
    }

    /// Queues `task` (a collective just prepared) on `stream` device-resident, if it runs so:
    /// the job that watches it, else `None` (the task is staged, or runs host-driven).
    pub(super) fn resident_job(
        &self,
        calls: &mut CallState,
        binding: &Arc<Binding>,
        task: &Task,
        stream: StreamRef,
    ) -> Result<Option<Job>> {
        let Job::Collective(job) = &task.job else { return Ok(None) };
        if calls.resident.is_none() {
            return Ok(None);
        }
        let c = job.checked;
        let call = c.call;
        // PreMulSum's scalar: by value only (one in memory is read when the call runs: staged).
        let scalar = match call.reduction {
            Reduction::PreMulSum(Scalar::Value(v)) if call.collective.reduces() => Some(v),
            Reduction::PreMulSum(_) => return Ok(None),
            _ => None,
        };
        if !matches!(c.space, MemSpace::Device(d) if d == binding.context().ordinal()) {
            return Ok(None);
        }
        let (scratch, stage) = binding.resident_workspaces();
        let (in_blocks, _) = call.collective.blocks(self.nranks);
        if in_blocks * c.block_bytes > stage.len {
            return Ok(None);
        }
        let plan = job.plan.clone();
        let last = calls.device_last;
        let Some(side) = calls.resident.as_mut() else { return Ok(None) };
        let Ok(prog) = plan.resident() else { return Ok(None) };
        if plan.padded || plan.scratch_bytes > scratch.len || !prog.fits(&side.links) {
            return Ok(None);
        }
        let stage_in = !c.input.is_empty()
            && (scalar.is_some()
                || c.placement == Placement::Overlapping
                || (c.placement == Placement::InPlace && !plan.schedule.in_place));
        let input = if stage_in { stage.sub(0, c.input.len).unwrap_or(stage) } else { c.input };
        let mut mem = Memory::new();
        mem.readable(INPUT, input);
        mem.writable(OUTPUT, c.output);
        mem.writable(SCRATCH, scratch.sub(0, plan.scratch_bytes).unwrap_or(scratch));

        let _current = binding.context().enter()?;
        let release = release_of(prog, &side.links, &side.counts)?;
        let ticket = binding.next_ticket();
        let outstanding = Outstanding::begin();
        let gate = Gate { deadline: Instant::now() + self.config.timeout, abort: &self.runner.abort, rank: self.rank };
        let mut s = binding.caller_stream(stream, call.dtype, call.reduction.op());
        // SAFETY: the caller's buffers are valid device memory until the stream has passed the
        // call (`submit_on`'s contract); the workspaces and windows live with the binding and
        // the links, longer than any stream's use of them.
        let queued = unsafe {
            (|| -> Result<()> {
                if let Some((_, prev)) = last.filter(|(last, _)| *last != stream) {
                    s.after(prev)?;
                }
                match scalar {
                    Some(v) => s.scale(input, c.input, &v[..call.dtype.size()])?,
                    None if stage_in => s.copy(input.addr as u64, c.input.addr as u64, c.input.len)?,
                    None => {}
                }
                emit(prog, &mem, &side.links, &mut side.counts, &mut s, &gate)?;
                if call.reduction == Reduction::Op(ReduceOp::Avg) && !c.output.is_empty() {
                    s.divide(c.output, self.nranks)?;
                }
                s.finish(ticket)
            })()
        };
        let failed = queued.err();
        side.queued += 1;
        calls.device_last = Some((stream, ticket));
        if failed.is_some() {
            // Whatever was queued may wait on words no peer will write now: let it through.
            release.release();
            binding.complete_from_host(ticket);
        }
        Ok(Some(Job::Resident(ResidentJob {
            binding: binding.clone(),
            ticket,
            release,
            failed,
            header: job.header,
            outstanding,
        })))
    }
}

//! Running one planned call on the executor: a collective (staging where its placement or
//! layout needs it, PreMulSum's multiplication, the engine, the average's division), or a batch
//! of point-to-point transfers. Every byte of work goes through the executor's
//! [`LocalOps`](super::ops::LocalOps).
//!
//! The schedule cuts each block of the data (the whole buffer, or one rank's part for
//! reduce-scatter, all-gather and all-to-all) into `k` chunks, uneven by at most one element
//! where `k` does not divide the block. Staging happens only where it must: a schedule that
//! does not fit uneven chunks runs on padded copies of equal chunks (the result copied back);
//! an input that overlaps the output other than in NCCL's in-place layouts, or in place where
//! the schedule is not proven correct in place, is copied first; a PreMulSum input is
//! multiplied into a copy. Everything else runs straight on the caller's memory.

use std::sync::Arc;

use topoccl_transports::{Meta, Region};

use super::engine::{self, Resources};
use super::memory::{MemId, Memory, Span, INPUT, OUTPUT, SCRATCH};
use super::ops::Workspace;
use super::program::Program;
use super::wire::CallHeader;
use super::Executor;
use crate::comm::call::{Checked, Placement};
use crate::comm::plan::Plan;
use crate::error::{Error, Result};
use crate::types::{Dtype, ReduceOp, Reduction, Scalar};

/// A collective, checked and planned.
pub(crate) struct CollectiveJob {
    pub checked: Checked,
    pub plan: Arc<Plan>,
    pub header: CallHeader,
}

/// One send or receive of a batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transfer {
    pub send: bool,
    pub peer: u32,
    pub region: Region,
    /// The header its messages carry.
    pub meta: Meta,
    /// The message stream it belongs to (`program::P2P_TAG` or `PUT_TAG`).
    pub tag: u32,
}

/// Sends and receives that run together (a group's, or a lone call's).
pub(crate) struct TransferJob {
    pub transfers: Vec<Transfer>,
}

impl Executor {
    /// A workspace of at least `bytes`, kept between calls.
    fn grow(ops: &mut dyn super::ops::LocalOps, w: &mut Option<Workspace>, bytes: usize) -> Result<Region> {
        if w.as_ref().map_or(true, |w| w.region().len < bytes) {
            *w = Some(ops.alloc(bytes)?);
        }
        Ok(w.as_ref().map_or(Region::EMPTY, |w| w.region()))
    }

    /// Runs a collective to completion.
    ///
    /// # Safety
    /// The job's regions must be valid memory the local operations reach, used by nothing
    /// else until this returns.
    pub(crate) unsafe fn run_collective(&mut self, job: &CollectiveJob) -> Result<()> {
        let Checked { call, block_bytes, input, output, placement } = job.checked;
        self.reach(&[input, output])?;
        let plan = &*job.plan;
        let nranks = self.nranks;
        let (in_blocks, out_blocks) = call.collective.blocks(nranks);
        let reduces = call.collective.reduces();
        let scalar = match call.reduction {
            Reduction::PreMulSum(s) if reduces && !input.is_empty() => Some(self.scalar(call.dtype, s)?),
            _ => None,
        };
        let stride = if plan.padded { plan.layout.offset(plan.k) } else { block_bytes };
        let stage_in = plan.padded
            || scalar.is_some()
            || placement == Placement::Overlapping
            || (placement == Placement::InPlace && !plan.schedule.in_place);
        let ops = &mut *self.ops;
        let scratch = Executor::grow(ops, &mut self.scratch, plan.scratch_bytes)?.sub(0, plan.scratch_bytes);
        let mut mem = Memory::new();
        mem.writable(SCRATCH, scratch.unwrap_or(Region::EMPTY));
        let staged_in = if stage_in && !input.is_empty() {
            let w = ops.alloc(in_blocks * stride)?;
            for b in 0..in_blocks {
                let (to, from) = (sub(w.region(), b * stride, block_bytes)?, sub(input, b * block_bytes, block_bytes)?);
                // SAFETY: `from` lies in the caller's input (this fn's contract), `to` in a
                // fresh workspace.
                unsafe {
                    match &scalar {
                        Some(s) => ops.scale(call.dtype, to, from, s)?,
                        None => ops.copy(to, from)?,
                    }
                }
            }
            mem.readable(INPUT, w.region());
            Some(w)
        } else {
            mem.readable(INPUT, input);
            None
        };
        let staged_out = if plan.padded && !output.is_empty() {
            let w = ops.alloc(out_blocks * stride)?;
            mem.writable(OUTPUT, w.region());
            Some(w)
        } else {
            mem.writable(OUTPUT, output);
            None
        };
        let metas = [job.header.encode()];
        let cfg = self.settings.run(
            self.rank,
            &self.abort,
            call.dtype,
            call.reduction.op(),
            Some(job.header),
            self.board.as_deref(),
        );
        let res = Resources { mem: &mem, links: &mut self.links, ops, forward: &mut self.forward };
        // SAFETY: the caller's regions are valid and ours for the call (this fn's contract);
        // the rest are this executor's workspaces, alive until after the run.
        unsafe { engine::run(&plan.program, &metas, res, &cfg)? };
        drop(staged_in);
        if let Some(w) = staged_out {
            for b in 0..out_blocks {
                let (to, from) =
                    (sub(output, b * block_bytes, block_bytes)?, sub(w.region(), b * stride, block_bytes)?);
                // SAFETY: as above.
                unsafe { self.ops.copy(to, from)? };
            }
        }
        if reduces && call.reduction == Reduction::Op(ReduceOp::Avg) && !output.is_empty() {
            // SAFETY: the caller's output, ours for the call.
            unsafe { self.ops.divide(call.dtype, output, nranks)? };
        }
        Ok(())
    }

    /// Refuses buffers in memory the local operations cannot reach (before anything moves).
    fn reach(&self, regions: &[Region]) -> Result<()> {
        match regions.iter().find(|r| !r.is_empty() && !self.ops.reaches(r.space)) {
            Some(r) => Err(Error::InvalidArgument(format!(
                "a buffer lies in {}, which this communicator's executor ({}) cannot reach",
                r.space,
                self.ops.name()
            ))),
            None => Ok(()),
        }
    }

    /// A PreMulSum scalar's bytes.
    fn scalar(&mut self, dtype: Dtype, s: Scalar) -> Result<Vec<u8>> {
        let n = dtype.size();
        match s {
            Scalar::Value(v) => Ok(v[..n].to_vec()),
            Scalar::At(b) => {
                if b.is_null() {
                    return Err(Error::InvalidArgument("the PreMulSum scalar's address is NULL".into()));
                }
                let mut out = vec![0u8; n];
                // SAFETY: the scalar's memory stays valid, holding one element, for as long as
                // the operator is used (NCCL's contract for `ncclScalarDevice`, which the
                // caller of the job's submission accepted).
                unsafe { self.ops.read(&mut out, b.region(n))? };
                Ok(out)
            }
        }
    }

    /// Runs a batch of sends and receives together: sends to one peer in order, receives from
    /// one peer in order, peers concurrently; a send to this rank itself is copied into the
    /// receive from itself it pairs with (in order).
    ///
    /// # Safety
    /// As for [`Executor::run_collective`].
    pub(crate) unsafe fn run_transfers(&mut self, job: &TransferJob) -> Result<()> {
        let regions: Vec<Region> = job.transfers.iter().map(|t| t.region).collect();
        self.reach(&regions)?;
        let mut prog = Program::default();
        let mut mem = Memory::new();
        let mut metas = Vec::with_capacity(job.transfers.len());
        let mut own_sends = Vec::new();
        let mut own_recvs = Vec::new();
        for (i, t) in job.transfers.iter().enumerate() {
            let id =
                MemId::try_from(3 + i).map_err(|_| Error::InvalidArgument("too many calls in one group".into()))?;
            if t.send {
                mem.readable(id, t.region);
            } else {
                mem.writable(id, t.region);
            }
            let span = Span::new(id, 0, t.region.len);
            if t.peer == self.rank {
                if t.send {
                    own_sends.push(span)
                } else {
                    own_recvs.push(span)
                }
                continue;
            }
            prog.add_p2p(t.send, t.peer, span, metas.len() as u32, t.tag);
            metas.push(t.meta);
        }
        for (src, dst) in own_sends.into_iter().zip(own_recvs) {
            prog.add_copy(dst, src);
        }
        let cfg = self.settings.run(self.rank, &self.abort, Dtype::Uint8, ReduceOp::Sum, None, self.board.as_deref());
        let res = Resources { mem: &mem, links: &mut self.links, ops: &mut *self.ops, forward: &mut self.forward };
        // SAFETY: the transfers' regions are valid and ours for the call (this fn's contract).
        unsafe { engine::run(&prog, &metas, res, &cfg) }
    }
}

fn sub(r: Region, at: usize, len: usize) -> Result<Region> {
    r.sub(at, len).ok_or_else(|| Error::Internal(format!("bytes {at}..{} outside a {}-byte buffer", at + len, r.len)))
}

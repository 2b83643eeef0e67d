//! Running one planned call on the executor: a collective (staging where its placement or
//! layout needs it, PreMulSum's multiplication, the engine, the average's division), or a batch
//! of point-to-point transfers. Every byte of work goes through the executor's
//! [`LocalOps`](crate::ops::LocalOps).
//!
//! The schedule cuts each block of the data (the whole buffer, or one rank's part for
//! reduce-scatter, all-gather and all-to-all) into `k` chunks, uneven by at most one element
//! where `k` does not divide the block. Staging happens only where it must: a schedule that
//! does not fit uneven chunks runs on padded copies of equal chunks (the result copied back);
//! an input that overlaps the output other than in NCCL's in-place layouts, or in place where
//! the schedule is not proven correct in place, is copied first; a PreMulSum input is
//! multiplied into a copy. Everything else runs straight on the caller's memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use topoccl_transports::{Connection, MemSpace, Region};

use super::engine::{self, Resources};
use super::memory::{MemId, Memory, Span, INPUT, OUTPUT, SCRATCH};
use super::p2p::{Counters, ANY_SOURCE};
use super::plan::Plan;
use super::program::Program;
use super::{DeviceSide, Executor, Settings, Space, SpaceRef};
use crate::call::{Checked, Placement};
use crate::cuda::StreamSync;
use crate::diag::Board;
use crate::error::{Error, Result};
use crate::ops::{CpuOps, LocalOps, Workspace};
use crate::types::{Dtype, ReduceOp, Reduction, Scalar};
use crate::wire::CallHeader;

/// A collective, checked and planned.
pub(crate) struct CollectiveJob {
    pub checked: Checked,
    pub plan: Arc<Plan>,
    pub header: CallHeader,
    /// Its ties to the caller's CUDA stream, if it was called on one.
    pub sync: Option<StreamSync>,
}

/// A device-resident collective, already on its caller's stream: what is left for the
/// executor is to watch it end, and to release its stream should it fail (`super::resident`).
pub(crate) struct ResidentJob {
    pub binding: Arc<crate::cuda::Binding>,
    /// The ticket the caller's stream writes at the call's end.
    pub ticket: u32,
    pub release: super::resident::Release,
    /// What went wrong while it was queued, if anything (the stream is released already).
    pub failed: Option<Error>,
    pub header: CallHeader,
    pub outstanding: crate::cuda::Outstanding,
    /// The peers of a call run as one kernel (`resident::ll`), which waits for them inside
    /// the kernel; empty for a call of stream waits.
    pub ll_peers: Vec<u32>,
    /// For such a call, every other rank's count of one-kernel calls launched (a host word it
    /// stores) and the count this call reaches: who has not launched yet, when it hangs.
    pub ll_launched: Vec<(u32, topoccl_transports::ipc::Word, u32)>,
}

/// What the executor runs.
pub(crate) enum Job {
    Collective(CollectiveJob),
    Transfers(TransferJob),
    Resident(ResidentJob),
    /// A device call staged through pinned host memory (`super::staged`).
    Staged(super::staged::StagedJob),
}

impl Job {
    /// Its ties to its caller's CUDA stream, if it was called on one.
    pub(crate) fn sync(&self) -> Option<&StreamSync> {
        match self {
            Job::Collective(c) => c.sync.as_ref(),
            Job::Transfers(t) => t.sync.as_ref(),
            Job::Resident(_) | Job::Staged(_) => None,
        }
    }

    /// Lets its caller's stream go on (a job that will never run).
    pub(crate) fn release(&self) {
        if let Job::Resident(r) = self {
            r.outstanding.end();
            if !r.ll_peers.is_empty() {
                r.binding.abort_device_calls();
            }
            r.release.release();
            r.binding.complete_from_host(r.ticket);
        }
        if let Job::Staged(s) = self {
            s.outstanding.end();
            s.release();
        }
        if let Some(s) = self.sync() {
            s.binding.complete_from_host(s.ticket);
        }
    }
}

/// One send or receive of a batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transfer {
    pub send: bool,
    /// The peer; for a receive, [`ANY_SOURCE`] takes the first message of its tag any peer sent.
    pub peer: u32,
    pub region: Region,
    /// The header its messages carry, numbered (`seq`) when it runs.
    pub header: CallHeader,
    /// The transport tag of its message stream (see [`super::p2p`]).
    pub tag: u32,
    /// Where a receive writes the rank its message came from (a host `u32`), if anywhere.
    pub source: Option<usize>,
}

/// Sends and receives that run together (a group's, or a lone call's).
pub(crate) struct TransferJob {
    pub transfers: Vec<Transfer>,
    /// Its ties to the caller's CUDA stream, if it was called on one.
    pub sync: Option<StreamSync>,
}

impl Executor {
    /// Runs a queued job to completion on the memory space its buffers lie in: waits for the
    /// work its caller's stream had before it, runs it, and marks it done for that stream.
    ///
    /// # Safety
    /// The job's regions must be valid memory of the space they name, used by nothing else
    /// until the job is done (for a job tied to a stream: until the stream has passed it).
    pub(crate) unsafe fn run(&mut self, job: &Job) -> Result<()> {
        match job {
            Job::Resident(r) => return self.watch(r),
            // SAFETY: this fn's contract.
            Job::Staged(s) => return unsafe { self.run_staged(s) },
            _ => {}
        }
        let sync = job.sync();
        // SAFETY: this fn's contract.
        let r = unsafe { self.run_on_space(job, sync) };
        match (sync, &r) {
            (Some(s), Ok(())) => self.complete(s),
            // A call that failed, or never started, releases its caller's stream at once.
            (Some(s), Err(_)) => {
                s.binding.complete_from_host(s.ticket);
                r
            }
            (None, _) => r,
        }
    }

    /// [`Executor::run`] without the completion.
    ///
    /// # Safety
    /// As for [`Executor::run`].
    unsafe fn run_on_space(&mut self, job: &Job, sync: Option<&StreamSync>) -> Result<()> {
        let space = match job {
            Job::Collective(c) => c.checked.space,
            Job::Transfers(t) => t.space()?,
            Job::Resident(_) | Job::Staged(_) => {
                return Err(Error::Internal("a device-resident or staged call on the host path".into()))
            }
        };
        // Host calls wait on the host for the caller's stream. So do device calls over a
        // connection that reads device memory itself (CUDA IPC): its copies run on its own
        // stream, which the caller's stream does not order.
        let reached_directly = space != MemSpace::Host && self.links.iter().flatten().any(|l| l.reaches(space));
        if space == MemSpace::Host || reached_directly {
            if let Some(s) = sync {
                self.started_on_host(s)?;
            }
        }
        let Executor { rank, nranks, links, settings, abort, board, host, device, p2p } = self;
        let parts = Parts { rank: *rank, nranks: *nranks, links, settings, abort, board: board.as_deref(), p2p };
        match space {
            // SAFETY: this fn's contract.
            MemSpace::Host => unsafe { parts.dispatch(job, host.as_dyn()) },
            MemSpace::Device(d) => {
                let sync = sync.ok_or_else(|| {
                    Error::InvalidArgument(format!("buffers in {space} need a CUDA stream to order the call"))
                })?;
                let dev = device_for(device, sync, d)?;
                let _current = dev.binding.context().enter()?;
                dev.space.ops.stream().wait(&sync.start)?;
                // SAFETY: this fn's contract.
                unsafe { parts.dispatch(job, dev.space.as_dyn()) }
            }
        }
    }

    /// Waits on the host until the work before a host-memory call on its caller's stream is
    /// done (a host call cannot make the stream's work wait for it the device's way).
    fn started_on_host(&self, sync: &StreamSync) -> Result<()> {
        let begun = Instant::now();
        let _current = sync.binding.context().enter()?;
        let mut rounds = 0u32;
        while !sync.start.done()? {
            if self.abort.load(Ordering::Relaxed) {
                return Err(Error::Aborted);
            }
            if begun.elapsed() >= self.settings.timeout {
                return Err(Error::Timeout {
                    rank: self.rank,
                    secs: begun.elapsed().as_secs_f64(),
                    call: "a call on host buffers".into(),
                    waiting: "the work before it on its CUDA stream never finished".into(),
                });
            }
            rounds += 1;
            if rounds < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        Ok(())
    }

    /// Releases the caller's stream once the call's work is done: written by the executor's
    /// device stream after that work where there is one, else by the host at once.
    fn complete(&mut self, sync: &StreamSync) -> Result<()> {
        match &self.device {
            Some(d) => {
                // SAFETY: the executor's stream belongs to the binding's context.
                let r = d
                    .binding
                    .context()
                    .enter()
                    .and_then(|_current| unsafe { sync.binding.complete_on(d.space.ops.stream(), sync.ticket) });
                if r.is_err() {
                    // The device failed (a sticky error): nothing it would write can come.
                    sync.binding.complete_from_host(sync.ticket);
                }
                r
            }
            None => {
                sync.binding.complete_from_host(sync.ticket);
                Ok(())
            }
        }
    }
}

/// What a run borrows of the executor besides one memory space's operations and workspaces.
struct Parts<'e> {
    rank: u32,
    nranks: u32,
    links: &'e mut Vec<Option<Box<dyn Connection>>>,
    settings: &'e Settings,
    abort: &'e AtomicBool,
    board: Option<&'e Board>,
    p2p: &'e mut Counters,
}

impl Parts<'_> {
    /// Runs `job` with the operations and workspaces of one memory space.
    ///
    /// # Safety
    /// As for [`Executor::run`].
    unsafe fn dispatch(self, job: &Job, space: SpaceRef<'_>) -> Result<()> {
        // SAFETY: this fn's contract.
        unsafe {
            match job {
                Job::Collective(c) => self.run_collective(c, space),
                Job::Transfers(t) => self.run_transfers(t, space),
                Job::Resident(_) | Job::Staged(_) => {
                    Err(Error::Internal("a device-resident or staged call on the host path".into()))
                }
            }
        }
    }

    /// Runs a collective to completion.
    ///
    /// # Safety
    /// The job's regions must be valid memory the local operations reach, used by nothing
    /// else until this returns.
    unsafe fn run_collective(self, job: &CollectiveJob, sp: SpaceRef<'_>) -> Result<()> {
        let Checked { call, block_bytes, input, output, placement, .. } = job.checked;
        reach(&*sp.ops, &[input, output])?;
        let plan = &*job.plan;
        let nranks = self.nranks;
        let (in_blocks, out_blocks) = call.collective.blocks(nranks);
        let reduces = call.collective.reduces();
        let ops = sp.ops;
        let scalar = match call.reduction {
            Reduction::PreMulSum(s) if reduces && !input.is_empty() => Some(Parts::scalar(ops, call.dtype, s)?),
            _ => None,
        };
        let stride = if plan.padded { plan.layout.offset(plan.k) } else { block_bytes };
        let stage_in = plan.padded
            || scalar.is_some()
            || placement == Placement::Overlapping
            || (placement == Placement::InPlace && !plan.schedule.in_place);
        let scratch = grow(ops, sp.scratch, plan.scratch_bytes)?.sub(0, plan.scratch_bytes);
        let mut mem = Memory::new();
        mem.writable(SCRATCH, scratch.unwrap_or(Region::EMPTY));
        // The last operation writing what the run reads (a connection that reads device
        // memory itself waits for it): at first, the work before the call on its stream.
        let mut written = ops.mark()?;
        if stage_in && !input.is_empty() {
            let w = grow(ops, sp.stage_in, in_blocks * stride)?;
            for b in 0..in_blocks {
                let (to, from) = (sub(w, b * stride, block_bytes)?, sub(input, b * block_bytes, block_bytes)?);
                // SAFETY: `from` lies in the caller's input (this fn's contract), `to` in a
                // fresh workspace.
                written = unsafe {
                    match &scalar {
                        Some(s) => ops.scale(call.dtype, to, from, s)?,
                        None => ops.copy(to, from)?,
                    }
                };
            }
            mem.readable(INPUT, w);
        } else {
            mem.readable(INPUT, input);
        }
        let staged_out = if plan.padded && !output.is_empty() {
            let w = grow(ops, sp.stage_out, out_blocks * stride)?;
            mem.writable(OUTPUT, w);
            Some(w)
        } else {
            mem.writable(OUTPUT, output);
            None
        };
        let metas = [job.header.encode()];
        let cfg =
            self.settings.run(self.rank, self.abort, call.dtype, call.reduction.op(), Some(job.header), self.board);
        let res = Resources {
            mem: &mem,
            links: self.links,
            ops,
            written,
            forward: sp.forward,
            staging: sp.staging,
            sources: &mut [],
        };
        // SAFETY: the caller's regions are valid and ours for the call (this fn's contract);
        // the rest are this executor's workspaces, alive until after the run (device ones until
        // the device is past it: `CudaOps` frees in stream order).
        unsafe { engine::run(&plan.program, &metas, res, &cfg)? };
        if let Some(w) = staged_out {
            for b in 0..out_blocks {
                let (to, from) = (sub(output, b * block_bytes, block_bytes)?, sub(w, b * stride, block_bytes)?);
                // SAFETY: as above.
                unsafe { ops.copy(to, from)? };
            }
        }
        if reduces && call.reduction == Reduction::Op(ReduceOp::Avg) && !output.is_empty() {
            // SAFETY: the caller's output, ours for the call.
            unsafe { ops.divide(call.dtype, output, nranks)? };
        }
        Ok(())
    }

    /// A PreMulSum scalar's bytes (read, for a scalar kept in memory, once the work before the
    /// call is done).
    fn scalar(ops: &mut dyn LocalOps, dtype: Dtype, s: Scalar) -> Result<Vec<u8>> {
        let n = dtype.size();
        match s {
            Scalar::Value(v) => Ok(v[..n].to_vec()),
            Scalar::At(b) => {
                if b.is_null() {
                    return Err(Error::InvalidArgument("the PreMulSum scalar's address is NULL".into()));
                }
                let mut out = vec![0u8; n];
                let mut cpu = CpuOps;
                let ops: &mut dyn LocalOps = match b.space {
                    s if ops.reaches(s) => ops,
                    MemSpace::Host => &mut cpu,
                    s => {
                        return Err(Error::InvalidArgument(format!(
                            "the PreMulSum scalar lies in {s}, which the call's operations ({}) cannot read",
                            ops.name()
                        )))
                    }
                };
                // SAFETY: the scalar's memory stays valid, holding one element, for as long as
                // the operator is used (NCCL's contract for `ncclScalarDevice`, which the
                // caller of the job's submission accepted).
                unsafe { ops.read(&mut out, b.region(n))? };
                Ok(out)
            }
        }
    }

    /// Runs a batch of sends and receives together: sends to one peer in order, receives from
    /// one peer in order, peers concurrently; a send to this rank itself is copied into the
    /// receive from itself it pairs with (in order).
    ///
    /// # Safety
    /// As for [`Parts::run_collective`].
    unsafe fn run_transfers(self, job: &TransferJob, sp: SpaceRef<'_>) -> Result<()> {
        let regions: Vec<Region> = job.transfers.iter().map(|t| t.region).collect();
        reach(&*sp.ops, &regions)?;
        let mut prog = Program::default();
        let mut mem = Memory::new();
        let mut metas = Vec::with_capacity(job.transfers.len());
        let mut own_sends = Vec::new();
        let mut own_recvs = Vec::new();
        let mut sources = Vec::with_capacity(job.transfers.len());
        // A receive from any source listens to every peer.
        let any = job.transfers.iter().any(|t| t.peer == ANY_SOURCE);
        if any {
            prog.peers = (0..self.nranks).filter(|&p| p != self.rank).collect();
        }
        // Refused before any message is numbered.
        if MemId::try_from(3 + job.transfers.len()).is_err() {
            return Err(Error::InvalidArgument("too many calls in one group".into()));
        }
        for (i, t) in job.transfers.iter().enumerate() {
            let id = MemId::try_from(3 + i).map_err(|_| Error::Internal("a group's transfers outnumber ids".into()))?;
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
            // A receive from any source checks every header field but the number, which is
            // its source's (counted below, once it is known).
            let seq = if t.peer == ANY_SOURCE { 0 } else { self.p2p.take(t.tag, t.peer, t.send) };
            metas.push(CallHeader { seq, ..t.header }.encode());
            sources.push(t.peer);
        }
        for (src, dst) in own_sends.into_iter().zip(own_recvs) {
            prog.add_copy(dst, src);
        }
        let cfg = self.settings.run(self.rank, self.abort, Dtype::Uint8, ReduceOp::Sum, None, self.board);
        let res = Resources {
            mem: &mem,
            links: self.links,
            written: sp.ops.mark()?,
            ops: sp.ops,
            forward: sp.forward,
            staging: sp.staging,
            sources: &mut sources,
        };
        // SAFETY: the transfers' regions are valid and ours for the call (this fn's contract).
        unsafe { engine::run(&prog, &metas, res, &cfg) }?;
        // The message-carrying transfers' peers, in order (a receive from any source's known now).
        let mut peers = sources.iter();
        for t in &job.transfers {
            let from = match t.peer {
                p if p == self.rank => p,
                _ => *peers.next().ok_or_else(|| Error::Internal("a transfer without its peer".into()))?,
            };
            if t.peer == ANY_SOURCE {
                if from == ANY_SOURCE {
                    return Err(Error::Internal("a receive from any source ended without a message".into()));
                }
                self.p2p.take(t.tag, from, false);
            }
            if let Some(at) = t.source {
                // SAFETY: the caller's `u32` for this receive, valid for writes until the job is
                // done (the contract of the group's raw receive, which `run`'s caller accepted).
                unsafe { (at as *mut u32).write_unaligned(from) };
            }
        }
        Ok(())
    }
}

/// The device side for a call on device `ordinal` tied to `sync`, made on first use.
// Without CUDA `CudaOps` cannot be made, so the end of this function is unreachable there.
#[cfg_attr(not(feature = "cuda"), allow(unreachable_code))]
fn device_for<'d>(device: &'d mut Option<DeviceSide>, sync: &StreamSync, ordinal: u32) -> Result<&'d mut DeviceSide> {
    let ctx = sync.binding.context();
    if ctx.ordinal() != ordinal {
        return Err(Error::InvalidArgument(format!(
            "a buffer lies in memory of CUDA device {ordinal}, the communicator uses device {}",
            ctx.ordinal()
        )));
    }
    if let Some(d) = device {
        if !Arc::ptr_eq(&d.binding, &sync.binding) {
            return Err(Error::Internal("a call tied to another device binding".into()));
        }
    } else {
        *device = Some(DeviceSide { binding: sync.binding.clone(), space: Space::new(sync.binding.take_ops()?) });
    }
    device.as_mut().ok_or_else(|| Error::Internal("no device side".into()))
}

/// A workspace of at least `bytes`, kept between calls.
fn grow(ops: &mut dyn LocalOps, w: &mut Option<Workspace>, bytes: usize) -> Result<Region> {
    if w.as_ref().map_or(true, |w| w.region().len < bytes) {
        *w = Some(ops.alloc(bytes)?);
    }
    Ok(w.as_ref().map_or(Region::EMPTY, |w| w.region()))
}

/// Refuses buffers in memory the local operations cannot reach (before anything moves).
fn reach(ops: &dyn LocalOps, regions: &[Region]) -> Result<()> {
    match regions.iter().find(|r| !r.is_empty() && !ops.reaches(r.space)) {
        Some(r) => Err(Error::InvalidArgument(format!(
            "a buffer lies in {}, which this communicator's executor ({}) cannot reach",
            r.space,
            ops.name()
        ))),
        None => Ok(()),
    }
}

/// The one memory space of a job's buffers (host when it has none).
fn one_space(regions: impl Iterator<Item = Region>) -> Result<MemSpace> {
    let mut space = None;
    for r in regions.filter(|r| !r.is_empty()) {
        match space {
            None => space = Some(r.space),
            Some(s) if s != r.space => {
                return Err(Error::InvalidArgument(format!(
                    "one call's buffers lie in {s} and in {}: a call runs on one memory space",
                    r.space
                )))
            }
            Some(_) => {}
        }
    }
    Ok(space.unwrap_or(MemSpace::Host))
}

impl TransferJob {
    pub(crate) fn space(&self) -> Result<MemSpace> {
        one_space(self.transfers.iter().map(|t| t.region))
    }
}

fn sub(r: Region, at: usize, len: usize) -> Result<Region> {
    r.sub(at, len).ok_or_else(|| Error::Internal(format!("bytes {at}..{} outside a {}-byte buffer", at + len, r.len)))
}

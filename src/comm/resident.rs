//! The communicator's side of device-resident calls (`crate::exec::resident`): which calls
//! run so, and queueing them on the caller's stream from the caller's thread.
//!
//! A call runs device-resident when every rank of the communicator reaches every other by
//! CUDA IPC (agreed at init, so that all ranks decide alike) and its buffers are device
//! memory. A call that does not fit what the binding and the windows hold (its input, where it
//! is staged, within the binding's staging workspace; its scratch within the scratch
//! workspace; every pair's messages within the pair's resident window) is cut into pieces that
//! do, as staged calls are cut (the same element range of every block, each piece planned as
//! a call of its own size), and the pieces are queued one after another on the stream: a large
//! call never leaves the device. Everything else is staged through pinned host slots
//! (`super::staged`): PreMulSum with a scalar in device memory, schedules that need padded
//! chunks, grouped send/recv, a call in overlapping buffers too large to run whole.
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

use topoccl_transports::ipc::{DevicePeer, ResidentLink, Word};
use topoccl_transports::{MemSpace, Region};

use super::work::Task;
use super::{CallState, Communicator};
use crate::call::Checked;
use crate::call::Placement;
use crate::cuda::{Binding, Outstanding, StreamRef};
use crate::error::Result;
use crate::exec::job::{CollectiveJob, Job, ResidentJob};
use crate::exec::memory::{Blocks, Memory, INPUT, OUTPUT, SCRATCH};
use crate::exec::plan::Plan;
use crate::exec::resident::ll::{ll_threads, LlArgs, LlProgram, LlRegion, LL_ABORT, LL_PEER0, LL_TICKET};
use crate::exec::resident::{emit, release_of, Counts, DeviceStream, Gate, Release};
use crate::types::{ReduceOp, Reduction, Scalar};
use std::sync::atomic::Ordering;
use topoccl_transports::ipc::LL_AREA_BYTES;

/// The device-resident side of a communicator: a link per rank, and the counts its words
/// carry so far.
pub(crate) struct ResidentSide {
    links: Vec<Option<ResidentLink>>,
    counts: Vec<Counts>,
    /// Calls queued device-resident so far, and the pieces they were cut into.
    queued: u64,
    pieces: u64,
    /// Whether small calls may run as one kernel (agreed at init), how many did, and the
    /// stream operations all device-resident calls queued.
    pub(super) ll: bool,
    ll_queued: u64,
    ops: u64,
    /// Keep the windows and pages the links name alive.
    _peers: Vec<Arc<DevicePeer>>,
}

impl ResidentSide {
    /// The side over `peers` (one per rank, `None` for this rank), if every other rank is one.
    /// `ll_mode` is `TOPOCCL_DEVICE_LL`'s (0 never, 1 where no two ranks share a device, 2
    /// also there): what this rank's links allow, which init agrees on ([`ResidentSide::ll`]).
    pub(crate) fn new(rank: u32, peers: Vec<Option<Arc<DevicePeer>>>, ll_mode: u8) -> Option<ResidentSide> {
        let all = peers.iter().enumerate().all(|(r, p)| r as u32 == rank || p.is_some());
        if !all || peers.len() < 2 {
            return None;
        }
        let links: Vec<Option<ResidentLink>> = peers.iter().map(|p| p.as_ref().map(|p| p.link)).collect();
        let counts = vec![Counts::default(); peers.len()];
        // Ranks sharing one device only when asked: processes run in turns (time slices: a
        // kernel spinning for a peer of another context holds the device until its slice
        // ends), and threads of one context may call on one stream (the legacy stream, say),
        // where the second rank's kernel would queue behind the first, which waits for it.
        let ll = ll_mode > 0
            && links.iter().flatten().all(|l| l.ll_tx != 0 && l.ll_rx != 0 && (ll_mode == 2 || !l.same_device));
        Some(ResidentSide {
            links,
            counts,
            queued: 0,
            pieces: 0,
            ll,
            ll_queued: 0,
            ops: 0,
            _peers: peers.into_iter().flatten().collect(),
        })
    }
}

/// The smallest piece a large call is cut into: below it the call is staged instead (a schedule
/// whose messages at this size still overflow the windows is not one to run in pieces).
const MIN_PIECE_BYTES: usize = 64 << 10;

/// One piece of a device-resident call: elements `first..first + count` of every block, run
/// with `plan` (the call's own when the call is one piece).
struct Piece {
    first: usize,
    count: usize,
    plan: Arc<Plan>,
}

/// Whether `plan` runs device-resident over `links` with `scratch_len` bytes of scratch (the
/// same answer on every rank: nothing in it is this rank's alone).
fn runs_resident(plan: &Plan, links: &[Option<ResidentLink>], scratch_len: usize) -> bool {
    !plan.padded && plan.scratch_bytes <= scratch_len && plan.resident().is_ok_and(|p| p.fits(links))
}

/// Whether a piece of `count` elements run with `plan` copies its input into the staging
/// workspace first: a scalar to apply, buffers that overlap, or an in-place call on a schedule
/// that is not safe in place.
fn stages_input(c: &Checked, plan: &Plan, scaled: bool) -> bool {
    !c.input.is_empty()
        && (scaled
            || c.placement == Placement::Overlapping
            || (c.placement == Placement::InPlace && !plan.schedule.in_place))
}

/// `region` as elements `first..first + count` (of `ds` bytes) of each of its `blocks` blocks
/// of `block_bytes`, registered under `id`; the whole region where that is all of it.
fn piece_of(mem: &mut Memory, id: u16, region: Region, c: &Checked, blocks: usize, piece: &Piece, write: bool) {
    let ds = c.call.dtype.size();
    if region.is_empty() || piece.count == c.call.count {
        if write {
            mem.writable(id, region);
        } else {
            mem.readable(id, region);
        }
        return;
    }
    let b = Blocks { first: piece.first * ds, len: piece.count * ds, stride: c.block_bytes, count: blocks };
    mem.blocks(id, region, b, write);
}

impl Communicator {
    /// How many calls ran device-resident (queued whole on their caller's stream) so far; `None`
    /// where none can (not every rank reaches every other by CUDA IPC, or
    /// `TOPOCCL_DEVICE_RESIDENT=0`).
    pub fn device_resident_calls(&self) -> Option<u64> {
        self.calls().resident.as_ref().map(|s| s.queued)
    }

    /// How many device-resident calls ran as one kernel (the small-call path); `None` as for
    /// [`Communicator::device_resident_calls`].
    pub fn device_one_launch_calls(&self) -> Option<u64> {
        self.calls().resident.as_ref().map(|s| s.ll_queued)
    }

    /// How many operations (copies, kernels, stream memory operations) the device-resident
    /// calls so far queued on their callers' streams; `None` as for
    /// [`Communicator::device_resident_calls`].
    pub fn device_resident_ops(&self) -> Option<u64> {
        self.calls().resident.as_ref().map(|s| s.ops)
    }

    /// How many pieces the device-resident calls so far were cut into (a call that fits whole
    /// is one); `None` as for [`Communicator::device_resident_calls`].
    pub fn device_resident_pieces(&self) -> Option<u64> {
        self.calls().resident.as_ref().map(|s| s.pieces)
    }

    /// The pieces `job` runs device-resident in, or `None` where it cannot (it is staged).
    fn resident_pieces(
        &self,
        calls: &mut CallState,
        job: &CollectiveJob,
        scaled: bool,
        stage: Region,
        scratch: Region,
    ) -> Result<Option<Vec<Piece>>> {
        let c = job.checked;
        let call = c.call;
        let ds = call.dtype.size();
        let (in_blocks, out_blocks) = call.collective.blocks(self.nranks);
        let fits = |calls: &CallState, plan: &Plan, count: usize| {
            let links = calls.resident.as_ref().map_or(&[][..], |s| &s.links[..]);
            runs_resident(plan, links, scratch.len)
                && (!stages_input(&c, plan, scaled) || in_blocks * count * ds <= stage.len)
        };
        if fits(calls, &job.plan, call.count) {
            return Ok(Some(vec![Piece { first: 0, count: call.count, plan: job.plan.clone() }]));
        }
        if c.placement == Placement::Overlapping {
            // Each piece would read input that an earlier one overwrote: run whole, staged.
            return Ok(None);
        }
        // Elements per piece: the staging workspace's worth of input, on a 64-byte boundary,
        // halved until a piece's plan fits.
        let align = 64 / ds;
        let mut per = (stage.len / (in_blocks.max(out_blocks) * ds)).min(call.count.div_ceil(2));
        per -= per % align;
        let plan = loop {
            if per == 0 || per * ds * in_blocks.max(out_blocks) < MIN_PIECE_BYTES {
                return Ok(None);
            }
            let (plan, _) = calls.planner.plan(call.collective, ds, per)?;
            if fits(calls, &plan, per) {
                break plan;
            }
            per = (per / 2) - (per / 2) % align;
        };
        // Every piece but the last is `per` elements and runs `plan`; the last is planned (and
        // checked) at its own size.
        let mut pieces: Vec<Piece> =
            (0..call.count / per).map(|i| Piece { first: i * per, count: per, plan: plan.clone() }).collect();
        let first = pieces.len() * per;
        if first < call.count {
            let count = call.count - first;
            let (plan, _) = calls.planner.plan(call.collective, ds, count)?;
            if !fits(calls, &plan, count) {
                return Ok(None);
            }
            pieces.push(Piece { first, count, plan });
        }
        Ok(Some(pieces))
    }

    /// Queues `task` (a collective just prepared) on `stream` device-resident, if it runs so:
    /// the job that watches it, else `None` (the task is staged, or runs host-driven).
    ///
    /// A call on a stream being `captured` into a CUDA graph runs either path: the stream
    /// words carry the same values at every call and the one-kernel path keeps its counts on
    /// the device, so every replay is right. The stream path needs no rank sharing this rank's
    /// CUDA context (the gate that orders their hardware queues runs on the host, at capture,
    /// not at each replay): else the call is refused. The call's ticket is never written by
    /// the device (a replay would write an old one) but by the host at once: what the host
    /// watches ends with the capture; the work runs at each launch.
    pub(super) fn resident_job(
        &self,
        calls: &mut CallState,
        binding: &Arc<Binding>,
        task: &Task,
        stream: StreamRef,
        captured: bool,
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
        let Some(pieces) = self.resident_pieces(calls, job, scalar.is_some(), stage, scratch)? else {
            return Ok(None);
        };
        let ds = call.dtype.size();
        let (in_blocks, out_blocks) = call.collective.blocks(self.nranks);
        let last = calls.device_last;
        let Some(side) = calls.resident.as_mut() else { return Ok(None) };
        // A small call whose every rank's part fits one kernel runs so (the same choice on
        // every rank: the call's size, the agreed side, the schedule).
        let call_bytes = call.count * ds * in_blocks.max(out_blocks);
        let avg = call.reduction == Reduction::Op(ReduceOp::Avg);
        let ll = match pieces.as_slice() {
            [whole] if side.ll && call_bytes <= LL_CALL_BYTES => whole.plan.ll(avg).map(|p| (whole.plan.clone(), p)),
            _ => None,
        };
        if captured && ll.is_none() && side.links.iter().flatten().any(|l| l.same_context) {
            return Ok(None);
        }

        let _current = binding.context().enter()?;
        let ticket = binding.next_ticket();
        let outstanding = Outstanding::begin();
        let mut release = Release::default();
        let mut launched = Vec::new();
        let mut s = binding.caller_stream(stream, call.dtype, call.reduction.op());
        // SAFETY: the caller's buffers are valid device memory until the stream has passed the
        // call (`submit_on`'s contract); the workspaces and windows live with the binding and
        // the links, longer than any stream's use of them. The pieces run one after another on
        // the one stream, so each may reuse the workspaces.
        let queued = unsafe {
            (|| -> Result<()> {
                // (A captured call's order against calls outside its graph is the launcher's.)
                if let Some((_, prev)) = last.filter(|(last, _)| *last != stream && !captured) {
                    s.after(prev)?;
                }
                if let Some((plan, llp)) = &ll {
                    let gate = Gate {
                        deadline: Instant::now() + self.config.timeout,
                        abort: &self.runner.abort,
                        rank: self.rank,
                    };
                    let ticket = (!captured).then_some(ticket);
                    let work = OneLaunch { c: &c, plan, prog: llp, scalar, stage, scratch, ticket, call_bytes };
                    return self.one_launch(binding, side, &mut s, &work, &gate, &mut launched);
                }
                for (i, piece) in pieces.iter().enumerate() {
                    let prog = piece.plan.resident().map_err(|e| crate::error::Error::Internal(e.to_string()))?;
                    let bytes = piece.count * ds;
                    let mut mem = Memory::new();
                    if stages_input(&c, &piece.plan, scalar.is_some()) {
                        let staged = stage.sub(0, in_blocks * bytes).unwrap_or(stage);
                        for b in 0..in_blocks {
                            let from = b * c.block_bytes + piece.first * ds;
                            let (Some(dst), Some(src)) = (staged.sub(b * bytes, bytes), c.input.sub(from, bytes))
                            else {
                                return Err(crate::error::Error::Internal("a piece outside its call's input".into()));
                            };
                            match scalar {
                                Some(v) => s.scale(dst, src, &v[..ds])?,
                                None => s.copy(dst.addr as u64, src.addr as u64, bytes)?,
                            }
                        }
                        mem.readable(INPUT, staged);
                    } else {
                        piece_of(&mut mem, INPUT, c.input, &c, in_blocks, piece, false);
                    }
                    piece_of(&mut mem, OUTPUT, c.output, &c, out_blocks, piece, true);
                    mem.writable(SCRATCH, scratch.sub(0, piece.plan.scratch_bytes).unwrap_or(scratch));
                    let last = i + 1 == pieces.len();
                    release.0.extend(release_of(prog, &side.links, &side.counts, last)?.0);
                    let gate = Gate {
                        deadline: Instant::now() + self.config.timeout,
                        abort: &self.runner.abort,
                        rank: self.rank,
                    };
                    emit(prog, &mem, &side.links, &mut side.counts, &mut s, &gate, last)?;
                }
                if call.reduction == Reduction::Op(ReduceOp::Avg) && !c.output.is_empty() {
                    s.divide(c.output, self.nranks)?;
                }
                if captured {
                    return Ok(());
                }
                s.finish(ticket)
            })()
        };
        let failed = queued.err();
        if failed.is_some() && !captured {
            // The stream's own end of what was queued, so that the job's watch sees when the
            // stream has passed it (if even this cannot be queued, the watch's bound ends it).
            let _ = s.finish(ticket);
        }
        side.queued += 1;
        side.pieces += pieces.len() as u64;
        side.ops += s.ops();
        let ll_peers: Vec<u32> =
            ll.as_ref().map(|(_, p)| p.slots.iter().map(|sl| sl.peer).collect()).unwrap_or_default();
        if !captured {
            calls.device_last = Some((stream, ticket));
        }
        if failed.is_some() {
            // Whatever was queued may wait on words no peer will write now: let it through
            // (the job's watch goes on doing so until the stream has passed the call).
            release.release();
        }
        if captured {
            // The call queued nothing but its capture (failed or not): its host side ends here.
            binding.complete_from_host(ticket);
        }
        Ok(Some(Job::Resident(ResidentJob {
            binding: binding.clone(),
            ticket,
            release,
            failed,
            header: job.header,
            outstanding,
            ll_peers,
            ll_launched: launched,
        })))
    }

    /// Queues a small call as one kernel (`exec::resident::ll`) on `s`: fills the kernel's
    /// regions and flags from the side's links and counts, launches it, advances the counts,
    /// and waits until every rank sharing this rank's context has launched its own (each
    /// kernel must be queued before anything a rank queues after its own, which may share a
    /// hardware queue with it, and before any rank blocks the context in a copy).
    ///
    /// # Safety
    /// As the caller's queued work (`resident_job`): the call's buffers are valid device
    /// memory until the stream has run the kernel; the workspaces and the links' areas live
    /// longer.
    unsafe fn one_launch(
        &self,
        binding: &Binding,
        side: &mut ResidentSide,
        s: &mut crate::cuda::CallerStream<'_>,
        w: &OneLaunch<'_>,
        gate: &Gate<'_>,
        launched: &mut Vec<(u32, Word, u32)>,
    ) -> Result<()> {
        let c = w.c;
        let call = c.call;
        let ds = call.dtype.size();
        let internal = |what: &str| crate::error::Error::Internal(format!("a one-launch call: {what}"));
        let mut input = c.input;
        let mut prescale = w.scalar.is_some();
        if stages_input(c, w.plan, false) {
            // Its input apart from its output first, as the stream path stages it.
            let staged = w.stage.sub(0, c.input.len).ok_or_else(|| internal("its input exceeds the workspace"))?;
            match w.scalar {
                // SAFETY: the caller's input and the workspace (this fn's contract).
                Some(v) => unsafe { s.scale(staged, c.input, &v[..ds])? },
                // SAFETY: as above.
                None => unsafe { s.copy(staged.addr as u64, c.input.addr as u64, c.input.len)? },
            }
            input = staged;
            prescale = false;
        }
        let region = |r: Region| LlRegion { ptr: if r.is_empty() { 0 } else { r.addr as u64 }, len: r.len as u64 };
        let threads = ll_threads(w.call_bytes);
        let mut args = LlArgs::default();
        args.regions[usize::from(INPUT)] = region(input);
        args.regions[usize::from(OUTPUT)] = region(c.output);
        args.regions[usize::from(SCRATCH)] = region(w.scratch.sub(0, w.plan.scratch_bytes).unwrap_or(Region::EMPTY));
        let abort = binding.ll_abort_word();
        if let Some(t) = w.ticket {
            args.regions[LL_TICKET as usize] = LlRegion { ptr: binding.word_device_addr(t), len: 4 };
        }
        args.regions[LL_ABORT as usize] = LlRegion { ptr: abort, len: 4 };
        for (i, slot) in w.prog.slots.iter().enumerate() {
            let l = side
                .links
                .get(slot.peer as usize)
                .and_then(Option::as_ref)
                .ok_or_else(|| internal("a peer without a link"))?;
            args.regions[LL_PEER0 as usize + 2 * i] = LlRegion { ptr: l.ll_tx, len: LL_AREA_BYTES as u64 };
            args.regions[LL_PEER0 as usize + 2 * i + 1] = LlRegion { ptr: l.ll_rx, len: LL_AREA_BYTES as u64 };
            args.active |= u32::from(slot.sends) << i | u32::from(slot.receives) << (8 + i);
        }
        args.steps = w.prog.steps.len() as u32;
        args.step[..w.prog.steps.len()].copy_from_slice(&w.prog.steps);
        args.op = match call.reduction.op() {
            ReduceOp::Sum | ReduceOp::Avg => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
        };
        args.divisor = self.nranks;
        args.prescale = u32::from(prescale);
        if let (true, Some(v)) = (prescale, w.scalar) {
            let mut bits = [0u8; 8];
            bits[..ds].copy_from_slice(&v[..ds]);
            args.scalar = u64::from_le_bytes(bits);
        }
        args.ticket = w.ticket.unwrap_or(0);
        // SAFETY: every region is the call's buffers, the binding's workspaces and words, or
        // the links' areas (this fn's contract); the steps lie inside them (the kernel checks).
        unsafe { s.launch_ll(&args, threads)? };
        side.ll_queued += 1;
        // Every rank says it launched (its host watch names a rank that never did). Ranks
        // sharing this context are waited for, all of them, not only this call's peers: a
        // peer's kernel may wait for a rank this one never talks to, and a thread that
        // returned may sit in a copy into pageable memory, holding the context lock that rank
        // may still need.
        let mut shared: Vec<(ResidentLink, u32, u32)> = Vec::new();
        for (peer, (l, cnt)) in side.links.iter().zip(side.counts.iter_mut()).enumerate() {
            if let Some(l) = l {
                cnt.ll_with = cnt.ll_with.wrapping_add(1);
                l.ll_out_enq.host().store(cnt.ll_with, Ordering::Release);
                launched.push((peer as u32, l.ll_in_enq, cnt.ll_with));
                if l.same_context {
                    shared.push((*l, peer as u32, cnt.ll_with));
                }
            }
        }
        for (l, peer, n) in &shared {
            gate.until(&l.ll_in_enq, *n, *peer, "its one-launch kernel")?;
        }
        Ok(())
    }
}

/// Calls of at most this many bytes (the largest of the call's input and output, on every
/// rank alike) may run as one kernel.
pub(crate) const LL_CALL_BYTES: usize = 64 << 10;

/// What one small call's kernel is made from.
struct OneLaunch<'a> {
    c: &'a Checked,
    plan: &'a Plan,
    prog: &'a LlProgram,
    scalar: Option<[u8; 8]>,
    stage: Region,
    scratch: Region,
    /// The ticket the kernel writes at its end (none in a capture).
    ticket: Option<u32>,
    call_bytes: usize,
}

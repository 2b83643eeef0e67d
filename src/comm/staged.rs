//! Staged device calls: every device call that does not run device-resident (peers over shared
//! memory, TCP or RDMA; calls larger than the resident workspaces; a PreMulSum scalar in device
//! memory; schedules with padded chunks; grouped send/recv) goes through the binding's pinned
//! host slots (`crate::cuda::StagedSlot`), so that no host thread makes a driver call while the
//! caller's stream waits for it (NCCL's proxy works so: the GPU's queues copy, the host only
//! moves bytes).
//!
//! The call is cut into pieces that fit a slot (for a collective, the same element range of
//! every block; for transfers, chunk `j` of every message). For each piece the caller's thread
//! queues, on the caller's stream: the copies of its device data into the slot, a write of the
//! slot's input word, then (after the next piece's copies in, so that the stream fills one slot
//! while the host runs the other) a wait on the slot's output word and the copies back. The
//! progress thread runs each piece as a host call over the slot ([`crate::exec::staged`]).
//!
//! Where another rank may share this rank's CUDA context (thread ranks on one device), a wait at
//! the head of a shared hardware queue (`CUDA_DEVICE_MAX_CONNECTIONS=1`) would hold the other
//! rank's copies behind it, and that rank's copies are what the wait needs: there the caller's
//! thread waits for each piece's output word itself before it queues the copies back, and the
//! stream never waits on the host.
//!
//! Every rank cuts a call alike, from what all of them share (the call, the slot size), so the
//! pieces meet; the ranks of a communicator all stage or all run device-resident for the same
//! reason (`super::resident`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use topoccl_transports::{MemSpace, Region};

use super::submit::call_header;
use super::work::{Task, Work};
use super::{CallState, Communicator};
use crate::buffer::Buffer;
use crate::call::{CollectiveCall, Placement};
use crate::cuda::{Binding, CallerStream, Outstanding, StreamRef, STAGED_BYTES};
use crate::error::{Error, Result};
use crate::exec::job::{CollectiveJob, Job, Transfer, TransferJob};
use crate::exec::resident::DeviceStream;
use crate::exec::staged::{StagedJob, StagedPiece};
use crate::types::{Dtype, Reduction, Scalar};

/// The largest chunk of one message in a piece of staged transfers: a message's chunks
/// depend only on its length, so a sender and its receiver cut it alike.
pub(crate) const TRANSFER_CHUNK: usize = 128 << 10;

/// Where a piece's parts lie in a slot half: each starts on this boundary.
const SLOT_ALIGN: usize = 64;

/// One copy: (destination, source, bytes).
type Copy = (usize, usize, usize);

/// A piece's stream work: copies into its slot before its input word, copies back after its
/// output word.
struct PieceCopies {
    number: u32,
    ins: Vec<Copy>,
    outs: Vec<Copy>,
}

impl Communicator {
    /// How many device calls (collectives, groups of transfers) went through the staging
    /// slots so far.
    pub fn device_staged_calls(&self) -> u64 {
        self.calls().staged
    }

    /// Whether a device call on `space` is staged here.
    pub(super) fn stages(&self, binding: &Binding, space: MemSpace) -> bool {
        self.config.device_staged && matches!(space, MemSpace::Device(d) if d == binding.context().ordinal())
    }

    /// Stages the collective `task` (just prepared) on `stream` and queues its host part.
    pub(super) fn submit_staged(
        &self,
        calls: &mut CallState,
        binding: &Arc<Binding>,
        mut task: Task,
        stream: StreamRef,
    ) -> Result<Work> {
        let Job::Collective(job) = &task.job else {
            return Err(Error::Internal("a staged collective that is not one".into()));
        };
        let header = job.header;
        let dtype = job.checked.call.dtype;
        let pieces = self.collective_pieces(calls, binding, job);
        let pieces = match pieces {
            Ok(p) => p,
            Err(e) => {
                // The agreement is every rank's, whatever became of this rank's call.
                if let Some(a) = task.agreement.take() {
                    drop(self.runner.submit(*a));
                }
                return Err(e);
            }
        };
        self.queue_staged(calls, binding, stream, dtype, header, pieces, task.agreement.take())
    }

    /// Stages a group's transfers on `stream` and queues their host part.
    pub(super) fn submit_staged_transfers(
        &self,
        calls: &mut CallState,
        binding: &Arc<Binding>,
        job: TransferJob,
        stream: StreamRef,
    ) -> Result<Work> {
        let pieces = transfer_pieces(binding, &job)?;
        let header = job.transfers.first().map(|t| t.header).ok_or_else(|| Error::Internal("an empty group".into()))?;
        self.queue_staged(calls, binding, stream, Dtype::Uint8, header, pieces, None)
    }

    /// Cuts a collective into pieces that fit a slot, each planned and numbered as a call of
    /// its own (a call that fits is one piece with the call's own plan).
    fn collective_pieces(
        &self,
        calls: &mut CallState,
        binding: &Binding,
        job: &CollectiveJob,
    ) -> Result<Vec<(StagedPiece, PieceCopies)>> {
        let c = job.checked;
        let call = c.call;
        let ds = call.dtype.size();
        let (in_blocks, out_blocks) = call.collective.blocks(self.nranks);
        let mut per = (STAGED_BYTES / (in_blocks.max(out_blocks) * ds)).max(1);
        if per * ds > SLOT_ALIGN {
            per -= per % (SLOT_ALIGN / ds.min(SLOT_ALIGN)).max(1);
        }
        let count = call.count;
        let n = count.div_ceil(per);
        if n > 1 && c.placement == Placement::Overlapping {
            return Err(Error::InvalidArgument(format!(
                "device buffers that overlap other than in NCCL's in-place layouts, in a call of {} bytes: \
                 larger than one staging slot ({STAGED_BYTES} bytes a side), which such a call needs",
                c.input.len.max(c.output.len)
            )));
        }
        let device_scalar = match call.reduction {
            Reduction::PreMulSum(Scalar::At(b)) if b.space != MemSpace::Host && call.collective.reduces() => Some(b),
            _ => None,
        };
        let mut out = Vec::with_capacity(n);
        for k in 0..n {
            let (a, e) = (k * per, per.min(count - k * per));
            let number = binding.next_piece();
            let slot = binding.staged_slot(number);
            let mut pc = CollectiveCall { count: e, ..call };
            if device_scalar.is_some() {
                pc.reduction = Reduction::PreMulSum(Scalar::At(Buffer::host(slot.scalar.addr as *const u8)));
            }
            let checked = pc.check(
                self.rank,
                self.nranks,
                Buffer::host(slot.input.addr as *const u8),
                Buffer::host(slot.output.addr as *const u8),
            )?;
            let (plan, header) = if n == 1 {
                (job.plan.clone(), job.header)
            } else {
                let (plan, _) = calls.planner.plan(pc.collective, ds, e)?;
                // The first piece keeps the call's number; the others are numbered as calls.
                let seq = if k == 0 { job.header.seq } else { calls.seq };
                let header = call_header(&pc, seq, plan.hash);
                if k > 0 {
                    calls.seq = calls.seq.wrapping_add(1);
                }
                (plan, header)
            };
            let mut copies = PieceCopies { number, ins: Vec::new(), outs: Vec::new() };
            let bytes = e * ds;
            if !c.input.is_empty() {
                if let Some(s) = device_scalar {
                    copies.ins.push((slot.scalar.addr, s.addr, ds));
                }
                for b in 0..in_blocks {
                    copies.ins.push((slot.input.addr + b * bytes, c.input.addr + b * c.block_bytes + a * ds, bytes));
                }
            }
            if !c.output.is_empty() {
                for b in 0..out_blocks {
                    copies.outs.push((c.output.addr + b * c.block_bytes + a * ds, slot.output.addr + b * bytes, bytes));
                }
            }
            let job = Job::Collective(CollectiveJob { checked, plan, header, sync: None });
            out.push((StagedPiece { number, job }, copies));
        }
        Ok(out)
    }

    /// Queues the pieces' copies and words on `stream` and their host part on the executor.
    #[allow(clippy::too_many_arguments)]
    fn queue_staged(
        &self,
        calls: &mut CallState,
        binding: &Arc<Binding>,
        stream: StreamRef,
        dtype: Dtype,
        header: crate::wire::CallHeader,
        pieces: Vec<(StagedPiece, PieceCopies)>,
        agreement: Option<Box<Task>>,
    ) -> Result<Work> {
        let (pieces, copies): (Vec<StagedPiece>, Vec<PieceCopies>) = pieces.into_iter().unzip();
        let _current = binding.context().enter()?;
        let ticket = binding.next_ticket();
        let abandoned = Arc::new(AtomicBool::new(false));
        let prev = calls.device_last.filter(|(last, _)| *last != stream).map(|(_, t)| t);
        calls.device_last = Some((stream, ticket));
        let job = StagedJob {
            binding: binding.clone(),
            pieces,
            ticket,
            abandoned: abandoned.clone(),
            header,
            outstanding: Outstanding::begin(),
        };
        let mut s = binding.caller_stream(stream, dtype, crate::types::ReduceOp::Sum);
        let on_host = calls.shares_context;
        calls.staged += 1;
        let release = StagedRelease::of(&job);
        let mut pending = Some((job, agreement));
        let mut work = None;
        if on_host {
            // The executor waits for the inputs; this thread waits for the outputs.
            if let Some((job, agreement)) = pending.take() {
                work = Some(self.runner.submit(Task { job: Job::Staged(job), refine: None, agreement }));
            }
        }
        let queued = (|| -> Result<()> {
            if let Some(t) = prev {
                s.after(t)?;
            }
            let gate = OutputGate { binding, on_host, comm: self };
            for (i, p) in copies.iter().enumerate() {
                put_in(&mut s, p)?;
                if i > 0 {
                    take_out(&mut s, &copies[i - 1], &gate)?;
                }
            }
            if let Some(last) = copies.last() {
                take_out(&mut s, last, &gate)?;
            }
            s.finish(ticket)
        })();
        match queued {
            Ok(()) => Ok(match (work, pending) {
                (Some(w), _) => w,
                (None, Some((job, agreement))) => {
                    self.runner.submit(Task { job: Job::Staged(job), refine: None, agreement })
                }
                (None, None) => return Err(Error::Internal("a staged call queued twice".into())),
            }),
            Err(e) => {
                // Whatever was queued may wait on words no host will write now.
                abandoned.store(true, Ordering::Release);
                release.release(binding, ticket);
                if let Some((job, agreement)) = pending {
                    job.outstanding.end();
                    if let Some(a) = agreement {
                        drop(self.runner.submit(*a));
                    }
                }
                drop(work);
                Err(e)
            }
        }
    }
}

/// What releases a staged call's stream: its last pieces' numbers.
struct StagedRelease(Vec<u32>);

impl StagedRelease {
    fn of(job: &StagedJob) -> StagedRelease {
        let n = job.pieces.len();
        StagedRelease(
            job.pieces[n.saturating_sub(crate::cuda::STAGED_SLOTS as usize)..].iter().map(|p| p.number).collect(),
        )
    }

    fn release(&self, binding: &Binding, ticket: u32) {
        for &n in &self.0 {
            binding.staged_output_done(n);
        }
        binding.complete_from_host(ticket);
    }
}

/// How a piece's output is waited for before its copies back.
struct OutputGate<'a> {
    binding: &'a Binding,
    /// On this thread (the context may be shared: module documentation), not on the stream.
    on_host: bool,
    comm: &'a Communicator,
}

/// Queues piece `p`'s copies into its slot and the write of its input word.
fn put_in(s: &mut CallerStream<'_>, p: &PieceCopies) -> Result<()> {
    for &(dst, src, len) in &p.ins {
        // SAFETY: the source is the caller's device memory, valid until the stream has passed
        // the call (`submit_on`'s contract); the destination is the piece's slot, which no
        // other piece uses until this one's copies back have run (stream order).
        unsafe { s.copy(dst as u64, src as u64, len)? };
    }
    s.staged_input_done(p.number)
}

/// Waits for piece `p`'s output (as `gate` says) and queues its copies back.
fn take_out(s: &mut CallerStream<'_>, p: &PieceCopies, gate: &OutputGate<'_>) -> Result<()> {
    if gate.on_host {
        // Each piece has the whole timeout: a long call is many pieces, each of which moves.
        let deadline = Instant::now() + gate.comm.config.timeout;
        let mut rounds = 0u32;
        while !gate.binding.staged_output_ready(p.number) {
            rounds = rounds.wrapping_add(1);
            if rounds % 64 == 0 {
                if gate.comm.runner.abort.load(Ordering::Relaxed) {
                    return Err(Error::Aborted);
                }
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        rank: gate.comm.rank,
                        secs: gate.comm.config.timeout.as_secs_f64(),
                        call: "a staged device call".into(),
                        waiting: "the host to run a piece of the call (its peers to take part)".into(),
                    });
                }
            }
            if rounds < 1024 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    } else {
        s.staged_output_wait(p.number)?;
    }
    for &(dst, src, len) in &p.outs {
        // SAFETY: as in `put_in`, the other way.
        unsafe { s.copy(dst as u64, src as u64, len)? };
    }
    Ok(())
}

/// Cuts transfers into pieces: piece `j` holds chunk `j` of every message that has one
/// ([`TRANSFER_CHUNK`]), sends in the slot's input half, receives in its output half.
fn transfer_pieces(binding: &Binding, job: &TransferJob) -> Result<Vec<(StagedPiece, PieceCopies)>> {
    let chunks = |t: &Transfer| t.region.len.div_ceil(TRANSFER_CHUNK).max(1);
    if let Some(t) = job.transfers.iter().find(|t| t.peer == crate::exec::p2p::ANY_SOURCE && chunks(t) > 1) {
        return Err(Error::InvalidArgument(format!(
            "a receive from any source of {} bytes into device memory: staged, it must fit one chunk \
             ({TRANSFER_CHUNK} bytes)",
            t.region.len
        )));
    }
    let n = job.transfers.iter().map(chunks).max().unwrap_or(0);
    let mut out = Vec::with_capacity(n);
    for j in 0..n {
        let number = binding.next_piece();
        let slot = binding.staged_slot(number);
        let (mut at_in, mut at_out) = (0usize, 0usize);
        let mut copies = PieceCopies { number, ins: Vec::new(), outs: Vec::new() };
        let mut transfers = Vec::new();
        for t in job.transfers.iter().filter(|t| chunks(t) > j) {
            let from = j * TRANSFER_CHUNK;
            let len = (t.region.len - from.min(t.region.len)).min(TRANSFER_CHUNK);
            let (half, at) = if t.send { (slot.input, &mut at_in) } else { (slot.output, &mut at_out) };
            if *at + len > half.len {
                return Err(Error::InvalidArgument(format!(
                    "a group of {} device transfers: chunk {j} of each needs more than a staging slot's \
                     {STAGED_BYTES} bytes a side",
                    job.transfers.len()
                )));
            }
            let region = Region::new(MemSpace::Host, half.addr + *at, len);
            if t.send {
                copies.ins.push((region.addr, t.region.addr + from, len));
            } else {
                copies.outs.push((t.region.addr + from, region.addr, len));
            }
            *at = (*at + len).next_multiple_of(SLOT_ALIGN);
            let count = len as u64 / t.header.dtype.size() as u64;
            transfers.push(Transfer {
                region,
                header: crate::wire::CallHeader { count, ..t.header },
                source: if j == 0 { t.source } else { None },
                ..*t
            });
        }
        out.push((StagedPiece { number, job: Job::Transfers(TransferJob { transfers, sync: None }) }, copies));
    }
    Ok(out)
}

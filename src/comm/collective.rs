//! Running one collective: from the caller's buffers and counts to a run of the executor.
//!
//! The schedule cuts each block of the data (the whole buffer, or one rank's part for
//! reduce-scatter, all-gather and all-to-all) into `k` chunks, of sizes differing by at most
//! one element when `k` does not divide the block ([`ChunkLayout`]). Only a schedule that does
//! not fit such a layout runs on padded staging copies of equal chunks, with the result copied
//! back; when the input and output overlap and the schedule is not proven correct in place, the
//! input is staged first. Everything else runs straight on the caller's memory.

use topoccl_synth::schedule::Collective;

use super::Communicator;
use crate::error::{Error, Result};
use crate::exec::engine::{self, RunConfig};
use crate::exec::layout::ChunkLayout;
use crate::exec::memory::{Memory, Span, INPUT, OUTPUT, SCRATCH};
use crate::exec::program::Program;
use crate::exec::reduce::divide;
use crate::exec::wire::{CallHeader, CallKind};
use crate::types::{Dtype, ReduceOp};

/// The caller's view of a collective.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub kind: CallKind,
    pub dtype: Dtype,
    pub op: ReduceOp,
    pub root: u32,
    /// Elements per block: NCCL's `count` (per rank for reduce-scatter's output, all-gather's
    /// input, and each peer's part of all-to-all).
    pub count: usize,
}

/// Where the caller's data is.
pub(crate) enum Buffers<'a> {
    Separate {
        input: &'a [u8],
        output: &'a mut [u8],
    },
    /// One buffer, aliased the way NCCL's in-place calls alias (for reduce-scatter the output
    /// is the rank's block of the input, for all-gather the input is its block of the output).
    InPlace(&'a mut [u8]),
}

impl Call {
    fn collective(&self) -> Collective {
        match self.kind {
            CallKind::AllReduce => Collective::AllReduce,
            CallKind::ReduceScatter => Collective::ReduceScatter,
            CallKind::AllGather => Collective::AllGather,
            CallKind::Broadcast => Collective::Broadcast { root: self.root },
            CallKind::Reduce => Collective::Reduce { root: self.root },
            CallKind::AllToAll | CallKind::SendRecv => Collective::AllToAll,
        }
    }

    /// Blocks in the input and in the output.
    fn blocks(&self, n: usize) -> (usize, usize) {
        match self.kind {
            CallKind::ReduceScatter => (n, 1),
            CallKind::AllGather => (1, n),
            CallKind::AllToAll => (n, n),
            _ => (1, 1),
        }
    }
}

impl Communicator {
    pub(crate) fn collective(&mut self, call: Call, buffers: Buffers<'_>) -> Result<()> {
        self.usable()?;
        let result = self.collective_checked(call, buffers);
        result.map_err(|e| self.fail(e))
    }

    fn collective_checked(&mut self, call: Call, buffers: Buffers<'_>) -> Result<()> {
        let n = self.nranks as usize;
        let me = self.rank;
        if call.root >= self.nranks {
            return Err(Error::InvalidArgument(format!("root {} is out of range for {} ranks", call.root, n)));
        }
        let esize = call.dtype.size();
        let (in_blocks, out_blocks) = call.blocks(n);
        let overflow = || Error::InvalidArgument(format!("count {} overflows the address space", call.count));
        let block_bytes = call.count.checked_mul(esize).ok_or_else(overflow)?;
        let in_bytes = block_bytes.checked_mul(in_blocks).ok_or_else(overflow)?;
        let out_bytes = block_bytes.checked_mul(out_blocks).ok_or_else(overflow)?;
        // Buffers only the root uses may be empty elsewhere.
        let uses_input = !(call.kind == CallKind::Broadcast && me != call.root);
        let uses_output = !(call.kind == CallKind::Reduce && me != call.root);

        let mut user = Memory::new();
        match buffers {
            Buffers::Separate { input, output } => {
                if uses_input && input.len() != in_bytes {
                    return Err(length("send", input.len(), in_bytes, esize));
                }
                if uses_output && output.len() != out_bytes {
                    return Err(length("receive", output.len(), out_bytes, esize));
                }
                user.readable(INPUT, if uses_input { input } else { &[] });
                user.writable(OUTPUT, if uses_output { output } else { &mut [] });
            }
            Buffers::InPlace(buf) => {
                let whole = in_bytes.max(out_bytes);
                if buf.len() != whole {
                    return Err(length("in-place", buf.len(), whole, esize));
                }
                let (in_off, out_off) = match call.kind {
                    CallKind::ReduceScatter => (0, me as usize * block_bytes),
                    CallKind::AllGather => (me as usize * block_bytes, 0),
                    _ => (0, 0),
                };
                let p = buf.as_mut_ptr();
                // SAFETY: both ranges lie inside `buf` (its length was checked against the
                // larger of the two), which is exclusively borrowed for the whole call and
                // only accessed through `user`, whose views handle the aliasing.
                unsafe {
                    user.raw(INPUT, p.add(in_off), if uses_input { in_bytes } else { 0 }, false);
                    user.raw(OUTPUT, p.add(out_off), if uses_output { out_bytes } else { 0 }, true);
                }
            }
        }
        if call.count == 0 {
            self.seq = self.seq.wrapping_add(1);
            return Ok(());
        }

        let chosen = self.schedule(call.collective(), block_bytes)?;
        let s = &*chosen.schedule;
        let k = (s.chunks / s.collective.chunk_multiple(s.nranks)) as usize;
        let chunk_elems = call.count.div_ceil(k);
        let chunk_bytes = chunk_elems * esize;
        let overlap = user_overlap(&user, in_bytes, out_bytes);
        let header = CallHeader {
            seq: self.seq,
            kind: call.kind,
            dtype: call.dtype,
            op: call.op,
            root: call.root,
            count: call.count as u64,
            schedule: chosen.hash,
        };
        let uneven = ChunkLayout::new(k, call.count, esize);
        let key = (s.collective, chosen.hash, uneven);
        if self.programs.len() >= PROGRAM_CACHE && !self.programs.contains_key(&key) {
            self.programs.clear();
        }
        let (layout, prog) = self.programs.entry(key).or_insert_with(|| {
            let layout = if uneven.fits(s) { uneven } else { ChunkLayout::padded(k, chunk_elems, esize) };
            (layout, Program::from_schedule(s, me, &layout, header.encode()))
        });
        // Only a schedule that moves chunks between slots of unequal size needs equal, padded
        // chunks, and with them staging copies of the buffers.
        let padded = *layout != uneven;
        prog.metas[0] = header.encode();
        let scratch_len = layout.offset(s.scratch_chunks as usize);
        let prog = &*prog;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(scratch_len.div_ceil(8), 0);
        let scratch_bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut scratch);
        let scratch_bytes = &mut scratch_bytes[..scratch_len];
        let cfg = RunConfig {
            rank: me,
            dtype: call.dtype,
            op: call.op,
            slice_bytes: self.config.slice_bytes,
            max_backlog: self.config.max_backlog,
            timeout: self.config.timeout,
            abort: &self.abort,
            call: Some(header),
            oversubscribed: self.oversubscribed,
        };

        let result = if padded || (overlap && !s.in_place) {
            // Staging: blocks laid out at `k` chunks each (padded), run, copy back.
            let stride = if padded { k * chunk_bytes } else { block_bytes };
            let mut st_in = vec![0u64; (in_blocks * stride).div_ceil(8)];
            let mut st_out_store;
            let st_in_bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut st_in)[..in_blocks * stride];
            if uses_input {
                for b in 0..in_blocks {
                    let src = user.read(Span::new(INPUT, b * block_bytes, block_bytes))?;
                    st_in_bytes[b * stride..b * stride + block_bytes].copy_from_slice(src);
                }
            }
            let mut mem = Memory::new();
            mem.readable(INPUT, if uses_input { st_in_bytes } else { &[] });
            mem.writable(SCRATCH, scratch_bytes);
            let run = if padded {
                st_out_store = vec![0u64; (out_blocks * stride).div_ceil(8)];
                let st_out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut st_out_store)[..out_blocks * stride];
                mem.writable(OUTPUT, if uses_output { &mut st_out[..] } else { &mut [] });
                let r = engine::run(prog, &mut mem, &mut self.links, &cfg, &mut self.slice_tmp);
                drop(mem);
                if r.is_ok() && uses_output {
                    for b in 0..out_blocks {
                        user.write(Span::new(OUTPUT, b * block_bytes, block_bytes))?
                            .copy_from_slice(&st_out[b * stride..b * stride + block_bytes]);
                    }
                }
                r
            } else {
                let out = if uses_output { user.write(Span::new(OUTPUT, 0, out_bytes))? } else { &mut [] };
                mem.writable(OUTPUT, out);
                engine::run(prog, &mut mem, &mut self.links, &cfg, &mut self.slice_tmp)
            };
            run
        } else {
            let mut mem = user;
            mem.writable(SCRATCH, scratch_bytes);
            let r = engine::run(prog, &mut mem, &mut self.links, &cfg, &mut self.slice_tmp);
            user = mem;
            r
        };
        let averaged = match result {
            Ok(()) if call.op == ReduceOp::Avg && reduces(call.kind) && uses_output => {
                user.write(Span::new(OUTPUT, 0, out_bytes)).map(|out| divide(call.dtype, out, self.nranks))
            }
            other => other,
        };
        drop(user);
        self.scratch = scratch;
        averaged?;
        self.seq = self.seq.wrapping_add(1);
        Ok(())
    }
}

/// Lowered programs kept per communicator (by schedule and chunk size).
const PROGRAM_CACHE: usize = 256;

fn length(which: &str, got: usize, want: usize, esize: usize) -> Error {
    Error::InvalidArgument(format!(
        "the {which} buffer holds {} elements, the call needs {}",
        got / esize.max(1),
        want / esize.max(1)
    ))
}

/// Whether the registered input and output ranges share bytes.
fn user_overlap(m: &Memory<'_>, in_bytes: usize, out_bytes: usize) -> bool {
    match (m.read(Span::new(INPUT, 0, in_bytes)), m.read(Span::new(OUTPUT, 0, out_bytes))) {
        (Ok(a), Ok(b)) if !a.is_empty() && !b.is_empty() => {
            let (a0, b0) = (a.as_ptr() as usize, b.as_ptr() as usize);
            a0 < b0 + b.len() && b0 < a0 + a.len()
        }
        _ => false,
    }
}

fn reduces(kind: CallKind) -> bool {
    matches!(kind, CallKind::AllReduce | CallKind::ReduceScatter | CallKind::Reduce)
}

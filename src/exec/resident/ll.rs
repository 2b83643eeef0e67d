//! The one-launch path of small device-resident calls: a rank's [`ResidentProgram`] (its part
//! of the schedule IR, already in stream order) as the steps of one kernel
//! (`kernels/ll.cuh`): copies and reductions between the call's buffers and the pair areas,
//! where data travels as LL lines (4 bytes of data and a 4-byte flag per 8-byte store), so
//! the items that only order a stream (a "landed" count, a wait on it, a wait for room) have
//! nothing left to do: a read of a line waits for its flag, and the kernel waits once, at its
//! start, for each peer to have read the lines it is about to overwrite. The flags that tell a
//! call's lines from the last ones are counts the kernels keep on the device, never the host's,
//! so a call captured into a CUDA graph is right at every replay and between uncaptured calls.
//!
//! Whether a plan may run so is decided from the schedule alone ([`ll_capable`]), so that
//! every rank of a call takes the same path.

use topoccl_synth::schedule::{BufferKind, Op, Schedule};

use super::{Item, Loc, ResidentProgram};
use crate::exec::memory::{Span, INPUT, OUTPUT, SCRATCH};

/// Peers one call may exchange with (`TOPOCCL_LL_PEERS`).
pub(crate) const LL_PEERS: usize = 7;
/// Steps of one kernel (`TOPOCCL_LL_STEPS`).
pub(crate) const LL_STEPS: usize = 112;
/// Data bytes one call may send one peer (half an area's parity of lines: 16-byte lines of 8
/// data bytes; `topoccl_transports::ipc::LL_AREA_BYTES`).
pub(crate) const LL_DATA_BYTES: usize = 128 << 10;
/// Bytes of lines per parity in an area: what the transport's area holds after its 4 KiB
/// header, halved.
pub(crate) const LL_LINE_BYTES: u32 = ((topoccl_transports::ipc::LL_AREA_BYTES - 4096) / 2) as u32;
const _: () = assert!(2 * LL_DATA_BYTES == LL_LINE_BYTES as usize);

/// Region numbers of the kernel's argument block (`LL_INPUT` … in `kernels/ll.cuh`); the
/// call's buffers are numbered as [`crate::exec::memory`]'s ids.
pub(crate) const LL_TICKET: u32 = 3;
pub(crate) const LL_ABORT: u32 = 4;
pub(crate) const LL_PEER0: u32 = 5;

/// A step's kind (`LL_COPY` …).
pub(crate) const LL_COPY: u32 = 0;
pub(crate) const LL_REDUCE: u32 = 1;
pub(crate) const LL_DIVIDE: u32 = 2;

/// Where a step reads or writes: `off` bytes into region `region` (`topoccl_ll_operand`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LlOperand {
    pub off: u32,
    pub region: u32,
}

/// One step of the kernel (`topoccl_ll_step`): `dst = a` (copy), `a ⊕ b` (reduce), `a / n`
/// (divide), over `len` bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LlStep {
    pub kind: u32,
    pub len: u32,
    pub dst: LlOperand,
    pub a: LlOperand,
    pub b: LlOperand,
}

/// One memory region of the kernel (`topoccl_ll_region`): address and bytes, 0 where unused.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LlRegion {
    pub ptr: u64,
    pub len: u64,
}

/// Regions of the argument block.
pub(crate) const LL_REGIONS: usize = 5 + 2 * LL_PEERS;

/// The kernel's argument block (`topoccl_ll_args` in `kernels/ll.cuh`, the same layout). It
/// holds no per-call count: the line flags come from the pair counts the kernels keep in the
/// header of this rank's area for each peer, so the same block replayed from a CUDA graph
/// runs as the pair's next call each time.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct LlArgs {
    pub regions: [LlRegion; LL_REGIONS],
    pub steps: u32,
    pub op: u32,
    pub divisor: u32,
    pub prescale: u32,
    pub ticket: u32,
    pub line_bytes: u32,
    pub active: u32,
    pub scalar: u64,
    pub step: [LlStep; LL_STEPS],
}

const _: () = assert!(std::mem::size_of::<LlArgs>() == 3928 && std::mem::align_of::<LlArgs>() == 8);

impl Default for LlArgs {
    fn default() -> LlArgs {
        LlArgs {
            regions: [LlRegion::default(); LL_REGIONS],
            steps: 0,
            op: 0,
            divisor: 0,
            prescale: 0,
            ticket: 0,
            line_bytes: LL_LINE_BYTES,
            active: 0,
            scalar: 0,
            step: [LlStep::default(); LL_STEPS],
        }
    }
}

/// Threads of a call's kernel (one block): one per 8-byte unit of the call's bytes, a warp at
/// least, 512 at most.
pub(crate) fn ll_threads(call_bytes: usize) -> u32 {
    (call_bytes.div_ceil(8).next_power_of_two()).clamp(32, 512) as u32
}

/// One peer of a call: its rank, and whether the call sends it / receives from it anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LlSlot {
    pub peer: u32,
    pub sends: bool,
    pub receives: bool,
}

/// A rank's part of one call as the kernel's steps.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct LlProgram {
    pub steps: Vec<LlStep>,
    pub slots: Vec<LlSlot>,
}

/// Whether every rank's part of `schedule` runs as one kernel: at most [`LL_PEERS`] peers and
/// [`LL_STEPS`] steps (each step of the IR lowers to one or two, an average adds a divide per
/// output range), and every pair's messages within [`LL_DATA_BYTES`] (`peak`, the schedule's
/// largest per pair and call). The same answer on every rank: nothing in it is one rank's own.
pub(crate) fn ll_capable(schedule: &Schedule, peak: usize) -> bool {
    let n = schedule.ranks.len();
    if !(2..=LL_PEERS + 1).contains(&n) || peak > LL_DATA_BYTES {
        return false;
    }
    // Steps of a rank: one per step of the IR, two for a receive that also keeps what it
    // forwards, and a division per output range (an average), counted on every rank.
    schedule.ranks.iter().all(|rank| {
        let steps = rank.channels.iter().flat_map(|c| &c.steps);
        let items: usize = steps
            .clone()
            .map(|st| 1 + usize::from(matches!(st.op, Op::RecvCopySend { .. } | Op::RecvReduceCopySend { .. })))
            .sum();
        let mut outputs: Vec<(u32, u32)> = steps
            .filter_map(|st| st.op.dst().filter(|d| d.buffer == BufferKind::Output).map(|d| (d.index, st.count)))
            .collect();
        outputs.sort_unstable();
        outputs.dedup();
        items + outputs.len() <= LL_STEPS
    })
}

impl LlProgram {
    /// `prog` as the kernel's steps; `avg` adds the division of every output range it writes.
    /// `None` where it does not fit one kernel (a plan [`ll_capable`] admits always does).
    pub(crate) fn lower(prog: &ResidentProgram, avg: bool) -> Option<LlProgram> {
        let mut slots: Vec<LlSlot> = Vec::new();
        for &(p, _, _) in &prog.to {
            slots.push(LlSlot { peer: p, sends: true, receives: false });
        }
        for &(p, _, _) in &prog.from {
            match slots.iter_mut().find(|s| s.peer == p) {
                Some(s) => s.receives = true,
                None => slots.push(LlSlot { peer: p, sends: false, receives: true }),
            }
        }
        slots.sort_unstable_by_key(|s| s.peer);
        if slots.len() > LL_PEERS {
            return None;
        }
        let slot_of = |peer: u32| slots.iter().position(|s| s.peer == peer).map(|i| i as u32);
        let operand = |loc: Loc| -> Option<LlOperand> {
            match loc {
                Loc::Buf(Span { mem, off, .. }) if [INPUT, OUTPUT, SCRATCH].contains(&mem) => {
                    Some(LlOperand { off: u32::try_from(off).ok()?, region: u32::from(mem) })
                }
                Loc::Buf(_) => None,
                Loc::Tx { peer, off, len } | Loc::Rx { peer, off, len } => {
                    if off % 8 != 0 || off + len > LL_DATA_BYTES {
                        return None;
                    }
                    let rx = u32::from(matches!(loc, Loc::Rx { .. }));
                    Some(LlOperand { off: off as u32, region: LL_PEER0 + 2 * slot_of(peer)? + rx })
                }
            }
        };
        let mut steps = Vec::new();
        let mut outputs: Vec<Span> = Vec::new();
        // A reduction that also sends its result is two steps here: the reduction, then the
        // send of what it wrote (lines are written by a copy step).
        let parts = prog.items.iter().flat_map(|item| {
            let (first, second) = match *item {
                Item::Copy { dst, src } => (Some((LL_COPY, dst, src, src)), None),
                Item::Reduce { dst, a, b, also } => {
                    (Some((LL_REDUCE, dst, a, b)), also.map(|t| (LL_COPY, t, dst, dst)))
                }
                Item::Arrival { .. } | Item::Landed { .. } | Item::Room { .. } => (None, None),
            };
            first.into_iter().chain(second)
        });
        for (kind, dst, a, b) in parts {
            let len = dst.len();
            if len == 0 {
                continue;
            }
            if let Loc::Buf(s) = dst {
                if s.mem == OUTPUT && !outputs.contains(&s) {
                    outputs.push(s);
                }
            }
            steps.push(LlStep {
                kind,
                len: u32::try_from(len).ok()?,
                dst: operand(dst)?,
                a: operand(a)?,
                b: operand(b)?,
            });
        }
        if avg {
            for s in outputs {
                let o = operand(Loc::Buf(s))?;
                steps.push(LlStep { kind: LL_DIVIDE, len: u32::try_from(s.len).ok()?, dst: o, a: o, b: o });
            }
        }
        (steps.len() <= LL_STEPS).then_some(LlProgram { steps, slots })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::layout::ChunkLayout;
    use crate::exec::program::Program;
    use topoccl_synth::generate::Request;
    use topoccl_synth::registry::Registry;
    use topoccl_synth::schedule::Collective;
    use topoccl_synth::topology::resolve;

    fn ring(n: usize) -> Schedule {
        let topo = resolve(&format!("full:{n}")).unwrap();
        let reg = Registry::builtin();
        let g = reg.iter().find(|g| g.name() == "ring").unwrap();
        g.generate(&Request::new(&topo, Collective::AllReduce)).unwrap()
    }

    fn lowered(schedule: &Schedule, count: usize, me: u32) -> ResidentProgram {
        let k = (schedule.chunks / schedule.collective.chunk_multiple(schedule.nranks)).max(1) as usize;
        let layout = ChunkLayout::new(k, count, 4);
        let program = Program::from_schedule(schedule, me, &layout);
        ResidentProgram::lower(schedule, &layout, &program, me).unwrap()
    }

    #[test]
    fn a_ring_all_reduce_is_one_kernel_of_copies_and_reductions_into_lines() {
        let s = ring(4);
        let prog = lowered(&s, 1000, 1);
        assert!(ll_capable(&s, prog.peak));
        let ll = LlProgram::lower(&prog, false).unwrap();
        // Its ring neighbours, left and right.
        assert_eq!(ll.slots.len(), 2);
        assert!(ll.slots.iter().all(|s| s.sends || s.receives));
        assert!(ll.steps.iter().any(|s| s.kind == LL_REDUCE && s.dst.region >= LL_PEER0));
        assert!(ll.steps.iter().all(|s| s.kind != LL_DIVIDE));
        let avg = LlProgram::lower(&prog, true).unwrap();
        // The division covers the output once: its ranges are disjoint and add up to it.
        let mut divided: Vec<(u32, u32)> =
            avg.steps.iter().filter(|s| s.kind == LL_DIVIDE).map(|s| (s.dst.off, s.len)).collect();
        divided.sort_unstable();
        assert!(divided.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
        assert_eq!(divided.iter().map(|d| d.1).sum::<u32>(), 4000);
        assert_eq!(avg.steps.len(), ll.steps.len() + divided.len());
        // Every line operand is a whole message at an 8-byte offset.
        for st in &ll.steps {
            for o in [st.dst, st.a] {
                assert!(o.region < LL_PEER0 || o.off % 8 == 0);
            }
        }
    }

    #[test]
    fn too_many_ranks_or_bytes_are_not_one_kernel() {
        let s = ring(9);
        assert!(!ll_capable(&s, 64));
        let s = ring(2);
        assert!(!ll_capable(&s, LL_DATA_BYTES + 1));
        assert!(ll_capable(&s, LL_DATA_BYTES));
    }
}

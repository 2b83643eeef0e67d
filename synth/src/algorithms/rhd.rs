//! Recursive halving (reduce-scatter) and doubling (all-gather), all-reduce as both
//! (Rabenseifner). For n that is not a power of two, the largest power of two p ≤ n ranks take
//! part: each of the first n − p even ranks folds its data into its odd neighbour first and gets
//! the result back at the end; the odd neighbour's block group covers both ranks' blocks.
//! log₂ p steps each way: the algorithm of choice for mid sizes on well-connected topologies.

use crate::error::Result;
use crate::generate::{unsupported, Request, ScheduleGenerator};
use crate::schedule::{Collective, Op, Rank, Schedule, ScheduleBuilder, Slot};

pub struct RecursiveHalvingDoubling;

/// Who takes part and which blocks each participant covers.
pub(super) struct Layout {
    pub(super) n: u32,
    /// Largest power of two ≤ n.
    pub(super) p: u32,
    /// n − p: ranks 0, 2, …, 2(extra−1) fold into their odd neighbour.
    pub(super) extra: u32,
}

impl Layout {
    pub(super) fn new(n: u32) -> Layout {
        let p = 1u32 << (31 - n.leading_zeros());
        Layout { n, p, extra: n - p }
    }
    /// Virtual rank of a participant; `None` for a folded (extra) rank.
    pub(super) fn virt(&self, r: Rank) -> Option<u32> {
        if r < 2 * self.extra {
            (r % 2 == 1).then_some(r / 2)
        } else {
            Some(r - self.extra)
        }
    }
    pub(super) fn real(&self, v: u32) -> Rank {
        if v < self.extra {
            2 * v + 1
        } else {
            v + self.extra
        }
    }
    /// The first real rank whose block belongs to virtual rank `v` (v = p gives n).
    fn first_rank(&self, v: u32) -> u32 {
        if v < self.extra {
            2 * v
        } else {
            v + self.extra
        }
    }
    /// Halving levels, largest distance first.
    pub(super) fn distances(&self) -> impl DoubleEndedIterator<Item = u32> {
        let levels = self.p.trailing_zeros();
        (0..levels).rev().map(|l| 1u32 << l)
    }
}

/// Recursive doubling in the output buffer: participant `v` (real rank `me`) starts holding
/// virtual ranks [lo, lo+1) and at each distance d = 1, 2, … swaps its range with its partner's,
/// doubling it. `span` maps a virtual range to its chunks.
fn doubling(b: &mut ScheduleBuilder, l: &Layout, me: Rank, v: u32, mut lo: u32, span: &dyn Fn(u32, u32) -> (u32, u32)) {
    for d in l.distances().rev() {
        let partner = l.real(v ^ d);
        let plo = lo ^ d;
        let (s0, sn) = span(lo, lo + d);
        let (p0, pn) = span(plo, plo + d);
        b.push(me, 0, Op::Send { to: partner, src: Slot::output(s0) }, sn);
        b.push(me, 0, Op::Recv { from: partner, dst: Slot::output(p0) }, pn);
        lo = lo.min(plo);
    }
}

impl ScheduleGenerator for RecursiveHalvingDoubling {
    fn name(&self) -> &'static str {
        "rhd"
    }
    fn describe(&self) -> &'static str {
        "recursive halving-doubling (Rabenseifner), any rank count"
    }
    fn supports(&self, c: Collective) -> bool {
        matches!(c, Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather)
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        let l = Layout::new(req.nranks());
        let k = req.pipeline.max(1);
        let coll = req.collective;
        let mut b = match coll {
            Collective::AllReduce => ScheduleBuilder::new("rhd", coll, l.n, l.p * k),
            Collective::ReduceScatter | Collective::AllGather => ScheduleBuilder::new("rhd", coll, l.n, l.n * k),
            _ => {
                return Err(unsupported(
                    "rhd",
                    coll,
                    "halving-doubling builds all-reduce, reduce-scatter and all-gather",
                ))
            }
        };
        b.in_place(true);
        if l.n == 1 {
            b.push(0, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(0) }, k);
            return Ok(b.build());
        }
        // Chunk span of virtual ranks [lo, hi).
        let span = |lo: u32, hi: u32| -> (u32, u32) {
            match coll {
                Collective::AllReduce => (lo * k, (hi - lo) * k),
                _ => (l.first_rank(lo) * k, (l.first_rank(hi) - l.first_rank(lo)) * k),
            }
        };
        let total = b.nranks() * k;
        match coll {
            Collective::AllReduce | Collective::ReduceScatter => {
                let chunks = if coll == Collective::AllReduce { l.p * k } else { total };
                // Where partial sums accumulate: the output for all-reduce, scratch for
                // reduce-scatter (whose output holds only the rank's own block).
                let work = |i: u32| if coll == Collective::AllReduce { Slot::output(i) } else { Slot::scratch(i) };
                if coll == Collective::ReduceScatter {
                    b.reserve_scratch(chunks);
                }
                for r in 0..l.n {
                    let me = r;
                    let Some(v) = l.virt(r) else {
                        // Folded rank: hand everything to the neighbour, get the result back.
                        b.push(me, 0, Op::Send { to: me + 1, src: Slot::input(0) }, chunks);
                        let (dst, count) = if coll == Collective::AllReduce {
                            (Slot::output(0), chunks)
                        } else {
                            (Slot::output(0), k)
                        };
                        b.push(me, 0, Op::Recv { from: me + 1, dst }, count);
                        continue;
                    };
                    let mut cur_in_input = true;
                    if v < l.extra {
                        b.push(me, 0, Op::RecvReduce { from: me - 1, src: Slot::input(0), dst: work(0) }, chunks);
                        cur_in_input = false;
                    }
                    let (mut lo, mut hi) = (0, l.p);
                    for d in l.distances() {
                        let partner = l.real(v ^ d);
                        let mid = (lo + hi) / 2;
                        let (keep, send) = if v & d == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
                        let cur = |i: u32| if cur_in_input { Slot::input(i) } else { work(i) };
                        let (s0, sn) = span(send.0, send.1);
                        let (k0, kn) = span(keep.0, keep.1);
                        b.push(me, 0, Op::Send { to: partner, src: cur(s0) }, sn);
                        b.push(me, 0, Op::RecvReduce { from: partner, src: cur(k0), dst: work(k0) }, kn);
                        cur_in_input = false;
                        (lo, hi) = keep;
                    }
                    if coll == Collective::AllReduce {
                        doubling(&mut b, &l, me, v, lo, &span);
                        if v < l.extra {
                            b.push(me, 0, Op::Send { to: me - 1, src: Slot::output(0) }, chunks);
                        }
                    } else {
                        if v < l.extra {
                            b.push(me, 0, Op::Send { to: me - 1, src: Slot::scratch((me - 1) * k) }, k);
                        }
                        b.push(me, 0, Op::Copy { src: Slot::scratch(me * k), dst: Slot::output(0) }, k);
                    }
                }
            }
            Collective::AllGather => {
                for r in 0..l.n {
                    let me = r;
                    let Some(v) = l.virt(r) else {
                        b.push(me, 0, Op::Send { to: me + 1, src: Slot::input(0) }, k);
                        b.push(me, 0, Op::Recv { from: me + 1, dst: Slot::output(0) }, total);
                        continue;
                    };
                    b.push(me, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(me * k) }, k);
                    if v < l.extra {
                        b.push(me, 0, Op::Recv { from: me - 1, dst: Slot::output((me - 1) * k) }, k);
                    }
                    doubling(&mut b, &l, me, v, v, &span);
                    if v < l.extra {
                        b.push(me, 0, Op::Send { to: me - 1, src: Slot::output(0) }, total);
                    }
                }
            }
            _ => unreachable!("checked above"),
        }
        Ok(b.build())
    }
}

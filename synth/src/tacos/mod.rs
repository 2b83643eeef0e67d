//! TACOS (Won et al., MICRO 2024): collectives synthesized on the time-expanded network of the
//! topology. All-gather by the link-chunk matcher of [`ten`]; reduce-scatter as that all-gather
//! on the reversed graph, run backwards in time (partial sums flow up the trees the chunks
//! spread along); all-reduce as reduce-scatter then all-gather.
//!
//! Emission into the IR: one channel per outgoing link position (a link from s to d is channel
//! "index of d among s's out-links" on both ends, so sends and receives match FIFO); steps are
//! appended in the synthesized time order, with every moment's sends before its receives. A send
//! only depends on receives of earlier moments, so the global time order is an execution order
//! and the schedule cannot deadlock.

pub mod attempts;
mod lockstep;
mod matching;
mod prefetch;
pub mod problem;
pub mod ten;

use rustc_hash::FxHashMap;

use crate::error::Result;
use crate::generate::{unsupported, Request, ScheduleGenerator};
use crate::schedule::{Collective, Op, Rank, Schedule, ScheduleBuilder, Slot, StepRef};
use crate::topology::logical::{RankArc, RankGraph};
use attempts::best_all_gather;
use problem::{TenOptions, TenSchedule};

/// Message size the link times are computed for when the request gives none (TACOS
/// synthesizes per size; large messages are where its schedules matter).
pub const DEFAULT_BYTES: u64 = 1 << 30;

/// Candidates per free link, as a multiple of the free links into a rank (see `ten`).
pub const WINDOW: usize = 2;

pub struct Tacos;

/// The reversed graph and, for each of its arcs, the arc of `g` it reverses.
fn reversed(g: &RankGraph) -> (RankGraph, Vec<usize>) {
    let arcs: Vec<RankArc> = g.arcs().iter().map(|a| RankArc { from: a.to, to: a.from, ..*a }).collect();
    let r = RankGraph::from_arcs(g.nranks(), arcs);
    let back = r.arcs().iter().map(|a| g.find(a.to, a.from).unwrap_or(usize::MAX)).collect();
    (r, back)
}

/// Fractions of a rank's fastest in-link below which its other in-links are dropped, tried in
/// turn until the ranks stay strongly connected.
const SLOW_ARC_FRACTIONS: [f64; 3] = [0.25, 1.0 / 16.0, 0.0];

/// `g` without the links much slower than the best link into the same rank, as long as every
/// rank still reaches every other. The matcher is greedy in time: a free PCIe path on a DGX-1
/// would get a whole chunk that an NVLink delivers many times sooner a moment later (all-reduce
/// at 11 % of the bound with them, 56 % without). Like Blink's trees, TACOS then works on
/// the fast fabric, and falls back to the slow links only where they are needed to connect.
fn fast_subgraph(g: &RankGraph) -> RankGraph {
    let n = g.nranks();
    let best_in: Vec<f64> =
        (0..n as Rank).map(|r| g.in_arcs(r).iter().map(|&a| g.arc(a).bandwidth).fold(0.0, f64::max)).collect();
    for f in SLOW_ARC_FRACTIONS {
        let kept: Vec<RankArc> =
            g.arcs().iter().copied().filter(|a| a.bandwidth >= f * best_in[a.to as usize] * (1.0 - 1e-9)).collect();
        if kept.len() == g.arcs().len() {
            break;
        }
        let sub = RankGraph::from_arcs(n, kept);
        if strongly_connected(&sub) {
            return sub;
        }
    }
    g.clone()
}

fn strongly_connected(g: &RankGraph) -> bool {
    let reach = |forward: bool| {
        let mut seen = vec![false; g.nranks()];
        let mut stack = vec![0 as Rank];
        seen[0] = true;
        while let Some(r) = stack.pop() {
            let arcs = if forward { g.out_arcs(r) } else { g.in_arcs(r) };
            for &a in arcs {
                let next = if forward { g.arc(a).to } else { g.arc(a).from };
                if !seen[next as usize] {
                    seen[next as usize] = true;
                    stack.push(next);
                }
            }
        }
        seen.iter().all(|&s| s)
    };
    g.nranks() <= 1 || (reach(true) && reach(false))
}

/// Channel of each arc of `g`: the position of its head among its tail's out-links.
fn channels(g: &RankGraph) -> Vec<u32> {
    let mut ch = vec![0u32; g.arcs().len()];
    for r in 0..g.nranks() as Rank {
        for (i, &a) in g.out_arcs(r).iter().enumerate() {
            ch[a] = i as u32;
        }
    }
    ch
}

/// Per (rank, chunk): the steps that accumulated its partial sum.
type Reduced = FxHashMap<(Rank, u32), Vec<StepRef>>;
/// Per (rank, chunk): the step that sent its partial sum on.
type Sent = FxHashMap<(Rank, u32), StepRef>;

/// Writes synthesized transfers as schedule steps.
struct Emitter<'a> {
    g: &'a RankGraph,
    ch: Vec<u32>,
}

impl Emitter<'_> {
    /// Emits an all-gather phase. `first_src(rank, chunk)` is where a rank reads a chunk it
    /// sends without having received it in this phase, `first_deps` what that read waits for,
    /// `recv_deps` what a receive into the output must wait for.
    fn all_gather(
        &self,
        b: &mut ScheduleBuilder,
        ten: &TenSchedule,
        first_src: &dyn Fn(Rank, u32) -> Slot,
        first_deps: &dyn Fn(Rank, u32) -> Vec<StepRef>,
        recv_deps: &dyn Fn(Rank, u32) -> Vec<StepRef>,
    ) {
        let mut got: FxHashMap<(Rank, u32), StepRef> = FxHashMap::default();
        for (m, &start) in ten.moments.iter().enumerate() {
            let end = ten.moments.get(m + 1).map_or(ten.order.len(), |&e| e as usize);
            let moment = &ten.order[start as usize..end];
            for &(a, c) in moment {
                let arc = self.g.arc(a as usize);
                let (s, d) = (arc.from, arc.to);
                let (src, deps) = match got.get(&(s, c)) {
                    Some(&r) => (Slot::output(c), vec![r]),
                    None => (first_src(s, c), first_deps(s, c)),
                };
                b.push_after(s, self.ch[a as usize], Op::Send { to: d, src }, 1, &deps);
            }
            for &(a, c) in moment {
                let arc = self.g.arc(a as usize);
                let (s, d) = (arc.from, arc.to);
                let r = b.push_after(
                    d,
                    self.ch[a as usize],
                    Op::Recv { from: s, dst: Slot::output(c) },
                    1,
                    &recv_deps(d, c),
                );
                got.insert((d, c), r);
            }
        }
    }

    /// Emits a reduce-scatter from an all-gather synthesized on the reversed graph (`rg`, whose
    /// arc i reverses `back[i]` of the real graph). `acc(rank, chunk)` accumulates a chunk;
    /// returns, per (rank, chunk), the steps that finished its accumulation and its send.
    fn reduce_scatter(
        &self,
        b: &mut ScheduleBuilder,
        rg: &RankGraph,
        back: &[usize],
        ten: &TenSchedule,
        acc: &dyn Fn(Rank, u32) -> Slot,
    ) -> (Reduced, Sent) {
        let mut reduced = Reduced::default();
        let mut sent = Sent::default();
        for m in (0..ten.moments.len()).rev() {
            let start = ten.moments[m] as usize;
            let end = ten.moments.get(m + 1).map_or(ten.order.len(), |&e| e as usize);
            let moment = &ten.order[start..end];
            // In the reversed all-gather p → x carried chunk c; here x sends its partial sum to p.
            for &(a, c) in moment {
                let real = back[a as usize];
                let (x, p) = (rg.arc(a as usize).to, rg.arc(a as usize).from);
                let deps = reduced.get(&(x, c)).cloned().unwrap_or_default();
                let src = if deps.is_empty() { Slot::input(c) } else { acc(x, c) };
                let r = b.push_after(x, self.ch[real], Op::Send { to: p, src }, 1, &deps);
                sent.insert((x, c), r);
            }
            for &(a, c) in moment {
                let real = back[a as usize];
                let (x, p) = (rg.arc(a as usize).to, rg.arc(a as usize).from);
                let list = reduced.entry((p, c)).or_default();
                // Partial sums from several links accumulate one after another.
                let (src, deps) = match list.last() {
                    None => (Slot::input(c), Vec::new()),
                    Some(&prev) => (acc(p, c), vec![prev]),
                };
                let r = b.push_after(p, self.ch[real], Op::RecvReduce { from: x, src, dst: acc(p, c) }, 1, &deps);
                list.push(r);
            }
        }
        (reduced, sent)
    }
}

impl ScheduleGenerator for Tacos {
    fn name(&self) -> &'static str {
        "tacos"
    }
    fn describe(&self) -> &'static str {
        "TACOS time-expanded-network synthesis (maximum matching per step)"
    }
    fn supports(&self, c: Collective) -> bool {
        matches!(c, Collective::AllGather | Collective::ReduceScatter | Collective::AllReduce)
    }

    fn searched(&self) -> bool {
        true
    }
    fn size_dependent(&self) -> bool {
        true
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        let coll = req.collective;
        if !self.supports(coll) {
            return Err(unsupported("tacos", coll, "TACOS builds all-gather, reduce-scatter and all-reduce"));
        }
        let g = fast_subgraph(&RankGraph::of(req.topology));
        let n = g.nranks();
        let k = req.pipeline.max(1);
        let total = n * k as usize;
        let bytes = if req.bytes == 0 { DEFAULT_BYTES } else { req.bytes };
        let opt = TenOptions {
            per_rank: k,
            chunk_bytes: bytes as f64 / total as f64,
            keep_order: true,
            window: WINDOW,
            seed: 0,
        };
        let em = Emitter { ch: channels(&g), g: &g };
        let mut b = ScheduleBuilder::new("tacos", coll, n as u32, total as u32);
        b.in_place(true);
        let none = |_: Rank, _: u32| Vec::new();
        match coll {
            Collective::AllGather => {
                // Own chunks are copied into place first and sent from there (in place, input
                // and output overlap: reading the input beside the copy would race).
                let copies: Vec<StepRef> = (0..n as Rank)
                    .map(|r| b.push(r, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(r * k) }, k))
                    .collect();
                let ten = best_all_gather(&g, opt)?;
                em.all_gather(&mut b, &ten, &|_, c| Slot::output(c), &|r, _| vec![copies[r as usize]], &none);
            }
            Collective::ReduceScatter => {
                b.reserve_scratch(total as u32);
                let (rg, back) = reversed(&g);
                let ten = best_all_gather(&rg, opt)?;
                let owner_acc = |r: Rank, c: u32| if c / k == r { Slot::output(c % k) } else { Slot::scratch(c) };
                em.reduce_scatter(&mut b, &rg, &back, &ten, &owner_acc);
                if n == 1 {
                    b.push(0, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(0) }, k);
                }
            }
            Collective::AllReduce => {
                let (rg, back) = reversed(&g);
                let rs = best_all_gather(&rg, opt)?;
                let (reduced, sent) = em.reduce_scatter(&mut b, &rg, &back, &rs, &|_, c| Slot::output(c));
                if n == 1 {
                    b.push(0, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(0) }, total as u32);
                }
                let ag = if g.is_symmetric() { rs } else { best_all_gather(&g, opt)? };
                let owner_deps = |r: Rank, c: u32| reduced.get(&(r, c)).cloned().unwrap_or_default();
                let recv_deps = |r: Rank, c: u32| sent.get(&(r, c)).copied().into_iter().collect();
                em.all_gather(&mut b, &ag, &|_, c| Slot::output(c), &owner_deps, &recv_deps);
            }
            _ => return Err(unsupported("tacos", coll, "checked by supports()")),
        }
        Ok(b.build())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;
    use crate::verify::verify;

    #[test]
    fn tacos_schedules_verify() {
        for spec in ["torus2d:4x4", "mesh2d:3x3", "hypercube:8", "dgx1[0,1,2,4,5]", "cluster-2x4-slow", "ring:5"] {
            let t = resolve(spec).unwrap();
            for coll in [Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce] {
                for k in [1, 2] {
                    let s = Tacos.generate(&Request::new(&t, coll).pipeline(k)).unwrap();
                    verify(&s).unwrap_or_else(|e| panic!("{spec} {coll} k={k}: {e}"));
                }
            }
        }
    }
}

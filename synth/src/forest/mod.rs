//! ForestColl-style all-gather and reduce-scatter (Zhao et al., 2024): every rank's shard
//! travels its own spanning trees, all roots at one rate, packed into the machine's links
//! ([`packing`]), so the collective runs at the cut bound where rings reach (n−1)/n of one
//! link's rate, or less where the machine has no Hamiltonian cycle of fast links.
//!
//! - all-gather: out-trees from every root, chunks of the root's shard broadcast down them;
//! - reduce-scatter: in-trees into every root, chunks of the root's block summed up them;
//! - all-reduce: the two composed per chunk (a chunk goes down its all-gather tree as soon as
//!   its root holds the sum), which is what beats Blink's trees where reduce-scatter plus
//!   all-gather is the better shape.
//!
//! The plan is emitted as equal lanes ([`crate::packing::lanes`]): every lane carries the same
//! share of every shard, since links are shared equally between the message streams on them,
//! not in proportion to planned rates. The lanes are packed whole where that
//! realizes more than giving each fractional bundle a whole number of lanes (`lanes.rs`).

mod lanes;
pub mod packing;

use crate::error::Result;
use crate::generate::{unsupported, Request, ScheduleGenerator};
use crate::packing::lanes::lane_counts_on;
use crate::recent::Recent;
use crate::schedule::{Collective, Op, Rank, Schedule, ScheduleBuilder, Slot};
use crate::topology::Topology;
use crate::trees::{Tree, TreeLanes};
use packing::{forest_plan, Direction, ForestPlan, RootTree};
use std::sync::Arc;

/// Garg–Könemann stops this close to its certificate.
const TOLERANCE: f64 = 0.01;
/// The LP/ILP may give up this much rate to keep fewer bundles.
const SLACK: f64 = 0.01;
/// About this many equal lanes per direction (each lane is one tree per root): equal shares of
/// a link per message stream realize the packing's rates only with enough lanes.
const LANES: usize = 32;
/// Chunks per lane when the request leaves pipelining to us.
const DEFAULT_PIPELINE: u32 = 8;
/// Packing one tree per root costs n arborescences per round: beyond this many ranks the
/// packing takes longer than the tuner should wait, and clusters use the hierarchical
/// algorithms instead.
pub const FOREST_MAX_RANKS: usize = 32;

pub struct Forest;

/// Plans packed recently, by (topology fingerprint, direction, fabric paths): the tuner prices
/// one topology at several pipeline depths, and the packing does not depend on the depth.
static RECENT_PLANS: Recent<(u64, Direction, bool), ForestPlan> = Recent::new(8);

/// [`forest_plan`] for `topo`, from [`RECENT_PLANS`] when packed already.
fn plan_for(topo: &Topology, direction: Direction, fabric: bool) -> Option<Arc<ForestPlan>> {
    RECENT_PLANS
        .get_or_try((topo.fingerprint(), direction, fabric), || {
            forest_plan(topo, direction, fabric, TOLERANCE, SLACK, LANES).ok_or(())
        })
        .ok()
}

/// One tree of one root on channels of its own, and its paths.
struct LaneTree {
    lanes: TreeLanes,
    paths: RootTree,
}

/// A direction's plan laid out as equal lanes: `trees[lane][root]`, a bundle taking a whole
/// number of lanes.
struct Laid {
    plan: Arc<ForestPlan>,
    trees: Vec<Vec<LaneTree>>,
}

impl Laid {
    /// Lays `plan` out from channel `base` on; returns it and the next free channel.
    fn new(plan: Arc<ForestPlan>, mut base: u32) -> (Laid, u32) {
        let rates: Vec<f64> = plan.bundles.iter().map(|b| b.rate).collect();
        let (counts, _) = lane_counts_on(&plan.cap, &plan.usage, &rates, LANES);
        let mut trees = Vec::new();
        for (bundle, &copies) in plan.bundles.iter().zip(&counts) {
            for _ in 0..copies {
                let lane = bundle
                    .trees
                    .iter()
                    .map(|t| {
                        let lanes = TreeLanes::one_way(Tree::from_parents(t.parent.clone()), base);
                        base += lanes.channels();
                        LaneTree { lanes, paths: t.clone() }
                    })
                    .collect();
                trees.push(lane);
            }
        }
        (Laid { plan, trees }, base)
    }

    fn lanes(&self) -> u32 {
        self.trees.len() as u32
    }

    /// The tree that carries chunk `j` of the `per_root` of `root`'s shard (a multiple of the
    /// lanes, which take contiguous runs).
    fn tree_of(&self, root: Rank, j: u32, per_root: u32) -> &TreeLanes {
        &self.trees[(j / (per_root / self.lanes())) as usize][root as usize].lanes
    }

    /// Marks the sends of every tree edge that takes the fabric path.
    fn mark_fabric_sends(&self, schedule: &mut Schedule) {
        for tree in self.trees.iter().flatten() {
            let channels = tree.lanes.base()..tree.lanes.base() + tree.lanes.channels();
            schedule.mark_via_fabric(channels, |from, to| {
                tree.paths.arc_of_send(from, to).is_some_and(|a| self.plan.arcs[a].fabric)
            });
        }
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl ScheduleGenerator for Forest {
    fn name(&self) -> &'static str {
        "forest"
    }
    fn describe(&self) -> &'static str {
        "ForestColl tree packing: one spanning tree per root, all roots at one rate (all-gather, reduce-scatter, both for all-reduce)"
    }
    fn searched(&self) -> bool {
        true
    }
    fn supports(&self, c: Collective) -> bool {
        matches!(c, Collective::AllGather | Collective::ReduceScatter | Collective::AllReduce)
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        let coll = req.collective;
        if !self.supports(coll) {
            return Err(unsupported(
                "forest",
                coll,
                "tree packing per root builds all-gather, reduce-scatter and all-reduce",
            ));
        }
        let n = req.nranks();
        if n as usize > FOREST_MAX_RANKS {
            return Err(unsupported("forest", coll, "packing a tree per root is run up to 32 ranks"));
        }
        if n == 1 {
            let mut b = ScheduleBuilder::new("forest", coll, 1, 1);
            b.in_place(true);
            b.push(0, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(0) }, 1);
            return Ok(b.build());
        }
        let directions: &[Direction] = match coll {
            Collective::AllGather => &[Direction::Out],
            Collective::ReduceScatter => &[Direction::In],
            _ => &[Direction::In, Direction::Out],
        };
        let mut base = 0;
        let mut laid = Vec::with_capacity(directions.len());
        for &d in directions {
            let plan = plan_for(req.topology, d, req.follow_paths)
                .filter(|p| !p.bundles.is_empty())
                .ok_or_else(|| unsupported("forest", coll, "some rank cannot reach another"))?;
            let (l, next) = Laid::new(plan, base);
            base = next;
            laid.push(l);
        }
        // Chunks per root: a whole number per lane of every direction, about `pipeline` each.
        let pipeline = if req.pipeline <= 1 { DEFAULT_PIPELINE } else { req.pipeline };
        let lcm = laid.iter().fold(1, |a, l| a / gcd(a, l.lanes()) * l.lanes());
        let most = laid.iter().map(Laid::lanes).max().unwrap_or(1);
        let per_root = lcm * (pipeline * most).div_ceil(lcm);
        let chunks = n * per_root;
        let mut b = ScheduleBuilder::new("forest", coll, n, chunks);
        b.in_place(true);
        if coll == Collective::ReduceScatter {
            b.reserve_scratch(chunks);
        }
        for j in 0..per_root {
            for s in 0..n {
                let c = s * per_root + j;
                match coll {
                    Collective::AllGather => {
                        let t = laid[0].tree_of(s, j, per_root);
                        // In place the copy is a no-op, but the verifier (and an executor) must
                        // see it ordered before the reads of the same bytes.
                        let copy = b.push(s, t.base(), Op::Copy { src: Slot::input(j), dst: Slot::output(c) }, 1);
                        t.broadcast(&mut b, Slot::output(c), Slot::output(c), &[copy]);
                    }
                    Collective::ReduceScatter => {
                        let t = laid[0].tree_of(s, j, per_root);
                        t.reduce(&mut b, Slot::input(c), &|_| Slot::scratch(c), Slot::output(j));
                    }
                    _ => {
                        let up = laid[0].tree_of(s, j, per_root);
                        let down = laid[1].tree_of(s, j, per_root);
                        let summed = up.reduce(&mut b, Slot::input(c), &|_| Slot::output(c), Slot::output(c));
                        down.broadcast(&mut b, Slot::output(c), Slot::output(c), &summed);
                    }
                }
            }
        }
        let mut schedule = b.build();
        for l in &laid {
            l.mark_fabric_sends(&mut schedule);
        }
        Ok(schedule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;
    use crate::verify::verify;

    #[test]
    fn forest_schedules_verify() {
        for spec in ["dgx1", "dgx1[0,1,4]", "dgx-a100", "cluster-2x4-slow", "ring:5", "ring:1"] {
            let t = resolve(spec).unwrap();
            for coll in [Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce] {
                for follow in [false, true] {
                    let s = Forest.generate(&Request::new(&t, coll).follow_paths(follow)).unwrap();
                    verify(&s).unwrap_or_else(|e| panic!("{spec} {coll}: {e}"));
                }
            }
        }
    }
}

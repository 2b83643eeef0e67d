//! Blink (Wang et al., MLSys 2020): pack spanning trees into the link capacities and split the
//! data across them in proportion to their rates, so that every link works, whatever the
//! topology — where rings need a Hamiltonian cycle of fast links (fragmented DGX-1 allocations
//! often have none), trees only need connectivity.
//!
//! - [`fractional`]: fractional packing by multiplicative weights, with a certified ceiling.
//! - [`select`]: LP over the trees found, then an ILP that keeps a few (Blink's second stage).
//! - [`exact`]: where capacities are whole multiples of a unit (NVLink counts) and the trees are
//!   rooted (broadcast, reduce), Edmonds' theorem gives an exact integral packing with as many
//!   trees as the min cut; it is computed too and wins when it is at least as fast.
//!
//! All-reduce reduces up each tree and broadcasts down it (both directions of each tree edge);
//! broadcast and reduce use arborescences out of / into the root. Chunks of a tree are
//! pipelined, one step per chunk, emitted by the same [`TreeLanes`] as the double binary tree.

use crate::error::Result;
use crate::generate::{unsupported, Request, ScheduleGenerator};
use crate::packing::fractional::{self, pack_trees, PackedTree, PackingShape};
use crate::packing::multipath::{self, MultipathPlan};
use crate::packing::{exact, lanes, select};
use crate::recent::Recent;
use crate::schedule::{Collective, Schedule, ScheduleBuilder};
use crate::topology::logical::RankGraph;
use crate::topology::Topology;
use crate::trees::{Tree, TreeLanes};

/// MWU stops when its rate is this close to its certificate (the LP then closes most of the gap).
const TOLERANCE: f64 = 0.02;
/// The ILP may give up this much rate to use fewer trees.
const SLACK: f64 = 0.01;
/// Above this many ranks the packing is not run to convergence (minutes on a 512-rank
/// cluster): a few spread-out trees are used instead, and the method says so.
const PACKING_MAX_RANKS: usize = 64;
const LARGE_TREES: usize = 4;
/// Chunks per tree when the request leaves pipelining to us.
const DEFAULT_PIPELINE: u32 = 32;
/// Equal-rate lanes the trees are emitted as (DGX-1 fragments, % of bound, mean over the 5- /
/// 6-GPU sets: 8 lanes 91.3 / 77.9, 16 91.9 / 88.4, 32 94.0 / 91.4, 64 94.1 / 92.3).
const LANES: usize = 32;
/// Trees over two paths per pair are used when they beat the one-path plan by this much
/// (relative): otherwise the plan that every transport can follow is kept.
const MULTIPATH_GAIN: f64 = 0.02;

/// The trees Blink uses for one collective and how they were found.
#[derive(Debug, Clone, PartialEq)]
pub struct TreePlan {
    pub shape: PackingShape,
    pub trees: Vec<PackedTree>,
    /// Σ tree rates, GB/s.
    pub rate: f64,
    /// No packing of this shape beats this, GB/s.
    pub upper: f64,
    /// `mwu+ilp`, `edmonds` (exact integral), `spread` (large graphs, not optimised; `upper`
    /// is then NaN) or `local` (one rank).
    pub method: &'static str,
}

/// Packs trees for `collective` on `topo`.
pub fn plan(topo: &Topology, collective: Collective) -> Result<TreePlan> {
    let shape = match collective {
        Collective::AllReduce => PackingShape::Bidirectional,
        Collective::Broadcast { root } => PackingShape::Rooted { root, reversed: false },
        Collective::Reduce { root } => PackingShape::Rooted { root, reversed: true },
        other => return Err(unsupported("blink", other, "tree packing builds all-reduce, broadcast and reduce")),
    };
    if topo.nranks() <= 1 {
        // One rank: a one-node tree (the collective is a local copy).
        let trees = vec![PackedTree { root: 0, parent: vec![None], rate: 1.0 }];
        return Ok(TreePlan { shape, trees, rate: 1.0, upper: f64::INFINITY, method: "local" });
    }
    let graph = RankGraph::of(topo);
    if topo.nranks() > PACKING_MAX_RANKS {
        let trees = fractional::spread_trees(&graph, shape, LARGE_TREES);
        let rate = trees.iter().map(|t| t.rate).sum::<f64>();
        if trees.is_empty() {
            return Err(unsupported("blink", collective, "the ranks cannot be spanned by trees of usable links"));
        }
        return Ok(TreePlan { shape, trees, rate, upper: f64::NAN, method: "spread" });
    }
    // Rooted shapes on whole-link capacities: Edmonds' packing, when it reaches the ceiling no
    // packing can pass, is the answer, and the MWU (tens of seconds at 64 ranks) is not run.
    let integral = match shape {
        PackingShape::Rooted { root, reversed } => exact::unit_capacities(&graph).and_then(|(unit, units)| {
            let trees = exact::pack_arborescences(&graph, &units, unit, root, reversed);
            let rate = unit * trees.len() as f64;
            (!trees.is_empty()).then_some((trees, rate, exact::rooted_ceiling(&graph, root, reversed)))
        }),
        PackingShape::Bidirectional => None,
    };
    let integral = match integral {
        Some((trees, rate, ceiling)) if rate >= ceiling * (1.0 - 1e-9) => {
            return Ok(TreePlan { shape, trees, rate, upper: ceiling, method: "edmonds" });
        }
        other => other,
    };
    let packing = pack_trees(&graph, shape, TOLERANCE);
    if packing.trees.is_empty() {
        return Err(unsupported(
            "blink",
            collective,
            "the ranks cannot be spanned by trees of usable links (an all-reduce tree needs links both ways)",
        ));
    }
    let trees = select::select_trees(&graph, shape, packing.trees, SLACK);
    let rate = trees.iter().map(|t| t.rate).sum::<f64>();
    let mut best = TreePlan { shape, trees, rate, upper: packing.upper.max(rate), method: "mwu+ilp" };
    if let Some((trees, rate, _)) = integral {
        if rate >= best.rate * (1.0 - 1e-9) {
            best = TreePlan { shape, trees, rate, upper: best.upper.max(rate), method: "edmonds" };
        }
    }
    Ok(best)
}

/// Splits `total` chunks over trees in proportion to `rates` (largest remainder, each ≥ 1),
/// trying totals from `base` to 2·`base` and keeping the one whose slowest tree is least
/// overloaded.
fn split_chunks(rates: &[f64], base: u32) -> Vec<u32> {
    let sum: f64 = rates.iter().sum();
    let mut best: (f64, Vec<u32>) = (f64::INFINITY, Vec::new());
    for total in base..=2 * base {
        let exact: Vec<f64> = rates.iter().map(|r| r / sum * f64::from(total)).collect();
        let mut parts: Vec<u32> = exact.iter().map(|e| (e.floor() as u32).max(1)).collect();
        let mut order: Vec<usize> = (0..rates.len()).collect();
        order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
        let mut k = 0;
        while parts.iter().sum::<u32>() < total && k < order.len() {
            parts[order[k]] += 1;
            k += 1;
        }
        let total = parts.iter().sum::<u32>();
        // Time ∝ the worst chunks-per-rate, relative to perfect proportion.
        let worst =
            parts.iter().zip(rates).map(|(&c, &r)| f64::from(c) / r).fold(0.0, f64::max) * sum / f64::from(total);
        if worst < best.0 - 1e-9 {
            best = (worst, parts);
        }
    }
    best.1
}

/// The plans Blink emits for `collective`: the one-path plan ([`plan`]) and, where paths are
/// followed and trees over two paths per pair (PCIe beside NVLink) beat it by
/// [`MULTIPATH_GAIN`], those, which are then emitted instead.
pub fn emitted_plans(
    topo: &Topology,
    collective: Collective,
    follow_paths: bool,
) -> Result<(TreePlan, Option<MultipathPlan>)> {
    let one_path = plan(topo, collective)?;
    let two_paths = (follow_paths && collective == Collective::AllReduce && topo.nranks() <= PACKING_MAX_RANKS)
        .then(|| multipath::multipath_plan(topo, TOLERANCE, SLACK))
        .flatten()
        .filter(|m| m.rate > one_path.rate * (1.0 + MULTIPATH_GAIN));
    Ok((one_path, two_paths))
}

/// Marks the sends of every lane whose tree edge takes the fabric path.
fn mark_fabric_sends(schedule: &mut Schedule, plan: &MultipathPlan, lanes: &[(usize, std::ops::Range<u32>)]) {
    for (t, channels) in lanes {
        let tree = &plan.trees[*t];
        schedule.mark_via_fabric(channels.clone(), |from, to| tree.via_fabric(&plan.arcs, from, to));
    }
}

/// The trees Blink emits and their lanes, by (topology fingerprint, collective, fabric paths):
/// the tuner prices one topology at several pipeline depths, and the packing does not depend
/// on the depth.
static RECENT_LANES: Recent<(u64, Collective, bool), LaidTrees> = Recent::new(8);

/// A collective's trees ([`emitted_plans`]) laid out as lanes, before any chunk is placed.
struct LaidTrees {
    trees: Vec<PackedTree>,
    /// Each lane's tree (an index into `trees`) and its share of the data.
    lanes_of: Vec<(usize, f64)>,
    /// The plan over two paths per pair, where that is what is emitted.
    two_paths: Option<MultipathPlan>,
}

impl LaidTrees {
    fn new(topo: &Topology, coll: Collective, follow_paths: bool) -> Result<LaidTrees> {
        let (tree_plan, two_paths) = emitted_plans(topo, coll, follow_paths)?;
        let trees: Vec<PackedTree> = match &two_paths {
            Some(m) => m.trees.iter().map(|t| t.tree.clone()).collect(),
            None => tree_plan.trees,
        };
        // Trees sharing a link get equal shares of it per message stream (as the simulator and
        // fair networks give them), not shares in proportion to their rates: the plan is
        // emitted as equal lanes, a whole number per tree ([`lanes`]).
        let counts = if let Some(m) = &two_paths {
            let rates: Vec<f64> = trees.iter().map(|t| t.rate).collect();
            lanes::lane_counts_on(&m.cap, &m.usage, &rates, LANES).0
        } else {
            lanes::lane_counts(&RankGraph::of(topo), tree_plan.shape, &trees, LANES).0
        };
        // Every lane carries the same data (what equal sharing of a link rewards).
        let mut lanes_of: Vec<(usize, f64)> = Vec::new();
        for (i, &copies) in counts.iter().enumerate() {
            lanes_of.extend(std::iter::repeat((i, 1.0)).take(copies));
        }
        if lanes_of.is_empty() {
            lanes_of.extend(trees.iter().enumerate().map(|(i, t)| (i, t.rate)));
        }
        Ok(LaidTrees { trees, lanes_of, two_paths })
    }
}

pub struct Blink;

impl ScheduleGenerator for Blink {
    fn name(&self) -> &'static str {
        "blink"
    }
    fn describe(&self) -> &'static str {
        "Blink spanning-tree packing (MWU + ILP; exact Edmonds packing for whole-link capacities)"
    }
    fn searched(&self) -> bool {
        true
    }
    fn supports(&self, c: Collective) -> bool {
        matches!(c, Collective::AllReduce | Collective::Broadcast { .. } | Collective::Reduce { .. })
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        let coll = req.collective;
        let laid = RECENT_LANES.get_or_try((req.topology.fingerprint(), coll, req.follow_paths), || {
            LaidTrees::new(req.topology, coll, req.follow_paths)
        })?;
        let LaidTrees { trees, lanes_of, two_paths } = &*laid;
        let rates: Vec<f64> = lanes_of.iter().map(|l| l.1).collect();
        let per_tree = if req.pipeline <= 1 { DEFAULT_PIPELINE } else { req.pipeline };
        let split = split_chunks(&rates, per_tree * lanes_of.len() as u32);
        let chunks: u32 = split.iter().sum();
        let mut b = ScheduleBuilder::new("blink", coll, req.nranks(), chunks);
        b.in_place(true);
        if matches!(coll, Collective::Reduce { .. }) {
            b.reserve_scratch(chunks);
        }
        let mut base = 0;
        let mut c = 0;
        // Each lane's tree and the channels it occupies.
        let mut lane_channels = Vec::with_capacity(lanes_of.len());
        for (&(t, _), &count) in lanes_of.iter().zip(&split) {
            let lanes = TreeLanes::new(Tree::from_parents(trees[t].parent.clone()), base);
            lane_channels.push((t, base..base + lanes.channels()));
            base += lanes.channels();
            for _ in 0..count {
                lanes.emit_chunk(&mut b, coll, c)?;
                c += 1;
            }
        }
        let mut schedule = b.build();
        if let Some(m) = two_paths {
            mark_fabric_sends(&mut schedule, m, &lane_channels);
        }
        Ok(schedule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Rank;
    use crate::topology::resolve;
    use crate::verify::verify;

    #[test]
    fn chunk_split_follows_rates() {
        assert_eq!(split_chunks(&[1.0, 1.0], 4).iter().sum::<u32>() % 2, 0);
        let s = split_chunks(&[3.0, 1.0], 8);
        assert_eq!(s[0], 3 * s[1]);
    }

    #[test]
    fn blink_schedules_verify_on_fragments() {
        for spec in ["dgx1", "dgx1[0,1,2]", "dgx1[0,1,4,5,6]", "cluster-2x4-slow", "ring:5"] {
            let t = resolve(spec).unwrap();
            for coll in [Collective::AllReduce, Collective::Broadcast { root: 1 }, Collective::Reduce { root: 2 }] {
                let s = Blink.generate(&Request::new(&t, coll)).unwrap();
                verify(&s).unwrap_or_else(|e| panic!("{spec} {coll}: {e}"));
            }
        }
    }

    #[test]
    fn rooted_plans_at_the_ceiling_are_edmonds_alone() {
        // A full mesh of 64: 63 disjoint arborescences reach the root's min cut, so the plan is
        // Edmonds' with the exact ceiling (no MWU certificate above it), and its trees fit.
        let t = resolve("full:64").unwrap();
        let g = RankGraph::of(&t);
        for coll in [Collective::Broadcast { root: 5 }, Collective::Reduce { root: 63 }] {
            let p = plan(&t, coll).unwrap();
            assert_eq!((p.method, p.trees.len()), ("edmonds", 63), "{coll}");
            assert!((p.upper - p.rate).abs() <= 1e-9 * p.rate, "{coll}: {} vs {}", p.upper, p.rate);
            let mut used = vec![0u32; g.arcs().len()];
            for tree in &p.trees {
                for (v, parent) in tree.parent.iter().enumerate() {
                    if let Some(u) = parent {
                        let (from, to) =
                            if matches!(coll, Collective::Reduce { .. }) { (v as Rank, *u) } else { (*u, v as Rank) };
                        used[g.find(from, to).unwrap()] += 1;
                    }
                }
            }
            assert!(used.iter().all(|&u| u <= 1), "{coll}: an arc carries two trees");
        }
    }

    #[test]
    fn edmonds_and_mwu_agree_on_whole_link_capacities() {
        // Rooted packings on NVLink-only graphs: the fractional optimum equals the integral one.
        let t = resolve("dgx1").unwrap();
        let g = RankGraph::of(&t).clone();
        let direct: Vec<_> = g.arcs().iter().copied().filter(|a| a.direct).collect();
        let nv = RankGraph::from_arcs(8, direct);
        let (unit, units) = exact::unit_capacities(&nv).unwrap();
        for root in [0, 5] {
            let k = exact::pack_arborescences(&nv, &units, unit, root, false).len() as f64 * unit;
            let p = pack_trees(&nv, PackingShape::Rooted { root, reversed: false }, 0.01);
            assert!(p.lower <= k * (1.0 + 1e-9) && p.upper >= k * (1.0 - 1e-9), "{k} vs [{}, {}]", p.lower, p.upper);
            assert!(p.lower >= 0.98 * k);
        }
    }
}

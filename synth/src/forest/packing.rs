//! The packing behind [`super::Forest`]: one spanning tree per root, every root at the same
//! rate, packed into the machine's link capacities.
//!
//! All-gather needs every rank's shard at every other rank at one rate x, i.e. out-trees from
//! every root (ForestColl, Zhao et al. 2024); reduce-scatter needs in-trees into every root. The
//! packing is found as *bundles*: a bundle holds one tree per root, all carrying the bundle's
//! rate. Any packing whose roots have equal rates splits into bundles (pair the roots' trees
//! off in order of their cumulative rates), and the cheapest bundle under link lengths is every
//! root's cheapest tree (Chu–Liu/Edmonds), so Garg–Könemann over bundles is the exact
//! fractional optimum, certificate included. Each tree edge takes one path of its pair: the
//! router's or, where transports follow paths, the fabric's (PCIe beside NVLink), so links that
//! several paths cross are shared exactly.

use crate::blink::arborescence::{min_arborescence, WeightedArc};
use crate::blink::multipath::{path_arcs, PathArc};
use crate::blink::packing::{garg_konemann, FoundTree};
use crate::blink::select::select;
use crate::schedule::Rank;
use crate::topology::Topology;

/// Which way data flows along the trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Out of the root to every rank (all-gather).
    Out,
    /// From every rank into the root, summed on the way (reduce-scatter).
    In,
}

/// One root's tree: every other rank's parent (towards the root) and the path arc its edge
/// takes (parent → rank for [`Direction::Out`], rank → parent for [`Direction::In`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RootTree {
    pub root: Rank,
    pub parent: Vec<Option<Rank>>,
    pub arc: Vec<Option<usize>>,
}

impl RootTree {
    /// The path arc a send from `from` to `to` takes on this tree, if it is a tree edge.
    pub fn arc_of_send(&self, from: Rank, to: Rank) -> Option<usize> {
        if self.parent[to as usize] == Some(from) {
            self.arc[to as usize]
        } else if self.parent[from as usize] == Some(to) {
            self.arc[from as usize]
        } else {
            None
        }
    }
}

/// One tree per root (indexed by root), all at `rate`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    pub trees: Vec<RootTree>,
    pub rate: f64,
}

/// A packing of bundles.
#[derive(Debug, Clone, PartialEq)]
pub struct ForestPlan {
    pub direction: Direction,
    pub arcs: Vec<PathArc>,
    pub bundles: Vec<Bundle>,
    /// Σ bundle rates: the rate of every root's shard, GB/s.
    pub rate: f64,
    /// No packing of these paths gives a root more, GB/s.
    pub upper: f64,
    /// Capacity of every link group, and the groups each kept bundle crosses (once per
    /// crossing, for lane counts).
    pub cap: Vec<f64>,
    pub usage: Vec<Vec<usize>>,
}

/// Packs bundles of trees of `direction` over every pair's routed path (and its fabric path
/// with `fabric`) until within `tolerance` of the certificate, then keeps a few by LP/ILP
/// (`slack`: rate given up for fewer bundles). `None` where some rank cannot reach another.
pub fn forest_plan(
    topo: &Topology,
    direction: Direction,
    fabric: bool,
    tolerance: f64,
    slack: f64,
) -> Option<ForestPlan> {
    let n = topo.nranks();
    if n <= 1 {
        return None;
    }
    let arcs = path_arcs(topo, fabric)?;
    let cap: Vec<f64> = topo.link_groups().iter().map(|g| g.bandwidth).collect();
    let mut between: Vec<Vec<usize>> = vec![Vec::new(); n * n];
    for (i, a) in arcs.iter().enumerate() {
        between[a.from as usize * n + a.to as usize].push(i);
    }
    let round_work = n * (arcs.len() + n * n);
    let packed = garg_konemann(&cap, tolerance, round_work, true, |length| {
        let len = |i: usize| arcs[i].groups.iter().map(|&g| length[g]).sum::<f64>();
        // Each pair's cheaper path, as an arc of the direction the trees grow in (from the
        // root outwards: reversed for in-trees).
        let mut warcs = Vec::new();
        let mut path_of = Vec::new();
        for a in 0..n {
            for b in 0..n {
                let cheapest = between[a * n + b]
                    .iter()
                    .map(|&i| (len(i), i))
                    .min_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
                if let Some((weight, i)) = cheapest {
                    let (from, to) = match direction {
                        Direction::Out => (a, b),
                        Direction::In => (b, a),
                    };
                    warcs.push(WeightedArc { from, to, weight });
                    path_of.push(i);
                }
            }
        }
        let mut trees = Vec::with_capacity(n);
        let mut usage = Vec::new();
        let mut total = 0.0;
        for root in 0..n {
            let entering = min_arborescence(n, root, &warcs)?;
            let mut parent = vec![None; n];
            let mut arc = vec![None; n];
            for (v, w) in entering.iter().enumerate() {
                if let Some(w) = *w {
                    parent[v] = Some(warcs[w].from as Rank);
                    arc[v] = Some(path_of[w]);
                    usage.extend(&arcs[path_of[w]].groups);
                    total += warcs[w].weight;
                }
            }
            trees.push(RootTree { root: root as Rank, parent, arc });
        }
        Some(FoundTree { key: trees, usage, length: total })
    })?;
    let rates: Vec<f64> = packed.trees.iter().map(|t| t.2).collect();
    let usage: Vec<Vec<usize>> = packed.trees.iter().map(|t| t.1.clone()).collect();
    let kept = select(&cap, &usage, &rates, slack);
    let mut bundles = Vec::with_capacity(kept.len());
    let mut kept_usage = Vec::with_capacity(kept.len());
    for (i, rate) in kept {
        bundles.push(Bundle { trees: packed.trees[i].0.clone(), rate });
        kept_usage.push(usage[i].clone());
    }
    let rate = bundles.iter().map(|b| b.rate).sum();
    Some(ForestPlan { direction, arcs, bundles, rate, upper: packed.upper.max(rate), cap, usage: kept_usage })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bound::bound;
    use crate::schedule::Collective;
    use crate::topology::resolve;

    fn check_fits(plan: &ForestPlan) {
        let mut load = vec![0.0; plan.cap.len()];
        for (b, u) in plan.bundles.iter().zip(&plan.usage) {
            for &g in u {
                load[g] += b.rate;
            }
        }
        assert!(load.iter().zip(&plan.cap).all(|(l, c)| *l <= c * (1.0 + 1e-6)), "{load:?}");
    }

    #[test]
    fn trees_span_from_every_root() {
        let topo = resolve("dgx1").unwrap();
        for direction in [Direction::Out, Direction::In] {
            let plan = forest_plan(&topo, direction, true, 0.02, 0.01).unwrap();
            check_fits(&plan);
            for b in &plan.bundles {
                for (r, t) in b.trees.iter().enumerate() {
                    assert_eq!(t.root as usize, r);
                    for v in 0..8 {
                        let mut x = v as Rank;
                        let mut hops = 0;
                        while let Some(p) = t.parent[x as usize] {
                            let arc = &plan.arcs[t.arc[x as usize].unwrap()];
                            let (from, to) = if direction == Direction::Out { (p, x) } else { (x, p) };
                            assert_eq!((arc.from, arc.to), (from, to));
                            x = p;
                            hops += 1;
                            assert!(hops < 8);
                        }
                        assert_eq!(x as usize, r);
                    }
                }
            }
        }
    }

    #[test]
    fn all_gather_forest_reaches_the_cut_bound_on_a_dgx1() {
        // Every GPU's shard at rate x to all: the cut bound's x* is reached by trees over NVLink
        // and PCIe both; over NVLink alone (one path per pair) it is not.
        let topo = resolve("dgx1").unwrap();
        let n = topo.nranks() as f64;
        let bound = bound(&topo, Collective::AllGather).rate_gbps / n;
        let both = forest_plan(&topo, Direction::Out, true, 0.01, 0.01).unwrap();
        assert!(both.rate >= 0.97 * bound, "{} vs bound {bound}", both.rate);
        let one = forest_plan(&topo, Direction::Out, false, 0.01, 0.01).unwrap();
        assert!(one.upper < 0.97 * bound, "{} vs bound {bound}", one.upper);
    }
}

//! Fractional packing of spanning trees into the rank graph's capacities by multiplicative
//! weight updates (Garg–Könemann), as Blink does.
//!
//! Each round prices every arc by its weight, asks an oracle for the cheapest tree, routes the
//! tree's bottleneck through it and raises the weights of the arcs it used. Every round also
//! yields a certificate: with arc weights ℓ, no packing can exceed Σ c·ℓ / (cheapest tree
//! under ℓ), so the result carries both a feasible rate (`lower`) and a proven ceiling
//! (`upper`); the loop stops when they are within the tolerance.

use std::collections::HashMap;

use super::arborescence::{min_arborescence, min_spanning_tree, orient, WeightedArc};
use crate::schedule::Rank;
use crate::topology::logical::RankGraph;

/// What the trees are used for, which decides the arcs a tree occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackingShape {
    /// Undirected spanning trees used both ways (all-reduce: reduce towards a root on one
    /// direction of each edge, broadcast back on the other).
    Bidirectional,
    /// Arborescences out of `root` (broadcast), or into it when `reversed` (reduce).
    Rooted { root: Rank, reversed: bool },
}

/// A tree of the packing: parent of every rank (root: `None`) and its rate in GB/s.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedTree {
    pub root: Rank,
    pub parent: Vec<Option<Rank>>,
    pub rate: f64,
}

impl PackedTree {
    /// Arc ids of `graph` this tree occupies under `shape`.
    pub fn arcs(&self, graph: &RankGraph, shape: PackingShape) -> Vec<usize> {
        let mut out = Vec::new();
        for (v, p) in self.parent.iter().enumerate() {
            if let Some(p) = *p {
                let v = v as Rank;
                let dirs: &[(Rank, Rank)] = match shape {
                    PackingShape::Bidirectional => &[(p, v), (v, p)],
                    PackingShape::Rooted { reversed: false, .. } => &[(p, v)],
                    PackingShape::Rooted { reversed: true, .. } => &[(v, p)],
                };
                out.extend(dirs.iter().filter_map(|&(a, b)| graph.find(a, b)));
            }
        }
        out
    }
}

/// A packing with its certificate.
#[derive(Debug, Clone, PartialEq)]
pub struct Packing {
    pub shape: PackingShape,
    /// Trees with rates that together respect every capacity.
    pub trees: Vec<PackedTree>,
    /// Σ rates of `trees` (GB/s).
    pub lower: f64,
    /// No packing of this shape exceeds this (GB/s).
    pub upper: f64,
    pub rounds: usize,
}

/// Cap on MWU work, in rounds × the work of one round (`round_work`: a rank-graph round reads
/// every arc for the oracle and again for the certificate, 2 per arc); large graphs get fewer
/// rounds, and the certificate says how close they got.
const WORK_BUDGET: usize = 40_000_000;
const MIN_ROUNDS: usize = 30;

/// Packs trees of `shape` into `graph` until the feasible rate is within `tolerance` (relative)
/// of the certified ceiling, or the round cap.
pub fn pack_trees(graph: &RankGraph, shape: PackingShape, tolerance: f64) -> Packing {
    let cap: Vec<f64> = graph.arcs().iter().map(|a| a.bandwidth).collect();
    let empty = |upper| Packing { shape, trees: Vec::new(), lower: 0.0, upper, rounds: 0 };
    if graph.nranks() <= 1 {
        return empty(f64::INFINITY);
    }
    let packed = garg_konemann(&cap, tolerance, 2 * cap.len(), false, |length| {
        let tree = cheapest_tree(graph, shape, length)?;
        let usage = tree.arcs(graph, shape);
        let length = usage.iter().map(|&a| length[a]).sum();
        Some(FoundTree { key: tree.parent, usage, length })
    });
    let Some(packed) = packed else {
        return empty(0.0); // the graph cannot span all ranks with this shape
    };
    let trees =
        packed.trees.into_iter().map(|(parent, _, rate)| PackedTree { root: root_of(&parent), parent, rate }).collect();
    Packing { shape, trees, lower: packed.lower, upper: packed.upper, rounds: packed.rounds }
}

/// The rank without a parent.
fn root_of(parent: &[Option<Rank>]) -> Rank {
    parent.iter().position(Option::is_none).unwrap_or(0) as Rank
}

/// A tree the oracle found: what identifies it (`key`), the link groups its paths cross (once
/// per crossing) and its length under the current link lengths.
pub(crate) struct FoundTree<K> {
    pub key: K,
    pub usage: Vec<usize>,
    pub length: f64,
}

/// The packing Garg–Könemann found: distinct trees with their rates (which together fit every
/// capacity), their total and the certified ceiling.
pub(crate) struct Packed<K> {
    pub trees: Vec<(K, Vec<usize>, f64)>,
    pub lower: f64,
    pub upper: f64,
    pub rounds: usize,
}

/// Garg–Könemann over resources of capacities `cap` (rank arcs, or the machine's link groups):
/// `cheapest` returns the cheapest tree under the lengths it is given (`None`: the ranks cannot
/// be spanned). Each round routes the tree's bottleneck through it, raises the lengths of what
/// it used and yields a certificate; it stops when the feasible rate is within `tolerance` of
/// the best certificate, or after [`WORK_BUDGET`] / `round_work` rounds.
pub(crate) fn garg_konemann<K: PartialEq>(
    cap: &[f64],
    tolerance: f64,
    round_work: usize,
    reuse: bool,
    mut cheapest: impl FnMut(&[f64]) -> Option<FoundTree<K>>,
) -> Option<Packed<K>> {
    let eps = (tolerance / 2.0).clamp(1e-3, 0.1);
    let mut length: Vec<f64> = cap.iter().map(|c| 1.0 / c).collect();
    let mut load = vec![0.0f64; cap.len()];
    let mut trees: Vec<(K, Vec<usize>, f64)> = Vec::new();
    let mut total = 0.0f64;
    let mut upper = f64::INFINITY;
    let mut uses = vec![0u32; cap.len()];
    // Each tree's index in `trees`, by the (sorted) resources it uses.
    let mut seen: HashMap<Vec<usize>, Vec<usize>> = HashMap::new();
    let mut rounds = 0;
    let max_rounds = (WORK_BUDGET / round_work.max(1)).max(MIN_ROUNDS);
    while rounds < max_rounds {
        rounds += 1;
        let tree = cheapest(&length)?;
        let volume: f64 = length.iter().zip(cap).map(|(l, c)| l * c).sum();
        upper = upper.min(volume / tree.length);
        // With `reuse`, a tree found before that is nearly as cheap is routed instead: the
        // packing then keeps to a few dozen trees, not thousands that each carry a sliver,
        // which the LP that selects among them could not take in.
        let mut pick: Option<usize> = None;
        if reuse {
            let mut best_len = tree.length * (1.0 + eps);
            for (i, t) in trees.iter().enumerate() {
                let l: f64 = t.1.iter().map(|&g| length[g]).sum();
                if l <= best_len {
                    best_len = l;
                    pick = Some(i);
                }
            }
        }
        let usage: &[usize] = match pick {
            Some(i) => &trees[i].1,
            None => &tree.usage,
        };
        uses.iter_mut().for_each(|u| *u = 0);
        for &g in usage {
            uses[g] += 1;
        }
        let rate = uses
            .iter()
            .zip(cap)
            .filter(|(u, _)| **u > 0)
            .map(|(&u, &c)| c / f64::from(u))
            .fold(f64::INFINITY, f64::min);
        for (g, &u) in uses.iter().enumerate().filter(|(_, u)| **u > 0) {
            let flow = rate * f64::from(u);
            load[g] += flow;
            length[g] *= 1.0 + eps * flow / cap[g];
        }
        total += rate;
        // Thousands of distinct trees on a large graph: found by what they use, not by a scan.
        let mut sorted = tree.usage.clone();
        sorted.sort_unstable();
        let found =
            pick.or_else(|| seen.get(&sorted).and_then(|same| same.iter().copied().find(|&i| trees[i].0 == tree.key)));
        match found {
            Some(i) => trees[i].2 += rate,
            None => {
                seen.entry(sorted).or_default().push(trees.len());
                trees.push((tree.key, tree.usage, rate));
            }
        }
        let over = load.iter().zip(cap).map(|(l, c)| l / c).fold(0.0, f64::max);
        if total / over >= (1.0 - tolerance) * upper {
            break;
        }
        let max_len = length.iter().copied().fold(0.0, f64::max);
        if max_len > 1e100 {
            length.iter_mut().for_each(|l| *l /= max_len);
        }
    }
    // Scaled to fit every capacity.
    let over = load.iter().zip(cap).map(|(l, c)| l / c).fold(0.0, f64::max).max(f64::MIN_POSITIVE);
    trees.iter_mut().for_each(|t| t.2 /= over);
    let lower = trees.iter().map(|t| t.2).sum::<f64>();
    Some(Packed { trees, lower, upper: upper.max(lower), rounds })
}

/// For graphs too large for a converged packing: `count` trees, each the cheapest under
/// lengths that double on every arc the previous trees used (so they spread over the links),
/// all at the one equal rate the capacities allow.
pub fn spread_trees(graph: &RankGraph, shape: PackingShape, count: usize) -> Vec<PackedTree> {
    let cap: Vec<f64> = graph.arcs().iter().map(|a| a.bandwidth).collect();
    let mut length: Vec<f64> = cap.iter().map(|c| 1.0 / c).collect();
    let mut uses = vec![0u32; cap.len()];
    let mut trees: Vec<PackedTree> = Vec::new();
    for _ in 0..count {
        let Some(tree) = cheapest_tree(graph, shape, &length) else { break };
        for a in tree.arcs(graph, shape) {
            uses[a] += 1;
            length[a] *= 2.0;
        }
        trees.push(tree);
    }
    let rate =
        uses.iter().zip(&cap).filter(|(u, _)| **u > 0).map(|(&u, &c)| c / f64::from(u)).fold(f64::INFINITY, f64::min);
    for t in &mut trees {
        t.rate = if rate.is_finite() { rate } else { 0.0 };
    }
    trees
}

/// The oracle: the cheapest tree of `shape` under arc lengths `length`.
fn cheapest_tree(graph: &RankGraph, shape: PackingShape, length: &[f64]) -> Option<PackedTree> {
    let n = graph.nranks();
    match shape {
        PackingShape::Bidirectional => {
            let mut edges = Vec::new();
            for (i, a) in graph.arcs().iter().enumerate() {
                if a.from < a.to {
                    if let Some(back) = graph.find(a.to, a.from) {
                        edges.push((a.from as usize, a.to as usize, length[i] + length[back]));
                    }
                }
            }
            let chosen = min_spanning_tree(n, &edges)?;
            let pairs: Vec<(usize, usize)> = chosen.iter().map(|&e| (edges[e].0, edges[e].1)).collect();
            let root = center(n, &pairs);
            Some(PackedTree { root, parent: orient(n, root, &pairs), rate: 0.0 })
        }
        PackingShape::Rooted { root, reversed } => {
            let warcs: Vec<WeightedArc> = graph
                .arcs()
                .iter()
                .zip(length)
                .map(|(a, &l)| {
                    let (from, to) = if reversed { (a.to, a.from) } else { (a.from, a.to) };
                    WeightedArc { from: from as usize, to: to as usize, weight: l }
                })
                .collect();
            let parent_arc = min_arborescence(n, root as usize, &warcs)?;
            let parent = parent_arc.iter().map(|a| a.map(|i| warcs[i].from as Rank)).collect();
            Some(PackedTree { root, parent, rate: 0.0 })
        }
    }
}

/// The vertex of a tree whose farthest vertex is nearest (shallowest root).
pub(crate) fn center(n: usize, edges: &[(usize, usize)]) -> Rank {
    let mut adj = vec![Vec::new(); n];
    for &(a, b) in edges {
        adj[a].push(b);
        adj[b].push(a);
    }
    let depth_from = |s: usize| {
        let mut dist = vec![usize::MAX; n];
        dist[s] = 0;
        let mut queue = std::collections::VecDeque::from([s]);
        let mut far = 0;
        while let Some(u) = queue.pop_front() {
            far = far.max(dist[u]);
            for &v in &adj[u] {
                if dist[v] == usize::MAX {
                    dist[v] = dist[u] + 1;
                    queue.push_back(v);
                }
            }
        }
        far
    };
    (0..n).min_by_key(|&s| (depth_from(s), s)).unwrap_or(0) as Rank
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::logical::RankArc;
    use crate::topology::resolve;

    #[test]
    fn complete_graph_packs_n_over_two_trees() {
        // K4 with unit links both ways: 6 edges, 3 edges per tree → 2 trees (Nash-Williams).
        let arcs =
            (0..4).flat_map(|a| (0..4).filter(move |&b| b != a).map(move |b| RankArc::link(a, b, 1.0))).collect();
        let g = RankGraph::from_arcs(4, arcs);
        let p = pack_trees(&g, PackingShape::Bidirectional, 0.01);
        assert!(p.lower >= 0.99 * 2.0 && p.upper <= 2.0 * 1.01 + 1e-9, "{} {}", p.lower, p.upper);
        let b = pack_trees(&g, PackingShape::Rooted { root: 0, reversed: false }, 0.01);
        // Edmonds: min cut out of the root is 3.
        assert!(b.lower >= 0.99 * 3.0 && b.upper <= 3.0 * 1.01 + 1e-9, "{} {}", b.lower, b.upper);
    }

    #[test]
    fn packings_respect_capacities() {
        let g = RankGraph::of(&resolve("dgx1[0,1,2,4,5]").unwrap());
        for shape in [PackingShape::Bidirectional, PackingShape::Rooted { root: 2, reversed: true }] {
            let p = pack_trees(&g, shape, 0.05);
            let mut load = vec![0.0; g.arcs().len()];
            for t in &p.trees {
                for a in t.arcs(&g, shape) {
                    load[a] += t.rate;
                }
            }
            for (a, l) in load.iter().enumerate() {
                assert!(*l <= g.arc(a).bandwidth * (1.0 + 1e-9), "arc {a} over capacity");
            }
            assert!(p.lower >= 0.95 * p.upper, "{shape:?}: {} vs {}", p.lower, p.upper);
        }
    }
}

//! The ceiling of tree packings on the physical machine, for the optimality bound.
//!
//! [`packing`](super::packing) packs trees into the rank graph, where a pair of ranks has one
//! arc: the router's path. On a DGX-1 that path is the NVLink where there is one, so the PCIe
//! switches and CPUs beside it are never counted, and the packing's ceiling is what trees of
//! single-path pairs can reach, not what the machine can. Here every tree edge is *routed*:
//! each of its two directions takes some path of the physical graph (through switches, CPUs,
//! NICs and forwarding ranks), chosen afresh for every tree, so one pair may use its NVLink in
//! one tree and the PCIe fabric in another, and every link's capacity is shared exactly, not
//! split into fair shares.
//!
//! Garg–Könemann as in `packing`, over link groups instead of rank arcs. The oracle is exact:
//! a routed tree costs the sum of its edges' path lengths, so the cheapest one is a minimum
//! spanning tree of the ranks under shortest-path distances (both directions of an edge
//! added). With link lengths ℓ, no packing of routed trees exceeds Σ c·ℓ / (cheapest tree), which
//! is the certificate kept as `upper`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::arborescence::min_spanning_tree;
use crate::topology::Topology;

/// Work cap, in rounds × (ranks × link groups): one shortest-path search per rank per round.
const WORK_BUDGET: usize = 40_000_000;
const MIN_ROUNDS: usize = 30;

/// A packing of routed bidirectional trees: a feasible rate and a proven ceiling, GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutedCeiling {
    pub lower: f64,
    pub upper: f64,
    pub rounds: usize,
}

/// Shortest paths from one node under link-group lengths, through forwarding nodes only.
struct PathSearch {
    dist: Vec<f64>,
    /// The group each node was reached by.
    via: Vec<Option<usize>>,
}

/// A tree the oracle found: what identifies it (`key`), the link groups its paths cross (once
/// per crossing) and its length under the current link lengths.
pub(crate) struct FoundTree<K> {
    pub key: K,
    pub usage: Vec<usize>,
    pub length: f64,
}

/// The packing Garg–Könemann found: distinct trees with their rates, and the certificate.
pub(crate) struct Packed<K> {
    pub trees: Vec<(K, Vec<usize>, f64)>,
    pub ceiling: RoutedCeiling,
}

/// Garg–Könemann over link groups of capacities `cap`: `cheapest` returns the cheapest tree
/// under the lengths it is given (`None`: the ranks cannot be spanned). Rounds cost
/// `round_work` each against [`WORK_BUDGET`].
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
    let mut best = RoutedCeiling { lower: 0.0, upper, rounds: 0 };
    let mut uses = vec![0u32; cap.len()];
    let max_rounds = (WORK_BUDGET / round_work.max(1)).max(MIN_ROUNDS);
    for rounds in 1..=max_rounds {
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
        match pick.or_else(|| trees.iter().position(|t| t.0 == tree.key)) {
            Some(i) => trees[i].2 += rate,
            None => trees.push((tree.key, tree.usage, rate)),
        }
        let over = load.iter().zip(cap).map(|(l, c)| l / c).fold(0.0, f64::max);
        best = RoutedCeiling { lower: (total / over).max(best.lower), upper, rounds };
        if best.lower >= (1.0 - tolerance) * upper {
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
    Some(Packed { trees, ceiling: RoutedCeiling { upper: best.upper.max(best.lower), ..best } })
}

/// Packs routed bidirectional trees (all-reduce's reduce-then-broadcast shape) into the link
/// groups of `topo` until the feasible rate is within `tolerance` of the certified ceiling, or
/// the work cap. `None` when the ranks cannot all reach each other both ways.
pub fn routed_tree_ceiling(topo: &Topology, tolerance: f64) -> Option<RoutedCeiling> {
    let n = topo.nranks();
    if n <= 1 {
        return Some(RoutedCeiling { lower: f64::INFINITY, upper: f64::INFINITY, rounds: 0 });
    }
    let groups = topo.link_groups();
    let cap: Vec<f64> = groups.iter().map(|g| g.bandwidth).collect();
    let nodes = topo.graph().node_count();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    for (i, g) in groups.iter().enumerate() {
        out[g.from.index()].push(i);
    }
    let rank_node: Vec<usize> = (0..n as u32).map(|r| topo.rank_node(r).index()).collect();
    let forwards: Vec<bool> = topo.graph().node_indices().map(|v| topo.graph()[v].forwards).collect();
    let packed = garg_konemann(&cap, tolerance, n * groups.len(), false, |length| {
        let searches: Vec<PathSearch> =
            rank_node.iter().map(|&s| shortest_paths(s, &out, groups, length, &forwards, nodes)).collect();
        let mut edges = Vec::with_capacity(n * (n - 1) / 2);
        for a in 0..n {
            for b in a + 1..n {
                let w = searches[a].dist[rank_node[b]] + searches[b].dist[rank_node[a]];
                if w.is_finite() {
                    edges.push((a, b, w));
                }
            }
        }
        let tree = min_spanning_tree(n, &edges)?;
        let mut usage = Vec::new();
        for &e in &tree {
            let (a, b, _) = edges[e];
            for (from, to) in [(a, b), (b, a)] {
                let mut v = rank_node[to];
                while let Some(g) = searches[from].via[v] {
                    usage.push(g);
                    v = groups[g].from.index();
                }
            }
        }
        // The bound needs no trees: one key for all.
        Some(FoundTree { key: (), usage, length: tree.iter().map(|&e| edges[e].2).sum() })
    })?;
    Some(packed.ceiling)
}

/// Dijkstra from node `source` over link groups of length `length`; only forwarding nodes are
/// passed through (a GPU that does not relay ends a path).
fn shortest_paths(
    source: usize,
    out: &[Vec<usize>],
    groups: &[crate::topology::LinkGroup],
    length: &[f64],
    forwards: &[bool],
    nodes: usize,
) -> PathSearch {
    let mut dist = vec![f64::INFINITY; nodes];
    let mut via = vec![None; nodes];
    let mut heap = BinaryHeap::new();
    dist[source] = 0.0;
    heap.push(Reverse((Ordered(0.0), source)));
    while let Some(Reverse((Ordered(d), u))) = heap.pop() {
        if d > dist[u] || (u != source && !forwards[u]) {
            continue;
        }
        for &g in &out[u] {
            let v = groups[g].to.index();
            let nd = d + length[g];
            if nd < dist[v] {
                dist[v] = nd;
                via[v] = Some(g);
                heap.push(Reverse((Ordered(nd), v)));
            }
        }
    }
    PathSearch { dist, via }
}

/// A non-NaN f64 ordered for the heap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ordered(f64);

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blink::packing::{pack_trees, PackingShape};
    use crate::topology::logical::RankGraph;
    use crate::topology::resolve;

    #[test]
    fn routed_trees_reach_what_single_path_trees_reach_and_more_where_pcie_lies_beside_nvlink() {
        // All pairs of dgx1[0,2,3] have NVLink, so the rank graph has no PCIe at all: its trees
        // top out at 62.5 GB/s. Routed trees may also use the PCIe switches and CPU: 74.3, what
        // each NVLink pair plus half of each GPU's PCIe link gives (and above the 68.1 of
        // reduce-scatter + all-gather).
        let topo = resolve("dgx1[0,2,3]").unwrap();
        let single = pack_trees(&RankGraph::of(&topo), PackingShape::Bidirectional, 0.01);
        let routed = routed_tree_ceiling(&topo, 0.01).unwrap();
        assert!((single.upper - 62.5).abs() < 1.0, "{single:?}");
        assert!(routed.lower >= 73.0 && routed.upper >= 74.0 && routed.lower >= 0.98 * routed.upper, "{routed:?}");
        // Where every path is a direct link, routing changes nothing.
        let ring = resolve("ring:6").unwrap();
        let single = pack_trees(&RankGraph::of(&ring), PackingShape::Bidirectional, 0.01);
        let routed = routed_tree_ceiling(&ring, 0.01).unwrap();
        assert!((routed.upper - single.upper).abs() <= 0.02 * single.upper, "{routed:?} vs {single:?}");
    }
}

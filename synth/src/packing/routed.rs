//! The ceiling of tree packings on the physical machine, for the optimality bound.
//!
//! [`fractional`](super::fractional) packs trees into the rank graph, where a pair of ranks has one
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

use super::arborescence::min_spanning_tree;
use super::fractional::{garg_konemann, FoundTree};
use crate::topology::routing::{out_groups, PathSearch};
use crate::topology::Topology;

/// A packing of routed bidirectional trees: a feasible rate and a proven ceiling, GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutedCeiling {
    pub lower: f64,
    pub upper: f64,
    pub rounds: usize,
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
    let out = out_groups(topo);
    let rank_node: Vec<usize> = (0..n as u32).map(|r| topo.rank_node(r).index()).collect();
    let forwards: Vec<bool> = topo.graph().node_indices().map(|v| topo.graph()[v].forwards).collect();
    // One shortest-path search per rank per round.
    let packed = garg_konemann(&cap, tolerance, n * groups.len(), false, |length| {
        let searches: Vec<PathSearch> =
            rank_node.iter().map(|&s| PathSearch::new(topo, &out, s, |g| length[g], |v| forwards[v])).collect();
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
                usage.extend(searches[from].path_to(topo, rank_node[to]).unwrap_or_default());
            }
        }
        // The bound needs no trees: one key for all.
        Some(FoundTree { key: (), usage, length: tree.iter().map(|&e| edges[e].2).sum() })
    })?;
    Some(RoutedCeiling { lower: packed.lower, upper: packed.upper, rounds: packed.rounds })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::fractional::{pack_trees, PackingShape};
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

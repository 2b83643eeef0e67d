//! Blink's all-reduce trees over two paths per rank pair: the router's (a DGX-1 pair's NVLink,
//! a DGX-A100 pair's NVSwitch) and the fabric's (the PCIe switches and CPUs beside it), each
//! edge direction of each tree taking one of them. The rank graph gives a pair only the
//! router's path, so trees packed there leave that PCIe idle; Blink's paper runs trees over
//! both. Packed by Garg–Könemann ([`super::fractional::garg_konemann`]) over the machine's link
//! groups, so links that several paths cross are shared exactly; kept to a few trees by the
//! same LP/ILP as the one-path plan ([`super::select`]).

use super::arborescence::{min_spanning_tree, orient};
use super::fractional::{center, garg_konemann, FoundTree, PackedTree};
use crate::topology::logical::RankGraph;
use crate::topology::routing::Router;
use crate::topology::{Rank, Topology};

/// One way from one rank to another: the link groups crossed, and whether it is the fabric
/// path (a send over it is marked `via_fabric`).
#[derive(Debug, Clone, PartialEq)]
pub struct PathArc {
    pub from: Rank,
    pub to: Rank,
    pub groups: Vec<usize>,
    pub fabric: bool,
}

/// A tree and, for every rank with a parent, the arcs (indices into [`MultipathPlan::arcs`])
/// its edge takes up (to the parent) and down.
#[derive(Debug, Clone, PartialEq)]
pub struct MultipathTree {
    pub tree: PackedTree,
    pub up: Vec<Option<usize>>,
    pub down: Vec<Option<usize>>,
}

impl MultipathTree {
    /// Whether this tree's edge from `from` to `to` takes the fabric path.
    pub fn via_fabric(&self, arcs: &[PathArc], from: Rank, to: Rank) -> bool {
        let arc = if self.tree.parent[from as usize] == Some(to) {
            self.up[from as usize]
        } else if self.tree.parent[to as usize] == Some(from) {
            self.down[to as usize]
        } else {
            None
        };
        arc.is_some_and(|a| arcs[a].fabric)
    }
}

/// A packing of trees over both paths.
#[derive(Debug, Clone, PartialEq)]
pub struct MultipathPlan {
    pub arcs: Vec<PathArc>,
    pub trees: Vec<MultipathTree>,
    /// Σ tree rates, GB/s.
    pub rate: f64,
    /// Capacity of every link group and the groups each tree crosses (for lane counts).
    pub cap: Vec<f64>,
    pub usage: Vec<Vec<usize>>,
}

/// The arcs: every rank-graph pair over its routed path, and (with `fabric`) over its fabric
/// path where it has one. `None` if some pair has no route.
pub(crate) fn path_arcs(topo: &Topology, fabric: bool) -> Option<Vec<PathArc>> {
    let graph = RankGraph::of(topo);
    let mut router = Router::new(topo);
    let mut arcs = Vec::new();
    for a in graph.arcs() {
        let route = router.route(a.from, a.to)?;
        arcs.push(PathArc { from: a.from, to: a.to, groups: route.groups, fabric: false });
        if let Some(other) = router.fabric_route(a.from, a.to).filter(|_| fabric) {
            arcs.push(PathArc { from: a.from, to: a.to, groups: other.groups, fabric: true });
        }
    }
    Some(arcs)
}

/// Packs all-reduce trees over both paths of every pair, then keeps a few by LP/ILP (`slack`:
/// rate given up for fewer trees). `None` where no pair has two paths or the ranks cannot be
/// spanned.
pub fn multipath_plan(topo: &Topology, tolerance: f64, slack: f64) -> Option<MultipathPlan> {
    let n = topo.nranks();
    if n <= 1 {
        return None;
    }
    // Where no pair has a fabric path there is nothing to gain over the one-path plan.
    let arcs = path_arcs(topo, true).filter(|arcs| arcs.iter().any(|a| a.fabric))?;
    let cap: Vec<f64> = topo.link_groups().iter().map(|g| g.bandwidth).collect();
    let mut between: Vec<Vec<usize>> = vec![Vec::new(); n * n];
    for (i, a) in arcs.iter().enumerate() {
        between[a.from as usize * n + a.to as usize].push(i);
    }
    let packed = garg_konemann(&cap, tolerance, arcs.len() + n * n, true, |length| {
        let len = |i: usize| arcs[i].groups.iter().map(|&g| length[g]).sum::<f64>();
        let cheapest = |a: usize, b: usize| {
            between[a * n + b].iter().map(|&i| (len(i), i)).min_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)))
        };
        let mut edges = Vec::new();
        let mut chosen = Vec::new();
        for a in 0..n {
            for b in a + 1..n {
                if let (Some(ab), Some(ba)) = (cheapest(a, b), cheapest(b, a)) {
                    edges.push((a, b, ab.0 + ba.0));
                    chosen.push((ab.1, ba.1));
                }
            }
        }
        let tree = min_spanning_tree(n, &edges)?;
        let pairs: Vec<(usize, usize)> = tree.iter().map(|&e| (edges[e].0, edges[e].1)).collect();
        let root = center(n, &pairs);
        let parent = orient(n, root, &pairs);
        let (mut up, mut down) = (vec![None; n], vec![None; n]);
        let mut usage = Vec::new();
        for &e in &tree {
            let (a, b, _) = edges[e];
            let (ab, ba) = chosen[e];
            // Orient the chosen arcs by which end is the child.
            let (child, to_parent, to_child) = if parent[b] == Some(a as Rank) { (b, ba, ab) } else { (a, ab, ba) };
            up[child] = Some(to_parent);
            down[child] = Some(to_child);
            usage.extend(&arcs[to_parent].groups);
            usage.extend(&arcs[to_child].groups);
        }
        let length = tree.iter().map(|&e| edges[e].2).sum();
        let tree = MultipathTree { tree: PackedTree { root, parent, rate: 0.0 }, up, down };
        Some(FoundTree { key: tree, usage, length })
    })?;
    let rates: Vec<f64> = packed.trees.iter().map(|t| t.2).collect();
    let usage: Vec<Vec<usize>> = packed.trees.iter().map(|t| t.1.clone()).collect();
    let kept = super::select::select(&cap, &usage, &rates, slack);
    let mut trees = Vec::with_capacity(kept.len());
    let mut kept_usage = Vec::with_capacity(kept.len());
    for (i, rate) in kept {
        let mut t = packed.trees[i].0.clone();
        t.tree.rate = rate;
        trees.push(t);
        kept_usage.push(usage[i].clone());
    }
    let rate = trees.iter().map(|t| t.tree.rate).sum();
    Some(MultipathPlan { arcs, trees, rate, cap, usage: kept_usage })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::routed::routed_tree_ceiling;
    use crate::topology::resolve;

    #[test]
    fn trees_over_both_paths_reach_the_routed_ceiling_on_a_dgx1_triple() {
        // dgx1[0,2,3]: one-path trees reach 62.5 GB/s; over NVLink and PCIe both, the routed
        // ceiling (74.3).
        let topo = resolve("dgx1[0,2,3]").unwrap();
        let plan = multipath_plan(&topo, 0.01, 0.01).unwrap();
        let ceiling = routed_tree_ceiling(&topo, 0.01).unwrap();
        assert!(plan.rate >= 0.97 * ceiling.upper, "{} vs {ceiling:?}", plan.rate);
        assert!(plan.trees.iter().any(|t| t.up.iter().chain(&t.down).flatten().any(|&a| plan.arcs[a].fabric)));
        // The kept trees fit every link.
        let mut load = vec![0.0; plan.cap.len()];
        for (t, u) in plan.trees.iter().zip(&plan.usage) {
            for &g in u {
                load[g] += t.tree.rate;
            }
        }
        assert!(load.iter().zip(&plan.cap).all(|(l, c)| *l <= c * (1.0 + 1e-6)), "{load:?}");
    }

    #[test]
    fn pcie_beside_an_nvswitch_is_used_too() {
        // DGX-A100: pairs meet in the NVSwitch (one-path trees: 171.4 GB/s); beside it, each
        // GPU has 31.5 GB/s of PCIe (routed ceiling 189.6).
        let topo = resolve("dgx-a100").unwrap();
        let plan = multipath_plan(&topo, 0.02, 0.01).unwrap();
        let one_path = crate::blink::plan(&topo, crate::schedule::Collective::AllReduce).unwrap();
        assert!(plan.rate >= 1.05 * one_path.rate, "{} vs {}", plan.rate, one_path.rate);
    }

    #[test]
    fn machines_without_a_second_path_have_no_multipath_plan() {
        assert_eq!(multipath_plan(&resolve("ring:6").unwrap(), 0.02, 0.01), None);
        assert_eq!(multipath_plan(&resolve("torus2d:4x4").unwrap(), 0.02, 0.01), None);
    }
}

//! The logical rank graph that synthesizers work on: one arc per ordered pair of ranks that can
//! send to each other as one schedule step, with the bandwidth that step may count on.
//!
//! A schedule's send from rank a to rank b always takes the router's path, so a synthesizer must
//! see exactly the pairs and capacities that routing gives. Directly linked ranks get their link
//! group. Ranks that reach each other only through a switched fabric (NVSwitch, PCIe, a NIC and
//! a network) get a *virtual* arc whose capacity is the pair's fair share of every link group on
//! its route: a group's bandwidth divided by how many such pairs are routed over it. That is
//! conservative: all virtual arcs used at full capacity at once still fit the physical links, so
//! anything packed into this graph is feasible on the machine (one shared NIC per node becomes
//! many thin arcs, not many fat ones).
//!
//! A large fabric (hundreds of ranks behind one network) gets arcs only between ranks at
//! power-of-two distances in rank order, not between all pairs (see [`fabric_peers`]).
//!
//! Ranks that forward (torus chips) reach far ranks through other ranks; those hops are already
//! schedule steps, so no virtual arc is made for them and the graph stays as sparse as the
//! topology (a 40 000-rank torus has 6 arcs per rank, not 40 000).

use std::collections::BTreeMap;

use petgraph::visit::EdgeRef;
use petgraph::Direction;

use super::routing::Router;
use super::{Rank, Topology};

/// One usable (from, to) pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankArc {
    pub from: Rank,
    pub to: Rank,
    /// GB/s this pair can count on.
    pub bandwidth: f64,
    /// µs along the routed path.
    pub latency: f64,
    /// Whether the ranks are physically adjacent (otherwise a share of a switched fabric).
    pub direct: bool,
}

#[cfg(test)]
impl RankArc {
    /// A direct link of `bandwidth` GB/s and 1 µs, for tests that build graphs by hand.
    pub(crate) fn link(from: Rank, to: Rank, bandwidth: f64) -> RankArc {
        RankArc { from, to, bandwidth, latency: 1.0, direct: true }
    }
}

/// Ranks and the arcs between them, sorted by (from, to).
#[derive(Debug, Clone)]
pub struct RankGraph {
    nranks: usize,
    arcs: Vec<RankArc>,
    out: Vec<Vec<usize>>,
    inc: Vec<Vec<usize>>,
}

impl RankGraph {
    /// Builds the graph of `topo` (see the module doc).
    pub fn of(topo: &Topology) -> RankGraph {
        let n = topo.nranks();
        let graph = topo.graph();
        let mut pairs: BTreeMap<(Rank, Rank), RankArc> = BTreeMap::new();
        for g in topo.link_groups() {
            if let (Some(a), Some(b)) = (graph[g.from].rank, graph[g.to].rank) {
                pairs.insert(
                    (a, b),
                    RankArc { from: a, to: b, bandwidth: g.bandwidth, latency: g.latency, direct: true },
                );
            }
        }
        // Fabric components: connected sets of non-rank nodes that forward.
        let fabric = |i: usize| {
            let node = &graph[petgraph::graph::NodeIndex::new(i)];
            node.rank.is_none() && node.forwards
        };
        let mut comp = UnionFind::new(graph.node_count());
        for e in graph.edge_references() {
            if fabric(e.source().index()) && fabric(e.target().index()) {
                comp.union(e.source().index(), e.target().index());
            }
        }
        let mut attached: BTreeMap<usize, Vec<Rank>> = BTreeMap::new();
        for r in 0..n as Rank {
            let mut seen = Vec::new();
            for v in graph.neighbors_directed(topo.rank_node(r), Direction::Outgoing) {
                if fabric(v.index()) {
                    let c = comp.find(v.index());
                    if !seen.contains(&c) {
                        seen.push(c);
                        attached.entry(c).or_default().push(r);
                    }
                }
            }
        }
        let mut router = Router::new(topo);
        let mut routed = Vec::new();
        let mut done: rustc_hash::FxHashSet<(Rank, Rank)> = Default::default();
        let mut load = vec![0u32; topo.link_groups().len()];
        for ranks in attached.values() {
            for (i, &a) in ranks.iter().enumerate() {
                for b in fabric_peers(ranks, i) {
                    if a == b || pairs.contains_key(&(a, b)) || !done.insert((a, b)) {
                        continue;
                    }
                    if let Some(route) = router.route(a, b) {
                        for &g in &route.groups {
                            load[g] += 1;
                        }
                        routed.push((a, b, route));
                    }
                }
            }
        }
        for (a, b, route) in routed {
            let share = route
                .groups
                .iter()
                .map(|&g| topo.group(g).bandwidth / f64::from(load[g].max(1)))
                .fold(f64::INFINITY, f64::min);
            pairs.insert((a, b), RankArc { from: a, to: b, bandwidth: share, latency: route.latency, direct: false });
        }
        RankGraph::from_arcs(n, pairs.into_values().collect())
    }

    /// A graph from explicit arcs (tests, hand-made models); keeps the first of duplicates.
    pub fn from_arcs(nranks: usize, mut arcs: Vec<RankArc>) -> RankGraph {
        arcs.retain(|a| (a.from as usize) < nranks && (a.to as usize) < nranks && a.from != a.to);
        arcs.sort_by_key(|a| (a.from, a.to));
        arcs.dedup_by_key(|a| (a.from, a.to));
        let mut out = vec![Vec::new(); nranks];
        let mut inc = vec![Vec::new(); nranks];
        for (i, a) in arcs.iter().enumerate() {
            out[a.from as usize].push(i);
            inc[a.to as usize].push(i);
        }
        RankGraph { nranks, arcs, out, inc }
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    pub fn arcs(&self) -> &[RankArc] {
        &self.arcs
    }

    pub fn arc(&self, id: usize) -> &RankArc {
        &self.arcs[id]
    }

    /// Arc ids leaving `r`, by destination.
    pub fn out_arcs(&self, r: Rank) -> &[usize] {
        &self.out[r as usize]
    }

    /// Arc ids entering `r`, by source.
    pub fn in_arcs(&self, r: Rank) -> &[usize] {
        &self.inc[r as usize]
    }

    /// The arc from `a` to `b`, if any.
    pub fn find(&self, a: Rank, b: Rank) -> Option<usize> {
        let list = &self.out[a as usize];
        list.binary_search_by_key(&b, |&i| self.arcs[i].to).ok().map(|k| list[k])
    }

    /// Whether every arc's reverse exists with the same bandwidth (links are full duplex).
    pub fn is_symmetric(&self) -> bool {
        self.arcs.iter().all(|a| {
            self.find(a.to, a.from).is_some_and(|r| (self.arcs[r].bandwidth - a.bandwidth).abs() <= 1e-9 * a.bandwidth)
        })
    }
}

/// A fabric with at most this many ranks gets a virtual arc between every pair of them.
const FULL_MESH_MAX: usize = 16;

/// The peers rank `ranks[i]` gets virtual arcs to through one fabric: all of them on a small
/// fabric; on a large one only those at distance ±1, ±2, ±4, … in the list (about 2·log₂ n), so
/// that each arc's fair share of a NIC is not split n ways (trees need few arcs per rank, and
/// a full mesh of 500 ranks would leave each pair a sliver).
fn fabric_peers(ranks: &[Rank], i: usize) -> Vec<Rank> {
    let k = ranks.len();
    if k <= FULL_MESH_MAX {
        return ranks.to_vec();
    }
    let mut out = Vec::new();
    let mut d = 1;
    while d < k {
        out.push(ranks[(i + d) % k]);
        out.push(ranks[(i + k - d) % k]);
        d *= 2;
    }
    out
}

struct UnionFind(Vec<usize>);

impl UnionFind {
    fn new(n: usize) -> UnionFind {
        UnionFind((0..n).collect())
    }
    fn find(&mut self, mut x: usize) -> usize {
        while self.0[x] != x {
            self.0[x] = self.0[self.0[x]];
            x = self.0[x];
        }
        x
    }
    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        self.0[a.max(b)] = a.min(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;

    #[test]
    fn dgx1_has_nvlink_arcs_and_pcie_shares_for_the_rest() {
        let g = RankGraph::of(&resolve("dgx1").unwrap());
        let nv = g.find(0, 3).map(|i| *g.arc(i)).unwrap();
        assert!(nv.direct && nv.bandwidth == 50.0);
        let far = g.find(0, 5).map(|i| *g.arc(i)).unwrap();
        assert!(!far.direct && far.bandwidth < 15.75, "{far:?}");
        assert!(g.is_symmetric());
    }

    #[test]
    fn a_shared_nic_is_split_between_the_pairs_that_cross_it() {
        let t = resolve("cluster-2x4-slow").unwrap();
        let g = RankGraph::of(&t);
        let cross = g.find(0, 4).map(|i| *g.arc(i)).unwrap();
        // 4 × 4 pairs share one 12.5 GB/s NIC per direction.
        assert!(cross.bandwidth <= 12.5 / 16.0 + 1e-9, "{cross:?}");
        let inside = g.find(0, 1).map(|i| *g.arc(i)).unwrap();
        assert!(inside.bandwidth > 10.0 * cross.bandwidth, "{inside:?}");
    }

    #[test]
    fn tori_stay_sparse() {
        let g = RankGraph::of(&resolve("torus2d:8x8").unwrap());
        assert_eq!(g.arcs().len(), 64 * 4);
    }
}

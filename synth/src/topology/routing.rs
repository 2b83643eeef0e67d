//! Paths between ranks. A path may pass only through nodes that forward (switches, CPUs, NICs,
//! and ranks of direct networks such as tori). Among equally short next hops one is picked by
//! the destination, as InfiniBand's fat-tree routing does ("d-mod-k": the destination's number
//! modulo the choices, then divided by them for the next choice). Routes that depend on the
//! destination only spread a shift permutation (every rank sending to the rank k places on,
//! which rings are made of) over a fat-tree's spines without two flows meeting on one up-link;
//! a hash of (source, destination), as Ethernet's ECMP does, lets about a third of such flows
//! collide, and no schedule could avoid that.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use petgraph::graph::NodeIndex;

use super::{Rank, Topology};

/// Paths are chosen for the time a message of this size takes over them (latency plus size over
/// bandwidth, summed per hop), so a fast switch wins over a slow bus with a shorter latency
/// (NVSwitch over PCIe inside a node), and among zero-latency paths the shortest wins.
const ROUTE_BYTES: f64 = 65536.0;

/// The link groups a transfer from one rank to another crosses, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub groups: Vec<usize>,
    /// Sum of the groups' latencies, µs.
    pub latency: f64,
    /// Smallest bandwidth along the path, GB/s.
    pub bandwidth: f64,
}

/// Computes and caches routes over one topology.
pub struct Router<'t> {
    topo: &'t Topology,
    out_groups: Vec<Vec<usize>>,
    in_groups: Vec<Vec<usize>>,
    /// Distance of every node to a destination node.
    dist_to: HashMap<NodeIndex, Vec<f64>>,
}

/// A (distance, node) heap entry ordered so that `BinaryHeap` pops the nearest first.
#[derive(PartialEq)]
pub(crate) struct Entry(pub(crate) f64, pub(crate) usize);
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1))
    }
}

impl<'t> Router<'t> {
    pub fn new(topo: &'t Topology) -> Router<'t> {
        let mut in_groups = vec![Vec::new(); topo.graph().node_count()];
        for (id, g) in topo.link_groups().iter().enumerate() {
            in_groups[g.to.index()].push(id);
        }
        Router { topo, out_groups: out_groups(topo), in_groups, dist_to: HashMap::new() }
    }

    fn weight(&self, group: usize) -> f64 {
        let g = self.topo.group(group);
        g.latency + ROUTE_BYTES / (g.bandwidth * 1e3)
    }

    /// Shortest-path distances to `dst` from every node (reverse Dijkstra).
    fn distances(&mut self, dst: NodeIndex) -> &Vec<f64> {
        if !self.dist_to.contains_key(&dst) {
            let graph = self.topo.graph();
            let mut dist = vec![f64::INFINITY; graph.node_count()];
            dist[dst.index()] = 0.0;
            let mut heap = BinaryHeap::from([Entry(0.0, dst.index())]);
            while let Some(Entry(d, u)) = heap.pop() {
                if d > dist[u] {
                    continue;
                }
                if u != dst.index() && !graph[NodeIndex::new(u)].forwards {
                    continue;
                }
                for &g in &self.in_groups[u] {
                    let v = self.topo.group(g).from.index();
                    let nd = d + self.weight(g);
                    if nd < dist[v] {
                        dist[v] = nd;
                        heap.push(Entry(nd, v));
                    }
                }
            }
            self.dist_to.insert(dst, dist);
        }
        &self.dist_to[&dst]
    }

    /// The route from rank `src` to rank `dst`; `None` only if the topology's connectivity check
    /// was bypassed.
    pub fn route(&mut self, src: Rank, dst: Rank) -> Option<Route> {
        let (s, d) = (self.topo.rank_node(src), self.topo.rank_node(dst));
        if let Some(g) = self.topo.group_between(s, d) {
            let grp = self.topo.group(g);
            return Some(Route { groups: vec![g], latency: grp.latency, bandwidth: grp.bandwidth });
        }
        let dist = self.distances(d).clone();
        if !dist[s.index()].is_finite() {
            return None;
        }
        let graph = self.topo.graph();
        let mut groups = Vec::new();
        let mut u = s;
        let mut digits = dst as usize;
        while u != d {
            let tol = 1e-9 * (1.0 + dist[u.index()]);
            let next: Vec<usize> = self.out_groups[u.index()]
                .iter()
                .copied()
                .filter(|&g| {
                    let v = self.topo.group(g).to;
                    (v == d || graph[v].forwards) && (dist[v.index()] + self.weight(g) - dist[u.index()]).abs() <= tol
                })
                .collect();
            let choices = next.len().max(1);
            let g = *next.get(digits % choices)?;
            digits /= choices;
            groups.push(g);
            u = self.topo.group(g).to;
        }
        Some(self.route_over(groups))
    }

    fn route_over(&self, groups: Vec<usize>) -> Route {
        let latency = groups.iter().map(|&g| self.topo.group(g).latency).sum();
        let bandwidth = groups.iter().map(|&g| self.topo.group(g).bandwidth).fold(f64::INFINITY, f64::min);
        Route { groups, latency, bandwidth }
    }

    /// The *fabric* route from rank `src` to rank `dst`, which a schedule step marked
    /// [`via_fabric`](crate::schedule::Channel::via_fabric) takes: the shortest path through
    /// switches, CPUs and NICs only (no rank relays) that does not leave `src` by the link the
    /// router's path starts with. On a DGX-1 that is the PCIe beside a pair's NVLink, on an
    /// NVSwitch machine the PCIe beside the switch. `None` when there is no such path.
    pub fn fabric_route(&mut self, src: Rank, dst: Rank) -> Option<Route> {
        let avoid = *self.route(src, dst)?.groups.first()?;
        let graph = self.topo.graph();
        let (s, d) = (self.topo.rank_node(src).index(), self.topo.rank_node(dst).index());
        let search = PathSearch::new(
            self.topo,
            &self.out_groups,
            s,
            |g| if g == avoid { f64::INFINITY } else { self.weight(g) },
            |v| graph[NodeIndex::new(v)].rank.is_none() && graph[NodeIndex::new(v)].forwards,
        );
        let groups = search.path_to(self.topo, d)?;
        Some(self.route_over(groups))
    }
}

/// The link groups leaving each node of `topo`.
pub(crate) fn out_groups(topo: &Topology) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); topo.graph().node_count()];
    for (id, g) in topo.link_groups().iter().enumerate() {
        out[g.from.index()].push(id);
    }
    out
}

/// Shortest paths from one node: the distance to every node and the group each was reached by.
pub(crate) struct PathSearch {
    pub dist: Vec<f64>,
    pub via: Vec<Option<usize>>,
}

impl PathSearch {
    /// Dijkstra from node `source` over the groups leaving each node (`out`, see
    /// [`out_groups`]) at `length(group)` each; a path passes only through nodes where
    /// `passable(node)` holds (any node may end one).
    pub(crate) fn new(
        topo: &Topology,
        out: &[Vec<usize>],
        source: usize,
        length: impl Fn(usize) -> f64,
        passable: impl Fn(usize) -> bool,
    ) -> PathSearch {
        let nodes = out.len();
        let mut dist = vec![f64::INFINITY; nodes];
        let mut via = vec![None; nodes];
        dist[source] = 0.0;
        let mut heap = BinaryHeap::from([Entry(0.0, source)]);
        while let Some(Entry(d, u)) = heap.pop() {
            if d > dist[u] || (u != source && !passable(u)) {
                continue;
            }
            for &g in &out[u] {
                let v = topo.group(g).to.index();
                let nd = d + length(g);
                if nd < dist[v] {
                    dist[v] = nd;
                    via[v] = Some(g);
                    heap.push(Entry(nd, v));
                }
            }
        }
        PathSearch { dist, via }
    }

    /// The groups of the path to node `to`, in order; `None` if it was not reached.
    pub(crate) fn path_to(&self, topo: &Topology, to: usize) -> Option<Vec<usize>> {
        let mut groups = Vec::new();
        let mut v = to;
        while let Some(g) = self.via[v] {
            groups.push(g);
            v = topo.group(g).from.index();
        }
        if groups.is_empty() {
            return None;
        }
        groups.reverse();
        Some(groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;

    #[test]
    fn dgx1_routes_over_nvlink_or_through_the_cpus() {
        let t = resolve("dgx1").unwrap();
        let mut r = Router::new(&t);
        let direct = r.route(0, 3).unwrap();
        assert_eq!(direct.groups.len(), 1);
        assert_eq!(direct.bandwidth, 50.0);
        // gpu0 → gpu5 has no NVLink: PCIe switch, CPU0, CPU1, PCIe switch.
        let far = r.route(0, 5).unwrap();
        assert_eq!(far.groups.len(), 5, "{far:?}");
        assert!(far.bandwidth < 25.0);
        // Beside its NVLink, gpu0 reaches gpu3 through PCIe switch, CPU0, PCIe switch, and
        // gpu2 reaches gpu3 through their shared PCIe switch.
        assert_eq!(r.fabric_route(0, 3).unwrap().groups.len(), 4);
        let near = r.fabric_route(2, 3).unwrap();
        assert_eq!((near.groups.len(), near.bandwidth), (2, 15.75));
        // gpu0 → gpu5 already takes the PCIe, and gpu0's other links lead to GPUs only.
        assert_eq!(r.fabric_route(0, 5), None);
        // On a DGX-A100 pairs meet in the NVSwitch; beside it, gpu0 and gpu1 share a PCIe
        // switch.
        let a100 = resolve("dgx-a100").unwrap();
        assert_eq!(Router::new(&a100).fabric_route(0, 1).unwrap().groups.len(), 2);
        // A torus has no fabric: its links join ranks only.
        let torus = resolve("torus2d:4x4").unwrap();
        assert_eq!(Router::new(&torus).fabric_route(0, 1), None);
    }

    #[test]
    fn torus_routes_through_ranks_and_fattree_spreads_over_spines() {
        let t = resolve("torus2d:4x4").unwrap();
        let mut r = Router::new(&t);
        assert_eq!(r.route(0, 10).unwrap().groups.len(), 4);
        let f = resolve("cluster:8x1,fabric=fattree,radix=2").unwrap();
        let mut r = Router::new(&f);
        let spines: std::collections::HashSet<usize> = (1..8).map(|d| r.route(0, d).unwrap().groups[2]).collect();
        assert!(spines.len() > 1, "all traffic through one spine");
    }

    #[test]
    fn a_shift_permutation_crosses_a_fat_tree_without_two_flows_on_one_link() {
        // 16 hosts of 4 GPUs, 8-port leaves (two hosts each), 8 spines: every rank sends to
        // the same GPU of the next host, and to the next GPU of the next host (a rotated ring).
        let t = resolve("cluster:16x4,fabric=fattree,radix=8").unwrap();
        let mut r = Router::new(&t);
        for shift in [4, 5] {
            let mut used = std::collections::HashSet::new();
            for src in 0..64 {
                for g in r.route(src, (src + shift) % 64).unwrap().groups {
                    assert!(used.insert(g), "shift {shift}: two flows on link group {g}");
                }
            }
        }
    }
}

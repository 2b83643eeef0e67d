//! The topology model: a directed multigraph of ranks (GPUs or processes), CPUs, NICs and
//! switches, each link with a bandwidth and a latency.
//!
//! Everything that reasons about "where" lives here; nothing here moves bytes. Files are read by
//! [`file`] (topoccl's TOML) and [`nccl_xml`] (NCCL's topology dumps), generated families by
//! [`families`], names resolved by [`library`], paths found by [`routing`].

pub mod families;
pub mod file;
pub mod library;
pub mod logical;
pub mod nccl_xml;
pub mod routing;

use std::collections::{HashMap, HashSet, VecDeque};

use petgraph::graph::{DiGraph, EdgeIndex};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hash::Fnv64;

pub use library::{builtin_names, parse_rank_list, resolve};
/// A node of a topology's graph.
pub use petgraph::graph::NodeIndex;
pub use routing::Route;

/// A rank number, 0-based, dense.
pub type Rank = u32;

/// The largest topology accepted, in ranks, nodes and directed links. Sixteen times the
/// largest cluster we model (`cluster:512x8`, 4 096 GPUs), so no real machine is refused; the
/// bounds keep a mistyped or hostile file or family from sizing gigabytes of tables (found by
/// fuzzing: `ring:99999999`, a node with `rank = 4000000000`).
pub const MAX_RANKS: usize = 1 << 16;
/// See [`MAX_RANKS`].
pub const MAX_NODES: usize = 1 << 20;
/// See [`MAX_RANKS`]. `full:1448` (2 095 256 directed links) is the largest full mesh.
pub const MAX_LINKS: usize = 1 << 21;

/// Checks a topology's size against [`MAX_RANKS`], [`MAX_NODES`] and [`MAX_LINKS`] before
/// anything of that size is built.
pub(crate) fn check_size(ranks: usize, nodes: usize, links: usize) -> std::result::Result<(), String> {
    let over = |what: &str, n: usize, max: usize| format!("{n} {what} is more than the {max} a topology may have");
    if ranks > MAX_RANKS {
        return Err(over("ranks", ranks, MAX_RANKS));
    }
    if nodes > MAX_NODES {
        return Err(over("nodes", nodes, MAX_NODES));
    }
    if links > MAX_LINKS {
        return Err(over("directed links", links, MAX_LINKS));
    }
    Ok(())
}

/// What a vertex of the topology is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// An accelerator or process that holds a rank.
    #[serde(alias = "rank", alias = "npu")]
    Gpu,
    Cpu,
    Nic,
    Switch,
}

impl NodeKind {
    /// Whether nodes of this kind hold a rank by default.
    pub fn holds_rank(self) -> bool {
        self == NodeKind::Gpu
    }
}

/// What a link physically is; informative (the model only uses bandwidth and latency).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    NvLink,
    Pcie,
    /// CPU-to-CPU (QPI/UPI/xGMI).
    Smp,
    /// A network link (InfiniBand, Ethernet, ICI, …).
    Net,
    #[default]
    Other,
}

/// One vertex.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    pub kind: NodeKind,
    pub rank: Option<Rank>,
    /// The machine this node is in; ranks on one host can share memory, and hierarchical
    /// algorithms group by it.
    pub host: String,
    /// Whether traffic between two other nodes may pass through this node. Switches, CPUs and
    /// NICs forward; GPUs in a server do not, chips of a torus network do.
    pub forwards: bool,
}

/// One directed link. Parallel links between the same pair are separate edges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// GB/s (10^9 bytes per second) in this direction.
    pub bandwidth: f64,
    /// Microseconds.
    pub latency: f64,
    pub kind: LinkKind,
}

/// All parallel links from one node to another, seen as one resource: a single transfer uses
/// them all (NVLinks between a GPU pair are bonded).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkGroup {
    pub from: NodeIndex,
    pub to: NodeIndex,
    /// Sum of the parallel links' bandwidths, GB/s.
    pub bandwidth: f64,
    /// The smallest latency among them, µs.
    pub latency: f64,
    /// How many parallel links.
    pub count: u32,
}

/// A machine or cluster: the graph plus the rank → node map.
#[derive(Debug, Clone)]
pub struct Topology {
    name: String,
    graph: DiGraph<Node, Link>,
    ranks: Vec<NodeIndex>,
    groups: Vec<LinkGroup>,
    /// (from, to) → index into `groups`.
    group_of: HashMap<(NodeIndex, NodeIndex), usize>,
}

impl Topology {
    /// Builds a topology from nodes and links and checks it: ranks dense and unique, bandwidths
    /// positive, every rank able to reach every other rank.
    pub fn new(name: impl Into<String>, nodes: Vec<Node>, links: Vec<(usize, usize, Link)>) -> Result<Topology> {
        let name = name.into();
        let invalid = |message: String| Error::InvalidTopology { name: name.clone(), message };
        check_size(0, nodes.len(), links.len()).map_err(invalid)?;
        let mut graph = DiGraph::with_capacity(nodes.len(), links.len());
        let mut seen = HashSet::new();
        for node in nodes {
            if !seen.insert(node.name.clone()) {
                return Err(invalid(format!("duplicate node name `{}`", node.name)));
            }
            graph.add_node(node);
        }
        let mut rank_nodes: Vec<Option<NodeIndex>> = Vec::new();
        for idx in graph.node_indices() {
            if let Some(r) = graph[idx].rank {
                let r = r as usize;
                if r >= MAX_RANKS {
                    return Err(invalid(format!(
                        "rank {r} of `{}` is beyond the {MAX_RANKS} ranks a topology may have",
                        graph[idx].name
                    )));
                }
                if rank_nodes.len() <= r {
                    rank_nodes.resize(r + 1, None);
                }
                if let Some(prev) = rank_nodes[r] {
                    return Err(invalid(format!(
                        "rank {r} given to both `{}` and `{}`",
                        graph[prev].name, graph[idx].name
                    )));
                }
                rank_nodes[r] = Some(idx);
            }
        }
        let mut ranks = Vec::with_capacity(rank_nodes.len());
        for (r, n) in rank_nodes.into_iter().enumerate() {
            ranks.push(n.ok_or_else(|| invalid(format!("ranks are not dense: rank {r} is missing")))?);
        }
        if ranks.is_empty() {
            return Err(invalid("no ranks (no node of kind gpu)".into()));
        }
        for (a, b, link) in links {
            if a >= graph.node_count() || b >= graph.node_count() {
                return Err(invalid(format!("link between unknown nodes {a} and {b}")));
            }
            if a == b {
                return Err(invalid(format!("link from `{}` to itself", graph[NodeIndex::new(a)].name)));
            }
            check_link(&link).map_err(invalid)?;
            graph.add_edge(NodeIndex::new(a), NodeIndex::new(b), link);
        }
        let mut topo = Topology { name, graph, ranks, groups: Vec::new(), group_of: HashMap::new() };
        topo.build_groups();
        topo.check_connected()?;
        Ok(topo)
    }

    fn build_groups(&mut self) {
        self.groups.clear();
        self.group_of.clear();
        for e in self.graph.edge_references() {
            let key = (e.source(), e.target());
            let link = e.weight();
            match self.group_of.get(&key) {
                Some(&g) => {
                    let grp = &mut self.groups[g];
                    grp.bandwidth += link.bandwidth;
                    grp.latency = grp.latency.min(link.latency);
                    grp.count += 1;
                }
                None => {
                    self.group_of.insert(key, self.groups.len());
                    self.groups.push(LinkGroup {
                        from: key.0,
                        to: key.1,
                        bandwidth: link.bandwidth,
                        latency: link.latency,
                        count: 1,
                    });
                }
            }
        }
    }

    /// Every rank must reach every other rank through nodes that forward.
    fn check_connected(&self) -> Result<()> {
        let n = self.nranks();
        if n <= 1 {
            return Ok(());
        }
        let all_forward = self.ranks.iter().all(|&r| self.graph[r].forwards);
        // Where ranks do not forward, every rank is a source of its own search: quadratic,
        // minutes for a cluster of 16 000 GPUs. A forwarding node that every rank reaches and
        // that reaches every rank proves all pairs connected in two searches (a path a → hub →
        // b passes only through forwarding nodes); rank 0's forwarding neighbours are tried as
        // that hub (a cluster's NIC, a machine's switch) before the exhaustive check.
        if !all_forward {
            let hubs = self.graph.neighbors_directed(self.ranks[0], Direction::Outgoing);
            for hub in hubs.filter(|&h| self.graph[h].forwards).take(4) {
                let everyone = |dir| self.reached_from(hub, dir).iter().all(|&r| r);
                if everyone(Direction::Outgoing) && everyone(Direction::Incoming) {
                    return Ok(());
                }
            }
        }
        let sources: Vec<Rank> = if all_forward { vec![0] } else { (0..n as Rank).collect() };
        for src in sources {
            let reached = self.reachable_ranks(src, Direction::Outgoing);
            if let Some(miss) = (0..n as Rank).find(|r| !reached[*r as usize]) {
                return Err(self.disconnected(src, miss));
            }
            if all_forward {
                let back = self.reachable_ranks(src, Direction::Incoming);
                if let Some(miss) = (0..n as Rank).find(|r| !back[*r as usize]) {
                    return Err(self.disconnected(miss, src));
                }
            }
        }
        Ok(())
    }

    fn disconnected(&self, from: Rank, to: Rank) -> Error {
        Error::InvalidTopology {
            name: self.name.clone(),
            message: format!(
                "rank {from} (`{}`) cannot reach rank {to} (`{}`): the ranks are disconnected",
                self.graph[self.ranks[from as usize]].name, self.graph[self.ranks[to as usize]].name
            ),
        }
    }

    /// Ranks reachable from `src` (following links in `dir`), passing only through forwarding
    /// nodes.
    fn reachable_ranks(&self, src: Rank, dir: Direction) -> Vec<bool> {
        let mut reached = self.reached_from(self.ranks[src as usize], dir);
        reached[src as usize] = true;
        reached
    }

    /// Ranks reachable from node `start` (which may forward or not; following links in `dir`),
    /// passing only through forwarding nodes.
    fn reached_from(&self, start: NodeIndex, dir: Direction) -> Vec<bool> {
        let mut seen = vec![false; self.graph.node_count()];
        let mut reached = vec![false; self.nranks()];
        seen[start.index()] = true;
        let mut queue = VecDeque::from([start]);
        while let Some(u) = queue.pop_front() {
            if u != start && !self.graph[u].forwards {
                continue;
            }
            for v in self.graph.neighbors_directed(u, dir) {
                if !seen[v.index()] {
                    seen[v.index()] = true;
                    if let Some(r) = self.graph[v].rank {
                        reached[r as usize] = true;
                    }
                    queue.push_back(v);
                }
            }
        }
        reached
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renames (used when a topology is derived from another, e.g. a subset).
    pub fn with_name(mut self, name: impl Into<String>) -> Topology {
        self.name = name.into();
        self
    }

    /// A hash of everything that affects synthesis and pricing (nodes' kinds, ranks, hosts and
    /// forwarding, links' ends, bandwidths and latencies; not the name), stable across runs
    /// and machines: the tuner's disk cache is keyed by it, and ranks compare it to make sure
    /// they reason about the same machine.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv64::new();
        h.write(&(self.graph.node_count() as u64).to_le_bytes());
        for idx in self.graph.node_indices() {
            let n = &self.graph[idx];
            h.write(&[n.kind as u8, u8::from(n.forwards)]);
            h.write(&n.rank.map_or(u64::MAX, u64::from).to_le_bytes());
            h.write(n.host.as_bytes());
            h.write(&[0xff]);
        }
        for e in self.graph.edge_indices() {
            if let (Some((a, b)), Some(l)) = (self.graph.edge_endpoints(e), self.graph.edge_weight(e)) {
                h.write(&(a.index() as u64).to_le_bytes());
                h.write(&(b.index() as u64).to_le_bytes());
                h.write(&l.bandwidth.to_bits().to_le_bytes());
                h.write(&l.latency.to_bits().to_le_bytes());
            }
        }
        h.finish()
    }

    pub fn nranks(&self) -> usize {
        self.ranks.len()
    }

    pub fn graph(&self) -> &DiGraph<Node, Link> {
        &self.graph
    }

    /// The node that holds `rank`. Panics if `rank >= nranks()` (a caller bug).
    pub fn rank_node(&self, rank: Rank) -> NodeIndex {
        self.ranks[rank as usize]
    }

    pub fn node(&self, idx: NodeIndex) -> &Node {
        &self.graph[idx]
    }

    /// All links grouped by (from, to).
    pub fn link_groups(&self) -> &[LinkGroup] {
        &self.groups
    }

    /// The group of parallel links from `a` to `b`, if they are adjacent.
    pub fn group_between(&self, a: NodeIndex, b: NodeIndex) -> Option<usize> {
        self.group_of.get(&(a, b)).copied()
    }

    pub fn group(&self, id: usize) -> &LinkGroup {
        &self.groups[id]
    }

    /// Direct (one-hop) bandwidth from rank `a` to rank `b` in GB/s, 0 if not adjacent.
    pub fn direct_bandwidth(&self, a: Rank, b: Rank) -> f64 {
        self.group_between(self.rank_node(a), self.rank_node(b)).map_or(0.0, |g| self.groups[g].bandwidth)
    }

    /// Host name of each rank, and hosts numbered in order of first appearance.
    pub fn hosts(&self) -> (Vec<u32>, Vec<String>) {
        let mut names: Vec<String> = Vec::new();
        let mut index: HashMap<&str, u32> = HashMap::new();
        let mut of_rank = Vec::with_capacity(self.nranks());
        for &n in &self.ranks {
            let host = self.graph[n].host.as_str();
            let id = *index.entry(host).or_insert_with(|| {
                names.push(host.to_string());
                (names.len() - 1) as u32
            });
            of_rank.push(id);
        }
        (of_rank, names)
    }

    /// Total bandwidth leaving each rank's node, GB/s (its injection bandwidth).
    pub fn egress_bandwidth(&self, rank: Rank) -> f64 {
        self.graph.edges_directed(self.rank_node(rank), Direction::Outgoing).map(|e| e.weight().bandwidth).sum()
    }

    /// The sub-topology with only `ranks` (renumbered 0.. in the given order); every non-rank
    /// node stays, other ranks' nodes and their links go. This is a fragmented allocation: the
    /// GPUs not selected belong to someone else and do not relay.
    pub fn select(&self, ranks: &[Rank]) -> Result<Topology> {
        let mut keep: HashMap<NodeIndex, Rank> = HashMap::new();
        for (new, &old) in ranks.iter().enumerate() {
            if old as usize >= self.nranks() {
                return Err(Error::InvalidTopology {
                    name: self.name.clone(),
                    message: format!("rank {old} selected but the topology has {} ranks", self.nranks()),
                });
            }
            if keep.insert(self.rank_node(old), new as Rank).is_some() {
                return Err(Error::InvalidTopology {
                    name: self.name.clone(),
                    message: format!("rank {old} selected twice"),
                });
            }
        }
        let mut new_index = HashMap::new();
        let mut nodes = Vec::new();
        for idx in self.graph.node_indices() {
            let node = &self.graph[idx];
            let rank = match node.rank {
                Some(_) => match keep.get(&idx) {
                    Some(&r) => Some(r),
                    None => continue,
                },
                None => None,
            };
            new_index.insert(idx, nodes.len());
            nodes.push(Node { rank, ..node.clone() });
        }
        let links = self
            .graph
            .edge_references()
            .filter_map(|e| Some((*new_index.get(&e.source())?, *new_index.get(&e.target())?, *e.weight())))
            .collect();
        let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
        Topology::new(format!("{}[{}]", self.name, list.join(",")), nodes, links)
    }

    /// Edge ids of the underlying graph (for tools that need the raw multigraph).
    pub fn edges(&self) -> impl Iterator<Item = (EdgeIndex, NodeIndex, NodeIndex, &Link)> {
        self.graph.edge_references().map(|e| (e.id(), e.source(), e.target(), e.weight()))
    }
}

/// Bandwidth must be positive and finite, latency non-negative and finite.
pub(crate) fn check_link(link: &Link) -> std::result::Result<(), String> {
    if !(link.bandwidth.is_finite() && link.bandwidth > 0.0) {
        return Err(format!("bandwidth must be a positive number of GB/s, got {}", link.bandwidth));
    }
    if !(link.latency.is_finite() && link.latency >= 0.0) {
        return Err(format!("latency must be zero or a positive number of µs, got {}", link.latency));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str, rank: Rank) -> Node {
        Node { name: name.into(), kind: NodeKind::Gpu, rank: Some(rank), host: "h".into(), forwards: false }
    }
    fn link(bw: f64) -> Link {
        Link { bandwidth: bw, latency: 1.0, kind: LinkKind::NvLink }
    }

    #[test]
    fn parallel_links_form_one_group() {
        let t = Topology::new(
            "t",
            vec![gpu("a", 0), gpu("b", 1)],
            vec![(0, 1, link(25.0)), (0, 1, link(25.0)), (1, 0, link(25.0))],
        )
        .unwrap();
        assert_eq!(t.direct_bandwidth(0, 1), 50.0);
        assert_eq!(t.direct_bandwidth(1, 0), 25.0);
    }

    #[test]
    fn disconnected_ranks_are_rejected() {
        let err = Topology::new("t", vec![gpu("a", 0), gpu("b", 1)], vec![(0, 1, link(1.0))]).unwrap_err();
        assert!(err.to_string().contains("cannot reach"), "{err}");
    }

    #[test]
    fn bad_bandwidth_and_duplicates_are_rejected() {
        let err = Topology::new("t", vec![gpu("a", 0), gpu("b", 1)], vec![(0, 1, link(0.0))]).unwrap_err();
        assert!(err.to_string().contains("bandwidth"), "{err}");
        let err = Topology::new("t", vec![gpu("a", 0), gpu("a", 1)], vec![]).unwrap_err();
        assert!(err.to_string().contains("duplicate"), "{err}");
    }

    #[test]
    fn gpus_do_not_relay_but_switches_do() {
        let sw = Node { name: "sw".into(), kind: NodeKind::Switch, rank: None, host: "h".into(), forwards: true };
        let nodes = vec![gpu("a", 0), gpu("b", 1), gpu("c", 2), sw];
        // a - b - c chain through GPU b: not connected for a→c.
        let chain = vec![(0, 1, link(1.0)), (1, 0, link(1.0)), (1, 2, link(1.0)), (2, 1, link(1.0))];
        assert!(Topology::new("t", nodes.clone(), chain).is_err());
        let star = (0..3).flat_map(|i| [(i, 3, link(1.0)), (3, i, link(1.0))]).collect();
        assert_eq!(Topology::new("t", nodes, star).unwrap().nranks(), 3);
    }

    #[test]
    fn fingerprint_ignores_the_name_but_not_a_bandwidth() {
        let mk = |name: &str, bw: f64| {
            Topology::new(name, vec![gpu("a", 0), gpu("b", 1)], vec![(0, 1, link(bw)), (1, 0, link(bw))]).unwrap()
        };
        assert_eq!(mk("x", 25.0).fingerprint(), mk("y", 25.0).fingerprint());
        assert_ne!(mk("x", 25.0).fingerprint(), mk("x", 50.0).fingerprint());
        let dgx = crate::topology::resolve("dgx1").unwrap();
        assert_eq!(dgx.fingerprint(), crate::topology::resolve("dgx1").unwrap().fingerprint());
    }
}

//! What an emulated topology is made of, decided without touching the system: which nodes of
//! the topology become network namespaces, which links become veth pairs and at what rate, the
//! address of every namespace, and the routes that make every rank-to-rank path the one the
//! simulator takes.
//!
//! - Every node on some rank-to-rank route becomes a namespace, switches, CPUs and NICs
//!   included: each forwards (IP routing), so a switch is a router whose ports are shaped, and
//!   contention on a shared link happens where the simulator puts it.
//! - Every pair of nodes joined by a link group used by a route becomes one veth pair; each
//!   end's egress is shaped to its direction's bandwidth × `scale` (parallel links are one
//!   group, as in the model).
//! - Routes follow the simulator's router exactly, per (source, destination) pair (it spreads
//!   equal paths by a hash of both, as ECMP does): a namespace forwards by source policy rules,
//!   one table per source rank, so two flows to one destination may leave by different ports.
//! - Latency is not emulated (`netem` is not available); the scaled topology the ranks and
//!   the simulator reason about has zero link latency.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use topoccl_synth::topology::routing::Router;
use topoccl_synth::topology::{Link, Node, Rank, Topology};

use crate::error::{Error, Result};

/// The interface that carries a namespace's own address (veths are unnumbered).
pub const ADDRESS_IFACE: &str = "emu0";

/// The fastest emulated link's rate when the caller gives no scale, Mbit/s: fast enough that a
/// 64 MiB collective takes seconds, slow enough that forwarding and the ranks' copies on a
/// machine of a few cores never become the bottleneck.
pub const DEFAULT_FASTEST_MBIT: f64 = 400.0;

/// A namespace.
#[derive(Debug, Clone)]
pub struct EmuNode {
    /// Index of the node in the topology's graph.
    pub topo_node: usize,
    pub name: String,
    pub rank: Option<Rank>,
    pub ip: Ipv4Addr,
}

/// A veth pair between namespaces `a` and `b` (indices into [`NetPlan::nodes`]).
#[derive(Debug, Clone)]
pub struct EmuLink {
    pub a: usize,
    pub b: usize,
    /// Egress rate of `a`'s end (toward `b`) and of `b`'s end, Mbit/s; `None` where the
    /// topology has no link in that direction.
    pub rate_ab: Option<f64>,
    pub rate_ba: Option<f64>,
}

impl EmuLink {
    /// The interface name at `end` (a namespace index): named after the namespace it leads to,
    /// unique inside each namespace.
    pub fn iface_at(&self, end: usize) -> String {
        let other = if end == self.a { self.b } else { self.a };
        format!("to{other}")
    }
}

/// One forwarding decision: at namespace `at`, traffic from rank namespace `from` to
/// namespace `to` leaves by link `link` toward namespace `next`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hop {
    pub at: usize,
    pub from: usize,
    pub to: usize,
    pub next: usize,
    pub link: usize,
}

/// Everything an emulation sets up. Rank r is namespace r (ranks come first in `nodes`).
#[derive(Debug, Clone)]
pub struct NetPlan {
    pub nodes: Vec<EmuNode>,
    pub links: Vec<EmuLink>,
    pub hops: Vec<Hop>,
    /// Mbit/s of emulated rate per GB/s of modelled bandwidth.
    pub scale: f64,
    /// The machine as emulated: the used nodes and links, at their shaped rates (in GB/s), with
    /// no latency. The ranks' tuner and `--compare-sim` reason about this.
    pub scaled: Topology,
}

fn address(i: usize) -> Result<Ipv4Addr> {
    let i = u32::try_from(i)
        .ok()
        .filter(|&i| i < 250 * 250)
        .ok_or_else(|| Error::InvalidArgument(format!("an emulated topology can have at most {} nodes", 250 * 250)))?;
    Ok(Ipv4Addr::new(10, 77, (i / 250) as u8, (i % 250 + 1) as u8))
}

impl NetPlan {
    /// Plans the emulation of `topo`; `scale` in Mbit/s per GB/s (`None`: the fastest used
    /// link runs at [`DEFAULT_FASTEST_MBIT`]).
    pub fn new(topo: &Topology, scale: Option<f64>) -> Result<NetPlan> {
        let n = topo.nranks();
        let mut router = Router::new(topo);
        // Every rank-to-rank route, as node paths.
        let mut paths: Vec<(Rank, Rank, Vec<usize>)> = Vec::new();
        for s in 0..n as Rank {
            for d in 0..n as Rank {
                if s == d {
                    continue;
                }
                let route = router.route(s, d).ok_or_else(|| {
                    Error::InvalidArgument(format!("topology {}: rank {s} cannot reach rank {d}", topo.name()))
                })?;
                let mut path = vec![topo.rank_node(s).index()];
                path.extend(route.groups.iter().map(|&g| topo.group(g).to.index()));
                paths.push((s, d, path));
            }
        }
        // Namespaces: ranks first (rank r is namespace r), then the forwarding nodes in use.
        let mut ns_of: BTreeMap<usize, usize> = BTreeMap::new();
        let mut order: Vec<usize> = (0..n as Rank).map(|r| topo.rank_node(r).index()).collect();
        for (_, _, p) in &paths {
            for &v in p {
                if !order.contains(&v) {
                    order.push(v);
                }
            }
        }
        let graph = topo.graph();
        let mut nodes = Vec::with_capacity(order.len());
        for (i, &v) in order.iter().enumerate() {
            ns_of.insert(v, i);
            let node: &Node = &graph[petgraph_index(v)];
            nodes.push(EmuNode { topo_node: v, name: node.name.clone(), rank: node.rank, ip: address(i)? });
        }
        // Links: one veth pair per unordered node pair a route crosses.
        let mut link_of: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        let mut links: Vec<EmuLink> = Vec::new();
        let mut fastest = 0.0f64;
        for (_, _, p) in &paths {
            for w in p.windows(2) {
                let (a, b) = (ns_of[&w[0]], ns_of[&w[1]]);
                let key = (a.min(b), a.max(b));
                if link_of.contains_key(&key) {
                    continue;
                }
                let bw = |x: usize, y: usize| {
                    topo.group_between(petgraph_index(order[x]), petgraph_index(order[y]))
                        .map(|g| topo.group(g).bandwidth)
                };
                let (ab, ba) = (bw(key.0, key.1), bw(key.1, key.0));
                fastest = fastest.max(ab.unwrap_or(0.0)).max(ba.unwrap_or(0.0));
                link_of.insert(key, links.len());
                links.push(EmuLink { a: key.0, b: key.1, rate_ab: ab, rate_ba: ba });
            }
        }
        let scale = match scale {
            Some(s) if s.is_finite() && s > 0.0 => s,
            Some(s) => return Err(Error::InvalidArgument(format!("--emulate-scale must be positive, got {s}"))),
            None if fastest > 0.0 => DEFAULT_FASTEST_MBIT / fastest,
            None => 1.0,
        };
        for l in &mut links {
            l.rate_ab = l.rate_ab.map(|g| g * scale);
            l.rate_ba = l.rate_ba.map(|g| g * scale);
        }
        // Forwarding: every node of every path but the last hands the packet on.
        let mut hops = Vec::new();
        for (s, d, p) in &paths {
            let (from, to) = (*s as usize, *d as usize);
            for w in p.windows(2) {
                let (at, next) = (ns_of[&w[0]], ns_of[&w[1]]);
                let link = link_of[&(at.min(next), at.max(next))];
                hops.push(Hop { at, from, to, next, link });
            }
        }
        hops.sort();
        let scaled = scaled_topology(topo, &nodes, &links)?;
        Ok(NetPlan { nodes, links, hops, scale, scaled })
    }

    /// A line per link: its ends and rates, for the run's header.
    pub fn describe(&self) -> String {
        let mbit = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.0}"));
        let w = self.nodes.iter().map(|n| n.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for l in &self.links {
            out += &format!(
                "#   {:>w$} <-> {:<w$}  {:>6} / {:<6}\n",
                self.nodes[l.a].name,
                self.nodes[l.b].name,
                mbit(l.rate_ab),
                mbit(l.rate_ba)
            );
        }
        out
    }
}

fn petgraph_index(i: usize) -> topoccl_synth::topology::NodeIndex {
    topoccl_synth::topology::NodeIndex::new(i)
}

/// The emulated machine as a topology: used nodes only, one link per shaped direction at its
/// rate in GB/s, no latency.
fn scaled_topology(topo: &Topology, nodes: &[EmuNode], links: &[EmuLink]) -> Result<Topology> {
    let graph = topo.graph();
    let kept: Vec<Node> = nodes.iter().map(|n| graph[petgraph_index(n.topo_node)].clone()).collect();
    let mut edges = Vec::new();
    for l in links {
        let kind = topo
            .edges()
            .find(|(_, a, b, _)| a.index() == nodes[l.a].topo_node && b.index() == nodes[l.b].topo_node)
            .map(|(_, _, _, k)| k.kind)
            .unwrap_or_default();
        let gbs = |mbit: f64| mbit / 8e3;
        if let Some(r) = l.rate_ab {
            edges.push((l.a, l.b, Link { bandwidth: gbs(r), latency: 0.0, kind }));
        }
        if let Some(r) = l.rate_ba {
            edges.push((l.b, l.a, Link { bandwidth: gbs(r), latency: 0.0, kind }));
        }
    }
    Ok(Topology::new(format!("{} (emulated)", topo.name()), kept, edges)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use topoccl_synth::topology::resolve;

    #[test]
    fn a_dgx1_fragment_uses_only_what_its_routes_cross() {
        let t = resolve("dgx1[0,1,2,3,7]").unwrap();
        let p = NetPlan::new(&t, None).unwrap();
        // Five GPUs; rank 4 (GPU 7) reaches GPUs 0-2 through PCIe and the CPUs.
        assert_eq!(p.nodes.iter().map(|n| n.rank).take(5).collect::<Vec<_>>(), (0..5).map(Some).collect::<Vec<_>>());
        assert!(p.nodes.iter().any(|n| n.name == "cpu1"), "{:?}", p.nodes);
        assert!(!p.nodes.iter().any(|n| n.name.starts_with("nic")));
        assert!(!p.nodes.iter().any(|n| n.name == "gpu4"), "unselected GPUs do not relay");
        // The double NVLink 0-3 (50 GB/s) is the fastest link: 400 Mbit/s.
        assert!((p.scale - 8.0).abs() < 1e-9, "{}", p.scale);
        let l03 = p.links.iter().find(|l| (l.a, l.b) == (0, 3)).unwrap();
        assert_eq!(l03.rate_ab, Some(400.0));
        // Every (source, destination) path is complete: it leaves the source, ends at the
        // destination, and each hop continues from where the previous one went.
        for s in 0..5 {
            for d in 0..5 {
                if s == d {
                    continue;
                }
                let mut at = s;
                for _ in 0..p.nodes.len() {
                    if at == d {
                        break;
                    }
                    let h = p.hops.iter().find(|h| h.at == at && h.from == s && h.to == d).unwrap();
                    at = h.next;
                }
                assert_eq!(at, d, "{s} -> {d}");
            }
        }
        // The scaled machine keeps the ranks and their hosts.
        assert_eq!(p.scaled.nranks(), 5);
        assert!((p.scaled.direct_bandwidth(0, 3) - 0.05).abs() < 1e-12);
    }

    #[test]
    fn a_given_scale_is_used_and_a_bad_one_refused() {
        let t = resolve("ring:4,bw=10").unwrap();
        let p = NetPlan::new(&t, Some(20.0)).unwrap();
        assert!(p.links.iter().all(|l| l.rate_ab == Some(200.0) && l.rate_ba == Some(200.0)));
        assert_eq!(p.links.len(), 4);
        assert!(NetPlan::new(&t, Some(0.0)).is_err());
    }
}

//! How fast a collective can possibly run on a topology, so that every schedule can be reported
//! as a percentage of optimal.
//!
//! Bandwidth terms, computed on the physical graph (switches, CPUs and ranks all relay):
//! - **all-gather / reduce-scatter**: the cut bound of ForestColl. If every rank's m = M/n bytes
//!   leave at rate x, any node set S whose complement holds a rank must push |S ∩ ranks|·x out
//!   through its outgoing links, so x* = min_S B⁺(S) / |S ∩ ranks|. By Edmonds' arborescence
//!   theorem (a super source feeding each rank at x) x is achievable exactly when every rank can
//!   receive n·x from the super source, so x* is found by max-flow tests, each failing test's
//!   min cut giving the next candidate (Dinkelbach).
//!   Time ≥ (M/n) / x*. Reduce-scatter is the same on the reversed graph.
//! - **broadcast / reduce**: Edmonds again: the root can feed every rank at min_v maxflow(root, v).
//! - **all-reduce**: twice the all-gather bound is only the best *reduce-scatter + all-gather*;
//!   on irregular graphs reduce-then-broadcast trees can be faster, so both shapes are bounded
//!   and the better one is the bound: RS+AG at n·x*/2, trees at the certified upper end of the
//!   fractional packing of bidirectional trees whose edges take any path of the machine
//!   ([`crate::packing::routed`]). (The ceiling of trees on the rank graph, one path per pair,
//!   which is all a schedule of the IR can use, is reported beside it.)
//! - **all-to-all**: each rank sends and receives (n−1)/n² of the buffer through its own links.
//!
//! The latency term is the longest shortest-latency path a byte must take (from the farthest
//! rank, or from the root). A schedule's time is bounded below by the larger of the two terms.

use std::collections::BinaryHeap;

use petgraph::visit::EdgeRef;

use crate::flow::FlowNetwork;
use crate::packing::fractional::{pack_trees, PackingShape};
use crate::packing::routed::routed_tree_ceiling;
use crate::schedule::{Collective, Rank};
use crate::topology::logical::RankGraph;
use crate::topology::routing::Entry;
use crate::topology::Topology;

/// Above this many (nodes × ranks) the exact cut bound is not computed; the single-rank cuts
/// (a rank's own in/out bandwidth) give a valid but possibly weaker bound instead.
const EXACT_LIMIT: usize = 1 << 22;
/// Above this many ranks the tree shape of all-reduce is not bounded (the packing would take
/// minutes); the bound is then the reduce-scatter + all-gather one.
const TREE_BOUND_MAX_RANKS: usize = 64;
/// Dinkelbach rounds before giving up (each finds a strictly better cut; a handful suffice).
const MAX_CUT_ROUNDS: usize = 64;

/// A lower bound on a collective's time.
#[derive(Debug, Clone, PartialEq)]
pub struct Bound {
    pub collective: Collective,
    /// Algorithm bandwidth (buffer bytes per second, GB/s) no schedule can exceed.
    pub rate_gbps: f64,
    /// µs no schedule can beat, however small the message.
    pub latency_us: f64,
    /// Which shape gives the bound (`cut`, `trees`, `rs+ag`, `edmonds`, `injection`).
    pub shape: &'static str,
    /// Whether the bandwidth term is the exact optimum (false: a valid but weaker bound).
    pub exact: bool,
    /// Every shape considered and its rate, for reports.
    pub shapes: Vec<(&'static str, f64)>,
}

impl Bound {
    /// The least time for a buffer of `bytes`, µs.
    pub fn time_us(&self, bytes: u64) -> f64 {
        self.latency_us.max(bytes as f64 / (self.rate_gbps * 1e3))
    }

    /// `time_us` as a fraction of the given time (1.0 = optimal).
    pub fn efficiency(&self, bytes: u64, time_us: f64) -> f64 {
        if time_us <= 0.0 {
            return 1.0;
        }
        self.time_us(bytes) / time_us
    }
}

/// The bound for `collective` on `topo`.
pub fn bound(topo: &Topology, collective: Collective) -> Bound {
    let n = topo.nranks();
    let latency_us = latency_bound(topo, collective.root());
    let b = |rate: f64, shape, exact, shapes| Bound { collective, rate_gbps: rate, latency_us, shape, exact, shapes };
    if n <= 1 {
        return b(f64::INFINITY, "local", true, Vec::new());
    }
    match collective {
        Collective::AllGather | Collective::ReduceScatter => {
            let reversed = collective == Collective::ReduceScatter;
            let cut = gather_rate(topo, reversed);
            let rate = cut.per_rank * n as f64;
            b(rate, "cut", cut.exact, vec![("cut", rate)])
        }
        Collective::AllReduce => {
            // Reduce-scatter's rate is all-gather's on the reversed graph: the same on symmetric
            // machines, not on ones with one-way fast links.
            let cut = gather_rate(topo, false);
            let rs_cut = if links_symmetric(topo) { cut } else { gather_rate(topo, true) };
            let (ag, rs) = (cut.per_rank * n as f64, rs_cut.per_rank * n as f64);
            let rsag = 1.0 / (1.0 / ag + 1.0 / rs);
            let cut = CutRate { per_rank: rsag, exact: cut.exact && rs_cut.exact };
            let mut shapes = vec![("rs+ag", rsag)];
            // The converged packing is only affordable on small graphs (see `blink`).
            let mut trees = 0.0;
            if n <= TREE_BOUND_MAX_RANKS {
                // Trees whose edges take any path of the machine (the bound), and, for reports,
                // trees of the rank graph's one path per pair (what schedules of the IR reach).
                if let Some(routed) = routed_tree_ceiling(topo, 0.02) {
                    trees = routed.upper;
                    shapes.push(("trees", trees));
                }
                shapes.push((
                    "trees on one path per pair",
                    pack_trees(&RankGraph::of(topo), PackingShape::Bidirectional, 0.02).upper,
                ));
            }
            let (rate, shape, exact) = if trees > rsag { (trees, "trees", true) } else { (rsag, "rs+ag", cut.exact) };
            // Every shape meets the message count: a shape's rate above it is a weak certificate
            // (the trees' packing may branch at switches, which cannot reduce).
            let (messages, grouping) = message_rate(topo);
            shapes.push((grouping, messages));
            if messages < rate * (1.0 - 1e-9) {
                b(messages, grouping, true, shapes)
            } else {
                b(rate, shape, exact, shapes)
            }
        }
        Collective::Broadcast { root } => {
            let rate = root_rate(topo, root, false);
            b(rate, "edmonds", true, vec![("edmonds", rate)])
        }
        Collective::Reduce { root } => {
            let rate = root_rate(topo, root, true);
            b(rate, "edmonds", true, vec![("edmonds", rate)])
        }
        Collective::AllToAll => {
            let worst = (0..n as Rank)
                .map(|r| in_bandwidth(topo, r).min(topo.egress_bandwidth(r)))
                .fold(f64::INFINITY, f64::min);
            // Each rank moves (n−1)/n² of the buffer through its own links.
            let rate = worst * (n * n) as f64 / (n - 1) as f64;
            b(rate, "injection", false, vec![("injection", rate)])
        }
    }
}

/// The message-count bound of all-reduce, whatever its shape. Parties that must all learn a sum
/// of all their inputs by one-way messages need at least 2(G−1) messages per element among G
/// parties (the one-way gossip bound; a chain in and back out meets it). Take the hosts (or the
/// ranks) as parties, free to talk inside: each of the 2(G−1)·M bytes crossing between parties
/// leaves one party and enters another, so the time is at least 2(G−1)·M over the parties'
/// summed egress (and ingress) bandwidth. On a cluster of H hosts with B of NICs each this is
/// H·B / 2(H−1), the bandwidth-optimal all-reduce (Patarasuk and Yuan). Returns the rate and
/// which parties gave it.
pub fn message_rate(topo: &Topology) -> (f64, &'static str) {
    let n = topo.nranks();
    let (_, hosts) = topo.hosts();
    let graph = topo.graph();
    // The rate when `party` maps each node to its party (none: outside every party, a fabric).
    let party_rate = |party: &dyn Fn(usize) -> Option<usize>, parties: usize| {
        if parties < 2 {
            return f64::INFINITY;
        }
        let (mut egress, mut ingress) = (0.0, 0.0);
        for g in topo.link_groups() {
            let (a, b) = (party(g.from.index()), party(g.to.index()));
            if a != b {
                if a.is_some() {
                    egress += g.bandwidth;
                }
                if b.is_some() {
                    ingress += g.bandwidth;
                }
            }
        }
        f64::min(egress, ingress) / (2 * (parties - 1)) as f64
    };
    let mut rank_of_node = vec![None; graph.node_count()];
    for r in 0..n as Rank {
        rank_of_node[topo.rank_node(r).index()] = Some(r as usize);
    }
    let by_rank = party_rate(&|v| rank_of_node[v], n);
    let host_index: std::collections::HashMap<&str, usize> =
        hosts.iter().enumerate().map(|(i, h)| (h.as_str(), i)).collect();
    let host_of_node: Vec<Option<usize>> =
        graph.node_indices().map(|v| host_index.get(graph[v].host.as_str()).copied()).collect();
    let by_host = party_rate(&|v| host_of_node[v], hosts.len());
    if by_host < by_rank {
        (by_host, "messages between hosts")
    } else {
        (by_rank, "messages between ranks")
    }
}

/// Whether every link group has a reverse group of the same bandwidth.
fn links_symmetric(topo: &Topology) -> bool {
    topo.link_groups().iter().all(|g| {
        topo.group_between(g.to, g.from)
            .is_some_and(|r| (topo.group(r).bandwidth - g.bandwidth).abs() <= 1e-9 * g.bandwidth)
    })
}

/// The all-gather cut bound: each rank's share can leave at `per_rank` GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CutRate {
    pub per_rank: f64,
    pub exact: bool,
}

/// The host cuts of [`gather_rate`]: each host's nodes, and all the others. Real cuts, so a valid
/// bound without the exact search, and the binding ones on clusters (a host's NICs).
fn host_cut_rate(topo: &Topology, reversed: bool) -> f64 {
    let n = topo.nranks();
    let g = topo.graph();
    let (host_of, hosts) = topo.hosts();
    if hosts.len() < 2 {
        return f64::INFINITY;
    }
    // Per host label: ranks, bandwidth leaving and entering its nodes.
    let mut label: std::collections::HashMap<&str, (usize, f64, f64)> = std::collections::HashMap::new();
    for &h in &host_of {
        label.entry(hosts[h as usize].as_str()).or_default().0 += 1;
    }
    for e in g.edge_references() {
        let (from, to) = (g[e.source()].host.as_str(), g[e.target()].host.as_str());
        if from != to {
            label.entry(from).or_default().1 += e.weight().bandwidth;
            label.entry(to).or_default().2 += e.weight().bandwidth;
        }
    }
    label
        .values()
        .filter(|&&(ranks, _, _)| ranks > 0 && ranks < n)
        .map(|&(ranks, out, inb)| {
            let (out, inb) = if reversed { (inb, out) } else { (out, inb) };
            // S = the host: B⁺(S) leaves it; S = the rest: B⁺(S) enters the host.
            (out / ranks as f64).min(inb / (n - ranks) as f64)
        })
        .fold(f64::INFINITY, f64::min)
}

/// The single-rank cuts (the complement of one rank, and one rank alone) and the host cuts: a
/// valid all-gather rate bound from one pass over the links.
fn simple_cut_rate(topo: &Topology, reversed: bool) -> f64 {
    let n = topo.nranks();
    (0..n as Rank)
        .map(|r| {
            let (inb, outb) = (in_bandwidth(topo, r), topo.egress_bandwidth(r));
            let (inb, outb) = if reversed { (outb, inb) } else { (inb, outb) };
            (inb / (n - 1).max(1) as f64).min(outb)
        })
        .fold(f64::INFINITY, f64::min)
        .min(host_cut_rate(topo, reversed))
}

/// A rate (buffer GB/s) no schedule of all-gather, reduce-scatter or all-reduce exceeds, from
/// the cuts that cost one pass over the links: single ranks and hosts, and for all-reduce the
/// message count. [`bound`]'s exact search can only lower it; on clusters the host cuts are
/// the binding ones, so the two agree there. What the tuner weighs candidates against at
/// scale, where the exact search takes a good part of a second. `None` for other collectives.
pub fn quick_rate(topo: &Topology, collective: Collective) -> Option<f64> {
    let n = topo.nranks() as f64;
    if topo.nranks() < 2 {
        return None;
    }
    match collective {
        Collective::AllGather => Some(simple_cut_rate(topo, false) * n),
        Collective::ReduceScatter => Some(simple_cut_rate(topo, true) * n),
        // Trees can beat reduce-scatter + all-gather; no shape beats the message count.
        Collective::AllReduce => Some(message_rate(topo).0),
        _ => None,
    }
}

/// x* = min over cuts of B⁺(S)/|S ∩ ranks| (on the reversed graph when `reversed`).
pub fn gather_rate(topo: &Topology, reversed: bool) -> CutRate {
    let n = topo.nranks();
    let hi = simple_cut_rate(topo, reversed);
    if topo.graph().node_count() * n > EXACT_LIMIT {
        return CutRate { per_rank: hi, exact: false };
    }
    let (mut net, source, feeds) = network(topo, reversed, true);
    // Dinkelbach's iteration: test x; if some rank cannot receive n·x, the min cut of that test
    // is a node set S with B⁺(S)/|S ∩ ranks| < x, a real cut, so its ratio is the next x (never
    // below x*). It ends, exactly, at the first x every rank passes — a few rounds instead of a
    // binary search's twenty. The rank that failed last is tried first.
    let mut order: Vec<Rank> = (0..n as Rank).collect();
    let mut x = hi;
    for _ in 0..MAX_CUT_ROUNDS {
        for &a in &feeds {
            net.set_capacity(a, x);
        }
        let want = n as f64 * x;
        let failed = order.iter().position(|&v| {
            net.reset();
            net.max_flow(source, topo.rank_node(v).index(), want) < want * (1.0 - 1e-9)
        });
        let Some(i) = failed else {
            return CutRate { per_rank: x, exact: true };
        };
        order.swap(0, i);
        // The failed flow ran to its maximum: what the source still reaches is S.
        let side = net.residual_reachable(source);
        let ranks_inside = (0..n as Rank).filter(|&r| side[topo.rank_node(r).index()]).count();
        let leaving: f64 = topo
            .link_groups()
            .iter()
            .map(|g| if reversed { (g.to, g.from, g.bandwidth) } else { (g.from, g.to, g.bandwidth) })
            .filter(|&(a, b, _)| side[a.index()] && !side[b.index()])
            .map(|(_, _, bw)| bw)
            .sum();
        let ratio = leaving / ranks_inside.max(1) as f64;
        if ratio >= x * (1.0 - 1e-12) {
            break; // rounding: x is as good as the cut says
        }
        x = ratio;
    }
    CutRate { per_rank: x, exact: true }
}

/// min over ranks v of the max flow root → v (v → root when `reversed`).
pub fn root_rate(topo: &Topology, root: Rank, reversed: bool) -> f64 {
    let (mut net, _, _) = network(topo, reversed, false);
    let s = topo.rank_node(root).index();
    (0..topo.nranks() as Rank)
        .filter(|&v| v != root)
        .map(|v| {
            net.reset();
            net.max_flow(s, topo.rank_node(v).index(), f64::INFINITY)
        })
        .fold(f64::INFINITY, f64::min)
}

/// The physical graph as a flow network (optionally reversed), plus a super source with one
/// arc to every rank when asked; returns (network, source, those arcs).
fn network(topo: &Topology, reversed: bool, with_source: bool) -> (FlowNetwork, usize, Vec<usize>) {
    let mut net = FlowNetwork::new(topo.graph().node_count());
    for g in topo.link_groups() {
        let (a, b) = if reversed { (g.to, g.from) } else { (g.from, g.to) };
        net.add_arc(a.index(), b.index(), g.bandwidth);
    }
    if !with_source {
        return (net, usize::MAX, Vec::new());
    }
    let source = net.add_node();
    let feeds = (0..topo.nranks() as Rank).map(|r| net.add_arc(source, topo.rank_node(r).index(), 0.0)).collect();
    (net, source, feeds)
}

fn in_bandwidth(topo: &Topology, r: Rank) -> f64 {
    topo.graph().edges_directed(topo.rank_node(r), petgraph::Direction::Incoming).map(|e| e.weight().bandwidth).sum()
}

/// Ranks from which the latency term is measured exactly; above, a sample (which still gives a
/// valid, possibly weaker, bound).
const LATENCY_SOURCES: usize = 4096;

/// The longest shortest-latency path from any rank (or from `root`) to any rank, µs.
pub fn latency_bound(topo: &Topology, root: Option<Rank>) -> f64 {
    let n = topo.nranks();
    let sources: Vec<Rank> = match root {
        Some(r) => vec![r],
        None if n <= LATENCY_SOURCES => (0..n as Rank).collect(),
        None => (0..n as Rank).step_by(n.div_ceil(LATENCY_SOURCES)).collect(),
    };
    let graph = topo.graph();
    let mut adj = vec![Vec::new(); graph.node_count()];
    for e in graph.edge_references() {
        adj[e.source().index()].push((e.target().index(), e.weight().latency));
    }
    let mut worst: f64 = 0.0;
    let mut dist = vec![f64::INFINITY; graph.node_count()];
    for s in sources {
        dist.iter_mut().for_each(|d| *d = f64::INFINITY);
        let start = topo.rank_node(s).index();
        dist[start] = 0.0;
        let mut heap = BinaryHeap::from([Entry(0.0, start)]);
        while let Some(Entry(d, u)) = heap.pop() {
            if d > dist[u] {
                continue;
            }
            for &(v, l) in &adj[u] {
                if d + l < dist[v] {
                    dist[v] = d + l;
                    heap.push(Entry(d + l, v));
                }
            }
        }
        for r in 0..n as Rank {
            let d = dist[topo.rank_node(r).index()];
            if d.is_finite() {
                worst = worst.max(d);
            }
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;

    #[test]
    fn uniform_ring_all_gather_bound_is_the_in_bandwidth_bound() {
        let t = resolve("ring:8").unwrap();
        let b = bound(&t, Collective::AllGather);
        // Each rank takes in 2 links; 7 shares must arrive: x* = 2·bw/7, rate = 8·x*.
        let bw = t.direct_bandwidth(0, 1);
        assert!((b.rate_gbps - 8.0 * 2.0 * bw / 7.0).abs() < 1e-6 * b.rate_gbps, "{b:?}");
        assert!(b.exact);
    }

    #[test]
    fn a_bottleneck_cut_is_found_by_binary_search() {
        // Two full-8 halves joined by a thin link: the half is the worst cut, not a single rank.
        let t = resolve("cluster-2x4-slow").unwrap();
        let b = gather_rate(&t, false);
        // 4 ranks' shares must cross one 12.5 GB/s NIC: x* ≤ 12.5/4.
        assert!(b.exact && b.per_rank <= 12.5 / 4.0 + 1e-6, "{b:?}");
        assert!(b.per_rank > 12.5 / 4.0 * 0.99, "{b:?}");
    }

    #[test]
    fn all_reduce_across_hosts_is_bounded_by_the_messages_between_them() {
        // Eight hosts of eight 25 GB/s NICs: 2·7 host-to-host messages per element over
        // 8·200 GB/s, whatever the trees' packing certifies.
        let t = resolve("cluster:8x8").unwrap();
        let b = bound(&t, Collective::AllReduce);
        assert!((b.rate_gbps - 8.0 * 200.0 / 14.0).abs() < 1e-6, "{b:?}");
        assert_eq!(b.shape, "messages between hosts");
        // Inside one host the ranks are the parties, and other shapes bind first.
        let one = bound(&resolve("dgx1").unwrap(), Collective::AllReduce);
        assert!(one.shape != "messages between hosts", "{one:?}");
    }

    #[test]
    fn broadcast_bound_is_the_root_min_cut() {
        let t = resolve("ring:6").unwrap();
        let bw = t.direct_bandwidth(0, 1);
        assert!((root_rate(&t, 0, false) - 2.0 * bw).abs() < 1e-9);
        assert!(latency_bound(&t, Some(0)) > 0.0);
    }
}

//! Exact integral arborescence packing where link capacities are whole multiples of one unit
//! (NVLink counts): Edmonds' theorem says a root reaches every rank by k arc-disjoint spanning
//! arborescences exactly when every rank's min cut from the root is ≥ k, so the best rate,
//! k·unit, is reached with just k trees and no rounding.
//!
//! Construction (Lovász's proof made into an algorithm): grow one arborescence F from the root;
//! an arc (u, v) leaving F may join it iff afterwards every set X ∌ root still has k−1 arcs
//! entering it outside F — i.e. iff the max flow from {root, u} to v in G − F − (u, v) is still
//! ≥ k−1 (the only sets that lose an arc are those containing v but not u). Lovász showed such an arc always
//! exists; when F spans, recurse on G − F with k−1. Each test is one max flow.

use super::fractional::PackedTree;
use crate::flow::FlowNetwork;
use crate::schedule::Rank;
use crate::topology::logical::RankGraph;

/// Whole-unit capacities of the direct arcs of `graph`, if they share a unit (the largest
/// u = min_bw / d, d ≤ 12, that divides every direct bandwidth); returns (unit, units per arc,
/// with 0 for virtual arcs).
pub fn unit_capacities(graph: &RankGraph) -> Option<(f64, Vec<u32>)> {
    let direct: Vec<f64> = graph.arcs().iter().filter(|a| a.direct).map(|a| a.bandwidth).collect();
    let min = direct.iter().copied().fold(f64::INFINITY, f64::min);
    if !min.is_finite() {
        return None;
    }
    (1..=12).map(|d| min / f64::from(d)).find_map(|unit| {
        let units: Option<Vec<u32>> = graph
            .arcs()
            .iter()
            .map(|a| {
                if !a.direct {
                    return Some(0);
                }
                let k = a.bandwidth / unit;
                ((k - k.round()).abs() < 1e-6 && k.round() <= 1e6).then_some(k.round() as u32)
            })
            .collect();
        units.map(|u| (unit, u))
    })
}

/// k arc-disjoint arborescences out of `root` (into it when `reversed`) using `units[a]` copies
/// of arc a, where k is the largest possible (the min cut). Each tree gets rate `unit`.
pub fn pack_arborescences(graph: &RankGraph, units: &[u32], unit: f64, root: Rank, reversed: bool) -> Vec<PackedTree> {
    let n = graph.nranks();
    // Arcs in the direction data flows away from the root.
    let arcs: Vec<(usize, usize)> = graph
        .arcs()
        .iter()
        .map(|a| if reversed { (a.to as usize, a.from as usize) } else { (a.from as usize, a.to as usize) })
        .collect();
    let mut left: Vec<u32> = units.to_vec();
    let root = root as usize;
    let mut k = min_cut(n, &arcs, &left, &[root]);
    // One network for every test, kept in step with `left`: node n is the source, joined to
    // the sources of a test by arcs of infinite capacity (0 otherwise).
    let mut net = FlowNetwork::new(n + 1);
    let ids: Vec<usize> = arcs.iter().zip(&left).map(|(&(a, b), &c)| net.add_arc(a, b, f64::from(c))).collect();
    let from_source: Vec<usize> = (0..n).map(|v| net.add_arc(n, v, 0.0)).collect();
    net.set_capacity(from_source[root], f64::INFINITY);
    // What is left into and out of each rank: a test whose flow these already bound below k−1
    // fails without running it.
    let mut into = vec![0u64; n];
    let mut out = vec![0u64; n];
    for (&(a, b), &c) in arcs.iter().zip(&left) {
        out[a] += u64::from(c);
        into[b] += u64::from(c);
    }
    // One copy of arc a taken from (`delta` −1) or given back to (+1) what is left.
    let adjust = |a: usize, delta: i32, left: &mut [u32], net: &mut FlowNetwork, into: &mut [u64], out: &mut [u64]| {
        left[a] = left[a].saturating_add_signed(delta);
        net.set_capacity(ids[a], f64::from(left[a]));
        into[arcs[a].1] = into[arcs[a].1].saturating_add_signed(i64::from(delta));
        out[arcs[a].0] = out[arcs[a].0].saturating_add_signed(i64::from(delta));
    };
    let mut trees = Vec::new();
    while k > 0 {
        let need = u64::from(k - 1);
        let mut in_tree = vec![false; n];
        in_tree[root] = true;
        let mut parent = vec![None; n];
        let mut grown = 1;
        while grown < n {
            let mut pick = None;
            for a in 0..arcs.len() {
                let (u, v) = arcs[a];
                if !in_tree[u] || in_tree[v] || left[a] == 0 {
                    continue;
                }
                // Taking the arc leaves into[v] − 1 into v and at most out[root] + out[u] − 1
                // out of the sources.
                let sources_out = out[root] + if u == root { 0 } else { out[u] };
                if into[v] <= need || sources_out <= need {
                    continue;
                }
                adjust(a, -1, &mut left, &mut net, &mut into, &mut out);
                if u != root {
                    net.set_capacity(from_source[u], f64::INFINITY);
                }
                net.reset();
                let flow = net.max_flow(n, v, f64::from(k - 1));
                if u != root {
                    net.set_capacity(from_source[u], 0.0);
                }
                adjust(a, 1, &mut left, &mut net, &mut into, &mut out);
                if flow >= f64::from(k - 1) - 0.5 {
                    pick = Some(a);
                    break;
                }
            }
            let Some(a) = pick else {
                // Cannot happen by Lovász's theorem; stop with what is proven so far.
                return trees;
            };
            let (u, v) = arcs[a];
            adjust(a, -1, &mut left, &mut net, &mut into, &mut out);
            in_tree[v] = true;
            parent[v] = Some(u as Rank);
            grown += 1;
        }
        trees.push(PackedTree { root: root as Rank, parent, rate: unit });
        k -= 1;
    }
    trees
}

/// The most any packing of arborescences out of `root` (into it when `reversed`) can carry
/// over `graph`'s arcs at their bandwidths, GB/s: the least max flow from the root to a rank
/// (Edmonds' theorem, fractional form). Over the rank graph, whose arcs the packings use, not
/// over the machine's links (`crate::bound::root_rate`, which a rank graph's routed arcs can
/// exceed).
pub fn rooted_ceiling(graph: &RankGraph, root: Rank, reversed: bool) -> f64 {
    let n = graph.nranks();
    let mut net = FlowNetwork::new(n);
    for a in graph.arcs() {
        let (from, to) = if reversed { (a.to, a.from) } else { (a.from, a.to) };
        net.add_arc(from as usize, to as usize, a.bandwidth);
    }
    (0..n)
        .filter(|&v| v != root as usize)
        .map(|v| {
            net.reset();
            net.max_flow(root as usize, v, f64::INFINITY)
        })
        .fold(f64::INFINITY, f64::min)
}

/// min over vertices v ∉ sources of the max flow from `sources` to v.
fn min_cut(n: usize, arcs: &[(usize, usize)], cap: &[u32], sources: &[usize]) -> u32 {
    (0..n).filter(|v| !sources.contains(v)).map(|v| flow_to(n, arcs, cap, sources, v).round() as u32).min().unwrap_or(0)
}

fn flow_to(n: usize, arcs: &[(usize, usize)], cap: &[u32], sources: &[usize], t: usize) -> f64 {
    let mut net = FlowNetwork::new(n + 1);
    for (&(a, b), &c) in arcs.iter().zip(cap) {
        if c > 0 {
            net.add_arc(a, b, f64::from(c));
        }
    }
    for &s in sources {
        net.add_arc(n, s, f64::INFINITY);
    }
    net.max_flow(n, t, f64::INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;

    #[test]
    fn dgx1_root_gets_as_many_trees_as_its_min_cut() {
        let full = resolve("dgx1").unwrap();
        let g = RankGraph::of(&full);
        let (unit, units) = unit_capacities(&g).unwrap();
        assert_eq!(unit, 25.0);
        let trees = pack_arborescences(&g, &units, unit, 0, false);
        // Every GPU has 6 NVLinks: 6 disjoint arborescences.
        assert_eq!(trees.len(), 6);
        let mut used = vec![0u32; g.arcs().len()];
        for t in &trees {
            for (v, p) in t.parent.iter().enumerate() {
                if let Some(p) = p {
                    used[g.find(*p, v as Rank).unwrap()] += 1;
                } else {
                    assert_eq!(v, 0);
                }
            }
        }
        assert!(used.iter().zip(&units).all(|(u, c)| u <= c));
    }
}

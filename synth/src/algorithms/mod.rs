//! The classic algorithms, each a construction that generates the schedule IR
//! ([`crate::generate::ScheduleGenerator`]), and the ring order they share. Nothing here
//! moves bytes or prices time: the executor and the simulator read what these produce. The
//! searched generators (Blink, forest packing, TACOS) are modules of their own, and
//! [`crate::registry`] names them all.

pub mod alltoall;
pub mod hier_doubling;
pub mod hierarchical;
pub mod rails;
pub mod rd;
pub mod rhd;
pub mod ring;
pub mod tree;

use std::sync::{Mutex, PoisonError};

use crate::schedule::Rank;
use crate::topology::routing::Router;
use crate::topology::Topology;

/// Exhaustive search is used up to this many ranks; beyond, rank order is kept.
const RING_SEARCH_MAX: usize = 9;

/// A ring order over all ranks that maximises the slowest hop's bandwidth (then the sum), as
/// NCCL's ring search does: on a DGX-1 it follows NVLinks. Hops without a direct link are
/// priced at their routed path's bottleneck. Large topologies keep rank order, which the
/// library's files and families number so that neighbours are adjacent.
///
/// The search takes milliseconds where every hop is alike (an NVSwitch machine prunes nothing)
/// and every ring-based generator and closed form asks for it, so its answers are kept per
/// topology for the process.
pub fn ring_order(topo: &Topology) -> Vec<Rank> {
    let n = topo.nranks();
    if n <= 3 || n > RING_SEARCH_MAX {
        return (0..n as Rank).collect();
    }
    static FOUND: Mutex<Vec<(u64, Vec<Rank>)>> = Mutex::new(Vec::new());
    let found = || FOUND.lock().unwrap_or_else(PoisonError::into_inner);
    let fingerprint = topo.fingerprint();
    if let Some((_, order)) = found().iter().find(|(f, _)| *f == fingerprint) {
        return order.clone();
    }
    let order = searched_ring_order(topo);
    let mut kept = found();
    // A handful of topologies per process; a bound all the same.
    if kept.len() >= 64 {
        kept.clear();
    }
    kept.push((fingerprint, order.clone()));
    order
}

/// [`ring_order`]'s exhaustive search.
fn searched_ring_order(topo: &Topology) -> Vec<Rank> {
    let n = topo.nranks();
    let mut router = Router::new(topo);
    let mut bw = vec![vec![0.0f64; n]; n];
    for (a, row) in bw.iter_mut().enumerate() {
        for (b, cell) in row.iter_mut().enumerate() {
            if a != b {
                *cell = router.route(a as Rank, b as Rank).map_or(0.0, |r| r.bandwidth);
            }
        }
    }
    let mut best: (f64, f64, Vec<usize>) = (-1.0, -1.0, Vec::new());
    let mut path = vec![0usize];
    let mut used = vec![false; n];
    used[0] = true;
    search(&bw, &mut path, &mut used, f64::INFINITY, 0.0, &mut best);
    best.2.into_iter().map(|r| r as Rank).collect()
}

fn search(
    bw: &[Vec<f64>],
    path: &mut Vec<usize>,
    used: &mut [bool],
    min: f64,
    sum: f64,
    best: &mut (f64, f64, Vec<usize>),
) {
    let n = bw.len();
    let last = path[path.len() - 1];
    if path.len() == n {
        let close = bw[last][0];
        let (m, s) = (min.min(close), sum + close);
        if m > best.0 + 1e-9 || ((m - best.0).abs() <= 1e-9 && s > best.1 + 1e-9) {
            *best = (m, s, path.clone());
        }
        return;
    }
    for next in 1..n {
        if used[next] {
            continue;
        }
        let m = min.min(bw[last][next]);
        if m + 1e-9 < best.0 {
            continue; // cannot beat the best bottleneck
        }
        used[next] = true;
        path.push(next);
        search(bw, path, used, m, sum + bw[last][next], best);
        path.pop();
        used[next] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;

    #[test]
    fn dgx1_ring_uses_only_nvlinks() {
        let t = resolve("dgx1").unwrap();
        let order = ring_order(&t);
        assert_eq!(order.len(), 8);
        for i in 0..8 {
            let (a, b) = (order[i], order[(i + 1) % 8]);
            assert!(t.direct_bandwidth(a, b) >= 25.0, "{order:?}: {a}->{b}");
        }
    }
}

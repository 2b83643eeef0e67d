//! Several attempts of the time-expanded-network matcher, differing only in how ties between
//! equally good chunks are broken, and the best kept. Which chunk a link takes among equally
//! rare ones decides whether a far rank's chunk can move on every step: on the 16-rank 2D torus
//! and hypercube chunk order needs 5 steps and other orders the optimal 4 (⌈15 / 4⌉).

use super::problem::{TenOptions, TenSchedule};
use super::ten::{all_gather, transfer_times, uniform};
use crate::error::Result;
use crate::topology::logical::RankGraph;

/// Work (ranks × chunks) one attempt's budget is measured in: [`best_all_gather`] makes about
/// `ATTEMPT_WORK / (ranks × chunks)` attempts (at most [`MAX_ATTEMPTS`]): 32 on a 16-rank
/// torus (well under a millisecond each), 4 at 256 ranks, one from 512 ranks up, where an
/// attempt takes long and the last step is a fraction of a percent of the time.
const ATTEMPT_WORK: usize = 1 << 18;
/// At most this many attempts.
pub const MAX_ATTEMPTS: u64 = 32;

/// [`all_gather`] tried with several tie-breaking seeds (`opt.seed` and the next ones), keeping
/// the soonest finish (then the fewest steps, then the first seed), and stopping early at the
/// per-step bound on uniform links. Which chunk a link takes among equally rare ones decides
/// whether a far rank's chunk can move on every step: on the 16-rank 2D torus and hypercube one
/// order of ties needs 5 steps and others the optimal 4 (⌈15 / 4⌉). The attempts are the same
/// on every rank, so the result is as deterministic as one attempt.
pub fn best_all_gather(graph: &RankGraph, opt: TenOptions) -> Result<TenSchedule> {
    let n = graph.nranks();
    let total = n * opt.per_rank.max(1) as usize;
    let attempts = (ATTEMPT_WORK / (n * total).max(1)).clamp(1, MAX_ATTEMPTS as usize) as u64;
    let floor = per_step_floor_us(graph, opt);
    let mut best = all_gather(graph, opt)?;
    for i in 1..attempts {
        if floor.is_some_and(|f| best.time_us <= f * (1.0 + 1e-9)) {
            break;
        }
        let s = all_gather(graph, TenOptions { seed: opt.seed.wrapping_add(i), ..opt })?;
        if (s.time_us, s.steps) < (best.time_us, best.steps) {
            best = s;
        }
    }
    Ok(best)
}

/// On links of one speed: no schedule finishes before the rank with the fewest in-links has
/// received every chunk it lacks, one per link and step. `None` on mixed speeds.
fn per_step_floor_us(graph: &RankGraph, opt: TenOptions) -> Option<f64> {
    let t = uniform(&transfer_times(graph, opt.chunk_bytes))?;
    let k = opt.per_rank.max(1) as usize;
    let lacking = graph.nranks() * k - k;
    let steps = (0..graph.nranks() as crate::schedule::Rank)
        .map(|r| lacking.div_ceil(graph.in_arcs(r).len().max(1)))
        .max()
        .unwrap_or(0);
    Some(steps as f64 * t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;

    #[test]
    fn torus_and_hypercube_reach_the_per_step_bound() {
        // Degree 4, 15 chunks to receive, 4 per step: ⌈15/4⌉ = 4 steps at best, and 4 are
        // possible (a SAT search over the time-expanded network finds schedules). Chunk order
        // alone takes 5: the antipode's chunk must move on every step without a pause.
        for spec in ["torus2d:4x4", "hypercube:16"] {
            let g = RankGraph::of(&resolve(spec).unwrap());
            assert_eq!(all_gather(&g, TenOptions::for_tests()).unwrap().steps, 5, "{spec}: seed 0 alone");
            let s = best_all_gather(&g, TenOptions::for_tests()).unwrap();
            assert_eq!(s.steps, 4, "{spec}");
            let moved: usize = s.per_arc.iter().map(Vec::len).sum();
            assert_eq!(moved, 16 * 15);
            assert_eq!(per_step_floor_us(&g, TenOptions::for_tests()), Some(s.time_us), "{spec}: at the floor");
            // Every rank runs the same attempts and gets the same schedule.
            assert_eq!(best_all_gather(&g, TenOptions::for_tests()).unwrap().per_arc, s.per_arc);
        }
    }

    #[test]
    fn attempts_never_do_worse_than_chunk_order_on_mixed_links() {
        for spec in ["dgx1[0,1,2,3,7]", "cluster-2x4-slow", "torus2d-4x4-slowlink"] {
            let g = RankGraph::of(&resolve(spec).unwrap());
            assert_eq!(per_step_floor_us(&g, TenOptions::for_tests()), None, "{spec} has mixed links");
            let first = all_gather(&g, TenOptions::for_tests()).unwrap();
            let best = best_all_gather(&g, TenOptions::for_tests()).unwrap();
            assert!(best.time_us <= first.time_us, "{spec}: {} > {}", best.time_us, first.time_us);
        }
    }
}

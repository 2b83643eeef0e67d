//! Pricing at scale: above a few dozen ranks, simulating every candidate costs seconds (a ring
//! across 512 ranks is four million messages), so candidates whose generator has a closed form
//! ([`ScheduleGenerator::estimate`](topoccl_synth::generate::ScheduleGenerator::estimate)) are
//! priced by it, and the rest are simulated only where they could still win: where the cut bound
//! leaves them room to beat the best priced so far, and, for synthesizers (seconds of search at
//! this size), only where the closed forms reach less than [`SYNTHESIS_BELOW`] of the bound.

use topoccl_synth::bound;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::lockstep::Lockstep;
use topoccl_synth::sim::SimConfig;
use topoccl_synth::topology::Topology;

use super::{Choice, Priced};

/// A candidate without a closed form is simulated only where the bound leaves it room to beat
/// the best priced so far by at least this fraction.
const MATTERS: f64 = 0.02;
/// A synthesizer is run at scale only where the best priced so far reaches less than this
/// fraction of the bound. On `cluster-64x8` TACOS takes 8 s to synthesize and simulate and
/// reaches 40 % of the bound at 1 GiB, where the ring reaches 98.6 %; where the regular shapes
/// fall below half the bound (all-gather at 64 MiB: 36 %) it is worth its seconds.
const SYNTHESIS_BELOW: f64 = 0.5;

/// Candidates with their index in the candidate list (which orders ties).
pub(super) type Indexed<T> = Vec<(usize, T)>;

/// The candidates of `list` priced by their closed forms, and the others.
pub(super) fn estimate(
    topology: &Topology,
    registry: &Registry,
    config: SimConfig,
    collective: Collective,
    bytes: u64,
    list: Vec<Choice>,
) -> (Indexed<Priced>, Indexed<Choice>) {
    let mut model = Lockstep::new(topology, config);
    let (mut priced, mut rest) = (Vec::new(), Vec::new());
    for (i, choice) in list.into_iter().enumerate() {
        let request = choice.request(topology, collective, bytes).follow_paths(config.follow_paths);
        let time = registry.get(&choice.algorithm).ok().and_then(|g| g.estimate(&request, bytes, &mut model));
        match time {
            Some(time_us) if time_us.is_finite() => priced.push((i, Priced { choice, time_us })),
            _ => rest.push((i, choice)),
        }
    }
    // Constructions before synthesizers: they are cheaper, and may make the synthesis moot.
    rest.sort_by_key(|(i, c)| (registry.get(&c.algorithm).is_ok_and(|g| g.searched()), *i));
    (priced, rest)
}

/// Whether a candidate without a closed form is worth simulating, given the best time priced so
/// far and the least time the bound allows (`None`: no bound for this collective, simulate).
pub(super) fn worth_simulating(searched: bool, best_us: f64, bound_us: Option<f64>) -> bool {
    let Some(bound_us) = bound_us.filter(|b| b.is_finite() && *b > 0.0) else {
        return true;
    };
    if !best_us.is_finite() {
        return true;
    }
    bound_us < best_us * (1.0 - MATTERS) && !(searched && bound_us >= best_us * SYNTHESIS_BELOW)
}

/// The least time, µs, any schedule of `collective` can take for `bytes` by the quick cuts.
pub(super) fn bound_us(topology: &Topology, collective: Collective, bytes: u64) -> Option<f64> {
    bound::quick_rate(topology, collective).map(|gbps| bytes as f64 / (gbps * 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulation_is_kept_for_candidates_that_could_win() {
        // No bound, or nothing priced yet: simulate.
        assert!(worth_simulating(true, 100.0, None));
        assert!(worth_simulating(true, f64::INFINITY, Some(50.0)));
        // The best is within 2 % of the bound: nothing can win by more.
        assert!(!worth_simulating(false, 100.0, Some(99.0)));
        // Room left: constructions are simulated, synthesizers only below half the bound.
        assert!(worth_simulating(false, 100.0, Some(80.0)));
        assert!(!worth_simulating(true, 100.0, Some(80.0)));
        assert!(worth_simulating(true, 100.0, Some(40.0)));
    }
}

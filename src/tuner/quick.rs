//! The quick decision: what a size bucket runs while the tuner decides it in full in the
//! background ([`super::refine`]). The full decision prices every depth of every generator and
//! synthesizes (a second per size on a DGX-1, eight on `cluster-64x8`); the quick one prices only
//! the constructions (no searched generator) at their default depth and channel variants, by
//! their closed forms where they have one, else in the simulator (at scale, where simulating
//! takes seconds, not at all). It is as
//! rank-invariant as the full one: the same inputs, the same fixed order, ties to the first.

use super::select::Selector;
use super::{at_scale, scale, size_bucket, Choice, Priced};
use crate::error::{Error, Result};
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::Simulator;

/// A construction without a closed form is priced quickly only where its schedule sends at most
/// this many messages per rank: the simulator's time grows with the messages (a DGX-1's
/// double binary tree, 28 per rank, simulates in about 0.15 ms; its hierarchical all-reduce,
/// 224, in 0.3 ms; a heap of them would cost the first call more than they could win).
const QUICK_SENDS_PER_RANK: u64 = 32;

/// The constructions that build `collective`, at their default depth and at each channel
/// variant, in registry order.
fn quick_candidates(registry: &Registry, collective: Collective) -> Vec<Choice> {
    let mut out = Vec::new();
    for g in registry.iter().filter(|g| g.supports(collective) && !g.searched()) {
        out.push(Choice::new(g.name(), 1, 0));
        out.extend(g.channel_variants().iter().map(|&c| Choice::new(g.name(), 1, c)));
    }
    out
}

impl Selector {
    /// The quick decision for `collective` on a buffer of `bytes`, with its price at the size
    /// bucket (infinite where nothing could price it: at scale without a closed form, the first
    /// construction in registry order runs). Kept per bucket.
    pub fn choose_quick(&mut self, collective: Collective, bytes: u64) -> Result<Priced> {
        self.check_root(collective)?;
        let key = self.decision_key(collective, bytes);
        if let Some(p) = self.quick.get(&key) {
            return Ok(p.clone());
        }
        if let Some((p, schedule)) = self.refinements.warmed(&key) {
            self.schedules.keep_proven(&self.registry, &p.choice, collective, bytes, schedule)?;
            self.quick.insert(key, p.clone());
            return Ok(p);
        }
        let bucket = size_bucket(bytes);
        let list = quick_candidates(&self.registry, collective);
        let first = list.first().cloned();
        let sim = self.options.sim;
        let (mut priced, rest) = scale::estimate(&self.topology, &self.registry, sim, collective, bucket, list);
        // Below scale, what has no closed form is simulated (once per distinct schedule: the
        // channel variants of some constructions are one schedule).
        if !at_scale(&self.topology) {
            let mut seen = Vec::new();
            for (i, choice) in rest {
                // A construction that cannot build this topology is no candidate.
                let Ok(schedule) = self.priceable(&choice, collective, bucket) else { continue };
                let stats = schedule.stats();
                let identity = (schedule.name.clone(), schedule.chunks, stats.max_channels, stats.sends);
                if seen.contains(&identity) || stats.sends > QUICK_SENDS_PER_RANK * self.topology.nranks() as u64 {
                    continue;
                }
                seen.push(identity);
                let time_us = Simulator::with_config(&self.topology, sim).run(&schedule, bucket)?.time_us;
                priced.push((i, Priced { choice, time_us }));
            }
        }
        priced.sort_by_key(|(i, _)| *i);
        let mut priced: Vec<Priced> = priced.into_iter().map(|(_, p)| p).collect();
        // At scale without a closed form, the first construction in registry order, unpriced.
        if let (true, Some(choice)) = (priced.is_empty(), first) {
            priced.push(Priced { choice, time_us: f64::INFINITY });
        }
        let best =
            priced.into_iter().reduce(|best, p| if p.time_us < best.time_us { p } else { best }).ok_or_else(|| {
                Error::InvalidArgument(format!("no algorithm builds {collective} on topology {}", self.topology.name()))
            })?;
        self.quick.insert(key, best.clone());
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuner::SelectorOptions;
    use topoccl_synth::topology::resolve;

    #[test]
    fn the_quick_choice_is_a_priced_construction_and_takes_no_synthesis() {
        let mut s = Selector::new(resolve("dgx1").unwrap(), SelectorOptions::default()).unwrap();
        let registry = Registry::builtin();
        for shift in [10, 20, 30] {
            let quick = s.choose_quick(Collective::AllReduce, 1 << shift).unwrap();
            assert!(!registry.get(&quick.choice.algorithm).unwrap().searched(), "{quick:?}");
            assert_eq!(quick.choice.pipeline, 1);
            assert!(quick.time_us.is_finite());
        }
        // Deterministic: a second selector makes the same choices.
        let mut t = Selector::new(resolve("dgx1").unwrap(), SelectorOptions::default()).unwrap();
        for shift in [10, 20, 30] {
            assert_eq!(
                s.choose_quick(Collective::AllReduce, 1 << shift).unwrap(),
                t.choose_quick(Collective::AllReduce, 1 << shift).unwrap()
            );
        }
    }

    #[test]
    fn at_scale_the_quick_choice_is_priced_by_closed_forms() {
        let mut s = Selector::new(resolve("cluster:17x4").unwrap(), SelectorOptions::default()).unwrap();
        let quick = s.choose_quick(Collective::AllGather, 1 << 30).unwrap();
        assert!(quick.time_us.is_finite(), "{quick:?}");
        // All-to-all has no closed form: the first construction runs, unpriced.
        let a2a = s.choose_quick(Collective::AllToAll, 1 << 20).unwrap();
        assert!(Registry::builtin().get(&a2a.choice.algorithm).unwrap().supports(Collective::AllToAll));
    }
}

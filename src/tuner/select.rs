//! [`Selector`]: the tuner as the communicator and collbench use it — candidates priced in the
//! simulator, user tuners consulted, decisions and schedules cached in memory and on disk.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::{Collective, Schedule};
use topoccl_synth::sim::{SimConfig, Simulator};
use topoccl_synth::topology::Topology;

use super::built::BuiltSchedules;
use super::cache::DiskCache;
use super::scale;
use super::{
    candidates, could_win_deeper, deeper, size_bucket, Choice, Priced, TuneRequest, Tuner, DEEPER_CONTENDER,
    TUNER_API_VERSION,
};
use crate::error::{Error, Result};

/// Settings every rank must share (they enter the decision).
#[derive(Debug, Clone, Default)]
pub struct SelectorOptions {
    /// Only this algorithm is considered where it builds the collective (`TOPOCCL_ALGO`).
    pub forced: Option<String>,
    /// The simulator's cost model while pricing (per-message costs, local copy speed).
    pub sim: SimConfig,
    pub cache: DiskCache,
    /// [`Selector::decide`] answers at once with a quick choice and makes the full decision in
    /// the background (a communicator's calls); off, it decides in full before it answers
    /// (collbench's sweeps, `TOPOCCL_TUNE=first-call`).
    pub background: bool,
    /// Holds each background decision back this long before it is made (tests: a rank that
    /// decides late).
    pub background_delay: std::time::Duration,
}

/// What a decision depends on: the size bucket, the forced algorithm and every knob of the
/// cost model (a decision priced under one model is not reused under another). Its text form
/// is the key of the disk cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct DecisionKey {
    forced: Option<String>,
    pub(super) collective: Collective,
    pub(super) bucket: u64,
    /// The cost model's knobs, floats by their bits.
    message_overhead_us: u64,
    rank_message_us: u64,
    local_gbps: Option<u64>,
    pair_sharing: bool,
    pair_queue_bytes: Option<u64>,
    follow_paths: bool,
}

impl DecisionKey {
    fn new(forced: Option<&str>, collective: Collective, bucket: u64, sim: &SimConfig) -> DecisionKey {
        DecisionKey {
            forced: forced.map(str::to_string),
            collective,
            bucket,
            message_overhead_us: sim.message_overhead_us.to_bits(),
            rank_message_us: sim.rank_message_us.to_bits(),
            local_gbps: sim.local_gbps.map(f64::to_bits),
            pair_sharing: sim.pair_sharing,
            pair_queue_bytes: sim.pair_queue_bytes.map(f64::to_bits),
            follow_paths: sim.follow_paths,
        }
    }
}

impl std::fmt::Display for DecisionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}/{}/{:?}/{}/{:?}/{}",
            self.forced.as_deref().unwrap_or("auto"),
            self.collective,
            self.bucket,
            f64::from_bits(self.message_overhead_us),
            f64::from_bits(self.rank_message_us),
            self.local_gbps.map(f64::from_bits),
            self.pair_sharing,
            self.pair_queue_bytes.map(f64::from_bits),
            self.follow_paths
        )
    }
}

/// Chooses and builds schedules for one topology. See the module documentation of
/// [`crate::tuner`].
pub struct Selector {
    pub(super) topology: Topology,
    fingerprint: u64,
    pub(super) registry: Registry,
    pub(super) options: SelectorOptions,
    plugins: Vec<Box<dyn Tuner>>,
    /// Decisions made or read from the disk cache this run.
    pub(super) decisions: FxHashMap<DecisionKey, Choice>,
    /// The disk cache's decisions for this topology, by their text keys (read once).
    stored: BTreeMap<String, Choice>,
    pub(super) schedules: BuiltSchedules,
    /// Quick decisions ([`super::quick`]), run while the full ones are made in the background.
    pub(super) quick: FxHashMap<DecisionKey, Priced>,
    /// Sizes switched to their background decision ([`super::refine`]), as
    /// [`Selector::decide`] found them.
    pub(super) settled: FxHashMap<DecisionKey, Choice>,
    /// The background decisions, shared with the communicator's executor.
    pub(super) refinements: Arc<super::refine::Refinements>,
    /// Set when the selector that asked for this one's decisions is gone: pricing stops
    /// between candidates ([`super::refine`]).
    pub(super) cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector")
            .field("topology", &self.topology.name())
            .field("fingerprint", &format_args!("{:016x}", self.fingerprint))
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Selector {
    pub fn new(topology: Topology, options: SelectorOptions) -> Result<Selector> {
        let registry = Registry::builtin();
        check_algorithm(&registry, options.forced.as_deref())?;
        let fingerprint = topology.fingerprint();
        let stored = options.cache.known_decisions(fingerprint, |a| registry.get(a).is_ok());
        let schedules = BuiltSchedules::new(fingerprint, options.cache.clone(), options.sim.follow_paths);
        let selector = Selector {
            topology,
            fingerprint,
            registry,
            options,
            plugins: Vec::new(),
            decisions: FxHashMap::default(),
            stored,
            schedules,
            quick: FxHashMap::default(),
            settled: FxHashMap::default(),
            refinements: Arc::default(),
            cancel: None,
        };
        if selector.options.background && selector.options.forced.is_none() {
            selector.refinements.start(&selector)?;
        }
        Ok(selector)
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn forced(&self) -> Option<&str> {
        self.options.forced.as_deref()
    }

    /// Forces an algorithm (`None` or `auto`: the tuner's choice).
    pub fn set_forced(&mut self, algo: Option<&str>) -> Result<()> {
        let algo = algo.filter(|a| *a != "auto");
        check_algorithm(&self.registry, algo)?;
        self.options.forced = algo.map(str::to_string);
        Ok(())
    }

    /// The background decisions, for the communicator's agreements (`comm::agree`).
    pub(crate) fn refinements(&self) -> Arc<super::refine::Refinements> {
        self.refinements.clone()
    }

    /// The topology's fingerprint.
    pub(super) fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether a user tuner was added.
    pub(super) fn has_tuners(&self) -> bool {
        !self.plugins.is_empty()
    }

    /// Adds a user tuner, consulted (in the order added) after the candidates are priced.
    pub fn add_tuner(&mut self, tuner: Box<dyn Tuner>) -> Result<()> {
        if tuner.api_version() != TUNER_API_VERSION {
            return Err(Error::InvalidArgument(format!(
                "tuner `{}` implements tuner API v{}, topoccl speaks v{TUNER_API_VERSION}",
                tuner.name(),
                tuner.api_version()
            )));
        }
        self.plugins.push(tuner);
        Ok(())
    }

    /// What runs `collective` on a buffer of `bytes` (nccl-tests' size): the fastest priced
    /// candidate of its size bucket, unless a user tuner picks another.
    pub fn choose(&mut self, collective: Collective, bytes: u64) -> Result<Choice> {
        self.check_root(collective)?;
        if self.plugins.is_empty() {
            let key = self.decision_key(collective, bytes);
            if let Some(c) = self.decisions.get(&key) {
                return Ok(c.clone());
            }
            if let Some(c) = self.stored.get(&key.to_string()) {
                self.decisions.insert(key, c.clone());
                return Ok(c.clone());
            }
        }
        Ok(self.choose_priced(collective, bytes)?.choice)
    }

    /// [`Selector::choose`]'s pick with its price (at the size bucket), always priced afresh:
    /// no decision made or stored before is read, and the decision is stored as `choose` stores
    /// it. This is how a decision is timed, and how a cluster too large to simulate is priced.
    pub fn choose_priced(&mut self, collective: Collective, bytes: u64) -> Result<Priced> {
        self.check_root(collective)?;
        let bucket = size_bucket(bytes);
        // `price` errs rather than return no candidate, and a candidate is dropped below only
        // while others remain, so `pick` always has one to index.
        let mut priced = self.price(collective, bytes)?;
        let chosen = loop {
            let best = self.pick(collective, bucket, &priced);
            // Pricing does not prove a searched candidate's schedule; the pick is proven now,
            // and one that fails is dropped and the pick made again without it (as pricing
            // drops a candidate whose generator fails).
            let choice = priced[best].choice.clone();
            if self.registry.get(&choice.algorithm).is_ok_and(|g| g.searched()) {
                if let Err(e) = self.schedule(&choice, collective, bucket) {
                    if priced.len() == 1 {
                        return Err(e);
                    }
                    priced.remove(best);
                    continue;
                }
            }
            break priced.swap_remove(best);
        };
        if self.plugins.is_empty() {
            let key = self.decision_key(collective, bytes);
            self.options.cache.store_decision(self.fingerprint, &key.to_string(), &chosen.choice);
            self.decisions.insert(key, chosen.choice.clone());
        }
        Ok(chosen)
    }

    /// The index in `priced` of the fastest candidate (the first of equals), unless a user tuner
    /// picks another.
    fn pick(&mut self, collective: Collective, bucket: u64, priced: &[Priced]) -> usize {
        let mut best = 0;
        for (i, p) in priced.iter().enumerate() {
            if p.time_us < priced[best].time_us {
                best = i;
            }
        }
        let request = TuneRequest { topology: &self.topology, collective, bytes: bucket, priced };
        for plugin in &mut self.plugins {
            if let Some(i) = plugin.choose(&request).filter(|&i| i < priced.len()) {
                return i;
            }
        }
        best
    }

    pub(super) fn decision_key(&self, collective: Collective, bytes: u64) -> DecisionKey {
        DecisionKey::new(self.options.forced.as_deref(), collective, size_bucket(bytes), &self.options.sim)
    }

    /// The simulated time, in microseconds, of the schedule [`Selector::choose`] picks for
    /// `collective` on exactly `bytes`.
    pub fn predict_us(&mut self, collective: Collective, bytes: u64) -> Result<f64> {
        let choice = self.choose(collective, bytes)?;
        self.predict_choice_us(&choice, collective, bytes)
    }

    /// The simulated time, in microseconds, of `choice`'s schedule for `collective` on exactly
    /// `bytes`.
    pub fn predict_choice_us(&mut self, choice: &Choice, collective: Collective, bytes: u64) -> Result<f64> {
        let schedule = self.schedule(choice, collective, size_bucket(bytes))?;
        Ok(Simulator::with_config(&self.topology, self.options.sim).run(&schedule, bytes)?.time_us)
    }

    /// Every candidate for `collective` priced at the size bucket of `bytes`, in candidate
    /// order, then any deeper ones tried after them ([`deeper`]). At scale, closed forms price
    /// what they can and candidates that cannot win are left out ([`scale`]). Candidates whose generator
    /// cannot build this topology are left out, as are duplicates (two knob settings a
    /// generator maps to one schedule).
    pub fn price(&mut self, collective: Collective, bytes: u64) -> Result<Vec<Priced>> {
        let bucket = size_bucket(bytes);
        let only =
            self.options.forced.as_deref().filter(|a| self.registry.get(a).is_ok_and(|g| g.supports(collective)));
        let list = candidates(&self.registry, &self.topology, collective, only);
        let config = self.options.sim;
        if super::at_scale(&self.topology) {
            return self.price_at_scale(collective, bucket, list);
        }
        let mut priced: Vec<Priced> = Vec::with_capacity(list.len());
        let mut seen: Vec<(String, u32, u32, u64)> = Vec::new();
        let mut failures = Vec::new();
        // Chunks of each priced schedule, beside `priced`.
        let mut chunks: Vec<u32> = Vec::new();
        let mut next = list;
        let mut deepened: Vec<Choice> = Vec::new();
        while !next.is_empty() {
            for choice in std::mem::take(&mut next) {
                self.check_cancelled()?;
                let best = priced.iter().map(|p| p.time_us).fold(f64::INFINITY, f64::min);
                if !could_win_deeper(&priced, &chunks, &choice, best) {
                    continue;
                }
                let schedule = match self.priceable(&choice, collective, bucket) {
                    Ok(s) => s,
                    Err(e) => {
                        failures.push(format!("{choice}: {e}"));
                        continue;
                    }
                };
                let stats = schedule.stats();
                let identity = (schedule.name.clone(), schedule.chunks, stats.max_channels, stats.sends);
                if seen.contains(&identity) {
                    continue;
                }
                seen.push(identity);
                let time_us = Simulator::with_config(&self.topology, config).run(&schedule, bucket)?.time_us;
                chunks.push(schedule.chunks);
                priced.push(Priced { choice, time_us });
            }
            // A winner at the deepest depth priced so far is tried deeper, while that keeps
            // winning (a forced algorithm is the only one listed, so the deeper one is of it).
            // So are close runners-up there: two tree packings a percent apart at p128 can
            // swap places at p256.
            let best = priced.iter().map(|p| p.time_us).fold(f64::INFINITY, f64::min);
            for (i, p) in priced.iter().enumerate() {
                if p.time_us > best * (1.0 + DEEPER_CONTENDER) {
                    continue;
                }
                if let Some(deeper) = deeper(&self.topology, &p.choice, chunks[i], bucket) {
                    if !deepened.contains(&deeper) {
                        deepened.push(deeper.clone());
                        next.push(deeper);
                    }
                }
            }
        }
        if priced.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "no algorithm builds {collective} on topology {}{}",
                self.topology.name(),
                if failures.is_empty() { String::new() } else { format!(": {}", failures.join("; ")) }
            )));
        }
        Ok(priced)
    }

    /// The schedule `choice` stands for, to be run: built on first use and kept, and proven by
    /// the verifier where a search found it.
    pub fn schedule(&mut self, choice: &Choice, collective: Collective, bytes: u64) -> Result<Arc<Schedule>> {
        self.check_root(collective)?;
        self.schedules.proven(&self.topology, &self.registry, choice, collective, bytes)
    }

    /// The schedule `choice` stands for, to be priced (not proven yet: see [`BuiltSchedules`]).
    pub(super) fn priceable(&mut self, choice: &Choice, collective: Collective, bytes: u64) -> Result<Arc<Schedule>> {
        self.check_root(collective)?;
        self.schedules.priceable(&self.topology, &self.registry, choice, collective, bytes)
    }
}

impl Selector {
    /// [`Selector::price`] above a few dozen ranks ([`scale`]): closed forms where they exist,
    /// then the rest simulated where they could still win, in candidate order.
    fn price_at_scale(&mut self, collective: Collective, bucket: u64, list: Vec<Choice>) -> Result<Vec<Priced>> {
        let config = self.options.sim;
        let (mut priced, rest) = scale::estimate(&self.topology, &self.registry, config, collective, bucket, list);
        let bound_us = scale::bound_us(&self.topology, collective, bucket);
        let mut failures = Vec::new();
        for (i, choice) in rest {
            self.check_cancelled()?;
            let best = priced.iter().map(|(_, p)| p.time_us).fold(f64::INFINITY, f64::min);
            let searched = self.registry.get(&choice.algorithm).is_ok_and(|g| g.searched());
            if !scale::worth_simulating(searched, best, bound_us) {
                continue;
            }
            let schedule = match self.priceable(&choice, collective, bucket) {
                Ok(s) => s,
                Err(e) => {
                    failures.push(format!("{choice}: {e}"));
                    continue;
                }
            };
            let time_us = Simulator::with_config(&self.topology, config).run(&schedule, bucket)?.time_us;
            priced.push((i, Priced { choice, time_us }));
        }
        if priced.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "no algorithm builds {collective} on topology {}: {}",
                self.topology.name(),
                failures.join("; ")
            )));
        }
        priced.sort_by_key(|(i, _)| *i);
        Ok(priced.into_iter().map(|(_, p)| p).collect())
    }

    /// [`Error::Aborted`] once the decision is no longer wanted ([`Selector::cancel`]).
    fn check_cancelled(&self) -> Result<()> {
        match &self.cancel {
            Some(c) if c.load(std::sync::atomic::Ordering::Relaxed) => Err(Error::Aborted),
            _ => Ok(()),
        }
    }

    /// A root must be a rank of the topology (generators index by it).
    pub(super) fn check_root(&self, collective: Collective) -> Result<()> {
        collective.check_root(self.topology.nranks()).map_err(Error::InvalidArgument)
    }
}

fn check_algorithm(registry: &Registry, algo: Option<&str>) -> Result<()> {
    match algo {
        Some(a) if registry.get(a).is_err() => {
            Err(Error::InvalidArgument(format!("unknown algorithm `{a}` (auto, {})", registry.names().join(", "))))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "tests/select_cache.rs"]
mod cache_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use topoccl_synth::topology::resolve;

    fn selector(topo: &str) -> Selector {
        Selector::new(
            resolve(topo).unwrap(),
            SelectorOptions {
                sim: SimConfig { message_overhead_us: 1.0, ..SimConfig::default() },
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn the_choice_is_the_cheapest_priced_candidate() {
        let mut s = selector("dgx1");
        for bytes in [1u64 << 10, 1 << 28] {
            let priced = s.price(Collective::AllReduce, bytes).unwrap();
            let choice = s.choose(Collective::AllReduce, bytes).unwrap();
            let best = priced.iter().map(|p| p.time_us).fold(f64::INFINITY, f64::min);
            let chosen = priced.iter().find(|p| p.choice == choice).unwrap();
            assert_eq!(chosen.time_us, best, "{bytes}: {priced:?}");
        }
    }

    #[test]
    fn a_winner_at_the_deepest_listed_depth_is_priced_deeper() {
        // On four GPUs of a DGX-1, Blink at 128 chunks per lane wins among the listed
        // candidates at 256 MiB; 256 chunks is then priced too, and wins (96.0 % of the bound
        // against 94.9 %). At 1 MiB its chunks would be too small to try.
        let mut s = selector("dgx1[0,1,2,3]");
        let deep = Choice::new("blink", 256, 0);
        let priced = s.price(Collective::AllReduce, 256 << 20).unwrap();
        assert!(priced.iter().any(|p| p.choice == deep), "{priced:?}");
        assert_eq!(s.choose(Collective::AllReduce, 256 << 20).unwrap(), deep);
        let priced = s.price(Collective::AllReduce, 1 << 20).unwrap();
        assert!(priced.iter().all(|p| p.choice.pipeline <= 128), "{priced:?}");
    }

    #[test]
    fn two_selectors_agree_and_forcing_restricts() {
        let (mut a, mut b) = (selector("dgx1[0,1,2,4,5]"), selector("dgx1[0,1,2,4,5]"));
        for shift in [3, 12, 20, 27] {
            let bytes = 1u64 << shift;
            assert_eq!(
                a.choose(Collective::AllGather, bytes).unwrap(),
                b.choose(Collective::AllGather, bytes).unwrap()
            );
        }
        a.set_forced(Some("tree")).unwrap();
        assert_eq!(a.choose(Collective::AllReduce, 1 << 20).unwrap().algorithm, "tree");
        // An algorithm that does not build the collective leaves it to the tuner.
        assert_ne!(a.choose(Collective::AllToAll, 1 << 20).unwrap().algorithm, "tree");
        assert!(a.set_forced(Some("nope")).is_err());
    }

    #[test]
    fn at_scale_closed_forms_price_and_hopeless_synthesizers_are_not_run() {
        // 17 hosts of 4: above the full search. At 1 GiB the ring's closed form is within a few
        // percent of the bound, so nothing without one is simulated, TACOS least of all.
        let mut s = selector("cluster:17x4");
        let priced = s.price(Collective::AllGather, 1 << 30).unwrap();
        let ring = priced.iter().find(|p| p.choice.algorithm == "ring").unwrap();
        let registry = Registry::builtin();
        let request = ring.choice.request(&s.topology, Collective::AllGather, 1 << 30);
        let mut model = topoccl_synth::sim::lockstep::Lockstep::new(&s.topology, s.options.sim);
        let closed = registry.get("ring").unwrap().estimate(&request, 1 << 30, &mut model).unwrap();
        assert_eq!(ring.time_us, closed);
        assert!(priced.iter().all(|p| p.choice.algorithm != "tacos"), "{priced:?}");
        assert_eq!(s.choose(Collective::AllGather, 1 << 30).unwrap().algorithm, "ring");
    }

    /// A searched generator whose all-reduce moves nothing: the fastest schedule there is, and
    /// wrong.
    struct FastAndWrong;
    impl topoccl_synth::generate::ScheduleGenerator for FastAndWrong {
        fn name(&self) -> &'static str {
            "fast-and-wrong"
        }
        fn describe(&self) -> &'static str {
            "moves nothing"
        }
        fn searched(&self) -> bool {
            true
        }
        fn supports(&self, c: Collective) -> bool {
            c == Collective::AllReduce
        }
        fn generate(&self, req: &topoccl_synth::generate::Request) -> topoccl_synth::Result<Schedule> {
            Ok(topoccl_synth::schedule::ScheduleBuilder::new(self.name(), req.collective, req.nranks(), 1).build())
        }
    }

    #[test]
    fn a_searched_schedule_that_fails_its_proof_is_priced_but_never_chosen_or_run() {
        let mut s = selector("ring:4");
        s.registry.register(Box::new(FastAndWrong)).unwrap();
        let bytes = 1 << 20;
        let priced = s.price(Collective::AllReduce, bytes).unwrap();
        let wrong = priced.iter().find(|p| p.choice.algorithm == "fast-and-wrong").expect("priced unproven");
        assert!(priced.iter().all(|p| p.time_us >= wrong.time_us), "{priced:?}");
        assert_ne!(s.choose(Collective::AllReduce, bytes).unwrap().algorithm, "fast-and-wrong");
        assert!(s.schedule(&wrong.choice, Collective::AllReduce, bytes).is_err());
        // Forced, it has nothing to fall back on: an error, not a wrong result.
        s.set_forced(Some("fast-and-wrong")).unwrap();
        assert!(s.choose(Collective::AllReduce, 1 << 24).is_err());
    }

    struct AlwaysLast;
    impl Tuner for AlwaysLast {
        fn name(&self) -> &str {
            "always-last"
        }
        fn choose(&mut self, r: &TuneRequest<'_>) -> Option<usize> {
            Some(r.priced.len() - 1)
        }
    }

    struct FromTheFuture;
    impl Tuner for FromTheFuture {
        fn name(&self) -> &str {
            "future"
        }
        fn api_version(&self) -> u32 {
            TUNER_API_VERSION + 1
        }
        fn choose(&mut self, _: &TuneRequest<'_>) -> Option<usize> {
            None
        }
    }

    #[test]
    fn user_tuners_override_and_versions_are_checked() {
        let mut s = selector("ring:4");
        let last = s.price(Collective::AllReduce, 4096).unwrap().pop().unwrap().choice;
        s.add_tuner(Box::new(AlwaysLast)).unwrap();
        assert_eq!(s.choose(Collective::AllReduce, 4096).unwrap(), last);
        assert!(s.add_tuner(Box::new(FromTheFuture)).unwrap_err().to_string().contains("v2"));
    }

    #[test]
    fn a_root_outside_the_topology_is_an_error_not_a_panic() {
        let mut s = selector("ring:4");
        let e = s.choose(Collective::Broadcast { root: 4 }, 4096).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let c = Choice::new("tree", 1, 0);
        assert!(s.schedule(&c, Collective::Reduce { root: 9 }, 4096).is_err());
    }
}

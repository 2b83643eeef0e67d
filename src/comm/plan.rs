//! From a checked call to what the executor runs: the tuner's schedule for the call's size,
//! the chunk layout on the call's element count, and this rank's program, kept together in one
//! plan cache keyed by what determines them (the collective, the element size and the count).
//! The tuner keeps its own memo of decisions per size bucket and of built schedules, which
//! pricing shares; nothing else is cached.
//!
//! Every rank plans from the same inputs, so all plan alike; the plan's schedule hash rides in
//! every message, so a rank that did not (another topology file, another `TOPOCCL_ALGO`) is
//! caught as a mismatch instead of corrupting data.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use topoccl_synth::schedule::{Collective, Schedule};

use crate::error::Result;
use crate::exec::plan::Plan;
use crate::tuner::{Choice, DecisionKey, Selector};
use topoccl_synth::hash::fnv64;

/// What a plan depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    collective: Collective,
    esize: usize,
    count: usize,
}

/// Plans kept per communicator before the cache is emptied.
const PLAN_CACHE: usize = 256;

/// The tuner and the plan cache of one communicator.
pub(crate) struct Planner {
    rank: u32,
    nranks: u32,
    pub tuner: Selector,
    /// Plans, with the size they run the quick choice for (until it is switched).
    plans: FxHashMap<PlanKey, (Arc<Plan>, Option<DecisionKey>)>,
    /// The plans of the communicator's own agreement calls (`super::agree`).
    internal: FxHashMap<PlanKey, Arc<Plan>>,
    /// Every size planned on a quick choice, in the order first planned: identical on every
    /// rank, as the calls are (`super::agree`).
    pub(crate) quick: Vec<DecisionKey>,
}

impl Planner {
    pub(crate) fn new(rank: u32, nranks: u32, tuner: Selector) -> Planner {
        Planner { rank, nranks, tuner, plans: FxHashMap::default(), internal: FxHashMap::default(), quick: Vec::new() }
    }

    /// Forgets every plan (the tuner's settings changed).
    pub(crate) fn clear(&mut self) {
        self.plans.clear();
    }

    /// The collective's buffer in bytes (nccl-tests' size), which the tuner decides by.
    fn size(&self, collective: Collective, block_bytes: usize) -> u64 {
        size_of(self.nranks, collective, block_bytes)
    }

    /// What the next call of `collective` on blocks of `block_bytes` runs.
    pub(crate) fn choice(&mut self, collective: Collective, block_bytes: usize) -> Result<Choice> {
        let size = self.size(collective, block_bytes);
        Ok(self.tuner.decide(collective, size)?.choice)
    }

    /// The simulated time of what the next call of `collective` on blocks of `block_bytes` runs.
    pub(crate) fn estimate_us(&mut self, collective: Collective, block_bytes: usize) -> Result<f64> {
        let size = self.size(collective, block_bytes);
        let choice = self.tuner.decide(collective, size)?.choice;
        self.tuner.predict_choice_us(&choice, collective, size)
    }

    /// The plan for `collective` on `count` elements of `esize` bytes (`count` > 0), with the
    /// size whose quick choice it runs, if it does (the executor switches such a call to the
    /// full decision where the ranks have agreed on it since: `super::agree`).
    pub(crate) fn plan(
        &mut self,
        collective: Collective,
        esize: usize,
        count: usize,
    ) -> Result<(Arc<Plan>, Option<DecisionKey>)> {
        let key = PlanKey { collective, esize, count };
        match self.plans.get(&key) {
            Some((p, None)) => return Ok((p.clone(), None)),
            Some((p, Some(quick))) if !self.tuner.refinements().all_switched(std::slice::from_ref(quick)) => {
                return Ok((p.clone(), Some(quick.clone())))
            }
            _ => {}
        }
        let size = self.size(collective, count.saturating_mul(esize));
        let decision = self.tuner.decide(collective, size)?;
        let quick = (!decision.settled).then_some(decision.key);
        if let Some(k) = quick.as_ref().filter(|k| !self.quick.contains(k)) {
            self.quick.push(k.clone());
        }
        let schedule = self.tuner.schedule(&decision.choice, collective, size)?;
        let plan = Arc::new(plan_of(self.rank, &decision.choice, schedule, esize, count));
        if self.plans.len() >= PLAN_CACHE {
            self.plans.clear();
        }
        self.plans.insert(key, (plan.clone(), quick.clone()));
        Ok((plan, quick))
    }

    /// The plan of an agreement call: the quick choice, always (it never starts a decision or
    /// waits for one).
    pub(crate) fn internal_plan(&mut self, collective: Collective, esize: usize, count: usize) -> Result<Arc<Plan>> {
        let key = PlanKey { collective, esize, count };
        if let Some(p) = self.internal.get(&key) {
            return Ok(p.clone());
        }
        let size = self.size(collective, count.saturating_mul(esize));
        let choice = self.tuner.choose_quick(collective, size)?.choice;
        let schedule = self.tuner.schedule(&choice, collective, size)?;
        let plan = Arc::new(plan_of(self.rank, &choice, schedule, esize, count));
        if self.internal.len() >= PLAN_CACHE {
            self.internal.clear();
        }
        self.internal.insert(key, plan.clone());
        Ok(plan)
    }
}

/// The collective's buffer in bytes for blocks of `block_bytes` (nccl-tests' size).
fn size_of(nranks: u32, collective: Collective, block_bytes: usize) -> u64 {
    let (i, o) = collective.blocks(nranks);
    (block_bytes as u64).saturating_mul(i.max(o) as u64)
}

/// The plan that runs `choice`'s `schedule` on `count` elements of `esize` bytes on `rank`.
pub(crate) fn plan_of(rank: u32, choice: &Choice, schedule: Arc<Schedule>, esize: usize, count: usize) -> Plan {
    let identity =
        format!("{}/{}/{}/{}/{choice}", schedule.name, schedule.collective, schedule.nranks, schedule.chunks);
    // The low half of its FNV-1a 64: the wire's field is four bytes.
    Plan::new(rank, schedule, fnv64(identity.as_bytes()) as u32, esize, count)
}

//! Decisions made in the background: a communicator's first call of a size runs the quick
//! choice ([`super::quick`]) at once, while a thread of its own makes the full decision (pricing
//! every candidate, synthesizing, proving the winner) with a [`Selector`] of its own.
//!
//! A rank must never switch alone: every rank switches a size at the same call, or the calls'
//! schedules differ. The thread only writes its answers into [`Refinements`]; the communicator's
//! ranks agree on which sizes every rank has answered, in call order (`comm::agree`), and mark
//! those [switched](Refinements::switch). Only a switched size's decision is ever run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rustc_hash::{FxHashMap, FxHashSet};
use topoccl_synth::schedule::{Collective, Schedule};

use super::select::{DecisionKey, Selector};
use super::{Choice, Priced, SelectorOptions};
use crate::error::{Error, Result};

/// What a call runs for its size, and whether that is final.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub choice: Choice,
    /// `false`: the quick choice, run until the ranks agree to switch to the full decision.
    pub settled: bool,
    /// The decision's identity ([`Refinements`]).
    pub(crate) key: DecisionKey,
}

/// A decision with its proven schedule.
pub(crate) type Decided = (Choice, Arc<Schedule>);

/// The background decisions of one selector, shared with its communicator's executor.
#[derive(Default)]
pub(crate) struct Refinements {
    inner: Mutex<Answers>,
}

#[derive(Default)]
struct Answers {
    /// Quick decisions made ahead by the background thread, with their schedules
    /// ([`WARMED_BUCKETS`]).
    warmed: FxHashMap<DecisionKey, (Priced, Arc<Schedule>)>,
    /// Made by the background thread, not run yet.
    made: FxHashMap<DecisionKey, Decided>,
    /// Agreed by every rank: what the size runs from the agreement on.
    switched: FxHashMap<DecisionKey, Decided>,
}

impl Refinements {
    fn lock(&self) -> MutexGuard<'_, Answers> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this rank has the decision of `key` (made, or switched already).
    pub(crate) fn made(&self, key: &DecisionKey) -> bool {
        let a = self.lock();
        a.made.contains_key(key) || a.switched.contains_key(key)
    }

    /// The decision `key` runs, once the ranks agreed on it.
    pub(crate) fn switched(&self, key: &DecisionKey) -> Option<Decided> {
        self.lock().switched.get(key).cloned()
    }

    /// Whether every one of `keys` is switched.
    pub(crate) fn all_switched(&self, keys: &[DecisionKey]) -> bool {
        let a = self.lock();
        keys.iter().all(|k| a.switched.contains_key(k))
    }

    /// Switches `key` to its decision: every rank has made it (an agreement said so, in call
    /// order). `false` if this rank has not, which the agreement rules out.
    pub(crate) fn switch(&self, key: &DecisionKey) -> bool {
        let mut a = self.lock();
        if a.switched.contains_key(key) {
            return true;
        }
        match a.made.remove(key) {
            Some(d) => {
                a.switched.insert(key.clone(), d);
                true
            }
            None => false,
        }
    }

    /// The quick decision of `key`, if the background thread made it ahead.
    pub(super) fn warmed(&self, key: &DecisionKey) -> Option<(Priced, Arc<Schedule>)> {
        self.lock().warmed.get(key).cloned()
    }

    fn answer(&self, key: DecisionKey, decided: Decided) {
        self.lock().made.insert(key, decided);
    }
}

/// One size to decide in full.
struct Ask {
    key: DecisionKey,
    collective: Collective,
    bytes: u64,
}

/// The background thread of one selector, started with it.
pub(super) struct Refiner {
    asks: Sender<Ask>,
    asked: FxHashSet<DecisionKey>,
    cancel: Arc<AtomicBool>,
}

impl Refiner {
    /// Starts the thread; it decides on a topology and options of its own (no user tuner, no
    /// forced algorithm: the quick path is taken only without them).
    pub(super) fn start(selector: &Selector) -> Result<Refiner> {
        let (asks, queue) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let options = SelectorOptions { forced: None, background: false, ..selector.options.clone() };
        let delay = selector.options.background_delay;
        let (topology, out, stop) = (selector.topology.clone(), selector.refinements.clone(), cancel.clone());
        std::thread::Builder::new()
            .name("topoccl-tuner".into())
            .spawn(move || {
                let Ok(mut background) = Selector::new(topology, options) else { return };
                background.cancel = Some(stop.clone());
                warm(&mut background, &queue, &out, delay, &stop);
                decide_all(&mut background, &queue, &out, delay, &stop);
            })
            .map_err(|e| Error::Io { context: "starting the tuner's background thread".into(), source: e })?;
        Ok(Refiner { asks, asked: FxHashSet::default(), cancel })
    }

    fn ask(&mut self, key: &DecisionKey, collective: Collective, bytes: u64) {
        if self.asked.insert(key.clone()) {
            // A closed channel means the thread ended: the size keeps its quick choice (it is
            // never made here, so never agreed).
            let _ = self.asks.send(Ask { key: key.clone(), collective, bytes });
        }
    }
}

impl Drop for Refiner {
    /// The thread stops at its next candidate (a synthesis under way runs to its end).
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// All-reduce buckets whose quick decisions the thread makes first, smallest first (1 B to
/// 4 GiB): a communicator's first calls then find them made (on a DGX-A100 a quick decision
/// costs about a millisecond, the goal of a first call). Sizes asked meanwhile go first.
const WARMED_BUCKETS: u32 = 33;

/// Makes the quick decisions of [`WARMED_BUCKETS`] ahead, deciding what is asked meanwhile
/// first. Quick decisions are the same wherever made, so a call that finds one made runs
/// what it would have decided itself.
fn warm(selector: &mut Selector, queue: &Receiver<Ask>, out: &Refinements, delay: Duration, stop: &AtomicBool) {
    for shift in 0..WARMED_BUCKETS {
        while let Ok(ask) = queue.try_recv() {
            if !decide_one(selector, ask, out, delay, stop) {
                return;
            }
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let (collective, bytes) = (Collective::AllReduce, 1u64 << shift);
        let quick = selector.choose_quick(collective, bytes);
        let Ok(quick) = quick else { return };
        let Ok(schedule) = selector.schedule(&quick.choice, collective, bytes) else { return };
        let key = selector.decision_key(collective, bytes);
        out.lock().warmed.insert(key, (quick, schedule));
    }
}

/// The thread: each size asked, decided in full and its winner proven, in the order asked. A
/// size whose full decision fails (alike on every rank: the inputs are shared) is answered with
/// its quick choice, said once.
fn decide_all(selector: &mut Selector, queue: &Receiver<Ask>, out: &Refinements, delay: Duration, stop: &AtomicBool) {
    for ask in queue {
        if !decide_one(selector, ask, out, delay, stop) {
            return;
        }
    }
}

/// Decides `ask` in full into `out`; `false` once the selector is no longer wanted.
fn decide_one(selector: &mut Selector, ask: Ask, out: &Refinements, delay: Duration, stop: &AtomicBool) -> bool {
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    if stop.load(Ordering::Relaxed) {
        return false;
    }
    let (collective, bytes) = (ask.collective, ask.bytes);
    let full =
        selector.choose(collective, bytes).and_then(|c| Ok((c.clone(), selector.schedule(&c, collective, bytes)?)));
    let decided = match full {
        Ok(d) => d,
        Err(Error::Aborted) => return false,
        Err(e) => {
            let quick = selector
                .choose_quick(collective, bytes)
                .and_then(|p| Ok((p.choice.clone(), selector.schedule(&p.choice, collective, bytes)?)));
            let Ok(quick) = quick else { return true };
            eprintln!("topoccl WARN tuner: deciding {} failed ({e}); keeping {}", ask.key, quick.0);
            quick
        }
    };
    out.answer(ask.key, decided);
    true
}

impl Selector {
    /// What a call of `collective` on a buffer of `bytes` runs now. With
    /// [`SelectorOptions::background`] and no forced algorithm or user tuner, a size not
    /// switched yet (`Refinements::switch`) gets the quick choice and its full decision is
    /// started in the background; otherwise the full decision is made here
    /// ([`Selector::choose`]).
    pub fn decide(&mut self, collective: Collective, bytes: u64) -> Result<Decision> {
        self.check_root(collective)?;
        let key = self.decision_key(collective, bytes);
        if !self.options.background || self.options.forced.is_some() || self.has_tuners() {
            let choice = self.choose(collective, bytes)?;
            return Ok(Decision { choice, settled: true, key });
        }
        if let Some(choice) = self.settled.get(&key) {
            return Ok(Decision { choice: choice.clone(), settled: true, key });
        }
        // Switched since: kept, so that later calls plan it at once.
        if let Some((choice, schedule)) = self.refinements.switched(&key) {
            self.schedules.keep_proven(&self.registry, &choice, collective, bytes, schedule)?;
            self.settled.insert(key.clone(), choice.clone());
            return Ok(Decision { choice, settled: true, key });
        }
        let choice = self.choose_quick(collective, bytes)?.choice;
        if self.refiner.is_none() {
            self.refiner = Some(Refiner::start(self)?);
        }
        if let Some(refiner) = &mut self.refiner {
            refiner.ask(&key, collective, bytes);
        }
        Ok(Decision { choice, settled: false, key })
    }

    /// Whether the quick decision for `collective` on `bytes` was made ahead by the background
    /// thread (the all-reduce's, from the selector's start: a first call then only looks it up).
    pub fn quick_ready(&self, collective: Collective, bytes: u64) -> bool {
        self.refinements.warmed(&self.decision_key(collective, bytes)).is_some()
    }
}

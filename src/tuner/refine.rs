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
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
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

/// What a communicator knows of the background decisions: the ones its ranks agreed to run
/// (its own), and the thread that makes them (shared by every communicator of the process on
/// the same topology and settings: local ranks as threads, or one process driving several
/// GPUs, decide each size once). Shared with the communicator's executor.
#[derive(Default)]
pub(crate) struct Refinements {
    background: OnceLock<Arc<Background>>,
    /// Agreed by every rank: what the size runs from the agreement on.
    switched: Mutex<FxHashMap<DecisionKey, Decided>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Refinements {
    /// The background thread's answers, where it runs.
    fn answers(&self) -> Option<MutexGuard<'_, Answers>> {
        self.background.get().map(|b| lock(&b.answers))
    }

    /// Whether this rank has the decision of `key` (made, or switched already).
    pub(crate) fn made(&self, key: &DecisionKey) -> bool {
        lock(&self.switched).contains_key(key) || self.answers().is_some_and(|a| a.made.contains_key(key))
    }

    /// The decision `key` runs, once the ranks agreed on it.
    pub(crate) fn switched(&self, key: &DecisionKey) -> Option<Decided> {
        lock(&self.switched).get(key).cloned()
    }

    /// Whether every one of `keys` is switched.
    pub(crate) fn all_switched(&self, keys: &[DecisionKey]) -> bool {
        let switched = lock(&self.switched);
        keys.iter().all(|k| switched.contains_key(k))
    }

    /// Switches `key` to its decision: every rank has made it (an agreement said so, in call
    /// order). `false` if this rank has not, which the agreement rules out.
    pub(crate) fn switch(&self, key: &DecisionKey) -> bool {
        if lock(&self.switched).contains_key(key) {
            return true;
        }
        let Some(decided) = self.answers().and_then(|a| a.made.get(key).cloned()) else { return false };
        lock(&self.switched).insert(key.clone(), decided);
        true
    }

    /// The quick decision of `key`, if the background thread made it ahead.
    pub(super) fn warmed(&self, key: &DecisionKey) -> Option<(Priced, Arc<Schedule>)> {
        self.answers().and_then(|a| a.warmed.get(key).cloned())
    }

    /// Starts `selector`'s background decisions (joining a thread already deciding for the
    /// same topology and settings) if they have not started.
    pub(super) fn start(&self, selector: &Selector) -> Result<()> {
        if self.background.get().is_none() {
            let _ = self.background.set(Background::shared(selector)?);
        }
        Ok(())
    }

    /// Asks the background thread for the full decision of `key`, once.
    fn ask(&self, key: &DecisionKey, collective: Collective, bytes: u64) {
        if let Some(b) = self.background.get() {
            b.ask(key, collective, bytes);
        }
    }
}

/// What the background thread made.
#[derive(Default)]
struct Answers {
    /// Quick decisions made ahead, with their schedules ([`WARMED`]).
    warmed: FxHashMap<DecisionKey, (Priced, Arc<Schedule>)>,
    /// Full decisions.
    made: FxHashMap<DecisionKey, Decided>,
}

/// One size to decide in full.
struct Ask {
    key: DecisionKey,
    collective: Collective,
    bytes: u64,
}

/// A background thread and what it made, shared by the communicators that use it; it stops
/// when the last of them is gone.
struct Background {
    asks: Mutex<Sender<Ask>>,
    asked: Mutex<FxHashSet<DecisionKey>>,
    answers: Arc<Mutex<Answers>>,
    cancel: Arc<AtomicBool>,
}

/// The process's background threads, by what they decide for ([`Background::identity`]).
static RUNNING: Mutex<Vec<(String, Weak<Background>)>> = Mutex::new(Vec::new());

impl Background {
    /// What a background thread's decisions depend on: the topology and the settings (the
    /// cost model, the cache, the delay; never a forced algorithm or a user tuner, which take
    /// no quick path).
    fn identity(selector: &Selector) -> String {
        let options = SelectorOptions { forced: None, ..selector.options.clone() };
        format!("{:016x}/{options:?}", selector.fingerprint())
    }

    /// The running thread deciding for `selector`'s topology and settings, or a new one.
    fn shared(selector: &Selector) -> Result<Arc<Background>> {
        let identity = Background::identity(selector);
        let mut running = lock(&RUNNING);
        running.retain(|(_, b)| b.strong_count() > 0);
        if let Some(b) = running.iter().find(|(i, _)| *i == identity).and_then(|(_, b)| b.upgrade()) {
            return Ok(b);
        }
        let b = Arc::new(Background::start(selector)?);
        running.push((identity, Arc::downgrade(&b)));
        Ok(b)
    }

    /// Starts the thread; it decides with a selector of its own (no user tuner, no forced
    /// algorithm: the quick path is taken only without them).
    fn start(selector: &Selector) -> Result<Background> {
        let (asks, queue) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Answers::default()));
        let options = SelectorOptions { forced: None, background: false, ..selector.options.clone() };
        let delay = selector.options.background_delay;
        let (topology, out, stop) = (selector.topology.clone(), answers.clone(), cancel.clone());
        std::thread::Builder::new()
            .name("topoccl-tuner".into())
            .spawn(move || {
                priority::lower_this_thread();
                let Ok(mut background) = Selector::new(topology, options) else { return };
                background.cancel = Some(stop.clone());
                warm(&mut background, &queue, &out, delay, &stop);
                decide_all(&mut background, &queue, &out, delay, &stop);
            })
            .map_err(|e| Error::Io { context: "starting the tuner's background thread".into(), source: e })?;
        Ok(Background { asks: Mutex::new(asks), asked: Mutex::default(), answers, cancel })
    }

    fn ask(&self, key: &DecisionKey, collective: Collective, bytes: u64) {
        if lock(&self.asked).insert(key.clone()) {
            // A closed channel means the thread ended: the size keeps its quick choice (it is
            // never made here, so never agreed).
            let _ = lock(&self.asks).send(Ask { key: key.clone(), collective, bytes });
        }
    }
}

impl Drop for Background {
    /// The thread stops at its next candidate (a synthesis under way runs to its end).
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// Buckets whose quick decisions the thread makes first (1 B to 4 GiB), for each of
/// [`WARMED`] in turn, smallest first: a communicator's first calls then find them made (on a
/// DGX-A100 a quick decision costs about a millisecond, the goal of a first call). Sizes asked
/// meanwhile go first.
const WARMED_BUCKETS: u32 = 33;
/// The collectives whose quick decisions are made ahead, most used first (a rooted collective's
/// for root 0 only: every root is a decision of its own).
const WARMED: [Collective; 6] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast { root: 0 },
    Collective::Reduce { root: 0 },
    Collective::AllToAll,
];

/// Makes the quick decisions of [`WARMED`] ahead, deciding what is asked meanwhile first.
/// Quick decisions are the same wherever made, so a call that finds one made runs what it would
/// have decided itself.
fn warm(selector: &mut Selector, queue: &Receiver<Ask>, out: &Mutex<Answers>, delay: Duration, stop: &AtomicBool) {
    for collective in WARMED {
        for shift in 0..WARMED_BUCKETS {
            while let Ok(ask) = queue.try_recv() {
                if !decide_one(selector, ask, out, delay, stop) {
                    return;
                }
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let bytes = 1u64 << shift;
            let quick = selector
                .choose_quick(collective, bytes)
                .and_then(|q| Ok((selector.schedule(&q.choice, collective, bytes)?, q)));
            // Not built on this topology: the calls will say why; the next collective.
            let Ok((schedule, quick)) = quick else { break };
            let key = selector.decision_key(collective, bytes);
            lock(out).warmed.insert(key, (quick, schedule));
        }
    }
}

/// Background work yields the CPU to the ranks: on a busy host (local ranks sharing cores) the
/// decisions come later, the calls not.
mod priority {
    /// The nice value of the tuner's thread (the lowest priority).
    const NICE: i32 = 19;

    /// Lowers the calling thread's priority to [`NICE`] (on Linux the nice value is a thread's
    /// own); where it cannot, it stays.
    pub(super) fn lower_this_thread() {
        let tid = nix::unistd::gettid().as_raw();
        // SAFETY: setpriority takes no pointers; given a thread id with PRIO_PROCESS, Linux
        // changes that thread's nice value alone.
        let _ = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid as nix::libc::id_t, NICE) };
    }
}

/// The thread: each size asked, decided in full and its winner proven, in the order asked. A
/// size whose full decision fails (alike on every rank: the inputs are shared) is answered with
/// its quick choice, said once.
fn decide_all(
    selector: &mut Selector,
    queue: &Receiver<Ask>,
    out: &Mutex<Answers>,
    delay: Duration,
    stop: &AtomicBool,
) {
    for ask in queue {
        if !decide_one(selector, ask, out, delay, stop) {
            return;
        }
    }
}

/// Decides `ask` in full into `out`; `false` once the selector is no longer wanted.
fn decide_one(selector: &mut Selector, ask: Ask, out: &Mutex<Answers>, delay: Duration, stop: &AtomicBool) -> bool {
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
    lock(out).made.insert(ask.key, decided);
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
        self.refinements.start(self)?;
        self.refinements.ask(&key, collective, bytes);
        Ok(Decision { choice, settled: false, key })
    }

    /// Whether the quick decision for `collective` on `bytes` was made ahead by the background
    /// thread (the common collectives', from the selector's start: a first call then only looks
    /// it up).
    pub fn quick_ready(&self, collective: Collective, bytes: u64) -> bool {
        self.refinements.warmed(&self.decision_key(collective, bytes)).is_some()
    }

    /// Whether a communicator's background thread makes `collective`'s quick decisions ahead,
    /// for 1 B to 4 GiB.
    pub fn made_ahead(collective: Collective) -> bool {
        WARMED.contains(&collective)
    }
}

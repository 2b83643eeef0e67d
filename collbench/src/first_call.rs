//! `collbench --simulate --first-call`: what the first call of each size costs with the tuner's
//! quick choice (its deciding time and price), against waiting for the full decision, which the
//! runtime makes in the background (`topoccl::tuner`). Cold: nothing is read from the disk
//! cache, and sizes share what earlier sizes built, as a communicator's calls do.

use std::fmt::Write as _;
use std::time::Instant;

use topoccl::tuner::cache::DiskCache;
use topoccl::tuner::{Selector, SelectorOptions};
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::SimConfig;
use topoccl_synth::topology::Topology;

use crate::error::{Error, Result};

/// The goal: a first call within this many times the steady time…
const GOAL_FACTOR: f64 = 2.0;
/// …plus this, µs.
const GOAL_SLACK_US: f64 = 1000.0;

/// The table for `sizes` (bytes) of `collective` on `topology`, priced under `sim`.
pub fn run(
    topology: &Topology,
    collective: Collective,
    sizes: &[u64],
    sim: SimConfig,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    let mut t = String::new();
    let options = SelectorOptions { sim, cache: DiskCache::disabled(), ..Default::default() };
    let mut quick = Selector::new(topology.clone(), options.clone())?;
    let mut full = Selector::new(topology.clone(), options.clone())?;
    // As a communicator's: the background thread makes the common collectives' quick decisions
    // ahead (all-reduce first).
    let started = Instant::now();
    let mut warmed = Selector::new(topology.clone(), SelectorOptions { background: true, ..options })?;
    let ahead = Selector::made_ahead(collective);
    let warm_sizes: Vec<u64> = sizes.iter().copied().filter(|&b| ahead && b <= 1 << 32).collect();
    while !warm_sizes.iter().all(|&b| warmed.quick_ready(collective, b)) && started.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let warm_ms = started.elapsed().as_secs_f64() * 1e3;
    let _ =
        writeln!(t, "# first calls of {collective} on {} ({} ranks), cold tuner", topology.name(), topology.nranks());
    let _ = writeln!(
        t,
        "| bytes | quick choice | deciding µs (cold / made ahead) | its time µs | full choice | deciding ms | steady µs | first call µs (before → cold, ahead) | goal µs | met |"
    );
    let _ = writeln!(t, "|---:|---|---:|---:|---|---:|---:|---|---:|---|");
    let (mut quick_total, mut full_total, mut met_all) = (0.0, 0.0, true);
    for &bytes in sizes {
        let started = Instant::now();
        let q = quick.choose_quick(collective, bytes)?;
        quick.schedule(&q.choice, collective, bytes)?;
        let quick_us = started.elapsed().as_secs_f64() * 1e6;
        let started = Instant::now();
        let w = warmed.choose_quick(collective, bytes)?;
        warmed.schedule(&w.choice, collective, bytes)?;
        let ahead_us = started.elapsed().as_secs_f64() * 1e6;
        if w != q {
            return Err(Error::InvalidArgument(format!("{bytes}: quick choice made ahead {w:?}, here {q:?}")));
        }
        let started = Instant::now();
        let f = full.choose_priced(collective, bytes)?;
        full.schedule(&f.choice, collective, bytes)?;
        let full_us = started.elapsed().as_secs_f64() * 1e6;
        quick_total += quick_us;
        full_total += full_us;
        let before = full_us + f.time_us;
        let after = quick_us + q.time_us;
        let ahead = ahead_us + q.time_us;
        let goal = GOAL_FACTOR * f.time_us + GOAL_SLACK_US;
        let met = ahead <= goal;
        met_all &= met;
        let _ = writeln!(
            t,
            "| {bytes} | {} | {quick_us:.0} / {ahead_us:.0} | {} | {} | {:.1} | {:.1} | {before:.0} → {}, {} | {goal:.0} | {} |",
            q.choice,
            if q.time_us.is_finite() { format!("{:.1}", q.time_us) } else { "unpriced".into() },
            f.choice,
            full_us / 1e3,
            f.time_us,
            if after.is_finite() { format!("{after:.0}") } else { "?".into() },
            if ahead.is_finite() { format!("{ahead:.0}") } else { "?".into() },
            if met { "yes" } else { "NO" }
        );
    }
    let _ = writeln!(
        t,
        "\n{} sizes: quick choices in {:.1} ms cold ({warm_ms:.0} ms until made ahead, in the background from the start), full decisions in {:.1} ms; goal (made ahead) {} on every size",
        sizes.len(),
        quick_total / 1e3,
        full_total / 1e3,
        if met_all { "met" } else { "NOT met" }
    );
    out.write_all(t.as_bytes()).map_err(|e| Error::io("writing the table", e))
}

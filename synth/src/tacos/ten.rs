//! The time-expanded network matcher at the heart of TACOS: all-gather by moving, at every
//! moment a link is free, a chunk its source holds and its destination still lacks.
//!
//! Differences from the published implementation (which picks at random and greedily):
//! - **maximum matching** per destination and moment: the free links into a rank are matched
//!   to distinct useful chunks by augmenting paths, so no link idles while a matching exists
//!   that would use it (greedy choice can give two links the same chunk's only alternative);
//! - a chunk is sent only by a rank that holds it when the transfer **starts** (checking at
//!   arrival, as the reference does, lets a fast link forward data a slow link has not finished
//!   delivering);
//! - deterministic: candidates are taken in the order the source received them, and ties
//!   between equally rare chunks are broken by a fixed sequence of seeds (the best attempt is
//!   kept, [`super::attempts::best_all_gather`]), so every rank synthesizes the same schedule
//!   and small tori and hypercubes reach the per-step bound;
//! - on mixed-speed links, a chunk is not put on a slow link when another in-link delivers it
//!   sooner, and a destination prefers chunks its in-neighbours neither hold nor are getting
//!   (so the GPUs of one node pull different chunks over a shared slow NIC, not the same one).
//!
//! This module is the event-driven engine (links of any speed: a moment is when some transfer
//! lands). On uniform links above a thousand ranks the same choices are made in lock step, on
//! several threads ([`super::lockstep`]); what a match looks at is in [`super::matching`].
//!
//! Memory stays linear in what is produced: a bitset of held chunks per rank (n² bits), the
//! arrival order per rank and the chunk sequence per link (4 bytes per transfer each); links
//! are the rank graph's sparse arcs, never an n × n matrix.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use super::lockstep;
use super::matching::{
    in_slots, link_list_capacity, match_links, FreeLink, Holdings, Links, MatchState, Scratch,
    LOCAL_SCARCITY_MAX_RANKS, NONE,
};
use super::problem::{ChunkId, TenOptions, TenSchedule};
use crate::error::{Error, Result};
use crate::topology::logical::RankGraph;

/// Synthesizes an all-gather on `graph`: every rank ends with every chunk. Fails only when some
/// rank cannot be reached from another over `graph`'s arcs.
pub fn all_gather(graph: &RankGraph, opt: TenOptions) -> Result<TenSchedule> {
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(MAX_THREADS);
    synthesize(
        graph,
        opt,
        Engine {
            threads,
            parallel_min: lockstep::PARALLEL_MIN_DESTINATIONS,
            scarcity_max: LOCAL_SCARCITY_MAX_RANKS,
            lockstep: true,
        },
    )
}

/// Up to this many threads match a step's destinations.
const MAX_THREADS: usize = 8;

/// How [`all_gather`] runs (tests vary it to check that results do not depend on it).
#[derive(Debug, Clone, Copy)]
struct Engine {
    /// Threads of the lock-step engine, used from this many destinations up.
    threads: usize,
    parallel_min: usize,
    /// Up to this many ranks, candidates are also ranked by in-neighbour counts.
    scarcity_max: usize,
    /// Whether uniform links without in-neighbour counts go to [`lockstep`] (the event-driven
    /// loop here gives the same schedule, one destination at a time).
    lockstep: bool,
}

fn synthesize(graph: &RankGraph, opt: TenOptions, engine: Engine) -> Result<TenSchedule> {
    let n = graph.nranks();
    let k = opt.per_rank.max(1) as usize;
    let total = n * k;
    let arcs = graph.arcs();
    let duration = transfer_times(graph, opt.chunk_bytes);
    // Whether link times differ at all (on uniform links no alternative is ever sooner, so
    // that check, and the `held` bitset it alone reads, are skipped).
    let step_us = uniform(&duration);
    let mixed = step_us.is_none();
    let local_scarcity = n <= engine.scarcity_max;
    if let (Some(step_us), false, true) = (step_us, local_scarcity, engine.lockstep) {
        let threads = if n >= engine.parallel_min { engine.threads } else { 1 };
        return lockstep::all_gather(graph, opt, threads, step_us);
    }
    let Holdings { coming, held, mut arrived, spread, mut missing, mut incomplete } = Holdings::new(n, k, mixed);
    let first_slot = in_slots(graph);
    let mut cursor = vec![0usize; arcs.len()];
    let mut per_arc: Vec<Vec<ChunkId>> =
        arcs.iter().map(|a| Vec::with_capacity(link_list_capacity(total - k, graph.in_arcs(a.to).len()))).collect();
    let mut order = Vec::new();
    let mut moments = Vec::new();
    // Links waiting for their source to receive something new, and whether a link is listed.
    let mut waiting: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut parked: Vec<bool> = vec![false; arcs.len()];
    // Transfers in flight by completion time (time bits → (arc, chunk)): completions come in
    // few distinct times, so a map of batches beats a heap of single transfers.
    let mut flights: BTreeMap<u64, Vec<(u32, ChunkId)>> = BTreeMap::new();
    // Arcs to match at the next moment, and the destinations they lead to.
    let mut ready: Vec<bool> = vec![true; arcs.len()];
    let mut dirty: Vec<u32> = (0..n as u32).collect();
    // When each arc's current transfer ends (≤ now when the arc is free).
    let mut busy_until: Vec<f64> = vec![0.0; arcs.len()];
    // The chunk each arc carries now (NONE when free).
    let mut carrying: Vec<ChunkId> = vec![NONE; arcs.len()];
    let window = if local_scarcity { opt.window } else { 1 };
    let mut now = 0.0f64;
    let mut steps = 0u64;
    let mut scratch = Scratch::default();
    let mut matches: Vec<Match> = Vec::new();
    // Set for one round after a stall: every link looks at everything its source holds.
    let mut forced = false;
    loop {
        dirty.sort_unstable();
        dirty.dedup();
        let mut started = false;
        // One destination at a time, each applied before the next is matched (the next may
        // count what this one's in-neighbours are getting, or defer to a sooner link).
        for &d in &dirty {
            let d = d as usize;
            let sources = graph.in_arcs(d as crate::schedule::Rank);
            let mut free = std::mem::take(&mut scratch.free);
            free.clear();
            free.extend(sources.iter().enumerate().filter(|&(_, &a)| ready[a]).map(|(i, &a)| FreeLink {
                arc: a as u32,
                index: i as u32,
                source: arcs[a].from,
            }));
            matches.clear();
            if missing[d] > 0 && !free.is_empty() {
                let state = MatchState {
                    links: Links {
                        graph,
                        duration: &duration,
                        busy_until: &busy_until,
                        carrying: &carrying,
                        mixed,
                        local_scarcity,
                        now,
                        forced,
                        seed: opt.seed,
                    },
                    arrived: &arrived,
                    coming: &coming,
                    held: &held,
                    spread: &spread,
                    window,
                };
                let slots = &mut cursor[first_slot[d]..first_slot[d + 1]];
                let matched = match_links(&free, &state, slots, d, &mut scratch);
                matches.extend(free.iter().zip(matched).map(|(f, m)| (d as u32, f.arc, m.unwrap_or(NONE))));
            }
            scratch.free = free;
            for &(d, a, c) in &matches {
                ready[a as usize] = false;
                if c != NONE {
                    coming.set(d as usize, c as usize);
                    if opt.keep_order {
                        if !started {
                            moments.push(order.len() as u32);
                        }
                        order.push((a, c));
                    }
                    per_arc[a as usize].push(c);
                    let end = now + duration[a as usize];
                    busy_until[a as usize] = end;
                    carrying[a as usize] = c;
                    flights.entry(end.to_bits()).or_default().push((a, c));
                    started = true;
                } else if !parked[a as usize] {
                    parked[a as usize] = true;
                    waiting[arcs[a as usize].from as usize].push(a);
                }
            }
        }
        if started {
            steps += 1;
        }
        dirty.clear();
        // Advance to the next completions (all those at the same moment).
        let Some((t, mut landed)) = flights.pop_first() else {
            if incomplete == 0 {
                break;
            }
            // Nothing in flight, yet ranks lack chunks: every free link declined (a sooner
            // link that then took other chunks, or a look-ahead that ended short). Once, match
            // again with every link and no such restraint; if even that starts nothing, the
            // ranks are not all connected.
            if forced {
                return Err(Error::InvalidTopology {
                    name: format!("{n}-rank graph"),
                    message: format!("{incomplete} ranks cannot receive every chunk over its links"),
                });
            }
            forced = true;
            for w in &mut waiting {
                w.clear();
            }
            parked.fill(false);
            for (a, arc) in arcs.iter().enumerate() {
                ready[a] = true;
                dirty.push(arc.to);
            }
            continue;
        };
        forced = false;
        now = f64::from_bits(t);
        landed.sort_unstable();
        for (a, c) in landed {
            carrying[a as usize] = NONE;
            let d = arcs[a as usize].to as usize;
            arrived.push(d, c);
            if mixed {
                held.set(d, c as usize);
            }
            spread[c as usize].fetch_add(1, Relaxed);
            missing[d] -= 1;
            if missing[d] == 0 {
                incomplete -= 1;
            }
            ready[a as usize] = true;
            dirty.push(d as u32);
            for w in waiting[d].drain(..) {
                parked[w as usize] = false;
                // A link woken below, now busy again, becomes ready when that transfer lands.
                if carrying[w as usize] == NONE {
                    ready[w as usize] = true;
                    dirty.push(arcs[w as usize].to);
                }
            }
            // On mixed speeds a free link into `d` may have declined because another in-link
            // was sooner; what `d` lacks has changed, so it gets another look.
            if mixed {
                for &i in graph.in_arcs(d as crate::schedule::Rank) {
                    if carrying[i] == NONE {
                        ready[i] = true;
                    }
                }
            }
        }
        if incomplete == 0 {
            break;
        }
    }
    Ok(TenSchedule { nranks: n, per_rank: k as u32, per_arc, order, moments, time_us: now, steps })
}

/// µs each arc of `graph` is busy with one chunk of `chunk_bytes`: its latency, then the bytes
/// at its bandwidth.
pub(super) fn transfer_times(graph: &RankGraph, chunk_bytes: f64) -> Vec<f64> {
    graph.arcs().iter().map(|a| a.latency + chunk_bytes / (a.bandwidth * 1e3)).collect()
}

/// The one value of `times` when they are all equal (0 when there are none), `None` when they
/// differ.
pub(super) fn uniform(times: &[f64]) -> Option<f64> {
    let t = times.first().copied().unwrap_or(0.0);
    times.iter().all(|&u| (u - t).abs() <= 1e-9 * t).then_some(t)
}

/// A matched link: (destination, arc, chunk or [`NONE`]).
type Match = (u32, u32, ChunkId);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;

    #[test]
    fn lockstep_makes_the_event_driven_choices_on_any_threads() {
        // On uniform links without in-neighbour counts, the lock-step engine on any split of
        // the destinations (one thread, three, a part per destination) gives the transfers the
        // event-driven engine gives, in the same order.
        for (spec, per_rank, seed) in [("torus2d:8x8", 1, 0), ("mesh2d:5x7", 2, 3), ("hypercube:64", 1, 9)] {
            let g = RankGraph::of(&resolve(spec).unwrap());
            let opt = TenOptions { per_rank, seed, ..TenOptions::for_tests() };
            let run = |threads, lockstep| {
                synthesize(&g, opt, Engine { threads, parallel_min: 1, scarcity_max: 0, lockstep }).unwrap()
            };
            let events = run(1, false);
            let n = g.nranks();
            let k = per_rank as usize;
            assert_eq!(events.per_arc.iter().map(Vec::len).sum::<usize>(), n * (n * k - k), "{spec}");
            for threads in [1, 2, 3, 64] {
                let steps = run(threads, true);
                assert_eq!(steps.order, events.order, "{spec}, {threads} threads");
                assert_eq!(steps.moments, events.moments, "{spec}");
                assert_eq!(steps.per_arc, events.per_arc, "{spec}");
                assert_eq!(steps.steps, events.steps, "{spec}");
                assert!((steps.time_us - events.time_us).abs() <= 1e-9 * events.time_us, "{spec}");
            }
        }
    }

    #[test]
    fn a_rank_nobody_sends_to_is_an_error_not_a_partial_schedule() {
        use crate::topology::logical::RankArc;
        let arc = |from, to| RankArc::link(from, to, 10.0);
        // 0 → 1 → 2 only: rank 0 can never receive.
        let g = RankGraph::from_arcs(3, vec![arc(0, 1), arc(1, 2)]);
        let e = all_gather(&g, TenOptions::for_tests()).unwrap_err();
        assert!(e.to_string().contains("cannot receive every chunk"), "{e}");
        let engine = Engine { threads: 2, parallel_min: 1, scarcity_max: 0, lockstep: true };
        let e = synthesize(&g, TenOptions::for_tests(), engine).unwrap_err();
        assert!(e.to_string().contains("cannot receive every chunk"), "lock step: {e}");
    }
}

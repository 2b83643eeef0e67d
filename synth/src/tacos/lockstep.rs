//! The time-expanded-network matcher on uniform links, in lock step: every transfer takes one
//! step, so all start together and all land together, and a step is two parallel passes over
//! the destinations — match (and start) every free link, then land what was started.
//!
//! It makes exactly the choices of the event-driven engine ([`super::ten`]) where that engine
//! would match destinations independently (uniform links, no in-neighbour counts: above
//! [`super::matching::LOCAL_SCARCITY_MAX_RANKS`]): matching a destination reads only its own
//! row of `coming`, its own link cursors and what the ranks hold after the last landing. What
//! the event-driven engine does between destinations (apply a match, queue its landing, park a
//! link with nothing to send, wake it when its source receives) is done here per destination,
//! on the thread that owns it, so nothing of a step runs on one thread alone. At 40 000 ranks
//! that serial part was half the run.

use std::sync::atomic::Ordering::Relaxed;

use super::matching::{
    in_slots, link_list_capacity, match_links, split_at_bounds, FreeLink, Holdings, Links, MatchState, Rows, Scratch,
    NONE,
};
use super::prefetch::prefetch;
use super::problem::{ChunkId, TenOptions, TenSchedule};
use crate::error::{Error, Result};
use crate::schedule::Rank;
use crate::topology::logical::RankGraph;

/// Fewer destinations than this are matched on one thread (two thread starts per step cost
/// tens of µs).
pub(super) const PARALLEL_MIN_DESTINATIONS: usize = 512;

/// All-gather on `graph`, whose arcs all take `step_us` per chunk, on up to `threads` threads.
pub(super) fn all_gather(graph: &RankGraph, opt: TenOptions, threads: usize, step_us: f64) -> Result<TenSchedule> {
    let n = graph.nranks();
    let k = opt.per_rank.max(1) as usize;
    let total = n * k;
    let Holdings { coming, held, mut arrived, spread, mut missing, mut incomplete } = Holdings::new(n, k, false);
    let first_slot = in_slots(graph);
    let slots = first_slot[n];
    // Each slot's arc and source, read in slot order (not through the graph's per-rank lists).
    let slot_arc: Vec<u32> = (0..n).flat_map(|d| graph.in_arcs(d as Rank).iter().map(|&a| a as u32)).collect();
    let slot_source: Vec<u32> = slot_arc.iter().map(|&a| graph.arc(a as usize).from).collect();
    let mut cursor = vec![0usize; slots];
    // What each in-link carries, per slot; the per-arc lists are put in arc order at the end.
    let mut per_slot: Vec<Vec<ChunkId>> = (0..n)
        .flat_map(|d| {
            let links = graph.in_arcs(d as Rank).len();
            (0..links).map(move |_| Vec::with_capacity(link_list_capacity(total - k, links)))
        })
        .collect();
    // The chunk each in-link carries in the current step (NONE: idle).
    let mut carried: Vec<ChunkId> = vec![NONE; slots];
    // Whether a rank received anything at the last landing. A link that found nothing to send
    // looks again only then (its source has something new), as a parked link is woken in the
    // event-driven engine; the first step looks everywhere.
    let mut received: Vec<bool> = vec![true; n];
    let parts = threads.clamp(1, n.max(1));
    // Destinations of part i: bounds[i]..bounds[i + 1].
    let bounds: Vec<usize> = (0..=parts).map(|i| n * i / parts).collect();
    let slot_bounds: Vec<usize> = bounds.iter().map(|&d| first_slot[d]).collect();
    let mut scratches: Vec<Scratch> = (0..parts).map(|_| Scratch::default()).collect();
    let mut started: Vec<Vec<(u32, ChunkId)>> = vec![Vec::new(); parts];
    let mut order = Vec::new();
    let mut moments = Vec::new();
    let mut steps = 0u64;
    while incomplete > 0 {
        // Match: every destination's free links, on the threads that own them.
        let state = MatchState {
            links: Links {
                graph,
                duration: &[],
                busy_until: &[],
                carrying: &[],
                mixed: false,
                local_scarcity: false,
                now: steps as f64 * step_us,
                forced: false,
                seed: opt.seed,
            },
            arrived: &arrived,
            coming: &coming,
            held: &held,
            spread: &spread,
            window: 1,
        };
        let shared = Shared {
            state: &state,
            first_slot: &first_slot,
            slot_arc: &slot_arc,
            slot_source: &slot_source,
            missing: &missing,
            received: &received,
        };
        let jobs = split_at_bounds(&mut cursor, &slot_bounds)
            .into_iter()
            .zip(split_at_bounds(&mut per_slot, &slot_bounds))
            .zip(split_at_bounds(&mut carried, &slot_bounds))
            .zip(scratches.iter_mut().zip(started.iter_mut()))
            .enumerate()
            .map(|(i, (((cursor, per_slot), carried), (scratch, out)))| MatchPart {
                dests: bounds[i]..bounds[i + 1],
                base: slot_bounds[i],
                cursor,
                per_slot,
                carried,
                scratch,
                out,
                keep_order: opt.keep_order,
            });
        let moved: usize = run_parts(jobs, |job| job.run(&shared));
        if moved == 0 {
            // No link has anything its destination lacks: on uniform links the first chunk past
            // a link's cursor is always one, so some rank is cut off from another.
            return Err(Error::InvalidTopology {
                name: format!("{n}-rank graph"),
                message: format!("{incomplete} ranks cannot receive every chunk over its links"),
            });
        }
        if opt.keep_order {
            moments.push(order.len() as u32);
            for o in &started {
                order.extend_from_slice(o);
            }
        }
        steps += 1;
        // Land: every destination takes in what its links carried, in arc order.
        let jobs = arrived
            .split(&bounds)
            .into_iter()
            .zip(split_at_bounds(&mut missing, &bounds))
            .zip(split_at_bounds(&mut received, &bounds))
            .enumerate()
            .map(|(i, ((arrived, missing), received))| LandPart {
                dests: bounds[i]..bounds[i + 1],
                arrived,
                missing,
                received,
            });
        let (carried, first_slot) = (&carried, &first_slot);
        let completed: usize = run_parts(jobs, |job| job.run(carried, first_slot));
        incomplete -= completed;
        // Spreads counted on this thread: landings of one chunk happen on both threads, and
        // atomic adds there kept the counters' cache lines moving between the cores.
        for &c in carried.iter().filter(|&&c| c != NONE) {
            let s = &spread[c as usize];
            s.store(s.load(Relaxed) + 1, Relaxed);
        }
    }
    // Per-slot lists into arc order.
    let mut per_arc: Vec<Vec<ChunkId>> = vec![Vec::new(); graph.arcs().len()];
    let mut lists = per_slot.into_iter();
    for d in 0..n {
        for &a in graph.in_arcs(d as Rank) {
            per_arc[a] = lists.next().unwrap_or_default();
        }
    }
    Ok(TenSchedule { nranks: n, per_rank: k as u32, per_arc, order, moments, time_us: steps as f64 * step_us, steps })
}

/// What every part reads while matching.
struct Shared<'a, 's> {
    state: &'a MatchState<'s>,
    first_slot: &'a [usize],
    slot_arc: &'a [u32],
    slot_source: &'a [u32],
    missing: &'a [usize],
    received: &'a [bool],
}

/// One thread's destinations in the match pass, with their slots of the per-slot arrays
/// (`base` is the first one's slot).
struct MatchPart<'a> {
    dests: std::ops::Range<usize>,
    base: usize,
    cursor: &'a mut [usize],
    per_slot: &'a mut [Vec<ChunkId>],
    carried: &'a mut [ChunkId],
    scratch: &'a mut Scratch,
    /// The transfers started, (arc, chunk) in destination order (only with `keep_order`).
    out: &'a mut Vec<(u32, ChunkId)>,
    keep_order: bool,
}

impl MatchPart<'_> {
    /// Matches and starts the free links into this part's destinations; returns how many
    /// started.
    fn run(self, shared: &Shared<'_, '_>) -> usize {
        let mut moved = 0;
        self.out.clear();
        let mut free = std::mem::take(&mut self.scratch.free);
        let end = self.dests.end;
        for d in self.dests.clone() {
            // Misses overlapped: the arrival-list entries at the cursors of a destination two
            // strides ahead, then (those entries loaded by now) the words of `coming` they
            // index for the destination one stride ahead, and where its links' lists grow.
            if d + 2 * AHEAD < end {
                self.prefetch_lists(d + 2 * AHEAD, shared);
            }
            if d + AHEAD < end {
                self.prefetch_rows(d + AHEAD, shared);
            }
            let slots = shared.first_slot[d] - self.base..shared.first_slot[d + 1] - self.base;
            free.clear();
            if shared.missing[d] > 0 {
                // Free: a link that carried something last step, or whose source just received.
                let first = shared.first_slot[d];
                for i in 0..slots.len() {
                    let source = shared.slot_source[first + i];
                    if self.carried[slots.start + i] != NONE || shared.received[source as usize] {
                        free.push(FreeLink { arc: shared.slot_arc[first + i], index: i as u32, source });
                    }
                }
            }
            self.carried[slots.clone()].fill(NONE);
            if free.is_empty() {
                continue;
            }
            let matched = match_links(&free, shared.state, &mut self.cursor[slots.clone()], d, self.scratch);
            for (f, &m) in free.iter().zip(matched) {
                let Some(c) = m else { continue };
                let slot = slots.start + f.index as usize;
                shared.state.coming.set(d, c as usize);
                self.per_slot[slot].push(c);
                self.carried[slot] = c;
                moved += 1;
                if self.keep_order {
                    self.out.push((f.arc, c));
                }
            }
        }
        self.scratch.free = free;
        moved
    }

    /// Starts loading the arrival-list entries at the cursors of `d`'s links.
    fn prefetch_lists(&self, d: usize, shared: &Shared<'_, '_>) {
        for slot in shared.first_slot[d]..shared.first_slot[d + 1] {
            let list = shared.state.arrived.list(shared.slot_source[slot] as usize);
            let cur = self.cursor[slot - self.base];
            // The look-ahead usually reads past the cursor's line: the next one too.
            for c in [list.get(cur), list.get(cur + LINE_CHUNKS)].into_iter().flatten() {
                prefetch(c);
            }
        }
    }

    /// Starts loading the words of `d`'s row of `coming` that its links' first candidates
    /// index, and the ends of its links' chunk lists.
    fn prefetch_rows(&self, d: usize, shared: &Shared<'_, '_>) {
        for slot in shared.first_slot[d]..shared.first_slot[d + 1] {
            let list = shared.state.arrived.list(shared.slot_source[slot] as usize);
            let cur = self.cursor[slot - self.base];
            for &c in list.get(cur..).unwrap_or_default().iter().take(CANDIDATES_AHEAD) {
                shared.state.coming.prefetch(d, c as usize);
            }
            if let Some(tail) = self.per_slot[slot - self.base].last() {
                prefetch(tail);
            }
        }
    }
}

/// How many destinations ahead [`MatchPart::run`] asks for the lines it will read.
const AHEAD: usize = 4;
/// Arrival-list entries past a cursor whose `coming` words are asked for ahead (the look-ahead
/// skips what is already on its way; at 20 000 ranks 12 took 65 s, 4 took 83 s, 24 no less).
const CANDIDATES_AHEAD: usize = 12;
/// Chunk ids in a 64-byte cache line.
const LINE_CHUNKS: usize = 16;

/// One thread's destinations in the landing pass.
struct LandPart<'a> {
    dests: std::ops::Range<usize>,
    arrived: Rows<'a>,
    missing: &'a mut [usize],
    received: &'a mut [bool],
}

impl LandPart<'_> {
    /// Lands what this part's in-links carried; returns how many destinations became complete.
    fn run(mut self, carried: &[ChunkId], first_slot: &[usize]) -> usize {
        let first = self.dests.start;
        let mut completed = 0;
        for d in self.dests {
            let i = d - first;
            let mut got = false;
            for &c in &carried[first_slot[d]..first_slot[d + 1]] {
                if c != NONE {
                    self.arrived.push(i, c);
                    self.missing[i] -= 1;
                    got = true;
                }
            }
            if got && self.missing[i] == 0 {
                completed += 1;
            }
            self.received[i] = got;
        }
        completed
    }
}

/// Runs `f` on every job, each on its own thread when there are several, and sums the results.
fn run_parts<J: Send, F: Fn(J) -> usize + Sync>(jobs: impl Iterator<Item = J>, f: F) -> usize {
    let mut jobs: Vec<J> = jobs.collect();
    if jobs.len() <= 1 {
        return jobs.pop().map_or(0, &f);
    }
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = jobs.into_iter().map(|job| scope.spawn(move || f(job))).collect();
        // A part that panicked is a bug: it panics here too rather than losing its work.
        handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).sum()
    })
}

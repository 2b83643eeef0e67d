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
//! Memory stays linear in what is produced: a bitset of held chunks per rank (n² bits), the
//! arrival order per rank and the chunk sequence per link (4 bytes per transfer each); links
//! are the rank graph's sparse arcs, never an n × n matrix.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::topology::logical::RankGraph;

/// Chunk `c` starts at rank `c / per_rank`.
pub type ChunkId = u32;

/// What the matcher produced.
#[derive(Debug, Clone)]
pub struct TenSchedule {
    pub nranks: usize,
    pub per_rank: u32,
    /// For every arc of the rank graph, the chunks it carries, in order.
    pub per_arc: Vec<Vec<ChunkId>>,
    /// Every transfer in start order: (arc, chunk) (only with `keep_order`).
    pub order: Vec<(u32, ChunkId)>,
    /// Where in `order` each moment's transfers begin (all of a moment start together).
    pub moments: Vec<u32>,
    /// Predicted completion, µs (links busy latency + chunk / bandwidth per chunk).
    pub time_us: f64,
    /// Distinct moments at which transfers started (the time-expanded network's steps).
    pub steps: u64,
}

/// Options for [`all_gather`].
#[derive(Debug, Clone, Copy)]
pub struct TenOptions {
    /// Chunks each rank starts with.
    pub per_rank: u32,
    /// Bytes per chunk, for link times.
    pub chunk_bytes: f64,
    /// Keep the transfer order (needed to emit a schedule; 8 bytes per transfer).
    pub keep_order: bool,
    /// Candidates looked at per free link and moment, as a multiple of the free links.
    pub window: usize,
    /// Breaks ties between equally good candidates: 0 takes them in chunk order, any other
    /// value in an order scrambled by it. Fixed per attempt, so every rank synthesizes the
    /// same schedule (see [`super::attempts::best_all_gather`]).
    pub seed: u64,
}

#[cfg(test)]
impl TenOptions {
    /// One 1 MB chunk per rank, order kept, the generator's window, seed 0.
    pub(crate) fn for_tests() -> TenOptions {
        TenOptions { per_rank: 1, chunk_bytes: 1e6, keep_order: true, window: 2, seed: 0 }
    }
}

/// One bit per (rank, chunk), rank-major: a destination's row is scanned over and over while
/// its links are matched, and stays in cache (a chunk-major layout measured 1.5× slower at
/// 4096 ranks).
struct Bits {
    words: Vec<u64>,
    stride: usize,
}

impl Bits {
    fn new(rows: usize, cols: usize) -> Bits {
        let stride = cols.div_ceil(64);
        Bits { words: vec![0; rows * stride], stride }
    }
    #[inline]
    fn get(&self, r: usize, c: usize) -> bool {
        self.words[r * self.stride + c / 64] >> (c % 64) & 1 == 1
    }
    #[inline]
    fn set(&mut self, r: usize, c: usize) {
        self.words[r * self.stride + c / 64] |= 1 << (c % 64);
    }
}

/// Synthesizes an all-gather on `graph`: every rank ends with every chunk. Fails only when some
/// rank cannot be reached from another over `graph`'s arcs.
pub fn all_gather(graph: &RankGraph, opt: TenOptions) -> Result<TenSchedule> {
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(MAX_THREADS);
    let engine = Engine { threads, parallel_min: PARALLEL_MIN_DESTINATIONS, scarcity_max: LOCAL_SCARCITY_MAX_RANKS };
    synthesize(graph, opt, engine)
}

/// How [`all_gather`] runs (tests vary it to check that results do not depend on it).
#[derive(Debug, Clone, Copy)]
struct Engine {
    threads: usize,
    parallel_min: usize,
    scarcity_max: usize,
}

fn synthesize(graph: &RankGraph, opt: TenOptions, engine: Engine) -> Result<TenSchedule> {
    let n = graph.nranks();
    let k = opt.per_rank.max(1) as usize;
    let total = n * k;
    let arcs = graph.arcs();
    let duration = transfer_times(graph, opt.chunk_bytes);
    // `coming[d]`: d holds chunk c or it is on its way. What d holds (and may send) is exactly
    // `arrived[d]`: a chunk joins it when its transfer ends, not when it starts.
    let mut coming = Bits::new(n, total);
    // Whether link times differ at all (on uniform links no alternative is ever sooner, so
    // that check, and the `held` bitset it alone reads, are skipped).
    let mixed = uniform(&duration).is_none();
    let mut held = Bits::new(if mixed { n } else { 0 }, total);
    // Every rank ends up with every chunk: sized once (growing by doubling would peak at up
    // to twice the n² × 4 bytes, 10 GB instead of 6 at 40 000 ranks).
    let mut arrived: Vec<Vec<ChunkId>> = (0..n)
        .map(|r| {
            let mut v = Vec::with_capacity(total);
            v.extend((r * k) as ChunkId..((r + 1) * k) as ChunkId);
            v
        })
        .collect();
    for r in 0..n {
        for c in r * k..(r + 1) * k {
            coming.set(r, c);
            if mixed {
                held.set(r, c);
            }
        }
    }
    // How many ranks hold each chunk: rare chunks are far from most ranks and go first.
    let mut spread: Vec<u32> = vec![1; total];
    let mut missing: Vec<usize> = vec![total - k; n];
    let mut incomplete = if total > k { n } else { 0 };
    // Per in-link of each destination (slot `first_slot[d] + i` for `graph.in_arcs(d)[i]`), how
    // far its source's arrival list has been found held by the destination. Destination-major,
    // so destinations can be matched on separate threads.
    let first_slot: Vec<usize> = std::iter::once(0)
        .chain((0..n).scan(0, |acc, d| {
            *acc += graph.in_arcs(d as crate::schedule::Rank).len();
            Some(*acc)
        }))
        .collect();
    let mut cursor = vec![0usize; arcs.len()];
    // A rank's chunks arrive spread over its in-links: reserve an even share (a Vec that grows
    // by doubling could hold twice what it carries).
    let mut per_arc: Vec<Vec<ChunkId>> =
        arcs.iter().map(|a| Vec::with_capacity((total - k) / graph.in_arcs(a.to).len().max(1) + 1)).collect();
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
    let local_scarcity = n <= engine.scarcity_max;
    let window = if local_scarcity { opt.window } else { 1 };
    let mut now = 0.0f64;
    let mut steps = 0u64;
    let threads = engine.threads.max(1);
    let mut scratches: Vec<Scratch> = (0..threads).map(|_| Scratch::default()).collect();
    let mut matches: Vec<Vec<Match>> = vec![Vec::new(); threads];
    // Destinations are matched independently of one another where matching one reads only its
    // own row of `coming` (no in-neighbour counts, no sooner-link checks): then a moment's
    // destinations are matched on several threads, with results identical to one thread.
    // Otherwise one destination at a time, each applied before the next is matched.
    let independent = !local_scarcity && !mixed;
    // Set for one round after a stall: every link looks at everything its source holds.
    let mut forced = false;
    loop {
        dirty.sort_unstable();
        dirty.dedup();
        let mut started = false;
        let batch = if independent { dirty.len() } else { 1 };
        for dests in dirty.chunks(batch.max(1)) {
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
                ready: &ready,
                missing: &missing,
                first_slot: &first_slot,
                window,
            };
            let parts = if dests.len() >= engine.parallel_min { threads } else { 1 };
            state.match_all(dests, parts, &mut cursor, &mut scratches, &mut matches);
            // Apply in destination order, as one thread would have.
            for &(d, a, c) in matches.iter().flatten() {
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
            arrived[d].push(c);
            if mixed {
                held.set(d, c as usize);
            }
            spread[c as usize] += 1;
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

/// The key ties are broken by: the chunk for seed 0, else a hash of (chunk, destination, seed)
/// (a multiply–xorshift mix), so that each destination orders equal candidates differently;
/// the chunk itself still breaks any tie left.
fn tie_break(c: ChunkId, d: usize, seed: u64) -> u32 {
    if seed == 0 {
        return c;
    }
    let mut x = (u64::from(c) | (d as u64) << 32) ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as u32
}

/// A matched link: (destination, arc, chunk or [`NONE`]).
type Match = (u32, u32, ChunkId);

/// Up to this many threads match a moment's destinations.
const MAX_THREADS: usize = 8;
/// Fewer destinations than this are matched on one thread (a thread costs tens of µs).
const PARALLEL_MIN_DESTINATIONS: usize = 512;

/// What matching reads at one moment (nothing here changes until the matches are applied).
struct MatchState<'a> {
    links: Links<'a>,
    arrived: &'a [Vec<ChunkId>],
    coming: &'a Bits,
    held: &'a Bits,
    spread: &'a [u32],
    ready: &'a [bool],
    missing: &'a [usize],
    first_slot: &'a [usize],
    window: usize,
}

impl MatchState<'_> {
    /// Matches the free links into `dests` (ascending), split into `parts` runs of destinations
    /// on as many threads; `out[i]` receives run i's matches in destination order. Each run
    /// owns its destinations' slots of `cursor`.
    fn match_all(
        &self,
        dests: &[u32],
        parts: usize,
        cursor: &mut [usize],
        scratches: &mut [Scratch],
        out: &mut [Vec<Match>],
    ) {
        for o in out.iter_mut() {
            o.clear();
        }
        let parts = parts.clamp(1, scratches.len().min(out.len()));
        if parts == 1 {
            self.match_run(dests, cursor, 0, &mut scratches[0], &mut out[0]);
            return;
        }
        let per = dests.len().div_ceil(parts);
        std::thread::scope(|scope| {
            let mut rest = cursor;
            let mut base = 0;
            for ((run, scratch), o) in dests.chunks(per).zip(scratches.iter_mut()).zip(out.iter_mut()) {
                // This run's slots: from its first destination's to past its last one's.
                let (Some(&lo), Some(&hi)) = (run.first(), run.last()) else { continue };
                let (lo, hi) = (self.first_slot[lo as usize], self.first_slot[hi as usize + 1]);
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(lo - base);
                let (mine, tail) = tail.split_at_mut(hi - lo);
                rest = tail;
                base = hi;
                scope.spawn(move || self.match_run(run, mine, lo, scratch, o));
            }
        });
    }

    /// Matches `dests` one after another; `cursor` holds their slots, the first being `base`.
    fn match_run(&self, dests: &[u32], cursor: &mut [usize], base: usize, scratch: &mut Scratch, out: &mut Vec<Match>) {
        let mut free = std::mem::take(&mut scratch.free);
        for &d in dests {
            let d = d as usize;
            let sources = self.links.graph.in_arcs(d as crate::schedule::Rank);
            free.clear();
            free.extend(
                sources.iter().enumerate().filter(|&(_, &a)| self.ready[a]).map(|(i, &a)| (a as u32, i as u32)),
            );
            if self.missing[d] == 0 || free.is_empty() {
                continue; // complete: these links are done for good
            }
            let slots = &mut cursor[self.first_slot[d] - base..self.first_slot[d + 1] - base];
            let matched = match_links(&free, self, slots, d, scratch);
            out.extend(free.iter().zip(matched).map(|(&(a, _), m)| (d as u32, a, m.unwrap_or(NONE))));
        }
        scratch.free = free;
    }
}

/// The arcs with their timing, as the matcher sees them at one moment.
struct Links<'a> {
    graph: &'a RankGraph,
    duration: &'a [f64],
    busy_until: &'a [f64],
    carrying: &'a [ChunkId],
    mixed: bool,
    local_scarcity: bool,
    now: f64,
    /// After a stall: no look-ahead cap and no deferring to sooner links.
    forced: bool,
    seed: u64,
}

const NONE: ChunkId = ChunkId::MAX;

/// Up to this many ranks candidates are also ranked by how few of the destination's
/// in-neighbours hold them. That costs one random read of a rank × chunk bitset per candidate
/// and in-neighbour, which stays in cache at a thousand ranks but not at tens of thousands,
/// where it changed no step count we measured (tori, meshes, hypercubes of 1024–8000 ranks);
/// above, the look-ahead window also shrinks to one candidate per free link.
const LOCAL_SCARCITY_MAX_RANKS: usize = 1024;
/// How far past its cursor a link looks for candidates, in multiples of the candidates wanted
/// (the 8×8 torus needs 16 to reach its 16 steps; 4 saved no time at 8000 ranks).
const SCAN_FACTOR: usize = 16;

impl Links<'_> {
    /// When `arc` could deliver chunk `c` to its head if it took it next: after its current
    /// transfer and after its tail holds `c` (now, or when an in-flight transfer brings it);
    /// `None` when the tail neither holds `c` nor has it on the way.
    fn delivery(&self, arc: usize, c: ChunkId, held: &Bits, coming: &Bits) -> Option<f64> {
        let s = self.graph.arc(arc).from as usize;
        let has = if held.get(s, c as usize) {
            self.now
        } else if coming.get(s, c as usize) {
            let j = self.graph.in_arcs(s as crate::schedule::Rank).iter().find(|&&j| self.carrying[j] == c)?;
            self.busy_until[*j]
        } else {
            return None;
        };
        Some(has.max(self.busy_until[arc]).max(self.now) + self.duration[arc])
    }
}

/// Assigns distinct chunks destination `d` lacks to the free links `links` into it. Each link's
/// candidates are the first `window` × (free links) chunks its source received that `d` lacks
/// (from a per-link cursor that skips what `d` already has); candidates are preferred when few
/// ranks hold them (a rare chunk is far from most ranks: its spread is the critical path), then
/// when few of `d`'s in-neighbours hold them or have them on the way (widely held ones can
/// still come over any link later, which keeps every link busy to the end; one an in-neighbour
/// is already getting will reach `d` through it), and the links are matched to
/// distinct chunks by Kuhn's augmenting paths in that preference order.
///
/// On mixed-speed machines a free slow link must not take a chunk that another in-link of `d`
/// (from a rank holding it or getting it) delivers sooner even after finishing its current
/// transfer:
/// a chunk stuck on a 5 GB/s link while a 50 GB/s one is free a moment later is how greedy
/// matching loses most of the bandwidth. Such candidates are skipped; on uniform links no
/// alternative is ever sooner, so nothing changes there.
fn match_links<'s>(
    links: &[(u32, u32)],
    state: &MatchState<'_>,
    cursor: &mut [usize],
    d: usize,
    scratch: &'s mut Scratch,
) -> &'s [Option<ChunkId>] {
    let MatchState { links: timing, arrived, coming, held, spread, window, .. } = state;
    let (coming, held) = (*coming, *held);
    let arcs = timing.graph.arcs();
    let sources = timing.graph.in_arcs(d as crate::schedule::Rank);
    let want = links.len();
    let limit = want * (*window).max(1);
    let Scratch { cands, mine, chosen, by_choice, seen, .. } = scratch;
    cands.clear();
    for &(a, slot) in links {
        let s = arcs[a as usize].from as usize;
        let list = &arrived[s];
        let cur = &mut cursor[slot as usize];
        while *cur < list.len() && coming.get(d, list[*cur] as usize) {
            *cur += 1;
        }
        mine.clear();
        let mut j = *cur;
        // Past the cursor, chunks already on their way to `d` are skipped again at every
        // moment: the look-ahead is capped so a link costs O(1) per moment, not O(n).
        let end = if timing.forced { list.len() } else { list.len().min(*cur + limit * SCAN_FACTOR) };
        while j < end && mine.len() < limit {
            let c = list[j];
            if !coming.get(d, c as usize) {
                let here = timing.now + timing.duration[a as usize];
                let mut holders = 0u32;
                let mut sooner = false;
                for &i in sources {
                    if timing.local_scarcity {
                        holders += u32::from(coming.get(arcs[i].from as usize, c as usize));
                    }
                    if timing.mixed && !timing.forced && i != a as usize {
                        sooner |= timing.delivery(i, c, held, coming).is_some_and(|t| t < here * (1.0 - 1e-9));
                    }
                }
                if !sooner {
                    mine.push((spread[c as usize], holders, tie_break(c, d, timing.seed), c));
                }
            }
            j += 1;
        }
        mine.sort_unstable();
        cands.push(mine.iter().map(|&(_, _, _, c)| c).collect());
    }
    // Links with the fewest choices pick first.
    by_choice.clear();
    by_choice.extend(0..want);
    by_choice.sort_by_key(|&l| cands[l].len());
    chosen.clear();
    chosen.resize(want, None);
    for &l in by_choice.iter() {
        seen.clear();
        augment(l, cands, chosen, seen);
    }
    chosen
}

/// Buffers [`match_links`] reuses from call to call.
#[derive(Default)]
struct Scratch {
    /// The free links into the destination being matched: (arc, index among its in-links).
    free: Vec<(u32, u32)>,
    cands: Vec<Vec<ChunkId>>,
    mine: Vec<(u32, u32, u32, ChunkId)>,
    chosen: Vec<Option<ChunkId>>,
    by_choice: Vec<usize>,
    seen: Vec<ChunkId>,
}

fn augment(l: usize, cands: &[Vec<ChunkId>], chosen: &mut [Option<ChunkId>], seen: &mut Vec<ChunkId>) -> bool {
    for &c in &cands[l] {
        if seen.contains(&c) {
            continue;
        }
        seen.push(c);
        match chosen.iter().position(|&x| x == Some(c)) {
            None => {
                chosen[l] = Some(c);
                return true;
            }
            Some(other) => {
                if augment(other, cands, chosen, seen) {
                    chosen[l] = Some(c);
                    return true;
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;

    #[test]
    fn threads_do_not_change_the_schedule() {
        // Without in-neighbour counts destinations are matched on threads; any split of them
        // (one thread, three, a run per destination) gives the same transfers in the same order.
        let g = RankGraph::of(&resolve("torus2d:8x8").unwrap());
        let run = |threads, parallel_min| {
            synthesize(&g, TenOptions::for_tests(), Engine { threads, parallel_min, scarcity_max: 0 }).unwrap()
        };
        let one = run(1, usize::MAX);
        assert_eq!(one.per_arc.iter().map(Vec::len).sum::<usize>(), 64 * 63);
        for (threads, parallel_min) in [(2, 1), (3, 1), (64, 1)] {
            let many = run(threads, parallel_min);
            assert_eq!(many.order, one.order, "{threads} threads");
            assert_eq!(many.per_arc, one.per_arc);
            assert_eq!(many.steps, one.steps);
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
    }
}

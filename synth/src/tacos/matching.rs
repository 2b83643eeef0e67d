//! Matching one destination's free links to distinct chunks it lacks: what both engines
//! ([`super::ten`], event-driven for any links, and [`super::lockstep`], synchronous steps on
//! uniform links) share, so that they make the same choices.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use super::problem::ChunkId;
use crate::topology::logical::RankGraph;

/// One bit per (rank, chunk), rank-major: a destination's row is scanned over and over while
/// its links are matched, and stays in cache (a chunk-major layout measured 1.5× slower at
/// 4096 ranks). Atomic words so that threads can each own some rows; every row has one writer
/// at a time (the thread matching that destination), so a set is a plain load and store.
pub(super) struct Bits {
    words: Vec<AtomicU64>,
    stride: usize,
}

impl Bits {
    pub(super) fn new(rows: usize, cols: usize) -> Bits {
        let stride = cols.div_ceil(64);
        Bits { words: (0..rows * stride).map(|_| AtomicU64::new(0)).collect(), stride }
    }
    #[inline]
    pub(super) fn get(&self, r: usize, c: usize) -> bool {
        self.words[r * self.stride + c / 64].load(Relaxed) >> (c % 64) & 1 == 1
    }
    /// Starts loading the word that holds bit (`r`, `c`).
    #[inline]
    pub(super) fn prefetch(&self, r: usize, c: usize) {
        if let Some(w) = self.words.get(r * self.stride + c / 64) {
            super::prefetch::prefetch(w);
        }
    }
    /// Sets bit (`r`, `c`); only the thread that owns row `r` may call it.
    #[inline]
    pub(super) fn set(&self, r: usize, c: usize) {
        let w = &self.words[r * self.stride + c / 64];
        w.store(w.load(Relaxed) | 1 << (c % 64), Relaxed);
    }
}

/// The chunks each rank holds, in the order they arrived: what a link's source may send. Every
/// rank ends up with every chunk, so rank r's list is row r of one n × total array (no
/// per-rank allocation or header to chase: a source's list is found by arithmetic).
pub(super) struct Arrivals {
    chunks: Vec<ChunkId>,
    len: Vec<u32>,
    total: usize,
}

impl Arrivals {
    /// `n` ranks holding `k` chunks each (rank r: chunks r·k to r·k + k − 1).
    fn new(n: usize, k: usize) -> Arrivals {
        let total = n * k;
        // Zeroed pages are only mapped when written: memory grows with what has arrived.
        let mut chunks = vec![0; n * total];
        for r in 0..n {
            for (j, c) in (r * k..(r + 1) * k).enumerate() {
                chunks[r * total + j] = c as ChunkId;
            }
        }
        Arrivals { chunks, len: vec![k as u32; n], total }
    }

    /// What rank `r` holds, in arrival order.
    #[inline]
    pub(super) fn list(&self, r: usize) -> &[ChunkId] {
        let start = r * self.total;
        &self.chunks[start..start + self.len[r] as usize]
    }

    /// Appends `c` to rank `r`'s list.
    pub(super) fn push(&mut self, r: usize, c: ChunkId) {
        Rows { chunks: &mut self.chunks, len: &mut self.len, total: self.total }.push(r, c);
    }

    /// The ranks `bounds[i]..bounds[i + 1]` as separately writable pieces.
    pub(super) fn split(&mut self, bounds: &[usize]) -> Vec<Rows<'_>> {
        let total = self.total;
        let chunk_bounds: Vec<usize> = bounds.iter().map(|b| b * total).collect();
        split_at_bounds(&mut self.chunks, &chunk_bounds)
            .into_iter()
            .zip(split_at_bounds(&mut self.len, bounds))
            .map(|(chunks, len)| Rows { chunks, len, total })
            .collect()
    }
}

/// `items` cut at `bounds` (ascending, from 0 to `items.len()`): piece i is
/// `bounds[i]..bounds[i + 1]`.
pub(super) fn split_at_bounds<'a, T>(mut items: &'a mut [T], bounds: &[usize]) -> Vec<&'a mut [T]> {
    let mut out = Vec::with_capacity(bounds.len().saturating_sub(1));
    for w in bounds.windows(2) {
        let (piece, rest) = std::mem::take(&mut items).split_at_mut(w[1] - w[0]);
        out.push(piece);
        items = rest;
    }
    out
}

/// Room to reserve for the chunks one of a rank's `in_links` links carries when the rank lacks
/// `lacking` chunks: an even share (a Vec that grows by doubling could hold twice what it
/// carries, which at 40 000 ranks is gigabytes).
pub(super) fn link_list_capacity(lacking: usize, in_links: usize) -> usize {
    lacking / in_links.max(1) + 1
}

/// Some consecutive ranks' arrival lists, writable (row 0 is the first of them).
pub(super) struct Rows<'a> {
    chunks: &'a mut [ChunkId],
    len: &'a mut [u32],
    total: usize,
}

impl Rows<'_> {
    /// Appends `c` to row `i` (a rank receives each chunk once, so a row never fills up).
    #[inline]
    pub(super) fn push(&mut self, i: usize, c: ChunkId) {
        let at = i * self.total + self.len[i] as usize;
        self.chunks[at] = c;
        self.len[i] += 1;
    }
}

/// What every rank holds, and what matching ranks candidates by; both engines start from it.
pub(super) struct Holdings {
    /// Chunks each rank holds or has on the way.
    pub coming: Bits,
    /// Chunks each rank holds (kept only on mixed-speed links, where the sooner-link check
    /// reads it).
    pub held: Bits,
    pub arrived: Arrivals,
    /// How many ranks hold each chunk: rare chunks are far from most ranks and go first.
    pub spread: Vec<AtomicU32>,
    /// Chunks each rank still lacks, and the ranks that lack any.
    pub missing: Vec<usize>,
    pub incomplete: usize,
}

impl Holdings {
    /// `n` ranks holding `k` chunks each (rank r: chunks r·k to r·k + k − 1).
    pub(super) fn new(n: usize, k: usize, keep_held: bool) -> Holdings {
        let total = n * k;
        let coming = Bits::new(n, total);
        let held = Bits::new(if keep_held { n } else { 0 }, total);
        let arrived = Arrivals::new(n, k);
        for r in 0..n {
            for c in r * k..(r + 1) * k {
                coming.set(r, c);
                if keep_held {
                    held.set(r, c);
                }
            }
        }
        Holdings {
            coming,
            held,
            arrived,
            spread: (0..total).map(|_| AtomicU32::new(1)).collect(),
            missing: vec![total - k; n],
            incomplete: if total > k { n } else { 0 },
        }
    }
}

/// Where each destination's in-links start in per-slot arrays: slot `first[d] + i` is
/// `graph.in_arcs(d)[i]`, and `first[n]` is the number of arcs. Destination-major, so that a
/// thread matching a run of destinations owns one contiguous piece.
pub(super) fn in_slots(graph: &RankGraph) -> Vec<usize> {
    std::iter::once(0)
        .chain((0..graph.nranks()).scan(0, |acc, d| {
            *acc += graph.in_arcs(d as crate::schedule::Rank).len();
            Some(*acc)
        }))
        .collect()
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

/// No chunk: a free link.
pub(super) const NONE: ChunkId = ChunkId::MAX;

/// Up to this many ranks candidates are also ranked by how few of the destination's
/// in-neighbours hold them. That costs one random read of a rank × chunk bitset per candidate
/// and in-neighbour, which stays in cache at a thousand ranks but not at tens of thousands,
/// where it changed no step count we measured (tori, meshes, hypercubes of 1024–8000 ranks);
/// above, the look-ahead window also shrinks to one candidate per free link.
pub(super) const LOCAL_SCARCITY_MAX_RANKS: usize = 1024;
/// How far past its cursor a link looks for candidates, in multiples of the candidates wanted
/// (the 8×8 torus needs 16 to reach its 16 steps; 4 saved no time at 8000 ranks).
const SCAN_FACTOR: usize = 16;

/// What matching reads at one moment (nothing here changes until the matches are applied).
pub(super) struct MatchState<'a> {
    pub links: Links<'a>,
    /// The chunks each rank holds, in the order they arrived.
    pub arrived: &'a Arrivals,
    /// Chunks each rank holds or has on the way.
    pub coming: &'a Bits,
    /// Chunks each rank holds (kept only on mixed-speed links).
    pub held: &'a Bits,
    /// How many ranks hold each chunk.
    pub spread: &'a [AtomicU32],
    /// Candidates per free link (see [`match_links`]).
    pub window: usize,
}

/// The arcs with their timing, as the matcher sees them at one moment.
pub(super) struct Links<'a> {
    pub graph: &'a RankGraph,
    /// µs each arc takes per chunk (read only on mixed links).
    pub duration: &'a [f64],
    /// When each arc's transfer ends, and the chunk it carries (read only on mixed links).
    pub busy_until: &'a [f64],
    pub carrying: &'a [ChunkId],
    pub mixed: bool,
    pub local_scarcity: bool,
    pub now: f64,
    /// After a stall: no look-ahead cap and no deferring to sooner links.
    pub forced: bool,
    pub seed: u64,
}

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
pub(super) fn match_links<'s>(
    links: &[FreeLink],
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
    if cands.len() < want {
        cands.resize_with(want, Vec::new);
    }
    // Only in-neighbour counts and the sooner-link check look at the other in-links.
    let others: &[usize] = if timing.local_scarcity || (timing.mixed && !timing.forced) { sources } else { &[] };
    for (l, &FreeLink { arc: a, index, source }) in links.iter().enumerate() {
        let list = arrived.list(source as usize);
        let cur = &mut cursor[index as usize];
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
                let mut holders = 0u32;
                let mut sooner = false;
                for &i in others {
                    if timing.local_scarcity {
                        holders += u32::from(coming.get(arcs[i].from as usize, c as usize));
                    }
                    if timing.mixed && !timing.forced && i != a as usize {
                        let here = timing.now + timing.duration[a as usize];
                        sooner |= timing.delivery(i, c, held, coming).is_some_and(|t| t < here * (1.0 - 1e-9));
                    }
                }
                if !sooner {
                    mine.push((spread[c as usize].load(Relaxed), holders, tie_break(c, d, timing.seed), c));
                }
            }
            j += 1;
        }
        mine.sort_unstable();
        cands[l].clear();
        cands[l].extend(mine.iter().map(|&(_, _, _, c)| c));
    }
    // Links with the fewest choices pick first.
    by_choice.clear();
    by_choice.extend(0..want);
    by_choice.sort_by_key(|&l| cands[l].len());
    chosen.clear();
    chosen.resize(want, None);
    for &l in by_choice.iter() {
        seen.clear();
        augment(l, &cands[..want], chosen, seen);
    }
    chosen
}

/// A free link into the destination being matched.
#[derive(Debug, Clone, Copy)]
pub(super) struct FreeLink {
    pub arc: u32,
    /// Its index among the destination's in-links (`graph.in_arcs(d)`), which is its cursor's.
    pub index: u32,
    /// Its source rank.
    pub source: u32,
}

/// Buffers [`match_links`] reuses from call to call.
#[derive(Default)]
pub(super) struct Scratch {
    /// The free links into the destination being matched.
    pub(super) free: Vec<FreeLink>,
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

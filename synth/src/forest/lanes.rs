//! Whole lanes packed directly, for where rounding the fractional packing loses rate.
//!
//! The executor and the network share a link equally between the streams on it, so the forest
//! is run as lanes that each carry the same share of every root's shard, one tree per root
//! each ([`crate::packing::lanes`]). Rounding a fractional packing of many thin bundles to whole
//! lanes can cost several points: on a DGX-1 24 bundles rounded to 51 lanes realize 95 % of the
//! cut bound although the fractional packing reaches 99 %. Here the trees of a fixed number of
//! lanes are chosen directly: greedily, each root's cheapest tree under an exponential penalty
//! on every link's load, then improved by taking trees out one at a time and putting each
//! root's cheapest tree back (rip-up and reroute), which never raises the penalty, and last by
//! moving single trees off the fullest links. The lanes' rate is
//! `lanes × min over links (capacity / trees crossing it)`.
//!
//! Trees can be held to a depth: with every link busy, a tree d deep finishes d − 1 chunk
//! times after its last chunk left the root (a DGX-1's depth-2 lanes at 8 chunks per lane
//! reach 89 % of the bound, at 128 chunks 98 %), and the cheapest arborescences, indifferent
//! to depth, come out as chains up to 7 deep. Packings are weighed at their rate after fill
//! ([`LanePacking::filled_rate`]).

use super::packing::{Direction, RootTree, TreeOracle};
use crate::packing::multipath::PathArc;
use crate::schedule::Rank;

/// Lane counts tried.
const LANE_COUNTS: [usize; 7] = [8, 12, 16, 24, 32, 48, 64];
/// Depths tried (`None`: any), shallowest first.
const DEPTHS: [Option<usize>; 4] = [Some(1), Some(2), Some(3), None];
/// Rate after fill given up for fewer lanes.
const LANE_SLACK: f64 = 0.002;
/// A pair's path is short if its latency is within this of the pair's quickest path, µs.
const SHORT_PATH_US: f64 = 0.25;

/// Penalty sharpness, raised pass by pass: a soft penalty spreads the trees, a sharp one then
/// works on the busiest links alone.
const SHARPNESS: [f64; 8] = [4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
/// Rip-up passes over every tree at each sharpness.
const PASSES: usize = 3;
/// At most this many trees moved off the fullest links at the end.
const POLISH_MOVES: usize = 10_000;

/// Trees of `lanes` lanes (`trees[lane][root]`) and the rate per root they realize, GB/s.
pub(crate) struct LanePacking {
    pub trees: Vec<Vec<RootTree>>,
    pub rate: f64,
    /// The deepest tree's depth.
    pub depth: usize,
}

impl LanePacking {
    /// The rate with the pipeline's fill paid: a lane of `PIPELINE_FILLED` chunks per root
    /// whose trees are d deep takes d − 1 chunk times more than its chunks, since the deepest
    /// ranks wait for the first chunk and the last one reaches them last, while the packing
    /// keeps every link busy in between.
    pub fn filled_rate(&self) -> f64 {
        filled_rate(self.rate, self.depth)
    }
}

/// [`LanePacking::filled_rate`] of any lanes realizing `rate` with trees `depth` deep.
pub(crate) fn filled_rate(rate: f64, depth: usize) -> f64 {
    let p = f64::from(PIPELINE_FILLED);
    rate * p / (p + depth.saturating_sub(1) as f64)
}

/// Chunks per lane the fill is weighed at: about what the tuner picks for large messages.
const PIPELINE_FILLED: u32 = 32;

/// The best whole lanes over `arcs` for `n` ranks: every depth of [`DEPTHS`] and lane count
/// of [`LANE_COUNTS`], first over each pair's short paths only (a chunk sent round through
/// the CPUs lands microseconds after one that crossed a switch, and the lanes end with their
/// last chunk), then over all. The best rate after fill is kept, or the fewest lanes within
/// [`LANE_SLACK`] of it, short paths first. Once lanes reach `target` (the fractional
/// packing's rate) the search stops: more lanes or deeper trees could win only within the
/// slack.
pub(crate) fn pack_whole(
    arcs: &[PathArc],
    n: usize,
    direction: Direction,
    cap: &[f64],
    latency: &[f64],
    target: f64,
) -> Option<LanePacking> {
    let delay: Vec<f64> = arcs.iter().map(|a| a.groups.iter().map(|&g| latency[g]).sum()).collect();
    let mut quickest = vec![f64::INFINITY; n * n];
    for (a, &d) in arcs.iter().zip(&delay) {
        let q = &mut quickest[a.from as usize * n + a.to as usize];
        *q = q.min(d);
    }
    let short = |i: usize| delay[i] <= quickest[arcs[i].from as usize * n + arcs[i].to as usize] + SHORT_PATH_US;
    let oracles = [TreeOracle::over(n, direction, arcs, short), TreeOracle::new(n, direction, arcs)];
    let mut found: Vec<(LanePacking, bool)> = Vec::new();
    'search: for depth in DEPTHS {
        for (oracle, only_short) in oracles.iter().zip([true, false]) {
            for &lanes in &LANE_COUNTS {
                let Some(p) = pack_lanes(oracle, cap, lanes, depth, target) else { continue };
                // The target is a float sum of bundle rates: lanes that equal it in exact
                // arithmetic may fall short of it by an ulp (full:29 searched every depth and
                // lane count, a minute, for 50 GB/s against 50.00000000000002).
                let reached = p.rate >= target * (1.0 - 1e-9);
                found.push((p, only_short));
                if reached {
                    break 'search;
                }
            }
        }
    }
    let best = found.iter().map(|(p, _)| p.filled_rate()).fold(0.0, f64::max);
    found.retain(|(p, _)| p.filled_rate() >= best * (1.0 - LANE_SLACK));
    found.into_iter().min_by_key(|(p, only_short)| (p.trees.len(), !only_short)).map(|(p, _)| p)
}

/// Packs `lanes` lanes over `oracle`'s arcs into link groups of capacities `cap` (GB/s);
/// `target` is about the best rate per root (the fractional packing's), which only scales the
/// penalty. `None` if some rank cannot reach another.
fn pack_lanes(
    oracle: &TreeOracle,
    cap: &[f64],
    lanes: usize,
    depth: Option<usize>,
    target: f64,
) -> Option<LanePacking> {
    let n = oracle.ranks();
    if lanes == 0 || n == 0 || target <= 0.0 {
        return None;
    }
    let mut state = Lanes::new(cap, lanes, depth, target);
    let mut trees: Vec<Vec<RootTree>> = Vec::with_capacity(lanes);
    for _ in 0..lanes {
        let mut lane = Vec::with_capacity(n);
        for root in 0..n {
            let tree = state.cheapest(oracle, root as Rank, SHARPNESS[0])?;
            state.add(oracle, &tree, 1);
            lane.push(tree);
        }
        trees.push(lane);
    }
    let mut best = (state.rate(), trees.clone());
    for &sharpness in &SHARPNESS {
        for _ in 0..PASSES {
            let mut changed = false;
            for lane in trees.iter_mut() {
                for tree in lane.iter_mut() {
                    state.add(oracle, tree, -1);
                    let better = state.cheapest(oracle, tree.root, sharpness)?;
                    state.add(oracle, &better, 1);
                    if better != *tree {
                        *tree = better;
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
            let rate = state.rate();
            if rate > best.0 {
                best = (rate, trees.clone());
            }
        }
    }
    let mut trees = best.1;
    state.load.iter_mut().for_each(|l| *l = 0);
    for tree in trees.iter().flatten() {
        state.add(oracle, tree, 1);
    }
    state.polish(oracle, &mut trees);
    let depth = trees.iter().flatten().map(RootTree::depth).max().unwrap_or(0);
    Some(LanePacking { rate: state.rate(), trees, depth })
}

/// Trees crossing each link group, and the penalty that steers new trees off busy links.
struct Lanes<'c> {
    cap: &'c [f64],
    lanes: usize,
    /// Trees crossing each group (once per crossing).
    load: Vec<i64>,
    /// A crossing's share of a group at the target rate: a group's load × this is 1 where the
    /// lanes run at `target` and the group is full.
    unit: Vec<f64>,
    target: f64,
    /// Trees no deeper than this, where one is found.
    depth: Option<usize>,
}

impl<'c> Lanes<'c> {
    fn new(cap: &'c [f64], lanes: usize, depth: Option<usize>, target: f64) -> Lanes<'c> {
        let unit = cap.iter().map(|&c| if c > 0.0 { target / (c * lanes as f64) } else { f64::INFINITY }).collect();
        Lanes { cap, lanes, load: vec![0; cap.len()], unit, target, depth }
    }

    fn add(&mut self, oracle: &TreeOracle, tree: &RootTree, delta: i64) {
        for g in oracle.groups(tree) {
            self.load[g] += delta;
        }
    }

    /// `root`'s cheapest tree when a crossing of a group costs what it adds to
    /// Σ exp(sharpness × fill), fill being the group's load in units of its full share.
    fn cheapest(&self, oracle: &TreeOracle, root: Rank, sharpness: f64) -> Option<RootTree> {
        // Relative to the fullest group, so the exponentials stay finite; a tiny term per
        // crossing prefers shorter paths among empty groups.
        let (fill, top) = self.fills();
        let length: Vec<f64> = fill
            .iter()
            .zip(&self.unit)
            .map(|(&f, &u)| {
                if u.is_finite() {
                    ((sharpness * (f + u - top)).exp() - (sharpness * (f - top)).exp()) + 1e-12 * u
                } else {
                    f64::INFINITY
                }
            })
            .collect();
        self.tree_under(oracle, root, &length).map(|(t, _)| t)
    }

    /// Every group's load in units of its full share, and the fullest such fill.
    fn fills(&self) -> (Vec<f64>, f64) {
        let fill: Vec<f64> = self.load.iter().zip(&self.unit).map(|(&l, &u)| l as f64 * u).collect();
        let top = fill.iter().copied().filter(|f| f.is_finite()).fold(0.0, f64::max);
        (fill, top)
    }

    /// `root`'s cheapest tree under `length` per group, held to the depth where one is found.
    fn tree_under(&self, oracle: &TreeOracle, root: Rank, length: &[f64]) -> Option<(RootTree, f64)> {
        let weighted = oracle.weighted(length);
        self.depth.and_then(|d| oracle.shallow_tree(root, &weighted, d)).or_else(|| oracle.tree(root, &weighted))
    }

    /// Moves trees off the fullest groups while some other tree of their root avoids every
    /// group at that fill: the penalty balances marginal costs, which can leave a whole
    /// crossing on a thin link where the busiest-link rate wants it elsewhere. Each move lowers
    /// the fullest fill or the number of groups at it, so this ends.
    fn polish(&mut self, oracle: &TreeOracle, trees: &mut [Vec<RootTree>]) {
        for _ in 0..POLISH_MOVES {
            let (fill, top) = self.fills();
            let full = |g: usize| fill[g] >= top * (1.0 - 1e-9);
            let mut moved = false;
            'search: for lane in trees.iter_mut() {
                for tree in lane.iter_mut() {
                    if !oracle.groups(tree).any(full) {
                        continue;
                    }
                    self.add(oracle, tree, -1);
                    // A crossing that would bring a group up to the top is barred; others cost
                    // a little, so the new tree stays short.
                    let length: Vec<f64> = self
                        .load
                        .iter()
                        .zip(&self.unit)
                        .map(|(&l, &u)| if (l + 1) as f64 * u >= top * (1.0 - 1e-9) { f64::INFINITY } else { u })
                        .collect();
                    let found = self.tree_under(oracle, tree.root, &length).filter(|(_, len)| len.is_finite());
                    // Lengths count each crossing alone; a tree crossing a group several
                    // times (a star's root link) must still stay under the top.
                    if let Some((better, _)) = found {
                        self.add(oracle, &better, 1);
                        if oracle.groups(&better).all(|g| (self.load[g] as f64 * self.unit[g]) < top * (1.0 - 1e-9)) {
                            *tree = better;
                            moved = true;
                            break 'search;
                        }
                        self.add(oracle, &better, -1);
                    }
                    self.add(oracle, tree, 1);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Rate per root the lanes realize now: every tree moves at its equal share of its busiest
    /// group.
    fn rate(&self) -> f64 {
        let per_lane = self
            .load
            .iter()
            .zip(self.cap)
            .filter(|&(&l, _)| l > 0)
            .map(|(&l, &c)| c / l as f64)
            .fold(f64::INFINITY, f64::min);
        if per_lane.is_finite() {
            per_lane * self.lanes as f64
        } else {
            self.target
        }
    }
}

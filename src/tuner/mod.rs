//! The tuner: for a (topology, collective, message size) it chooses the algorithm, the pipeline
//! depth (chunks per block) and the channel count, by pricing every candidate the registry can
//! build in the simulator and keeping the fastest (above a few dozen ranks, by closed forms
//! where a schedule's shape allows, simulating the rest only where it could win: [`scale`]).
//!
//! Every rank of a communicator must run the same schedule (NCCL hangs when hosts pick
//! differently). The choice is therefore a pure function of inputs all ranks share — the
//! topology, the collective, the size bucket, the forced algorithm and the tuner's settings —
//! priced by the deterministic simulator, with candidates tried in a fixed order and ties
//! going to the first. A rank that still disagrees (a different topology file, say) is caught
//! by the schedule hash every call carries on the wire and fails with a mismatch, not a hang.
//!
//! Decisions are made per power-of-two size bucket, synthesized schedules are built on first use,
//! and both are cached on disk by [`cache`], keyed by the topology's
//! [`fingerprint`](topoccl_synth::topology::Topology::fingerprint). A communicator's calls do
//! not wait for a decision: a size runs a quick choice (`quick`) until the full decision, made
//! in the background (`refine`), is agreed by every rank (`comm::agree`).
//!
//! Users bring their own policy through [`Tuner`], shaped like NCCL's tuner plugin: it sees the
//! priced candidates (NCCL's cost table) and may pick another one.

mod built;
pub mod cache;
mod quick;
mod refine;
mod scale;
mod select;

pub use refine::Decision;
pub(crate) use refine::Refinements;
pub(crate) use select::DecisionKey;
pub use select::{Selector, SelectorOptions};

use std::fmt;

use serde::{Deserialize, Serialize};
use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::topology::Topology;

/// Version of the [`Tuner`] interface; bumped on incompatible changes. A tuner reporting another
/// version is refused when it is added.
pub const TUNER_API_VERSION: u32 = 1;

/// One way to run a collective: which generator, and the knobs it is built with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Choice {
    pub algorithm: String,
    /// Chunks per block (`Request::pipeline`; ≤ 1 means the generator's default).
    pub pipeline: u32,
    /// Channels (`Request::channels`; 0 means the generator's default).
    pub channels: u32,
}

impl Choice {
    pub fn new(algorithm: &str, pipeline: u32, channels: u32) -> Choice {
        Choice { algorithm: algorithm.to_string(), pipeline, channels }
    }

    /// The generator request this choice stands for.
    pub fn request<'a>(&self, topology: &'a Topology, collective: Collective, bytes: u64) -> Request<'a> {
        Request::new(topology, collective).pipeline(self.pipeline).channels(self.channels).bytes(bytes)
    }
}

impl fmt::Display for Choice {
    /// `ring`, `ring p4`, `ring p4 c2`: the knobs shown only where not the default.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.algorithm)?;
        if self.pipeline > 1 {
            write!(f, " p{}", self.pipeline)?;
        }
        if self.channels > 0 {
            write!(f, " c{}", self.channels)?;
        }
        Ok(())
    }
}

/// A candidate with the simulator's time for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Priced {
    pub choice: Choice,
    /// Predicted time at the bucket's size, µs.
    pub time_us: f64,
}

/// What a tuner is asked.
#[derive(Debug, Clone, Copy)]
pub struct TuneRequest<'a> {
    pub topology: &'a Topology,
    pub collective: Collective,
    /// The collective's buffer in bytes (nccl-tests' size column), rounded up to its bucket.
    pub bytes: u64,
    /// Every candidate, priced, in the fixed candidate order.
    pub priced: &'a [Priced],
}

/// A user tuner, like NCCL's tuner plugin: sees the priced candidates and may choose one.
///
/// It must decide from the request alone (every rank asks its own copy, and all must agree).
pub trait Tuner: Send {
    fn name(&self) -> &str;
    /// The interface version the tuner was written for ([`TUNER_API_VERSION`]).
    fn api_version(&self) -> u32 {
        TUNER_API_VERSION
    }
    /// The index into `request.priced` to run, or `None` to keep the simulator's choice.
    fn choose(&mut self, request: &TuneRequest<'_>) -> Option<usize>;
}

/// Pipeline depths priced for each algorithm (deduplicated where a generator maps several to
/// one schedule); each generator's [channel variants](topoccl_synth::generate::ScheduleGenerator::channel_variants) are
/// priced at the shallowest and at depth 8.
const PIPELINES: [u32; 5] = [1, 2, 8, 32, 128];
/// Where the deepest priced depth wins, the winner is priced again at twice the depth, and so
/// on while that is faster, up to this depth. Deep pipelines pay off only for large messages
/// on trees (Blink on DGX-1 fragments), and pricing every algorithm at every size that deep
/// would double the tuner's cold start.
const DEEPEST_PIPELINE: u32 = 256;
/// Above this many ranks only each generator's defaults are priced (pricing is per candidate).
const FULL_SEARCH_MAX_RANKS: usize = 64;

/// Whether candidates are priced as at scale ([`scale`]): above [`FULL_SEARCH_MAX_RANKS`].
fn at_scale(topology: &Topology) -> bool {
    topology.nranks() > FULL_SEARCH_MAX_RANKS
}

/// The candidates for `collective` on `topology`, in the fixed order ties are broken by:
/// registry order, then pipeline, then channels. `only` restricts them to one algorithm.
pub fn candidates(registry: &Registry, topology: &Topology, collective: Collective, only: Option<&str>) -> Vec<Choice> {
    let full = topology.nranks() <= FULL_SEARCH_MAX_RANKS;
    let mut out = Vec::new();
    for g in registry.iter().filter(|g| g.supports(collective)) {
        if only.is_some_and(|o| o != g.name()) {
            continue;
        }
        if !full {
            out.push(Choice::new(g.name(), 1, 0));
            continue;
        }
        for p in PIPELINES {
            out.push(Choice::new(g.name(), p, 0));
        }
        for &c in g.channel_variants() {
            out.push(Choice::new(g.name(), 1, c));
            out.push(Choice::new(g.name(), 8, c));
        }
    }
    out
}

/// Chunks of a deeper candidate must stay at least this large: below it a message costs more
/// than it carries on any real transport, and the simulator, which prices the size but not
/// each message's software cost unless told, would go on preferring deeper.
const DEEPER_MIN_CHUNK_BYTES: u64 = 16 << 10;

/// The next deeper candidate to price after `best` (a schedule of `chunks` chunks) won at
/// `bytes`: twice its depth where `best` has the deepest depth priced so far and the chunks
/// stay at least [`DEEPER_MIN_CHUNK_BYTES`]; none past [`DEEPEST_PIPELINE`] or where only
/// defaults are priced.
pub fn deeper(topology: &Topology, best: &Choice, chunks: u32, bytes: u64) -> Option<Choice> {
    let full = topology.nranks() <= FULL_SEARCH_MAX_RANKS;
    let deepest_listed = PIPELINES[PIPELINES.len() - 1];
    let chunk_after = bytes / (2 * u64::from(chunks.max(1)));
    (full
        && best.pipeline >= deepest_listed
        && best.pipeline < DEEPEST_PIPELINE
        && chunk_after >= DEEPER_MIN_CHUNK_BYTES)
        .then(|| Choice { pipeline: best.pipeline * 2, ..best.clone() })
}

/// Runners-up this close to the best (relative) are priced deeper too, and a deeper depth is
/// priced where the pipeline model leaves it this close ([`could_win_deeper`]).
const DEEPER_CONTENDER: f64 = 0.03;

/// Whether `choice`, deeper than any of its siblings priced so far (same algorithm and
/// channels, with `chunks` beside `priced`), could still come within [`DEEPER_CONTENDER`] of
/// `best_us`.
///
/// Pipelining hides the time a chunk takes to cross the schedule, so a schedule of `c` chunks
/// takes about `steady + fill / c`. Fitted to the two deepest siblings, that model predicts the
/// deeper candidate; it is priced only where the last deepening gained and the prediction is
/// within reach of the best. The deep candidates are the costly ones (a synthesizer's time grows
/// with the chunks it places). Where the siblings do not
/// say how deep the candidate is (the deepest is the generator's default depth), it is priced.
pub fn could_win_deeper(priced: &[Priced], chunks: &[u32], choice: &Choice, best_us: f64) -> bool {
    let mut siblings: Vec<(u32, u32, f64)> = priced
        .iter()
        .zip(chunks)
        .filter(|(p, _)| p.choice.algorithm == choice.algorithm && p.choice.channels == choice.channels)
        .map(|(p, &c)| (c, p.choice.pipeline, p.time_us))
        .collect();
    siblings.sort_by_key(|s| s.0);
    let [.., (shallower, _, shallower_us), (deepest, pipeline, deepest_us)] = siblings[..] else {
        return true;
    };
    if pipeline <= 1 || choice.pipeline <= pipeline || shallower >= deepest {
        return true;
    }
    if deepest_us >= shallower_us {
        return false;
    }
    let (shallower, deepest) = (f64::from(shallower), f64::from(deepest));
    let depth = deepest * f64::from(choice.pipeline) / f64::from(pipeline);
    let fill = (shallower_us - deepest_us) / (1.0 / shallower - 1.0 / deepest);
    let predicted = deepest_us - fill * (1.0 / deepest - 1.0 / depth);
    predicted < best_us * (1.0 + DEEPER_CONTENDER)
}

/// The bucket a size falls in: the next power of two (sizes in one bucket share a decision).
pub fn size_bucket(bytes: u64) -> u64 {
    bytes.max(1).checked_next_power_of_two().unwrap_or(1 << 63)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_print_their_knobs_only_when_set() {
        assert_eq!(Choice::new("ring", 1, 0).to_string(), "ring");
        assert_eq!(Choice::new("ring", 4, 2).to_string(), "ring p4 c2");
    }

    #[test]
    fn a_deeper_depth_is_priced_where_the_pipeline_model_leaves_it_a_chance() {
        let priced = |times: &[(u32, f64)]| -> Vec<Priced> {
            times.iter().map(|&(p, time_us)| Priced { choice: Choice::new("x", p, 0), time_us }).collect()
        };
        // 100 + 3200 / chunks at 8 and 32 chunks per block (one block): 500 and 200; at 128 the
        // model says 125.
        let steady = priced(&[(8, 500.0), (32, 200.0)]);
        let chunks = [8, 32];
        let deeper = Choice::new("x", 128, 0);
        assert!(could_win_deeper(&steady, &chunks, &deeper, 125.0));
        assert!(could_win_deeper(&steady, &chunks, &deeper, 122.0)); // within 3 %
        assert!(!could_win_deeper(&steady, &chunks, &deeper, 115.0));
        // The last deepening gained nothing: no deeper.
        assert!(!could_win_deeper(&priced(&[(8, 200.0), (32, 200.0)]), &chunks, &deeper, 300.0));
        // Other channels, the default depth or one sibling say nothing: priced.
        assert!(could_win_deeper(&steady, &chunks, &Choice::new("x", 128, 2), 1.0));
        assert!(could_win_deeper(&priced(&[(8, 500.0), (1, 200.0)]), &chunks, &deeper, 1.0));
        assert!(could_win_deeper(&priced(&[(32, 200.0)]), &chunks[1..], &deeper, 1.0));
    }

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(size_bucket(0), 1);
        assert_eq!(size_bucket(1000), 1024);
        assert_eq!(size_bucket(1024), 1024);
        assert_eq!(size_bucket(u64::MAX), 1 << 63);
    }

    #[test]
    fn candidates_respect_support_and_restriction() {
        let t = topoccl_synth::topology::resolve("dgx1").unwrap();
        let reg = Registry::builtin();
        let all = candidates(&reg, &t, Collective::AllToAll, None);
        assert!(all.iter().all(|c| reg.get(&c.algorithm).unwrap().supports(Collective::AllToAll)));
        let rings = candidates(&reg, &t, Collective::AllReduce, Some("ring"));
        assert!(!rings.is_empty() && rings.iter().all(|c| c.algorithm == "ring"));
        assert!(candidates(&reg, &t, Collective::AllToAll, Some("blink")).is_empty());
    }
}

//! Algorithms, each a generator of the schedule IR. Nothing here moves bytes or prices time:
//! the executor and the simulator read what these produce.
//!
//! The plug point is [`ScheduleGenerator`], versioned like NCCL's plugins
//! ([`GENERATOR_API_VERSION`]); [`Registry`] maps names to generators.

pub mod alltoall;
pub mod hier_doubling;
pub mod hierarchical;
pub mod rails;
pub mod rd;
pub mod rhd;
pub mod ring;
pub mod tree;

use std::sync::{Mutex, PoisonError};

use crate::error::{Error, Result};
use crate::schedule::{Collective, Rank, Schedule};
use crate::sim::lockstep::Lockstep;
use crate::topology::routing::Router;
use crate::topology::Topology;

/// Version of the [`ScheduleGenerator`] interface. Bumped when the trait or [`Request`] changes
/// incompatibly; [`Registry::register`] refuses a generator written for another.
pub const GENERATOR_API_VERSION: u32 = 2;

/// What a generator is asked to build.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub topology: &'a Topology,
    pub collective: Collective,
    /// How many chunks each block of data is cut into for pipelining (≥ 1). More chunks
    /// overlap the hops of multi-hop algorithms (trees, chains) at the cost of more messages.
    pub pipeline: u32,
    /// Parallel channels (rings, tree pairs) to use; 0 lets the generator choose.
    pub channels: u32,
    /// The message size the schedule is for (the collective's buffer, bytes), for generators
    /// that synthesize per size (TACOS prices links with it); 0 = unknown.
    pub bytes: u64,
    /// Whatever runs the schedule can send a step over the path it names
    /// ([`via_fabric`](crate::schedule::Channel::via_fabric)); false: each rank pair has one
    /// path (topoccl's host transports), so generators plan for the router's paths only.
    pub follow_paths: bool,
}

impl<'a> Request<'a> {
    pub fn new(topology: &'a Topology, collective: Collective) -> Request<'a> {
        Request { topology, collective, pipeline: 1, channels: 0, bytes: 0, follow_paths: true }
    }
    pub fn follow_paths(mut self, yes: bool) -> Request<'a> {
        self.follow_paths = yes;
        self
    }
    pub fn pipeline(mut self, k: u32) -> Request<'a> {
        self.pipeline = k.max(1);
        self
    }
    pub fn channels(mut self, c: u32) -> Request<'a> {
        self.channels = c;
        self
    }
    pub fn bytes(mut self, bytes: u64) -> Request<'a> {
        self.bytes = bytes;
        self
    }
    pub fn nranks(&self) -> u32 {
        self.topology.nranks() as u32
    }
}

/// An algorithm: builds a schedule for a collective on a topology.
pub trait ScheduleGenerator: Send + Sync {
    /// The interface version the generator was written for ([`GENERATOR_API_VERSION`]).
    fn api_version(&self) -> u32 {
        GENERATOR_API_VERSION
    }
    /// Short name used on command lines (`ring`, `tree`, …).
    fn name(&self) -> &'static str;
    /// One line for `--help` and reports.
    fn describe(&self) -> &'static str;
    fn supports(&self, collective: Collective) -> bool;
    fn generate(&self, request: &Request) -> Result<Schedule>;
    /// Whether the schedule depends on [`Request::bytes`] (synthesizers that price links with
    /// the message size). Callers that cache schedules key them by size only when it does.
    fn size_dependent(&self) -> bool {
        false
    }
    /// Channel counts besides the default worth pricing (a tuner prices each at a shallow and a
    /// deep pipeline); none by default.
    fn channel_variants(&self) -> &'static [u32] {
        &[]
    }
    /// Whether schedules are found by a search (Blink, TACOS) rather than built by a proven
    /// construction; callers verify those before running them on data.
    fn searched(&self) -> bool {
        false
    }
    /// The time, µs, of what [`generate`](Self::generate) builds for `request` moving a buffer
    /// of `bytes`, in closed form under the simulator's model ([`Lockstep`]), for shapes that
    /// move in lock-step; `None`: no closed form, simulate it. Exact for one lock-step phase (a
    /// ring); where phases overlap, pessimistic by what the fluid model lends one phase from
    /// another's idle links. The tuner prices candidates this
    /// way above a few dozen ranks, where simulating a schedule costs seconds.
    fn estimate(&self, _request: &Request, _bytes: u64, _model: &mut Lockstep) -> Option<f64> {
        None
    }
}

/// Named generators.
pub struct Registry {
    generators: Vec<Box<dyn ScheduleGenerator>>,
}

impl Registry {
    /// The generators shipped with topoccl.
    pub fn builtin() -> Registry {
        Registry {
            generators: vec![
                Box::new(ring::Ring),
                Box::new(tree::DoubleBinaryTree),
                Box::new(rhd::RecursiveHalvingDoubling),
                Box::new(rd::RecursiveDoubling),
                Box::new(hierarchical::Hierarchical { halving_doubling: false }),
                Box::new(hierarchical::Hierarchical { halving_doubling: true }),
                Box::new(alltoall::PairwiseAllToAll),
                Box::new(crate::blink::Blink),
                Box::new(crate::forest::Forest),
                Box::new(crate::tacos::Tacos),
            ],
        }
    }

    /// Adds (or replaces, by name) a generator, refused if written for another interface
    /// version.
    pub fn register(&mut self, generator: Box<dyn ScheduleGenerator>) -> Result<()> {
        if generator.api_version() != GENERATOR_API_VERSION {
            return Err(Error::Unsupported {
                algorithm: generator.name().into(),
                collective: "any collective".into(),
                reason: format!(
                    "written for generator API v{}, topoccl-synth speaks v{GENERATOR_API_VERSION}",
                    generator.api_version()
                ),
            });
        }
        self.generators.retain(|g| g.name() != generator.name());
        self.generators.push(generator);
        Ok(())
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.generators.iter().map(|g| g.name()).collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn ScheduleGenerator> {
        self.generators.iter().map(|g| g.as_ref())
    }

    pub fn get(&self, name: &str) -> Result<&dyn ScheduleGenerator> {
        self.iter()
            .find(|g| g.name() == name)
            .ok_or_else(|| Error::UnknownAlgorithm(name.to_string(), self.names().join(", ")))
    }

    /// Generates with the named algorithm, checking that it supports the collective.
    pub fn generate(&self, name: &str, request: &Request) -> Result<Schedule> {
        let g = self.get(name)?;
        if !g.supports(request.collective) {
            return Err(unsupported(g.name(), request.collective, "not implemented by this algorithm"));
        }
        request
            .collective
            .check_root(request.topology.nranks())
            .map_err(|why| unsupported(g.name(), request.collective, &why))?;
        g.generate(request)
    }
}

pub(crate) fn unsupported(algorithm: &str, collective: Collective, reason: &str) -> Error {
    Error::Unsupported { algorithm: algorithm.into(), collective: collective.to_string(), reason: reason.into() }
}

/// Exhaustive search is used up to this many ranks; beyond, rank order is kept.
const RING_SEARCH_MAX: usize = 9;

/// A ring order over all ranks that maximises the slowest hop's bandwidth (then the sum), as
/// NCCL's ring search does: on a DGX-1 it follows NVLinks. Hops without a direct link are
/// priced at their routed path's bottleneck. Large topologies keep rank order, which the
/// library's files and families number so that neighbours are adjacent.
///
/// The search takes milliseconds where every hop is alike (an NVSwitch machine prunes nothing)
/// and every ring-based generator and closed form asks for it, so its answers are kept per
/// topology for the process.
pub fn ring_order(topo: &Topology) -> Vec<Rank> {
    let n = topo.nranks();
    if n <= 3 || n > RING_SEARCH_MAX {
        return (0..n as Rank).collect();
    }
    static FOUND: Mutex<Vec<(u64, Vec<Rank>)>> = Mutex::new(Vec::new());
    let found = || FOUND.lock().unwrap_or_else(PoisonError::into_inner);
    let fingerprint = topo.fingerprint();
    if let Some((_, order)) = found().iter().find(|(f, _)| *f == fingerprint) {
        return order.clone();
    }
    let order = searched_ring_order(topo);
    let mut kept = found();
    // A handful of topologies per process; a bound all the same.
    if kept.len() >= 64 {
        kept.clear();
    }
    kept.push((fingerprint, order.clone()));
    order
}

/// [`ring_order`]'s exhaustive search.
fn searched_ring_order(topo: &Topology) -> Vec<Rank> {
    let n = topo.nranks();
    let mut router = Router::new(topo);
    let mut bw = vec![vec![0.0f64; n]; n];
    for (a, row) in bw.iter_mut().enumerate() {
        for (b, cell) in row.iter_mut().enumerate() {
            if a != b {
                *cell = router.route(a as Rank, b as Rank).map_or(0.0, |r| r.bandwidth);
            }
        }
    }
    let mut best: (f64, f64, Vec<usize>) = (-1.0, -1.0, Vec::new());
    let mut path = vec![0usize];
    let mut used = vec![false; n];
    used[0] = true;
    search(&bw, &mut path, &mut used, f64::INFINITY, 0.0, &mut best);
    best.2.into_iter().map(|r| r as Rank).collect()
}

fn search(
    bw: &[Vec<f64>],
    path: &mut Vec<usize>,
    used: &mut [bool],
    min: f64,
    sum: f64,
    best: &mut (f64, f64, Vec<usize>),
) {
    let n = bw.len();
    let last = path[path.len() - 1];
    if path.len() == n {
        let close = bw[last][0];
        let (m, s) = (min.min(close), sum + close);
        if m > best.0 + 1e-9 || ((m - best.0).abs() <= 1e-9 && s > best.1 + 1e-9) {
            *best = (m, s, path.clone());
        }
        return;
    }
    for next in 1..n {
        if used[next] {
            continue;
        }
        let m = min.min(bw[last][next]);
        if m + 1e-9 < best.0 {
            continue; // cannot beat the best bottleneck
        }
        used[next] = true;
        path.push(next);
        search(bw, path, used, m, sum + bw[last][next], best);
        path.pop();
        used[next] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;

    #[test]
    fn a_root_outside_the_topology_is_refused_by_every_generator() {
        let t = resolve("ring:4").unwrap();
        let reg = Registry::builtin();
        for c in [Collective::Broadcast { root: 4 }, Collective::Reduce { root: 7 }] {
            for g in reg.iter().filter(|g| g.supports(c)) {
                assert!(reg.generate(g.name(), &Request::new(&t, c)).is_err(), "{}", g.name());
            }
        }
    }

    #[test]
    fn a_generator_for_another_interface_version_is_refused() {
        struct Future;
        impl ScheduleGenerator for Future {
            fn api_version(&self) -> u32 {
                GENERATOR_API_VERSION + 1
            }
            fn name(&self) -> &'static str {
                "future"
            }
            fn describe(&self) -> &'static str {
                "written for a later interface"
            }
            fn supports(&self, _: Collective) -> bool {
                true
            }
            fn generate(&self, request: &Request) -> Result<Schedule> {
                Registry::builtin().generate("ring", request)
            }
        }
        let mut reg = Registry::builtin();
        let e = reg.register(Box::new(Future)).unwrap_err().to_string();
        assert!(e.contains("generator API v3"), "{e}");
        assert!(reg.get("future").is_err());
    }

    #[test]
    fn dgx1_ring_uses_only_nvlinks() {
        let t = resolve("dgx1").unwrap();
        let order = ring_order(&t);
        assert_eq!(order.len(), 8);
        for i in 0..8 {
            let (a, b) = (order[i], order[(i + 1) % 8]);
            assert!(t.direct_bandwidth(a, b) >= 25.0, "{order:?}: {a}->{b}");
        }
    }

    #[test]
    fn registry_knows_its_generators() {
        let reg = Registry::builtin();
        assert!(reg.get("ring").is_ok());
        let err = reg.get("nope").err().unwrap().to_string();
        assert!(err.contains("ring") && err.contains("tree"), "{err}");
    }
}

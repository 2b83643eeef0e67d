//! The plug point of algorithms: a [`ScheduleGenerator`] builds the schedule IR for a
//! [`Request`] (a collective on a topology, with its pipelining and channel knobs), versioned
//! like NCCL's plugins ([`GENERATOR_API_VERSION`]). Generators depend on this module, never
//! the other way: the classic constructions (`crate::algorithms`), Blink, forest packing and
//! TACOS each implement it, and [`crate::registry`] names them.

use crate::error::{Error, Result};
use crate::schedule::{Collective, Schedule};
use crate::sim::lockstep::Lockstep;
use crate::topology::Topology;

/// Version of the [`ScheduleGenerator`] interface. Bumped when the trait or [`Request`] changes
/// incompatibly; [`Registry::register`](crate::registry::Registry::register) refuses a generator written for another.
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

/// A generator's refusal of `collective`, saying why.
pub(crate) fn unsupported(algorithm: &str, collective: Collective, reason: &str) -> Error {
    Error::Unsupported { algorithm: algorithm.into(), collective: collective.to_string(), reason: reason.into() }
}

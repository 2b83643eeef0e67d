//! The executor: one engine that runs any schedule of the IR (and grouped point-to-point
//! transfers) on real buffers over real connections. Nothing here knows which algorithm
//! produced the schedule, and nothing here touches a byte itself: local work goes through
//! [`ops::LocalOps`], data movement through the connections.

pub(crate) mod engine;
pub(crate) mod inflight;
pub(crate) mod job;
pub(crate) mod layout;
pub(crate) mod memory;
pub(crate) mod p2p;
pub(crate) mod plan;
pub(crate) mod program;
pub(crate) mod resident;
pub(crate) mod staged;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use topoccl_transports::Connection;

use crate::cuda::{Binding, CudaOps};
use crate::diag::Board;
use crate::ops::{CpuOps, LocalOps, Workspace};

/// How the executor runs: the settings every run shares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub slice_bytes: usize,
    pub max_backlog: usize,
    /// How long a run may go without progress before it fails. Never earlier (torch's and
    /// Gloo's timeouts mean the same): finding out why, with a board, comes after.
    pub timeout: Duration,
    /// More ranks share this host than it has cores: waiting ranks give their core away.
    pub oversubscribed: bool,
}

impl Settings {
    pub(crate) fn new(slice_bytes: usize, max_backlog: usize, timeout: Duration, oversubscribed: bool) -> Settings {
        Settings { slice_bytes, max_backlog, timeout, oversubscribed }
    }

    /// The configuration of one run of the engine.
    pub(crate) fn run<'a>(
        &self,
        rank: u32,
        abort: &'a AtomicBool,
        dtype: crate::types::Dtype,
        op: crate::types::ReduceOp,
        call: Option<crate::wire::CallHeader>,
        board: Option<&'a Board>,
    ) -> engine::RunConfig<'a> {
        engine::RunConfig {
            rank,
            dtype,
            op,
            slice_bytes: self.slice_bytes,
            max_backlog: self.max_backlog,
            timeout: self.timeout,
            abort,
            call,
            oversubscribed: self.oversubscribed,
            board,
        }
    }
}

/// The local operations of one memory space, and the memory the executor keeps in that space
/// between calls.
#[derive(Default)]
pub(crate) struct Space<O> {
    pub ops: O,
    scratch: Option<Workspace>,
    /// Where an input is staged (padded, scaled, or apart from an overlapping output), and a
    /// padded output: kept and grown, never made per call (freeing device memory synchronises
    /// the whole context).
    stage_in: Option<Workspace>,
    stage_out: Option<Workspace>,
    /// Slices receive-reduce-send steps reduce into and send on from.
    forward: Vec<Workspace>,
    /// Host slices payloads are staged into for connections that cannot reach this space.
    staging: Vec<Workspace>,
}

impl<O: LocalOps> Space<O> {
    pub(crate) fn new(ops: O) -> Space<O> {
        Space { ops, scratch: None, stage_in: None, stage_out: None, forward: Vec::new(), staging: Vec::new() }
    }

    /// The space with its operations as a trait object: what a run works with.
    fn as_dyn(&mut self) -> SpaceRef<'_> {
        SpaceRef {
            ops: &mut self.ops,
            scratch: &mut self.scratch,
            stage_in: &mut self.stage_in,
            stage_out: &mut self.stage_out,
            forward: &mut self.forward,
            staging: &mut self.staging,
        }
    }
}

/// A [`Space`] borrowed for one run.
pub(crate) struct SpaceRef<'s> {
    ops: &'s mut dyn LocalOps,
    scratch: &'s mut Option<Workspace>,
    stage_in: &'s mut Option<Workspace>,
    stage_out: &'s mut Option<Workspace>,
    forward: &'s mut Vec<Workspace>,
    staging: &'s mut Vec<Workspace>,
}

/// The device a communicator has run calls on: its binding (context and completion word) and
/// the operations on its memory.
pub(crate) struct DeviceSide {
    /// Dropped first: its stream drains before the binding's completion word can go.
    space: Space<CudaOps>,
    binding: Arc<Binding>,
}

/// One rank's executor: its connections, the local operations of each memory space its calls
/// use and the workspaces it keeps between calls.
pub(crate) struct Executor {
    pub rank: u32,
    pub nranks: u32,
    /// A connection per rank (`None` for this rank).
    pub links: Vec<Option<Box<dyn Connection>>>,
    pub settings: Settings,
    /// Set from any thread: the running call fails with `Aborted` within milliseconds.
    pub abort: Arc<AtomicBool>,
    /// Where this rank's progress is published for its peers (none in a bare executor).
    pub board: Option<Arc<Board>>,
    host: Space<CpuOps>,
    /// Made by the first call on device memory.
    device: Option<DeviceSide>,
    /// The point-to-point streams' message numbers, as their calls run.
    p2p: p2p::Counters,
}

impl Executor {
    pub(crate) fn new(
        rank: u32,
        links: Vec<Option<Box<dyn Connection>>>,
        settings: Settings,
        abort: Arc<AtomicBool>,
    ) -> Executor {
        let nranks = links.len() as u32;
        Executor {
            rank,
            nranks,
            links,
            settings,
            abort,
            board: None,
            host: Space::default(),
            device: None,
            p2p: p2p::Counters::default(),
        }
    }

    /// Closes every connection: peers see this rank gone, and no connection reads the memory
    /// of an unfinished send any more.
    pub(crate) fn close_links(&mut self) {
        for l in self.links.iter_mut().flatten() {
            l.close();
        }
    }

    /// The transport to each rank (`None` for this rank).
    pub(crate) fn transports(&self) -> Vec<Option<&'static str>> {
        self.links.iter().map(|l| l.as_ref().map(|c| c.transport())).collect()
    }
}

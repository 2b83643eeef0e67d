//! The byte-level API: buffers as bytes with an explicit [`Dtype`], for callers that choose the
//! datatype at run time (the C ABI, `collbench`). Same semantics and checks as the typed API.

use topoccl_synth::schedule::Collective;

use super::collective::{Buffers, Call};
use super::Communicator;
use crate::error::{Error, Result};
use crate::exec::wire::CallKind;
use crate::types::{Dtype, ReduceOp};

/// NCCL's collectives, as the byte-level API names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    AllToAll,
}

impl CollectiveKind {
    pub const ALL: [CollectiveKind; 6] = [
        CollectiveKind::AllReduce,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllGather,
        CollectiveKind::Broadcast,
        CollectiveKind::Reduce,
        CollectiveKind::AllToAll,
    ];

    /// `all_reduce`, `reduce_scatter`, …
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Reduce => "reduce",
            CollectiveKind::AllToAll => "all_to_all",
        }
    }

    /// Whether elements are combined with a [`ReduceOp`].
    pub fn reduces(self) -> bool {
        matches!(self, CollectiveKind::AllReduce | CollectiveKind::ReduceScatter | CollectiveKind::Reduce)
    }

    /// Whether a root rank takes part specially.
    pub fn rooted(self) -> bool {
        matches!(self, CollectiveKind::Broadcast | CollectiveKind::Reduce)
    }

    /// Blocks of `count` elements in the send and the receive buffer, with `n` ranks.
    pub fn blocks(self, n: usize) -> (usize, usize) {
        match self {
            CollectiveKind::ReduceScatter => (n, 1),
            CollectiveKind::AllGather => (1, n),
            CollectiveKind::AllToAll => (n, n),
            _ => (1, 1),
        }
    }

    /// The synthesizer's name for this collective (its schedules are built for it).
    pub fn collective(self, root: u32) -> Collective {
        match self {
            CollectiveKind::AllReduce => Collective::AllReduce,
            CollectiveKind::ReduceScatter => Collective::ReduceScatter,
            CollectiveKind::AllGather => Collective::AllGather,
            CollectiveKind::Broadcast => Collective::Broadcast { root },
            CollectiveKind::Reduce => Collective::Reduce { root },
            CollectiveKind::AllToAll => Collective::AllToAll,
        }
    }

    pub(crate) fn wire(self) -> CallKind {
        match self {
            CollectiveKind::AllReduce => CallKind::AllReduce,
            CollectiveKind::ReduceScatter => CallKind::ReduceScatter,
            CollectiveKind::AllGather => CallKind::AllGather,
            CollectiveKind::Broadcast => CallKind::Broadcast,
            CollectiveKind::Reduce => CallKind::Reduce,
            CollectiveKind::AllToAll => CallKind::AllToAll,
        }
    }
}

impl std::str::FromStr for CollectiveKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<CollectiveKind> {
        let s = s.trim().to_ascii_lowercase().replace('-', "_");
        let alias = match s.as_str() {
            "allreduce" => "all_reduce",
            "reducescatter" => "reduce_scatter",
            "allgather" => "all_gather",
            "alltoall" => "all_to_all",
            "bcast" => "broadcast",
            other => other,
        };
        CollectiveKind::ALL.into_iter().find(|k| k.name() == alias).ok_or_else(|| {
            let names: Vec<_> = CollectiveKind::ALL.iter().map(|k| k.name()).collect();
            Error::InvalidArgument(format!("unknown collective `{s}` ({})", names.join(", ")))
        })
    }
}

impl std::fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One collective call at the byte level. `count` is NCCL's: elements per block (per rank for
/// reduce-scatter's output, all-gather's input and each peer's part of all-to-all); `op` is
/// ignored where nothing is reduced, `root` where there is no root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveCall {
    pub kind: CollectiveKind,
    pub dtype: Dtype,
    pub op: ReduceOp,
    pub root: u32,
    pub count: usize,
}

impl CollectiveCall {
    fn call(&self) -> Call {
        Call { kind: self.kind.wire(), dtype: self.dtype, op: self.op, root: self.root, count: self.count }
    }
}

impl Communicator {
    /// Runs `call` from `send` into `recv` (lengths as the typed API requires, in bytes;
    /// buffers only a root uses may be empty on other ranks).
    pub fn collective_bytes(&mut self, call: &CollectiveCall, send: &[u8], recv: &mut [u8]) -> Result<()> {
        self.collective(call.call(), Buffers::Separate { input: send, output: recv })
    }

    /// Runs `call` in place, aliased as NCCL aliases in-place calls.
    pub fn collective_bytes_in_place(&mut self, call: &CollectiveCall, buf: &mut [u8]) -> Result<()> {
        self.collective(call.call(), Buffers::InPlace(buf))
    }
}

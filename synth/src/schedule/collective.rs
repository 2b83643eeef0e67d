//! [`Collective`]: what a schedule computes, with the facts every layer asks of it (its
//! buffers' sizes in blocks, which ranks read input or write output, its root).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Rank;

/// The collective a schedule computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast { root: Rank },
    Reduce { root: Rank },
    AllToAll,
}

impl Collective {
    /// All collectives, with root 0 where there is one.
    pub const ALL: [Collective; 6] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: 0 },
        Collective::Reduce { root: 0 },
        Collective::AllToAll,
    ];

    /// The nccl-tests style name (`all_reduce`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::Broadcast { .. } => "broadcast",
            Collective::Reduce { .. } => "reduce",
            Collective::AllToAll => "all_to_all",
        }
    }

    /// Parses a name, giving rooted collectives `root`.
    pub fn parse(name: &str, root: Rank) -> Option<Collective> {
        Some(match name.replace('-', "_").as_str() {
            "all_reduce" | "allreduce" => Collective::AllReduce,
            "reduce_scatter" | "reducescatter" => Collective::ReduceScatter,
            "all_gather" | "allgather" => Collective::AllGather,
            "broadcast" | "bcast" => Collective::Broadcast { root },
            "reduce" => Collective::Reduce { root },
            "all_to_all" | "alltoall" => Collective::AllToAll,
            _ => return None,
        })
    }

    pub fn root(&self) -> Option<Rank> {
        match *self {
            Collective::Broadcast { root } | Collective::Reduce { root } => Some(root),
            _ => None,
        }
    }

    /// Checks that the root, if the collective has one, is one of `nranks` ranks (generators
    /// index by it): the one root check, asked where a collective comes in from a user — a
    /// call, and the tuner's public API. The error is the message for the user.
    pub fn check_root(&self, nranks: usize) -> std::result::Result<(), String> {
        match self.root() {
            Some(root) if root as usize >= nranks => Err(format!("root {root} is out of range for {nranks} ranks")),
            _ => Ok(()),
        }
    }

    /// Whether the collective combines values (needs a reduction operator).
    pub fn reduces(&self) -> bool {
        matches!(self, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce { .. })
    }

    /// Whether one rank, the root, takes part specially.
    pub fn rooted(&self) -> bool {
        self.root().is_some()
    }

    /// The same collective with root `root` (rootless collectives are unchanged).
    pub fn with_root(self, root: Rank) -> Collective {
        match self {
            Collective::Broadcast { .. } => Collective::Broadcast { root },
            Collective::Reduce { .. } => Collective::Reduce { root },
            other => other,
        }
    }

    /// Blocks of NCCL's `count` elements in each rank's input and output buffer: `nranks` on
    /// the side that holds every rank's part (reduce-scatter's input, all-gather's output, both
    /// sides of all-to-all), one elsewhere.
    pub fn blocks(&self, nranks: u32) -> (usize, usize) {
        let n = nranks as usize;
        match self {
            Collective::ReduceScatter => (n, 1),
            Collective::AllGather => (1, n),
            Collective::AllToAll => (n, n),
            _ => (1, 1),
        }
    }

    /// Whether `rank` reads its input buffer (broadcast: the root only).
    pub fn uses_input(&self, rank: Rank) -> bool {
        !matches!(*self, Collective::Broadcast { root } if root != rank)
    }

    /// Whether `rank` writes its output buffer (reduce: the root only).
    pub fn uses_output(&self, rank: Rank) -> bool {
        !matches!(*self, Collective::Reduce { root } if root != rank)
    }

    /// The chunk count must be a multiple of this.
    pub fn chunk_multiple(&self, nranks: u32) -> u32 {
        match self {
            Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll => nranks,
            _ => 1,
        }
    }

    /// Chunks in each rank's input buffer.
    pub fn input_chunks(&self, nranks: u32, chunks: u32) -> u32 {
        match self {
            Collective::AllGather => chunks / nranks.max(1),
            _ => chunks,
        }
    }

    /// Chunks in each rank's output buffer.
    pub fn output_chunks(&self, nranks: u32, chunks: u32) -> u32 {
        match self {
            Collective::ReduceScatter => chunks / nranks.max(1),
            _ => chunks,
        }
    }

    /// nccl-tests' bus-bandwidth factor: busbw = algbw × factor.
    pub fn bus_factor(&self, nranks: u32) -> f64 {
        let n = f64::from(nranks.max(1));
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll => (n - 1.0) / n,
            Collective::Broadcast { .. } | Collective::Reduce { .. } => 1.0,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.root() {
            Some(root) => write!(f, "{}(root {root})", self.name()),
            None => f.write_str(self.name()),
        }
    }
}

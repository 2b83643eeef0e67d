//! The one error type of the core crate; the C ABI maps each variant onto an `ncclResult_t`.

/// Errors of the core crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Topology, schedule, verification or simulation failures.
    #[error(transparent)]
    Synth(#[from] topoccl_synth::Error),
    /// An argument a caller can fix (bad size string, wrong buffer length, rank out of range, …).
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// Ranks could not find each other (root unreachable, inconsistent ranks, bad environment).
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// A transport failed talking to `peer`.
    #[error("transport error with rank {peer}: {source}")]
    Transport { peer: u32, source: topoccl_transports::Error },
    /// A peer went away (its process died, or it aborted or failed).
    #[error("rank {peer} failed or exited: {reason}")]
    PeerFailed { peer: u32, reason: String },
    /// Nothing moved for the whole deadline.
    #[error("rank {rank}: {call} made no progress for {secs:.1} s (TOPOCCL_TIMEOUT): {waiting}")]
    Timeout { rank: u32, secs: f64, call: String, waiting: String },
    /// Ranks called different things.
    #[error("rank {rank} ran {ours}, but rank {peer} ran {theirs}")]
    Mismatch { rank: u32, peer: u32, theirs: String, ours: String },
    /// `abort()` was called.
    #[error("the communicator was aborted")]
    Aborted,
    /// An earlier call failed; the communicator cannot be used any more.
    #[error("the communicator is unusable after an earlier error: {0}")]
    Broken(String),
    /// A broken invariant inside topoccl (a bug): reported, never a panic.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { context: context.into(), source }
    }
}

//! The one error type of the core crate; the C ABI maps each variant onto an `ncclResult_t`.

use serde::{Deserialize, Serialize};

/// What one rank found (or was told) made a call fail: the ranks at fault and why (the
/// diagnosis's conclusion, `crate::diag`, carried by [`Error::Fault`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The ranks at fault (one, usually; several that wait on each other in a cycle).
    pub culprits: Vec<u32>,
    /// What happened, with the chain of waits that led to it.
    pub text: String,
    /// The rank that found this out.
    pub found_by: u32,
    /// The cause is a rank that stopped making progress (idle, hung, stopped, a cycle of
    /// waits), not one that failed or a broken link: every rank reports a timeout for it, as
    /// the ranks whose own deadline ran out do.
    #[serde(default)]
    pub stalled: bool,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

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
    #[error("rank {rank}: {call} timed out: no progress for {secs:.1} s (TOPOCCL_TIMEOUT): {waiting}")]
    Timeout { rank: u32, secs: f64, call: String, waiting: String },
    /// Ranks called different things.
    #[error("rank {rank} ran {ours}, but rank {peer} ran {theirs}")]
    Mismatch { rank: u32, peer: u32, theirs: String, ours: String },
    /// A call failed because of another rank: `cause` is what the ranks found out by asking
    /// each other (on a channel apart from the data path), `seen` what this rank saw.
    #[error("{cause} [rank {rank} saw: {seen}]")]
    Fault { rank: u32, cause: Verdict, seen: Box<Error> },
    /// `abort()` was called.
    #[error("the communicator was aborted")]
    Aborted,
    /// An earlier call failed; the communicator cannot be used any more.
    #[error("the communicator is unusable after an earlier error: {0}")]
    Broken(String),
    /// The CUDA driver is missing, lacks something, or failed a call (named in the message).
    #[error("CUDA: {0}")]
    Cuda(String),
    /// Topology detection cannot ask NVML here: no library, a missing entry point, or
    /// `nvmlInit` failed (no driver loaded). Callers fall back to the host model.
    #[error("no NVML: {0}")]
    NoNvml(String),
    /// NVML failed a call during topology detection (named in the message).
    #[error("NVML: {0}")]
    Nvml(String),
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

impl Error {
    /// The ranks a failure was traced to, when it was (see [`Error::Fault`]).
    pub fn culprits(&self) -> &[u32] {
        match self {
            Error::Fault { cause, .. } => &cause.culprits,
            _ => &[],
        }
    }

    /// What this rank itself saw: the error under a [`Error::Fault`]'s cause, else itself.
    pub fn seen(&self) -> &Error {
        match self {
            Error::Fault { seen, .. } => seen.seen(),
            e => e,
        }
    }
}

impl Clone for Error {
    /// The same error (one failure reported to several waiters); an I/O source keeps its kind
    /// and message.
    fn clone(&self) -> Error {
        match self {
            Error::Synth(e) => Error::Synth(e.clone()),
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::Io { context, source } => {
                Error::Io { context: context.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
            }
            Error::Bootstrap(m) => Error::Bootstrap(m.clone()),
            Error::Transport { peer, source } => Error::Transport { peer: *peer, source: source.clone() },
            Error::PeerFailed { peer, reason } => Error::PeerFailed { peer: *peer, reason: reason.clone() },
            Error::Timeout { rank, secs, call, waiting } => {
                Error::Timeout { rank: *rank, secs: *secs, call: call.clone(), waiting: waiting.clone() }
            }
            Error::Mismatch { rank, peer, theirs, ours } => {
                Error::Mismatch { rank: *rank, peer: *peer, theirs: theirs.clone(), ours: ours.clone() }
            }
            Error::Fault { rank, cause, seen } => {
                Error::Fault { rank: *rank, cause: cause.clone(), seen: seen.clone() }
            }
            Error::Aborted => Error::Aborted,
            Error::Broken(m) => Error::Broken(m.clone()),
            Error::Cuda(m) => Error::Cuda(m.clone()),
            Error::NoNvml(m) => Error::NoNvml(m.clone()),
            Error::Nvml(m) => Error::Nvml(m.clone()),
            Error::Internal(m) => Error::Internal(m.clone()),
        }
    }
}

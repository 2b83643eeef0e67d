//! The C ABI's one error type, and its one-to-one mapping onto `ncclResult_t`.

use std::ffi::{c_int, CStr};

use crate::abi::*;

/// Why a C entry point failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From the core library (a collective, the bootstrap, a transport, …).
    #[error(transparent)]
    Core(#[from] topoccl::Error),
    /// A NULL pointer, an unknown enum value, a count or rank out of range.
    #[error("{0}")]
    InvalidArgument(String),
    /// A call in the wrong state, or one whose meaning needs hardware this build lacks.
    #[error("{0}")]
    InvalidUsage(String),
    /// A remote rank failed while this one waited on it (a split or an init it takes part in).
    #[error("{0}")]
    Remote(String),
    /// The operating system or the network failed (a socket, a thread, memory).
    #[error("{0}")]
    System(String),
    /// A call or an init ran past its deadline (`TOPOCCL_TIMEOUT`).
    #[error("{0}")]
    Timeout(String),
    /// A panic caught at the boundary: a topoccl bug, reported instead of unwinding into C.
    #[error("internal error: {0}")]
    Panic(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The `ncclResult_t` a C caller sees.
    pub fn code(&self) -> ncclResult_t {
        match self {
            Error::Core(e) => core_code(e),
            Error::InvalidArgument(_) => NCCL_INVALID_ARGUMENT,
            Error::InvalidUsage(_) => NCCL_INVALID_USAGE,
            Error::Remote(_) => NCCL_REMOTE_ERROR,
            Error::System(_) => NCCL_SYSTEM_ERROR,
            Error::Timeout(_) => NCCL_TIMEOUT,
            Error::Panic(_) => NCCL_INTERNAL_ERROR,
        }
    }

    /// An error with this code and `message` (to report one failure in two places).
    pub fn with_code(code: ncclResult_t, message: String) -> Error {
        match code {
            NCCL_INVALID_ARGUMENT => Error::InvalidArgument(message),
            NCCL_REMOTE_ERROR => Error::Remote(message),
            NCCL_SYSTEM_ERROR => Error::System(message),
            NCCL_INTERNAL_ERROR => Error::Panic(message),
            NCCL_TIMEOUT => Error::Timeout(message),
            NCCL_UNHANDLED_CUDA_ERROR => Error::Core(topoccl::Error::Cuda(message)),
            _ => Error::InvalidUsage(message),
        }
    }
}

impl Clone for Error {
    /// The same code and message.
    fn clone(&self) -> Error {
        Error::with_code(self.code(), self.to_string())
    }
}

pub fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

pub fn usage(msg: impl Into<String>) -> Error {
    Error::InvalidUsage(msg.into())
}

/// Each core error variant's code (no wildcard: a new variant must be mapped here).
fn core_code(e: &topoccl::Error) -> ncclResult_t {
    use topoccl::Error as E;
    match e {
        // A topology or schedule the settings named cannot be built or run.
        E::Synth(_) => NCCL_INVALID_USAGE,
        E::InvalidArgument(_) => NCCL_INVALID_ARGUMENT,
        E::Io { .. } => NCCL_SYSTEM_ERROR,
        E::Bootstrap(_) => NCCL_SYSTEM_ERROR,
        E::Transport { .. } => NCCL_SYSTEM_ERROR,
        E::PeerFailed { .. } => NCCL_REMOTE_ERROR,
        E::Timeout { .. } => NCCL_TIMEOUT,
        // A rank that stopped making progress is a timeout on every rank (torch's and Gloo's
        // meaning: each rank's call timed out), whatever this rank saw of it (a peer that gave
        // up first); otherwise what this rank saw decides (a dead peer: remote).
        E::Fault { cause, .. } if cause.stalled => NCCL_TIMEOUT,
        E::Fault { seen, .. } => core_code(seen),
        E::Mismatch { .. } => NCCL_INVALID_USAGE,
        E::Aborted => NCCL_INVALID_USAGE,
        E::Broken(_) => NCCL_INVALID_USAGE,
        E::Cuda(_) => NCCL_UNHANDLED_CUDA_ERROR,
        // Detection falls back to the host model; an error reaches a caller only if asked for.
        E::NoNvml(_) | E::Nvml(_) => NCCL_SYSTEM_ERROR,
        E::Internal(_) => NCCL_INTERNAL_ERROR,
    }
}

/// `ncclGetErrorString`: NCCL's wording.
pub fn describe(code: c_int) -> &'static CStr {
    match code {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the topoccl developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        NCCL_TIMEOUT => c"operation timed out (see TOPOCCL_TIMEOUT; the error names the rank at fault)",
        _ => c"unknown result code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that stalled is a timeout on every rank, also on one that saw another peer give
    /// up first (torch matches "Timed out"); a dead peer stays a remote error.
    #[test]
    fn a_stalled_rank_is_a_timeout_everywhere() {
        let fault = |stalled: bool| {
            let cause = topoccl::Verdict { culprits: vec![3], text: "rank 3 ...".into(), found_by: 1, stalled };
            let seen = topoccl::Error::PeerFailed { peer: 1, reason: "it found the job broken".into() };
            Error::Core(topoccl::Error::Fault { rank: 0, cause, seen: Box::new(seen) })
        };
        assert_eq!(fault(true).code(), NCCL_TIMEOUT);
        assert_eq!(fault(false).code(), NCCL_REMOTE_ERROR);
    }

    #[test]
    fn every_code_has_its_own_words() {
        let words: Vec<_> = (0..NCCL_NUM_RESULTS).map(describe).collect();
        for (i, w) in words.iter().enumerate() {
            assert!(!words[i + 1..].contains(w), "{w:?}");
        }
        assert_eq!(describe(99), c"unknown result code");
        assert_eq!(Error::Core(topoccl::Error::Aborted).code(), NCCL_INVALID_USAGE);
        assert_eq!(invalid("x").code(), NCCL_INVALID_ARGUMENT);
    }
}

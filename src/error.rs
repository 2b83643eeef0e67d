//! The one error type of the core crate; the C ABI maps each variant onto an `ncclResult_t`.

/// Errors of the core crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Topology, schedule, verification or simulation failures.
    #[error(transparent)]
    Synth(#[from] topoccl_synth::Error),
    /// An argument a caller can fix (bad size string, unknown datatype, …).
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

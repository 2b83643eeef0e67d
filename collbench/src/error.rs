//! The one error type of the tools crate.

/// Errors of `collbench` and the emulator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From the library (a collective, the bootstrap, a transport, …).
    #[error(transparent)]
    Core(#[from] topoccl::Error),
    /// Topology, schedule, verification or simulation failures.
    #[error(transparent)]
    Synth(#[from] topoccl_synth::Error),
    /// A flag or value the user can fix.
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// Setting up or tearing down an emulated network (namespaces, veths, tc) failed.
    #[error("emulation: {0}")]
    Emulation(String),
    /// A broken invariant inside the tools (a bug): reported, never a panic.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { context: context.into(), source }
    }
}

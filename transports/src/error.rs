//! The one error type of the transports crate.

use std::io;

/// Transport failures. The core crate wraps these, naming the rank involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    /// The peer closed the connection or its process went away.
    #[error("the peer closed the connection ({0})")]
    PeerClosed(String),
    /// Bytes that do not follow the wire protocol (a foreign program, a version mismatch).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A request the transport cannot serve (message too large, shared memory unavailable, …).
    #[error("{0}")]
    Unsupported(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io { context: context.into(), source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Clone for Error {
    /// The same error; an I/O source keeps its kind and message (`io::Error` is not `Clone`).
    fn clone(&self) -> Error {
        match self {
            Error::Io { context, source } => {
                Error::Io { context: context.clone(), source: io::Error::new(source.kind(), source.to_string()) }
            }
            Error::PeerClosed(m) => Error::PeerClosed(m.clone()),
            Error::Protocol(m) => Error::Protocol(m.clone()),
            Error::Unsupported(m) => Error::Unsupported(m.clone()),
        }
    }
}

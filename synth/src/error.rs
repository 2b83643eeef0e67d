//! The one error type of `topoccl-synth`.

use std::path::PathBuf;

/// Everything that can go wrong while reading a topology, generating, verifying or simulating a
/// schedule. Messages are written for the person who typed the input.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A topology file that cannot be read or is not valid; `line` is 1-based, 0 if unknown.
    #[error("{}:{line}: {message}", file.display())]
    TopologyFile { file: PathBuf, line: usize, message: String },
    /// A topology that is structurally unusable (e.g. ranks that cannot reach each other).
    #[error("invalid topology `{name}`: {message}")]
    InvalidTopology { name: String, message: String },
    /// A topology name that is neither a built-in machine, a family nor a readable file.
    #[error("unknown topology `{0}` (built-in: {1}; families: ring:N, full:N, mesh2d:AxB, torus2d:AxB, torus3d:AxBxC, hypercube:N, cluster:NxM; or a path to a .toml file or an NCCL topology .xml)")]
    UnknownTopology(String, String),
    /// An algorithm name nobody registered.
    #[error("unknown algorithm `{0}` (known: {1})")]
    UnknownAlgorithm(String, String),
    /// An algorithm asked for a collective or a topology it cannot serve.
    #[error("algorithm `{algorithm}` cannot build {collective}: {reason}")]
    Unsupported { algorithm: String, collective: String, reason: String },
    /// A schedule that is malformed (bad rank, chunk or step reference) before any execution.
    #[error("malformed schedule: {0}")]
    MalformedSchedule(String),
    /// The verifier found that a schedule does not compute its collective.
    #[error("schedule `{schedule}` is wrong: {message}")]
    Verification { schedule: String, message: String },
    /// A schedule whose steps can never all run (found by the verifier or the simulator).
    #[error("schedule `{schedule}` deadlocks: {message}")]
    Deadlock { schedule: String, message: String },
    /// A schedule that was built for another rank count than the topology has.
    #[error("schedule has {schedule} ranks but topology `{topology}` has {ranks}")]
    RankMismatch { schedule: u32, topology: String, ranks: usize },
    /// Serialising or parsing a schedule document.
    #[error("schedule document: {0}")]
    Format(String),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An I/O error with the same kind and message (`std::io::Error` is not `Clone`).
fn copy_io(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}

impl Clone for Error {
    /// The same error; an I/O source keeps its kind and message.
    fn clone(&self) -> Error {
        match self {
            Error::TopologyFile { file, line, message } => {
                Error::TopologyFile { file: file.clone(), line: *line, message: message.clone() }
            }
            Error::InvalidTopology { name, message } => {
                Error::InvalidTopology { name: name.clone(), message: message.clone() }
            }
            Error::UnknownTopology(a, b) => Error::UnknownTopology(a.clone(), b.clone()),
            Error::UnknownAlgorithm(a, b) => Error::UnknownAlgorithm(a.clone(), b.clone()),
            Error::Unsupported { algorithm, collective, reason } => Error::Unsupported {
                algorithm: algorithm.clone(),
                collective: collective.clone(),
                reason: reason.clone(),
            },
            Error::MalformedSchedule(m) => Error::MalformedSchedule(m.clone()),
            Error::Verification { schedule, message } => {
                Error::Verification { schedule: schedule.clone(), message: message.clone() }
            }
            Error::Deadlock { schedule, message } => {
                Error::Deadlock { schedule: schedule.clone(), message: message.clone() }
            }
            Error::RankMismatch { schedule, topology, ranks } => {
                Error::RankMismatch { schedule: *schedule, topology: topology.clone(), ranks: *ranks }
            }
            Error::Format(m) => Error::Format(m.clone()),
            Error::Io { path, source } => Error::Io { path: path.clone(), source: copy_io(source) },
        }
    }
}

//! # topoccl
//!
//! A collective communication library that chooses — and synthesizes — its algorithms from the
//! topology it runs on. This crate is the core: datatypes and operators, and `collbench`, the
//! nccl-tests-style sweep. Topology reasoning, the schedule IR, the algorithms, the verifier and
//! the simulator live in [`synth`] (`topoccl-synth`); transports and the executor follow.

pub mod collbench;
pub mod comm;
pub mod emu;
pub mod error;
mod exec;
pub mod tuner;
pub mod types;

pub use comm::{AbortHandle, CollectiveCall, CollectiveKind, Communicator, Config, Group, TransportPolicy, UniqueId};
pub use error::{Error, Result};
pub use topoccl_synth as synth;
pub use topoccl_transports as transports;
pub use types::{DataType, Dtype, ReduceOp};

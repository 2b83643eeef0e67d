//! # topoccl
//!
//! A collective communication library that chooses — and synthesizes — its algorithms from the
//! topology it runs on. This crate is the core: datatypes and operators, and `collbench`, the
//! nccl-tests-style sweep. Topology reasoning, the schedule IR, the algorithms, the verifier and
//! the simulator live in [`synth`] (`topoccl-synth`); transports and the executor follow.

pub mod collbench;
pub mod error;
pub mod types;

pub use error::{Error, Result};
pub use topoccl_synth as synth;
pub use types::{DataType, ReduceOp};

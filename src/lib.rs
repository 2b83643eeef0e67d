//! # topoccl
//!
//! A collective communication library that chooses — and synthesizes — its algorithms from the
//! topology it runs on. This crate is the library: communicators, the executor, the tuner,
//! datatypes and operators. Topology reasoning, the schedule IR, the algorithms, the verifier
//! and the simulator live in [`synth`] (`topoccl-synth`); moving bytes between ranks in
//! [`transports`] (`topoccl-transports`). The tools (`collbench`, the network emulator) are a
//! crate of their own beside this one.

pub mod buffer;
mod call;
pub mod comm;
pub mod cuda;
pub mod detect;
mod diag;
pub mod env;
pub mod error;
mod exec;
pub mod fp8;
mod greet;
pub mod ops;
// The fuzz harnesses (fuzz/): compiled only by cargo-fuzz, never into the library.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
pub mod tuner;
pub mod types;
mod wire;

pub use buffer::{Buffer, MemSpace, Region};
pub use comm::{
    AbortHandle, CollectiveCall, Communicator, Config, Group, Health, Lane, Pending, Source, TransportPolicy, UniqueId,
    Work,
};
pub use error::Verdict;
pub use error::{Error, Result};
pub use exec::p2p::MAX_TAG;
pub use topoccl_synth as synth;
pub use topoccl_synth::schedule::Collective;
pub use topoccl_transports as transports;
pub use types::{Dtype, Element, ReduceOp, Reduction, Scalar};

//! A stand-in `libibverbs.so.1` with an emulated RC NIC per process, for testing topoccl's RDMA
//! verbs transport on machines without a NIC: a test tool, never shipped. See README.md for
//! the rules it enforces, the knobs, and what it cannot show.
//!
//! Each process is one node of a single emulated fabric spanning the machine (abstract Unix
//! sockets between processes, `nic`). Its NIC threads move the bytes: the requester reads the
//! source lazily from its own memory (`engine`), the responder places them into its own memory
//! (`responder`), so RDMA writes land without the target calling verbs at all.
//!
//! The rlib exposes the same `extern "C"` functions (`exports`) for Rust tests, and
//! [`stats`] for what the NIC did.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
pub mod cq;
pub mod device;
pub mod engine;
pub mod exports;
pub mod memio;
pub mod modify;
pub mod mr;
pub mod nic;
pub mod ops;
pub mod qp;
pub mod registry;
pub mod responder;
pub mod util;
pub mod wire;

/// rdma-core 44's declarations, shared with the transport.
pub use topoccl_transports::verbs::sys;

pub use exports::*;
pub use util::{stats, Stats};

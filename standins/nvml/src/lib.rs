//! A stand-in NVML (`libnvidia-ml.so.1`) for testing topoccl's topology detection without a
//! GPU: a test tool, never shipped. It exports the NVML functions detection calls and answers
//! as the machine `TOPOCCL_STANDIN_NVML_MACHINE` describes (a shipped DGX-1, DGX A100 or
//! DGX H100, or a machine file), enforcing NVML's argument rules. See README.md for the rules,
//! the knobs and what it cannot show.
//!
//! The rlib exposes the same `extern "C"` functions (`exports`) for Rust tests.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod error;
pub mod exports;
pub mod machine;
pub mod state;
pub mod sys;

pub use exports::*;

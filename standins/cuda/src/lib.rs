//! A stand-in CUDA driver (`libcuda.so.1`) for testing topoccl's GPU path without a GPU: a
//! test tool, never shipped. It exports the driver API functions topoccl and its C tests call
//! and behaves like the real driver where bugs hide: asynchronous streams, per-thread
//! contexts, sticky errors, IPC rules, bounds. Kernels run host-compiled (see
//! `topoccl-kernels-host`). See README.md for the rules and what it cannot show.
//!
//! The rlib exposes the same `extern "C"` functions (`exports`) for Rust tests.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod attributes;
pub mod capture;
pub mod config;
pub mod context;
pub mod copy;
pub mod device;
pub mod error;
pub mod event;
pub mod exports;
mod handle;
pub mod hwqueue;
pub mod image;
pub mod ipc;
pub mod launch;
pub mod mapping;
pub mod memop;
pub mod memory;
pub mod module;
pub mod stream;
mod sync;
pub mod sys;

pub use exports::*;

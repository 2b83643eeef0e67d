//! # topoccl-ffi: NCCL's C API over topoccl
//!
//! Builds `libnccl.so` with the soname `libnccl.so.2` and the header `include/nccl.h` (NCCL
//! 2.21.5's API, values and layouts): a program written against NVIDIA's `nccl.h` compiles
//! against ours and runs with `LD_LIBRARY_PATH` pointing at our library instead of NCCL's.
//!
//! Without CUDA, buffers are host memory, `stream` must be NULL, and every call has completed
//! when it returns (or at the outermost `ncclGroupEnd`). No panic and no Rust error crosses the
//! boundary: each entry point returns an `ncclResult_t`, and `ncclGetLastError` says why.
//!
//! Layout: [`abi`] (C types and values), [`error`] (the error type and its codes),
//! `raw` (every pointer conversion), `handle` (what an `ncclComm_t` is), `group`
//! (`ncclGroupStart`/`End`), `call` (running collectives and point-to-point transfers),
//! `settings` (NCCL's variables and `ncclConfig_t`), `log` (`NCCL_DEBUG`), and
//! [`api`], the exported functions.

pub mod abi;
pub mod api;
mod call;
pub mod error;
mod group;
mod handle;
mod log;
mod raw;
mod settings;

pub use api::*;

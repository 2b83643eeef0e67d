//! # topoccl-ffi: NCCL's C API over topoccl
//!
//! Builds `libnccl.so` with the soname `libnccl.so.2` and the header `include/nccl.h` (NCCL
//! 2.30.7's API, values and layouts, and exactly its export list): a program written against
//! NVIDIA's `nccl.h` compiles against ours, and a program compiled against NVIDIA's runs with
//! `LD_LIBRARY_PATH` (or, for PyTorch, `LD_PRELOAD`) pointing at our library instead of NCCL's.
//! Callers built against older headers pass shorter `ncclConfig_t`s, read by their size.
//!
//! Without CUDA, buffers are host memory, `stream` must be NULL, and every call has completed
//! when it returns (or at the outermost `ncclGroupEnd`). No panic and no Rust error crosses the
//! boundary: each entry point returns an `ncclResult_t`, and `ncclGetLastError` says why.
//!
//! Layout: [`abi`] (C types and values), [`error`] (the error type and its codes),
//! `raw` (every pointer conversion), `handle` (what an `ncclComm_t` is), `group`
//! (`ncclGroupStart`/`End`), `call` (running collectives and point-to-point transfers),
//! `settings` (NCCL's variables and `ncclConfig_t`), `log` (`NCCL_DEBUG`), `window` (windows
//! and one-sided puts), and [`api`], the exported functions: collectives and groups, the
//! communicator's life (init, split, shrink, grow, revoke, suspend), windows and signals,
//! parameters, and the device API's host side (`ncclInvalidUsage` without CUDA).

pub mod abi;
pub mod api;
mod call;
pub mod error;
mod group;
mod handle;
mod log;
mod raw;
mod settings;
mod window;

pub use api::*;

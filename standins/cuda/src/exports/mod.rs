//! The C ABI: `#[no_mangle] extern "C" fn cu*`, each a thin shell over the module that does
//! the work. Every function checks the caller's pointers for NULL before acting, never
//! unwinds into C (a panic becomes `CUDA_ERROR_UNKNOWN`), and returns a `CUresult`.
//!
//! Safety: the functions are `unsafe` because C callers promise what the driver API promises:
//! out-pointers, when not NULL, are valid for a write of their type, and buffers are as long
//! as the call says.

#![allow(non_snake_case, clippy::missing_safety_doc)]

mod context;
mod device;
mod graph;
mod ipc;
mod memory;
mod module;
mod stream;

pub use self::context::*;
pub use self::device::*;
pub use self::graph::*;
pub use self::ipc::*;
pub use self::memory::*;
pub use self::module::*;
pub use self::stream::*;

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use crate::sys::{code, CUresult, CuResult};

/// Runs an export's body: its `Err` is the returned code, a panic is `CUDA_ERROR_UNKNOWN`.
fn edge(body: impl FnOnce() -> CuResult<()>) -> CUresult {
    catch_unwind(AssertUnwindSafe(body)).map_or(CUresult::UNKNOWN, code)
}

/// A caller's out-pointer, known not to be NULL.
struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// `CUDA_ERROR_INVALID_VALUE` for NULL.
    ///
    /// # Safety
    /// A non-NULL `p` must be valid for a write of `T` (the driver API's contract).
    unsafe fn new(p: *mut T) -> CuResult<Self> {
        NonNull::new(p).map(Out).ok_or(CUresult::INVALID_VALUE)
    }

    fn set(self, v: T) {
        // SAFETY: `new`'s caller vouched for the pointer.
        unsafe { self.0.as_ptr().write_unaligned(v) }
    }
}

/// Writes `s` as a NUL-terminated string into the caller's `len`-byte buffer (truncated).
///
/// # Safety
/// A non-NULL `buf` must be valid for `len` bytes.
unsafe fn write_str(buf: *mut c_char, len: i32, s: &str) -> CuResult<()> {
    let len = usize::try_from(len).ok().filter(|&l| l > 0).ok_or(CUresult::INVALID_VALUE)?;
    if buf.is_null() {
        return Err(CUresult::INVALID_VALUE);
    }
    let n = s.len().min(len - 1);
    // SAFETY: `buf` holds `len` > n bytes (the caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(())
}

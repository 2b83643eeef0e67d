//! The exported functions: each `nccl*` and its `pnccl*` twin (the name profilers interpose
//! on) call one implementation through [`guard`], which turns errors and panics into an
//! `ncclResult_t` and remembers the message for `ncclGetLastError`.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::abi::ncclResult_t;
use crate::error::{Error, Result};
use crate::log;

mod coll;
mod comm;
mod device;
mod misc;
mod param;
mod resize;
mod rma;
mod tagged;
mod work;

pub use coll::*;
pub use comm::*;
pub use device::*;
pub use misc::*;
pub use param::*;
pub use resize::*;
pub use rma::*;
pub use tagged::*;
pub use work::*;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Remembers `msg` as this thread's last error.
pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error (valid until its next failing call).
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// Runs one entry point: its result code, or the code of its error (logged at WARN and kept
/// for `ncclGetLastError`), or `ncclInternalError` if it panicked.
pub(crate) fn guard(name: &str, f: impl FnOnce() -> Result<ncclResult_t>) -> ncclResult_t {
    let error = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => return code,
        Ok(Err(e)) => e,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Error::Panic(what)
        }
    };
    let msg = format!("{name}: {error}");
    log::warn(None, format_args!("{msg}"));
    set_last_error(&msg);
    crate::group::poison(&msg);
    error.code()
}

/// A datatype argument, checked.
pub(crate) fn dtype_of(datatype: crate::abi::ncclDataType_t) -> Result<topoccl::Dtype> {
    topoccl::Dtype::from_raw(i64::from(datatype))
        .ok_or_else(|| crate::error::invalid(format!("datatype {datatype} is not an ncclDataType_t (0..11)")))
}

/// A rank argument (`root`, `peer`) of a communicator of `n` ranks, checked.
/// A root as the core takes it, which checks its range with the call (`CollectiveCall`): here
/// only what a `u32` cannot hold.
pub(crate) fn root_arg(v: std::ffi::c_int) -> Result<u32> {
    u32::try_from(v).map_err(|_| crate::error::invalid(format!("root {v} is out of range: ranks are >= 0")))
}

pub(crate) fn rank_of(what: &str, v: std::ffi::c_int, n: u32) -> Result<u32> {
    u32::try_from(v)
        .ok()
        .filter(|r| *r < n)
        .ok_or_else(|| crate::error::invalid(format!("{what} {v} is out of range for {n} ranks")))
}

/// A stream argument: NULL without CUDA.
pub(crate) fn no_stream(stream: crate::abi::cudaStream_t) -> Result<()> {
    if stream.is_null() {
        Ok(())
    } else {
        Err(crate::error::invalid("stream must be NULL: topoccl was built without CUDA, buffers are host memory"))
    }
}

/// Defines an exported function and its `pnccl` twin over one implementation.
macro_rules! export {
    ($(#[doc = $doc:literal])* $name:ident / $pname:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $imp:path) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments must be valid as NCCL's documentation of this function requires.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $imp($($arg),*)
        }

        #[doc = concat!("`", stringify!($name), "` under its profiling name.")]
        ///
        /// # Safety
        /// As for the function it is the twin of.
        #[no_mangle]
        pub unsafe extern "C" fn $pname($($arg: $ty),*) -> $ret {
            $imp($($arg),*)
        }
    };
}
pub(crate) use export;

/// Defines an exported function of the extension (no `pnccl` twin: profilers do not know it).
macro_rules! extension {
    ($(#[doc = $doc:literal])* $name:ident ($($arg:ident: $ty:ty),* $(,)?) = $imp:path) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments must be valid as `include/topoccl.h` requires.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> ncclResult_t {
            $imp($($arg),*)
        }
    };
}
pub(crate) use extension;

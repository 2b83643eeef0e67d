//! The C ABI: `#[no_mangle] extern "C" fn nvml*`, each a thin shell over the module that does
//! the work. Every function checks NVML's state first (`NVML_ERROR_UNINITIALIZED`), then the
//! caller's handle and pointers (`NVML_ERROR_INVALID_ARGUMENT`), never unwinds into C (a panic
//! becomes `NVML_ERROR_UNKNOWN`), and returns an `nvmlReturn_t`.
//!
//! Safety: the functions are `unsafe` because C callers promise what NVML's API promises:
//! out-pointers, when not NULL, are valid for a write of their type, and buffers are as long
//! as the call says.

#![allow(non_snake_case, clippy::missing_safety_doc)]

mod device;
mod nvlink;
mod system;

pub use self::device::*;
pub use self::nvlink::*;
pub use self::system::*;

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use crate::machine::PciAddress;
use crate::sys::{code, nvmlPciInfo_t, nvmlReturn_t, NvmlResult};

/// Runs an export's body: its `Err` is the returned code, a panic is `NVML_ERROR_UNKNOWN`.
fn edge(body: impl FnOnce() -> NvmlResult<()>) -> nvmlReturn_t {
    catch_unwind(AssertUnwindSafe(body)).map_or(nvmlReturn_t::UNKNOWN, code)
}

/// A caller's out-pointer, known not to be NULL.
struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// `NVML_ERROR_INVALID_ARGUMENT` for NULL.
    ///
    /// # Safety
    /// A non-NULL `p` must be valid for a write of `T` (NVML's contract).
    unsafe fn new(p: *mut T) -> NvmlResult<Self> {
        NonNull::new(p).map(Out).ok_or(nvmlReturn_t::INVALID_ARGUMENT)
    }

    fn set(self, v: T) {
        // SAFETY: `new`'s caller vouched for the pointer.
        unsafe { self.0.as_ptr().write_unaligned(v) }
    }
}

/// Writes `s` NUL-terminated into the caller's `len`-byte buffer: NULL is
/// `NVML_ERROR_INVALID_ARGUMENT`, a buffer shorter than `s` and its NUL is
/// `NVML_ERROR_INSUFFICIENT_SIZE` (NVML never truncates).
///
/// # Safety
/// A non-NULL `buf` must be valid for `len` bytes.
unsafe fn write_str(buf: *mut c_char, len: u32, s: &str) -> NvmlResult<()> {
    if buf.is_null() {
        return Err(nvmlReturn_t::INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(nvmlReturn_t::INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds `len` > s.len() bytes (the caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// `s` as a NUL-terminated C array (truncated to fit; bus ids always fit).
fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

/// An `nvmlPciInfo_t` for a device at `pci`.
fn pci_info(pci: PciAddress, pci_device_id: u32, pci_sub_system_id: u32) -> nvmlPciInfo_t {
    nvmlPciInfo_t {
        busIdLegacy: c_array(&pci.bus_id_legacy()),
        domain: pci.domain,
        bus: pci.bus,
        device: pci.device,
        pciDeviceId: pci_device_id,
        pciSubSystemId: pci_sub_system_id,
        busId: c_array(&pci.bus_id()),
    }
}

//! Initialisation, error strings, the driver version, device count and handles.

use std::ffi::{c_char, c_uint};

use super::{edge, write_str, Out};
use crate::sys::{nvmlDevice_t, nvmlReturn_t};
use crate::{error, state};

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    edge(state::init)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    edge(state::shutdown)
}

/// A static string for any code, before `nvmlInit_v2` too.
#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    error::describe(result.0).as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    edge(|| {
        let m = state::machine()?;
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { write_str(version, length, &m.driver_version) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> nvmlReturn_t {
    edge(|| {
        let n = state::machine()?.gpus.len();
        // SAFETY: the caller's out-pointer.
        unsafe { Out::new(device_count) }?.set(n as c_uint);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    edge(|| {
        state::machine()?;
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(device) }?;
        out.set(state::handle(index)?);
        Ok(())
    })
}

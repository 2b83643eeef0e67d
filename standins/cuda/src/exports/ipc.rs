//! Legacy CUDA IPC of memory and events.

use std::ffi::c_uint;

use super::{edge, Out};
use crate::ipc;
use crate::sys::{CUdeviceptr, CUevent, CUipcEventHandle, CUipcMemHandle, CUresult};

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(handle) }?;
        out.set(ipc::get_mem_handle(dptr)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pdptr) }?;
        out.set(ipc::open_mem_handle(&handle, flags)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuIpcOpenMemHandle_v2(pdptr, handle, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    edge(|| ipc::close_mem_handle(dptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetEventHandle(handle: *mut CUipcEventHandle, ev: CUevent) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(handle) }?;
        out.set(ipc::get_event_handle(ev as usize)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenEventHandle(phevent: *mut CUevent, handle: CUipcEventHandle) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(phevent) }?;
        out.set(ipc::open_event_handle(&handle)? as CUevent);
        Ok(())
    })
}

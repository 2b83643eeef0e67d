//! Finding the CUDA driver, and turning its result codes into errors: the "checked calls"
//! layer over cudarc's `sys` bindings (which `dlopen` `libcuda.so.1` at run time and panic on a
//! missing library or symbol — so nothing here calls into `sys` before [`driver`] has made
//! sure both are there).

use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUresult};

use crate::error::{Error, Result};

/// Every driver entry point this crate calls. [`driver`] looks each one up before the first
/// call, so an old or partial driver is an error naming what it lacks, never a panic.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxGetDevice",
    "cuPointerGetAttributes",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemcpyAsync",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuStreamGetCtx",
    "cuStreamIsCapturing",
    "cuStreamWaitValue32_v2",
    "cuStreamWriteValue32_v2",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    // The CUDA IPC transport.
    "cuDeviceGetUuid_v2",
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamSynchronize",
    // RDMA into device memory (the verbs transport's dma-buf registrations).
    "cuMemGetHandleForAddressRange",
    "cuFlushGPUDirectRDMAWrites",
];

/// The driver, once found and initialised.
#[derive(Debug)]
pub struct Driver {
    /// `cuDriverGetVersion`: 12090 for CUDA 12.9.
    pub version: i32,
}

/// Whether a CUDA driver library can be loaded in this process (cheap after the first call).
pub fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to `dlopen` the candidate names; loading the
    // driver library runs no code of ours.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The driver, loaded and initialised (`cuInit`) on first use; an error that says what is
/// missing if there is none, it lacks an entry point this crate uses, or it fails to start.
pub fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    DRIVER.get_or_init(start).as_ref().map_err(|why| Error::Cuda(why.clone()))
}

/// Whether the driver library is loaded with every entry point this crate uses, without
/// initialising it (what may be called before `cuInit`: `cuPointerGetAttributes`).
pub fn loaded() -> std::result::Result<(), &'static str> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(load).as_ref().map(|_| ()).map_err(String::as_str)
}

fn load() -> std::result::Result<(), String> {
    if !present() {
        return Err("no CUDA driver: libcuda.so.1 was not found (device buffers and streams need one; host \
                    buffers work without)"
            .into());
    }
    // SAFETY: the library is present (checked above), so `culib` loads it rather than panic.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = SYMBOLS
        .iter()
        .copied()
        // SAFETY: looking a symbol up runs no code; the pointer is not used.
        .filter(|name| unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!("the CUDA driver is too old: it lacks {}", missing.join(", ")));
    }
    Ok(())
}

fn start() -> std::result::Result<Driver, String> {
    loaded().map_err(str::to_string)?;
    // SAFETY: every symbol called below exists (checked by `loaded`).
    unsafe {
        check(sys::cuInit(0), "cuInit").map_err(|e| e.to_string())?;
        let mut version = 0;
        check(sys::cuDriverGetVersion(&mut version), "cuDriverGetVersion").map_err(|e| e.to_string())?;
        Ok(Driver { version })
    }
}

/// The name of a driver result code (`CUDA_ERROR_INVALID_VALUE`).
fn name(r: CUresult) -> String {
    let mut s: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: `cuGetErrorName` writes a pointer to a static string, or leaves NULL for an
    // unknown code; only reached once the driver is loaded (every caller holds a result).
    let ok = unsafe { sys::cuGetErrorName(r, &mut s) } == CUresult::CUDA_SUCCESS;
    if ok && !s.is_null() {
        // SAFETY: a NUL-terminated static string of the driver's.
        unsafe { std::ffi::CStr::from_ptr(s) }.to_string_lossy().into_owned()
    } else {
        format!("CUDA error {}", r as u32)
    }
}

/// `Ok` for `CUDA_SUCCESS`, else an error naming the call and the code.
pub fn check(r: CUresult, call: &str) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("{call} failed: {}", name(r))))
    }
}

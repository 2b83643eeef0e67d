//! Finding the CUDA driver, and turning its result codes into errors: the "checked calls"
//! layer over cudarc's `sys` bindings (which `dlopen` `libcuda.so.1` at run time and panic on a
//! missing library or symbol — so nothing here calls into `sys` before [`driver`] has made
//! sure both are there).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    "cuFuncGetAttribute",
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

/// Device calls whose end the host has not seen yet, in this process.
static OUTSTANDING: AtomicUsize = AtomicUsize::new(0);
/// Driver calls the executor made while a device call was outstanding.
static FOREIGN: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// How deep this thread is in running queued work (it is the executor: the progress
    /// thread, or a waiting caller running what others queued).
    static ON_EXECUTOR: Cell<u32> = const { Cell::new(0) };
    /// Driver calls this library made on this thread.
    static ON_THIS_THREAD: Cell<u64> = const { Cell::new(0) };
}

/// The driver calls this library has made (through [`check`]) on the calling thread: what a
/// call costs its caller, for the table of driver calls per call.
pub fn driver_calls_on_this_thread() -> u64 {
    ON_THIS_THREAD.with(Cell::get)
}

/// The debug counter of NCCL's invariant: the driver calls this library's executor made
/// (through [`check`]) — on the progress thread, or on a waiting caller running queued work —
/// while some device call was between its enqueue and the host seeing its end. A
/// device-resident or staged call's work is all on the GPU's queues when it returns, and the
/// executor only watches it (or moves host bytes) with plain loads and stores of pinned memory,
/// so this stays 0 unless a host-driven device call (`TOPOCCL_DEVICE_STAGED=0`) runs, whose
/// driver calls a copy into pageable memory can deadlock (`../shared/gpu-review.md` §2).
pub fn foreign_driver_calls() -> u64 {
    FOREIGN.load(Ordering::Relaxed)
}

/// Marks the current thread as running queued work while it lives.
pub(crate) struct OnExecutor(());

impl OnExecutor {
    pub(crate) fn enter() -> OnExecutor {
        ON_EXECUTOR.with(|c| c.set(c.get() + 1));
        OnExecutor(())
    }
}

impl Drop for OnExecutor {
    fn drop(&mut self) {
        ON_EXECUTOR.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// One device call outstanding until it [ends](Outstanding::end) or is dropped (see
/// [`foreign_driver_calls`]).
#[derive(Debug)]
pub struct Outstanding(std::sync::atomic::AtomicBool);

impl Outstanding {
    pub(crate) fn begin() -> Outstanding {
        OUTSTANDING.fetch_add(1, Ordering::AcqRel);
        Outstanding(std::sync::atomic::AtomicBool::new(false))
    }

    /// The host has seen the call end (or given up on it).
    pub fn end(&self) {
        if !self.0.swap(true, Ordering::AcqRel) {
            OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.end();
    }
}

/// `Ok` for `CUDA_SUCCESS`, else an error naming the call and the code.
pub fn check(r: CUresult, call: &str) -> Result<()> {
    ON_THIS_THREAD.with(|c| c.set(c.get() + 1));
    if OUTSTANDING.load(Ordering::Relaxed) > 0 && ON_EXECUTOR.with(Cell::get) > 0 {
        FOREIGN.fetch_add(1, Ordering::Relaxed);
    }
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("{call} failed: {}", name(r))))
    }
}

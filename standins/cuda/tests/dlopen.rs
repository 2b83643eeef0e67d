//! The built library as a driver loader finds it: a child process with a temporary directory
//! holding `libcuda.so.1` (a link to the built `libcuda_standin.so`) on `LD_LIBRARY_PATH`
//! `dlopen`s it by that name, finds every symbol topoccl needs, and drives it through them.

#[macro_use]
mod common;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use common::*;

/// Every driver function topoccl's GPU path and its C tests call.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceGetPCIBusId",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetUuid_v2",
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxCreate_v2",
    "cuCtxDestroy_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxGetDevice",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyAsync",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemsetD8Async",
    "cuMemGetAddressRange_v2",
    "cuPointerGetAttribute",
    "cuPointerGetAttributes",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuStreamGetCtx",
    "cuStreamGetFlags",
    "cuStreamIsCapturing",
    "cuStreamWaitValue32_v2",
    "cuStreamWriteValue32_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuIpcGetEventHandle",
    "cuIpcOpenEventHandle",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
];

#[test]
fn the_built_library_loads_as_libcuda_so_1() {
    let Some(lib) = built_library() else {
        // Cargo builds the cdylib with the crate's tests; CI must never skip silently.
        assert!(std::env::var_os("CI").is_none(), "libcuda_standin.so was not built next to the test");
        eprintln!("skipped: libcuda_standin.so not found next to {:?}", std::env::current_exe());
        return;
    };
    let dir = std::env::temp_dir().join(format!("topoccl-standin-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        let _ = std::fs::remove_file(dir.join(name));
        std::os::unix::fs::symlink(lib.canonicalize().unwrap(), dir.join(name)).unwrap();
    }
    let status = run_child("child", "dlopen", &[("LD_LIBRARY_PATH", dir.display().to_string())]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{status:?}");
}

/// The library opened by name, as the driver loader does.
struct Lib(*mut c_void);

impl Lib {
    fn open(name: &str) -> Lib {
        let c = CString::new(name).unwrap();
        // SAFETY: dlopen with a valid C string; the handle is checked.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen({name}) failed");
        Lib(h)
    }

    fn sym(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).unwrap();
        // SAFETY: dlsym on a live handle with a valid C string.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        assert!(!p.is_null(), "missing symbol {name}");
        p
    }

    /// The function `name` with the C signature `F`.
    ///
    /// # Safety
    /// `F` must be the function's real signature.
    unsafe fn func<F: Copy>(&self, name: &str) -> F {
        let p = self.sym(name);
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: `p` is the address of `name`, whose signature the caller vouches for.
        unsafe { std::mem::transmute_copy(&p) }
    }
}

fn dlopen_body() {
    let lib = Lib::open("libcuda.so.1");
    for s in SYMBOLS {
        lib.sym(s);
    }
    type Count = unsafe extern "C" fn(*mut c_int) -> CUresult;
    type Init = unsafe extern "C" fn(c_uint) -> CUresult;
    type Name = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CUresult;
    type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult;
    type SetCurrent = unsafe extern "C" fn(*mut c_void) -> CUresult;
    type Alloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
    type HtoD = unsafe extern "C" fn(u64, *const c_void, usize) -> CUresult;
    type DtoH = unsafe extern "C" fn(*mut c_void, u64, usize) -> CUresult;
    type ErrName = unsafe extern "C" fn(c_uint, *mut *const c_char) -> CUresult;
    // SAFETY: each type is the function's signature in cuda.h.
    let (count, init, name, retain, set_current, alloc, htod, dtoh, err_name) = unsafe {
        (
            lib.func::<Count>("cuDeviceGetCount"),
            lib.func::<Init>("cuInit"),
            lib.func::<Name>("cuDeviceGetName"),
            lib.func::<Retain>("cuDevicePrimaryCtxRetain"),
            lib.func::<SetCurrent>("cuCtxSetCurrent"),
            lib.func::<Alloc>("cuMemAlloc_v2"),
            lib.func::<HtoD>("cuMemcpyHtoD_v2"),
            lib.func::<DtoH>("cuMemcpyDtoH_v2"),
            lib.func::<ErrName>("cuGetErrorName"),
        )
    };
    let mut n = 0;
    assert_eq!(cu!(count(&mut n)), CUresult::NOT_INITIALIZED, "before cuInit");
    assert_eq!(cu!(init(0)), CUresult::SUCCESS);
    assert_eq!(cu!(count(&mut n)), CUresult::SUCCESS);
    assert!(n >= 1);
    let mut buf = [0 as c_char; 64];
    assert_eq!(cu!(name(buf.as_mut_ptr(), 64, 0)), CUresult::SUCCESS);
    // SAFETY: NUL-terminated by the call.
    assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(), "topoccl stand-in GPU 0");
    let mut ctx = std::ptr::null_mut();
    assert_eq!(cu!(retain(&mut ctx, 0)), CUresult::SUCCESS);
    assert_eq!(cu!(set_current(ctx)), CUresult::SUCCESS);
    let mut p = 0;
    assert_eq!(cu!(alloc(&mut p, 1000)), CUresult::SUCCESS);
    let data: Vec<u8> = (0..1000).map(|i| i as u8).collect();
    assert_eq!(cu!(htod(p, data.as_ptr().cast(), 1000)), CUresult::SUCCESS);
    let mut back = vec![0u8; 1000];
    assert_eq!(cu!(dtoh(back.as_mut_ptr().cast(), p, 1000)), CUresult::SUCCESS);
    assert_eq!(back, data);
    let mut s = std::ptr::null();
    assert_eq!(cu!(err_name(201, &mut s)), CUresult::SUCCESS);
    // SAFETY: a static C string from the library.
    assert_eq!(unsafe { CStr::from_ptr(s) }.to_str().unwrap(), "CUDA_ERROR_INVALID_CONTEXT");
}

#[test]
fn child() {
    match child_body().as_deref() {
        None => {}
        Some("dlopen") => dlopen_body(),
        Some(other) => panic!("unknown child body {other}"),
    }
}

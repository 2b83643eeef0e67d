//! The built library as NVML's users find it: a child process with `target/<profile>/nvml-standin`
//! on `LD_LIBRARY_PATH` `dlopen`s `libnvidia-ml.so.1` by name, finds every function topoccl's
//! detection calls, and drives it through them.

#[macro_use]
mod common;

use std::ffi::{c_char, c_uint, c_void, CStr, CString};

use common::*;

/// Every NVML function topoccl's detection (`src/detect/nvml`) calls.
const SYMBOLS: &[&str] = &[
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkRemotePciInfo_v2",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
];

#[test]
fn the_built_library_loads_as_libnvidia_ml_so_1() {
    let dir = library_dir().display().to_string();
    run_child("child", "dlopen", &[("LD_LIBRARY_PATH", dir), (state::MACHINE_VAR, "dgx-h100".into())]);
}

/// The library opened by name, as NVML's users do.
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
    let lib = Lib::open("libnvidia-ml.so.1");
    for s in SYMBOLS {
        lib.sym(s);
    }
    type Init = unsafe extern "C" fn() -> nvmlReturn_t;
    type Count = unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t;
    type Handle = unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
    type Name = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
    type ErrorString = unsafe extern "C" fn(nvmlReturn_t) -> *const c_char;
    // SAFETY: each type is the function's signature in nvml.h.
    let (init, count, handle, name, error_string) = unsafe {
        (
            lib.func::<Init>("nvmlInit_v2"),
            lib.func::<Count>("nvmlDeviceGetCount_v2"),
            lib.func::<Handle>("nvmlDeviceGetHandleByIndex_v2"),
            lib.func::<Name>("nvmlDeviceGetName"),
            lib.func::<ErrorString>("nvmlErrorString"),
        )
    };
    let mut n = 0;
    assert_eq!(nv!(count(&mut n)), nvmlReturn_t::UNINITIALIZED, "before nvmlInit_v2");
    assert_eq!(nv!(init()), nvmlReturn_t::SUCCESS);
    assert_eq!(nv!(count(&mut n)), nvmlReturn_t::SUCCESS);
    assert_eq!(n, 8);
    let mut h = std::ptr::null_mut();
    assert_eq!(nv!(handle(7, &mut h)), nvmlReturn_t::SUCCESS);
    let mut buf = [0 as c_char; 96];
    assert_eq!(nv!(name(h, buf.as_mut_ptr(), 96)), nvmlReturn_t::SUCCESS);
    assert_eq!(text(&buf), "NVIDIA H100 80GB HBM3");
    // SAFETY: a static C string from the library.
    let words = unsafe { CStr::from_ptr(nv!(error_string(nvmlReturn_t::INSUFFICIENT_SIZE))) };
    assert_eq!(words.to_str().unwrap(), "Insufficient Size");
}

#[test]
fn child() {
    match child_body().as_deref() {
        None => {}
        Some("dlopen") => dlopen_body(),
        Some(other) => panic!("unknown child body {other}"),
    }
}

//! What the stand-in's integration tests share: initialisation with two devices, a context per
//! test (so one test's blocked streams or sticky error never reach another's), child processes
//! running a named body of the same test binary, and hand-built module images.

#![allow(dead_code)]

use std::ffi::c_void;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

pub use cuda_standin::sys::CUresult;
pub use cuda_standin::*;

/// Calls a driver function: `unsafe`, because the driver API trusts its pointers. This macro
/// is the tests' one unsafe block around driver calls (`#[macro_use] mod common;`).
/// SAFETY (for every use): the tests pass live pointers to correctly sized buffers.
macro_rules! cu {
    ($call:expr) => {{
        #[allow(unused_unsafe)]
        // SAFETY: see the macro's documentation.
        let r = unsafe { $call };
        r
    }};
}

/// Asserts that a driver call succeeds.
macro_rules! ok {
    ($call:expr) => {
        assert_eq!(cu!($call), $crate::common::CUresult::SUCCESS, "{}", stringify!($call))
    };
}

/// The environment variable that makes a test binary run a child body.
pub const CHILD: &str = "TOPOCCL_STANDIN_TEST_CHILD";

/// Two devices, short delays, one `cuInit` per process.
pub fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Set before the stand-in reads them (first cuInit), while no other thread reads the
        // environment (tests wait on this Once).
        std::env::set_var("TOPOCCL_STANDIN_DEVICES", "2");
        if std::env::var_os("TOPOCCL_STANDIN_DELAY_US").is_none() {
            std::env::set_var("TOPOCCL_STANDIN_DELAY_US", "200");
        }
        ok!(cuInit(0));
    });
}

/// A context of its own for one test, current on the creating thread; destroyed on drop.
pub struct Ctx(pub *mut c_void);

impl Ctx {
    pub fn new(device: i32) -> Ctx {
        init();
        let mut c = std::ptr::null_mut();
        ok!(cuCtxCreate_v2(&mut c, 0, device));
        Ctx(c)
    }

    /// Makes this context current on the calling thread.
    pub fn bind(&self) {
        ok!(cuCtxSetCurrent(self.0));
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        let r = cu!(cuCtxDestroy_v2(self.0));
        if !std::thread::panicking() {
            assert_eq!(r, CUresult::SUCCESS);
        }
    }
}

pub fn stream(flags: u32) -> *mut c_void {
    let mut s = std::ptr::null_mut();
    ok!(cuStreamCreate(&mut s, flags));
    s
}

pub fn alloc(bytes: usize) -> u64 {
    let mut p = 0;
    ok!(cuMemAlloc_v2(&mut p, bytes));
    p
}

/// Device memory holding `data`, written synchronously.
pub fn upload(data: &[u8]) -> u64 {
    let p = alloc(data.len());
    ok!(cuMemcpyHtoD_v2(p, data.as_ptr().cast(), data.len()));
    ok!(cuStreamSynchronize(std::ptr::null_mut()));
    p
}

/// `len` bytes of device memory read synchronously.
pub fn download(p: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ok!(cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), p, len));
    v
}

/// Pinned host memory of `len` bytes.
pub fn pinned(len: usize) -> &'static mut [u8] {
    let mut p = std::ptr::null_mut();
    ok!(cuMemHostAlloc(&mut p, len, 0));
    // SAFETY: `p` is `len` fresh bytes that the test owns until it frees them (never: leaked).
    unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) }
}

/// A pinned 32-bit flag that host code sets and streams wait on.
pub struct Flag(pub &'static AtomicU32);

impl Flag {
    pub fn new() -> Flag {
        let mem = pinned(4);
        // SAFETY: 4 page-aligned pinned bytes, only ever accessed atomically.
        let word = unsafe { &*(mem.as_mut_ptr() as *const AtomicU32) };
        word.store(0, Ordering::SeqCst);
        Flag(word)
    }

    pub fn addr(&self) -> u64 {
        self.0 as *const AtomicU32 as u64
    }

    pub fn set(&self, v: u32) {
        self.0.store(v, Ordering::SeqCst);
    }

    /// Makes `stream` wait until the flag is at least `v`.
    pub fn gate(&self, stream: *mut c_void, v: u32) {
        ok!(cuStreamWaitValue32_v2(stream, self.addr(), v, 0));
    }
}

/// Runs `body` of this test binary in a child process (the test named `entry` dispatches on
/// the `CHILD` variable), with extra environment.
pub fn run_child(entry: &str, body: &str, env: &[(&str, String)]) -> ExitStatus {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([entry, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD, body);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.status().unwrap()
}

/// The child body this process was started for, if any.
pub fn child_body() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// The stand-in's shared library, built by cargo beside the test executable (or named by
/// `TOPOCCL_STANDIN_LIB`).
pub fn built_library() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TOPOCCL_STANDIN_LIB") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [deps.join("libcuda_standin.so"), deps.parent()?.join("libcuda_standin.so")].into_iter().find(|p| p.exists())
}

/// A minimal cubin: an `EM_CUDA` ELF with `e_flags` = `sm` and a `.text.<name>` section per
/// kernel (empty sections; only the names and the header matter to the stand-in).
pub fn cubin(sm: u32, kernels: &[&str]) -> Vec<u8> {
    let mut strtab = vec![0u8];
    let mut name_at = |s: &str| {
        let at = strtab.len() as u32;
        strtab.extend_from_slice(s.as_bytes());
        strtab.push(0);
        at
    };
    let shstrtab_name = name_at(".shstrtab");
    let text_names: Vec<u32> = kernels.iter().map(|k| name_at(&format!(".text.{k}"))).collect();
    let strtab_off = 64u64;
    let shoff = (strtab_off + strtab.len() as u64).div_ceil(8) * 8;
    let shnum = 2 + kernels.len() as u16;
    let mut b = vec![0u8; 64];
    b[0..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little-endian
    b[6] = 1; // version
    b[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    b[18..20].copy_from_slice(&190u16.to_le_bytes()); // EM_CUDA
    b[20..24].copy_from_slice(&1u32.to_le_bytes());
    b[40..48].copy_from_slice(&shoff.to_le_bytes());
    b[48..52].copy_from_slice(&sm.to_le_bytes());
    b[52..54].copy_from_slice(&64u16.to_le_bytes());
    b[58..60].copy_from_slice(&64u16.to_le_bytes());
    b[60..62].copy_from_slice(&shnum.to_le_bytes());
    b[62..64].copy_from_slice(&1u16.to_le_bytes()); // .shstrtab is section 1
    b.extend_from_slice(&strtab);
    b.resize(shoff as usize, 0);
    let section = |name: u32, kind: u32, off: u64, size: u64| {
        let mut sh = [0u8; 64];
        sh[0..4].copy_from_slice(&name.to_le_bytes());
        sh[4..8].copy_from_slice(&kind.to_le_bytes());
        sh[24..32].copy_from_slice(&off.to_le_bytes());
        sh[32..40].copy_from_slice(&size.to_le_bytes());
        sh
    };
    b.extend_from_slice(&[0u8; 64]);
    b.extend_from_slice(&section(shstrtab_name, 3, strtab_off, strtab.len() as u64));
    for n in text_names {
        b.extend_from_slice(&section(n, 1, 0, 0));
    }
    b
}

/// PTX text (NUL-terminated) declaring `kernels` for `target` at ISA `version`.
pub fn ptx(version: &str, target: &str, kernels: &[&str]) -> Vec<u8> {
    let mut s = format!("//\n// stand-in test\n//\n\n.version {version}\n.target {target}\n.address_size 64\n\n");
    for k in kernels {
        s.push_str(&format!(
            "\t// .globl\t{k}\n.visible .entry {k}(\n\t.param .align 8 .b8 {k}_param_0[48]\n)\n{{\n\tret;\n}}\n\n"
        ));
    }
    let mut v = s.into_bytes();
    v.push(0);
    v
}

/// Loads an image and returns the module.
pub fn load(image: &[u8]) -> Result<*mut c_void, CUresult> {
    let mut m = std::ptr::null_mut();
    match cu!(cuModuleLoadData(&mut m, image.as_ptr().cast())) {
        CUresult::SUCCESS => Ok(m),
        e => Err(e),
    }
}

/// The function `name` of module `m`.
pub fn function(m: *mut c_void, name: &str) -> Result<*mut c_void, CUresult> {
    let c = std::ffi::CString::new(name).unwrap();
    let mut f = std::ptr::null_mut();
    match cu!(cuModuleGetFunction(&mut f, m, c.as_ptr())) {
        CUresult::SUCCESS => Ok(f),
        e => Err(e),
    }
}

/// Launches `f` with one `KernelArgs` on `stream`.
pub fn launch(
    f: *mut c_void,
    grid: u32,
    block: u32,
    stream: *mut c_void,
    args: &topoccl_kernels_host::KernelArgs,
) -> CUresult {
    let mut p = args as *const _ as *mut c_void;
    cu!(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream, &mut p, std::ptr::null_mut()))
}

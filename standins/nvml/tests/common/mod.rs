//! What the stand-in's integration tests share: child processes running a named body of the
//! same test binary with their own environment (NVML's state and the machine are per
//! process), a checked call macro, and the built library's directory.

#![allow(dead_code)]

use std::ffi::{c_char, CStr};
use std::path::PathBuf;
use std::process::Command;

pub use nvml_standin::sys::*;
pub use nvml_standin::*;

/// Calls an NVML function: `unsafe`, because NVML trusts its pointers. This macro is the
/// tests' one unsafe block around NVML calls (`#[macro_use] mod common;`).
/// SAFETY (for every use): the tests pass live pointers to correctly sized buffers.
macro_rules! nv {
    ($call:expr) => {{
        #[allow(unused_unsafe)]
        // SAFETY: see the macro's documentation.
        let r = unsafe { $call };
        r
    }};
}

/// Asserts that an NVML call succeeds.
macro_rules! ok {
    ($call:expr) => {
        assert_eq!(nv!($call), $crate::common::nvmlReturn_t::SUCCESS, "{}", stringify!($call))
    };
}

/// The environment variable that makes a test binary run a child body.
pub const CHILD: &str = "TOPOCCL_STANDIN_NVML_TEST_CHILD";

/// Runs `body` of this test binary in a child process (the test named `entry` dispatches on
/// the `CHILD` variable) with extra environment; panics with the child's output if it fails.
pub fn run_child(entry: &str, body: &str, env: &[(&str, String)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([entry, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD, body);
    cmd.env_remove(state::MACHINE_VAR).env_remove(state::INIT_VAR);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child body {body} failed ({}):\n{text}", out.status);
    assert!(text.contains("1 passed"), "child body {body} did not run:\n{text}");
}

/// The child body this process was started for, if any.
pub fn child_body() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// `target/<profile>/nvml-standin`, holding `libnvidia-ml.so.1` (build.rs's links to the
/// `deps/libnvml_standin.so` cargo builds with this crate's tests).
pub fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap().join("nvml-standin");
    assert!(dir.join("libnvidia-ml.so.1").exists(), "no stand-in NVML in {}", dir.display());
    dir
}

/// The handle of GPU `index` (NVML initialised).
pub fn gpu(index: u32) -> nvmlDevice_t {
    let mut h = std::ptr::null_mut();
    ok!(nvmlDeviceGetHandleByIndex_v2(index, &mut h));
    h
}

/// A NUL-terminated buffer as text.
pub fn text(buf: &[c_char]) -> String {
    // SAFETY: the buffer holds a NUL (the tests zero it and NVML terminates what it writes).
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

//! Running a test's body under the stand-in CUDA driver (`standins/cuda`): the test runs again
//! in a child process whose `LD_LIBRARY_PATH` finds the stand-in's `libcuda.so.1` (the dynamic
//! loader reads the variable only at start-up, so the parent cannot switch itself).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

const CHILD: &str = "TOPOCCL_STANDIN_CHILD";

/// The directory holding the stand-in's `libcuda.so.1`, built if cargo has not yet.
pub fn dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe.parent().and_then(|d| d.parent()).expect("target/<profile>").to_path_buf();
    let dir = profile.join("cuda-standin");
    if !profile.join("libcuda_standin.so").exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "topoccl-standin-cuda"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build of the stand-in");
        assert!(status.success(), "building the stand-in driver failed");
    }
    assert!(dir.join("libcuda.so.1").exists(), "no stand-in driver at {}", dir.display());
    dir
}

/// True in the child process (run the body there); in the parent, runs the test `name` in a
/// child under the stand-in with `env`, requires it to pass, and returns false.
pub fn child(name: &str, env: &[(&str, &str)]) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("test executable");
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", dir())
        .envs(env.iter().copied())
        .output()
        .expect("running the test's child");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} under the stand-in driver failed ({}):\n{text}", out.status);
    assert!(text.contains("1 passed"), "{name} did not run in the child:\n{text}");
    print!("{text}");
    false
}

//! The torch.distributed backend (`python/topoccl`, reaching this crate's C ABI with ctypes)
//! against the `libnccl.so` cargo built next to this test: runs the Python suite
//! (`python/tests/run_tests.py`: every collective on 2 and 4 processes, DDP and FSDP2 against
//! gloo, a dead and a stalled peer, every init method) and checks its exit status.
//!
//! Skipped, saying why, where python3 or torch is missing — unless `CI` is set: CI installs
//! torch, so there a missing one fails the test.

use std::process::Command;

mod common;
use common::{built_library, repo};

/// Skips (returns false after saying why), or fails under CI.
fn unavailable(why: &str) -> bool {
    assert!(std::env::var_os("CI").is_none(), "CI must run the torch backend suite, but {why}");
    eprintln!("skipped: {why}");
    false
}

/// The Python interpreter with torch, if this machine has one.
fn python_with_torch() -> Option<String> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    match Command::new(&python)
        .args(["-c", "import torch, torch.distributed as d; print(torch.__version__, d.is_available())"])
        .output()
    {
        Err(e) => {
            unavailable(&format!("`{python}` could not be run ({e})"));
            None
        }
        Ok(o) if !o.status.success() => {
            let err = String::from_utf8_lossy(&o.stderr);
            unavailable(&format!("`{python}` has no torch ({})", err.lines().last().unwrap_or_default()));
            None
        }
        Ok(o) => {
            let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if out.ends_with("False") {
                unavailable(&format!("torch {out}: torch.distributed is not available"));
                return None;
            }
            eprintln!("torch {out}");
            Some(python)
        }
    }
}

#[test]
fn torch_distributed_backend_suite() {
    let Some(python) = python_with_torch() else { return };
    let Some(lib) = built_library() else {
        unavailable("libnccl.so was not built next to the test");
        return;
    };
    // A private copy: cargo may rewrite target/*/libnccl.so while the ranks have it mapped.
    let dir = std::env::temp_dir().join(format!("topoccl-torch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("libnccl.so.2");
    std::fs::copy(&lib, &copy).unwrap();
    let out = Command::new(&python)
        .arg(repo().join("python/tests/run_tests.py"))
        .env("TOPOCCL_NCCL_LIB", &copy)
        .env("TOPOCCL_CACHE_DIR", std::env::temp_dir().join("topoccl-nccl-cache"))
        .env_remove("TOPOCCL_TIMEOUT")
        .env_remove("TOPOCCL_PY_INLINE")
        .env_remove("TOPOCCL_PY_DISABLE")
        .env_remove("NCCL_DEBUG")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "python/tests/run_tests.py failed ({}):\n{stdout}{stderr}", out.status);
    assert!(stdout.contains(" jobs passed in "), "no summary from the suite:\n{stdout}");
}

//! The torch.distributed backend (`python/topoccl`, a C++ `c10d::Backend` over this crate's C
//! ABI and `topoccl.h`) against the `libnccl.so` cargo built next to this test: runs the
//! backend's suite (`python/tests/run_tests.py`: every collective on 2 and 4 processes, DDP and
//! FSDP2 against gloo, a dead and a stalled peer, every init method), then torch's own
//! distributed suite beside gloo (`python/tests/torch_suite.py`), and checks their exit status.
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
        .env_remove("NCCL_DEBUG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "python/tests/run_tests.py failed ({}):\n{stdout}{stderr}", out.status);
    assert!(stdout.contains(" jobs passed in "), "no summary from the suite:\n{stdout}");

    // torch's own distributed suite, on gloo and on topoccl (2 and 4 ranks): every test gloo
    // passes must pass on topoccl, or be listed, with its reason, in torch_suite_known.txt;
    // profiler events are checked as gloo's are. Run after the suite above, not beside it: both
    // fork ranks that time out on purpose. Gloo's results come from torch_suite_gloo.json where
    // it was written by the torch installed here (`torch_suite.py --backends gloo
    // --profiler-events --write-gloo-cache python/tests/torch_suite_gloo.json`; about 100 s of
    // CI's time); another torch runs gloo beside topoccl.
    if Command::new(&python).args(["-c", "import expecttest"]).status().map(|s| !s.success()).unwrap_or(true) {
        unavailable("torch's test harness needs expecttest (python3 -m pip install expecttest)");
    } else {
        let suite = Command::new(&python)
            .arg(repo().join("python/tests/torch_suite.py"))
            .arg("--profiler-events")
            .arg("--gloo-cache")
            .arg(repo().join("python/tests/torch_suite_gloo.json"))
            .env("TOPOCCL_NCCL_LIB", &copy)
            .env("TOPOCCL_CACHE_DIR", std::env::temp_dir().join("topoccl-nccl-cache"))
            .env_remove("TOPOCCL_TIMEOUT")
            .env_remove("NCCL_DEBUG")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&suite.stdout);
        let stderr = String::from_utf8_lossy(&suite.stderr);
        eprintln!("{stdout}{stderr}");
        assert!(suite.status.success(), "python/tests/torch_suite.py failed ({}):\n{stdout}{stderr}", suite.status);
        assert!(stdout.contains("tests passing on gloo, on topoccl"), "no summary from torch's suite:\n{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// PyTorch's own NCCL process group links `libnccl.so.2`: with ours in its place, the dynamic
/// linker must bind every NCCL function `libtorch_cuda.so` imports to ours (before the 2.30
/// ABI, 21 of its 51 were missing and torch could not load the library). Skipped, saying why,
/// with a CPU-only torch.
#[test]
fn pytorchs_cuda_library_binds_every_nccl_function_to_ours() {
    let Some(python) = python_with_torch() else { return };
    let Some(lib) = built_library() else {
        unavailable("libnccl.so was not built next to the test");
        return;
    };
    let script = "import os, torch\n\
                  p = os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cuda.so')\n\
                  print(p if os.path.exists(p) else '')\n\
                  import torch.cuda.nccl as n\n\
                  print('version', n.version() if p and os.path.exists(p) else None)";
    let out = Command::new(&python)
        .args(["-c", script])
        .env("LD_PRELOAD", &lib)
        .env("LD_DEBUG", "bindings")
        .env("LD_DEBUG_OUTPUT", std::env::temp_dir().join(format!("topoccl-bindings-{}", std::process::id())))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let cuda_lib = stdout.lines().next().unwrap_or_default().trim().to_string();
    // LD_DEBUG_OUTPUT appends the process id to the name.
    let prefix = format!("topoccl-bindings-{}.", std::process::id());
    let mut log = String::new();
    for e in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            log += &std::fs::read_to_string(e.path()).unwrap_or_default();
            let _ = std::fs::remove_file(e.path());
        }
    }
    if cuda_lib.is_empty() {
        eprintln!("skipped: this torch has no libtorch_cuda.so (a CPU-only build)");
        return;
    }
    // What libtorch_cuda.so imports, from its dynamic symbol table.
    let nm = Command::new("nm").args(["-D", "--undefined-only", &cuda_lib]).output().unwrap();
    let mut wanted: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| s.starts_with("nccl"))
        .map(|s| s.split('@').next().unwrap_or(s).to_string())
        .collect();
    wanted.sort();
    wanted.dedup();
    assert!(!wanted.is_empty(), "{cuda_lib} imports no NCCL function");
    let ours = lib.to_string_lossy().to_string();
    let mut missing = Vec::new();
    for sym in &wanted {
        let bound = log.lines().any(|l| {
            l.contains("libtorch_cuda.so")
                && l.contains(&format!("to {ours} "))
                && l.contains(&format!("symbol `{sym}'"))
        });
        if !bound {
            missing.push(sym.as_str());
        }
    }
    eprintln!("{} NCCL functions imported by {cuda_lib}; {stdout}", wanted.len());
    assert!(missing.is_empty(), "not bound to {ours}: {missing:?}");
    assert!(stdout.contains("version (2, 30, 7)"), "{stdout}");
}

//! The stand-in's models of where a real driver deadlocks, checked with the lease script's own
//! probe program (`benches/gpu/lease/driver_probes.c`, the one a lent GPU runs first): the
//! same questions put to the stand-in, so that what the stand-in answers can be compared line
//! by line with a GPU's table.
//!
//! - hardware queues (`TOPOCCL_STANDIN_QUEUES=connections`): a stream waiting on a host word
//!   is released by a kernel and a value write on a stream made k streams later unless both
//!   streams share a queue: with `CUDA_DEVICE_MAX_CONNECTIONS=1` never, with 8 when k + 1 is a
//!   multiple of 8; each stream its own queue (the default for now): always;
//! - the context lock on every resource call (`TOPOCCL_STANDIN_LOCKS=all`): allocations, frees,
//!   registrations, IPC and module calls wait while another thread sits in a copy into
//!   pageable memory behind a waiting stream; by default only stream and event creation do;
//! - loading at first launch (`TOPOCCL_STANDIN_LAZY=launch`): a kernel only looked up is not
//!   loaded until `cuFuncGetAttribute`, `cuFuncLoad` or its first launch.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::built_library;

/// The probe program compiled here (`cc`), and a directory where the stand-in is
/// `libcuda.so.1`; `None` (the test skips) without a C compiler or the built library, which CI
/// always has.
fn setup(test: &str) -> Option<(PathBuf, PathBuf)> {
    let ci = std::env::var_os("CI").is_some();
    let Some(lib) = built_library() else {
        assert!(!ci, "libcuda_standin.so was not built next to the test");
        eprintln!("skipped: no libcuda_standin.so");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("topoccl-standin-models-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(lib.canonicalize().unwrap(), &link).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/gpu/lease/driver_probes.c");
    let exe = dir.join("driver_probes");
    let built =
        Command::new("cc").args(["-O1", "-std=gnu11", "-pthread", "-o"]).arg(&exe).arg(&source).arg("-ldl").status();
    if !built.is_ok_and(|s| s.success()) {
        assert!(!ci, "could not compile {}", source.display());
        eprintln!("skipped: no C compiler");
        return None;
    }
    Some((exe, dir))
}

/// The probe's output for `--only which` (and `args`) under `env`. Its limits are a loaded
/// CI machine's: a release has a second, a silent child 20 s.
fn probe(exe: &Path, dir: &Path, which: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let image = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/images/sm_90.cubin");
    let out = Command::new(exe)
        .args(["--image"])
        .arg(image)
        .args(["--only", which, "--watchdog-ms", "20000", "--window-ms", "1000"])
        .args(args)
        .env("LD_LIBRARY_PATH", dir)
        .env("TOPOCCL_STANDIN_DELAY_US", "0")
        .env_remove("TOPOCCL_STANDIN_STRICT")
        .env_remove("TOPOCCL_STANDIN_QUEUES")
        .env_remove("TOPOCCL_STANDIN_LOCKS")
        .env_remove("TOPOCCL_STANDIN_LAZY")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "driver_probes --only {which} {env:?} failed:\n{text}");
    text
}

/// The line starting with `prefix`.
fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{text}"))
}

#[test]
fn streams_that_share_a_hardware_queue_hold_each_other_up() {
    let Some((exe, dir)) = setup("queues") else { return };
    let queues = [("TOPOCCL_STANDIN_QUEUES", "connections")];
    let one = probe(&exe, &dir, "i", &["--connections", "1", "--max-between", "3"], &queues);
    assert!(
        line(&one, "RESULT (i) CUDA_DEVICE_MAX_CONNECTIONS=1:").contains("deadlocked at k=0-3"),
        "one queue: every later stream's release is behind the wait:\n{one}"
    );
    let eight = probe(&exe, &dir, "i", &["--connections", "8", "--max-between", "16"], &queues);
    assert!(
        line(&eight, "RESULT (i) CUDA_DEVICE_MAX_CONNECTIONS=8:")
            .contains("released at k=0-6,8-14,16; deadlocked at k=7,15"),
        "eight queues, round robin: the streams 8 apart share one:\n{eight}"
    );
    let own = probe(&exe, &dir, "i", &["--max-between", "16"], &[]);
    for conns in [1, 8] {
        assert!(
            line(&own, &format!("RESULT (i) CUDA_DEVICE_MAX_CONNECTIONS={conns}:")).contains("no deadlock"),
            "a queue per stream:\n{own}"
        );
    }
}

#[test]
fn resource_calls_wait_for_a_copy_into_pageable_memory() {
    let Some((exe, dir)) = setup("locks") else { return };
    let verdict = |text: &str, call: &str| {
        let l = line(text, &format!("{call} "));
        l.split('|').nth(1).map(str::trim).unwrap_or_default().to_string()
    };
    let all = probe(&exe, &dir, "ii", &[], &[("TOPOCCL_STANDIN_LOCKS", "all")]);
    for call in [
        "cuMemAlloc",
        "cuMemFree",
        "cuMemHostAlloc",
        "cuMemFreeHost",
        "cuMemHostRegister",
        "cuMemHostUnregister",
        "cuIpcGetMemHandle",
        "cuIpcOpenMemHandle",
        "cuIpcCloseMemHandle",
        "cuEventCreate",
        "cuStreamCreate",
        "cuModuleLoadData",
        "cuFuncLoad",
    ] {
        assert_eq!(verdict(&all, call), "BLOCKS", "{call} under TOPOCCL_STANDIN_LOCKS=all:\n{all}");
    }
    for call in
        ["cuEventQuery", "cuEventRecord", "cuMemcpyAsync", "cuStreamWriteValue32", "cuLaunchKernel (a kernel launched"]
    {
        assert_eq!(verdict(&all, call), "free", "{call}:\n{all}");
    }
    let observed = probe(&exe, &dir, "ii", &[], &[]);
    for call in ["cuEventCreate", "cuStreamCreate"] {
        assert_eq!(verdict(&observed, call), "BLOCKS", "{call} (as seen on an H200):\n{observed}");
    }
    for call in ["cuMemAlloc", "cuMemHostAlloc", "cuIpcGetMemHandle", "cuModuleLoadData"] {
        assert_eq!(verdict(&observed, call), "free", "{call} by default:\n{observed}");
    }
}

#[test]
fn kernels_load_at_their_first_launch_unless_loaded_before() {
    let Some((exe, dir)) = setup("loading") else { return };
    let at_launch = probe(&exe, &dir, "iii", &[], &[("TOPOCCL_STANDIN_LAZY", "launch")]);
    let lazy = line(&at_launch, "RESULT (iii) CUDA_MODULE_LOADING=(unset)");
    assert!(lazy.contains("after cuModuleGetFunction: NOT loaded"), "{at_launch}");
    assert!(lazy.contains("cuFuncGetAttribute(LOCAL_SIZE_BYTES) = 0: loaded"), "{at_launch}");
    let eager = line(&at_launch, "RESULT (iii) CUDA_MODULE_LOADING=EAGER");
    assert!(eager.contains("after cuModuleGetFunction: loaded"), "{at_launch}");
    let at_lookup = probe(&exe, &dir, "iii", &[], &[]);
    assert!(
        line(&at_lookup, "RESULT (iii) CUDA_MODULE_LOADING=(unset)").contains("after cuModuleGetFunction: loaded"),
        "{at_lookup}"
    );
}

/// Kernels of two streams on one shared hardware queue run side by side: two one-launch
/// kernels waiting for each other's line both end. Work of the first stream queued between
/// the two launches holds the queue, and they hang (the probe ends them through the abort
/// word): why topoccl's thread ranks return only once every rank has launched.
#[test]
fn kernels_of_streams_sharing_a_queue_run_side_by_side() {
    let Some((exe, dir)) = setup("side_by_side") else { return };
    let queues = [("TOPOCCL_STANDIN_QUEUES", "connections")];
    let one = probe(&exe, &dir, "v", &["--connections", "1"], &queues);
    assert!(line(&one, "launched one after the other").contains("both ended"), "{one}");
    assert!(line(&one, "A's stream has a copy queued between").contains("held up"), "{one}");
    assert!(!one.contains("WRONG DATA") && !one.contains("still busy"), "{one}");
    let eight = probe(&exe, &dir, "v", &["--connections", "8"], &queues);
    assert!(line(&eight, "launched one after the other").contains("both ended"), "{eight}");
    assert!(line(&eight, "A's stream has a copy queued between").contains("both ended"), "{eight}");
}

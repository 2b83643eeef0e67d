//! The C ABI's GPU data path from C, under the stand-in CUDA driver (`standins/cuda`):
//! `tests/c/device.c` calls the CUDA driver API itself (declaring what it uses, no `cuda.h`),
//! starts ranks — forked processes that each make a context and a stream after the fork, or
//! threads of one process after one `cuInit`, each making its context current and its own
//! stream and `ncclCommInitRank` communicator — and runs every collective × datatype × operator
//! on device buffers queued on the stream, checking every element read back on that stream;
//! also groups, DistributedDataParallel's steps as PyTorch's NCCL process group queues them (a
//! second, non-blocking stream, events both ways, a watchdog thread querying events, a pageable
//! read of the parameters after every step), `ncclCommInitAll` on one device,
//! `ncclCommCuDevice`, `ncclMemAlloc` and a stream of another context. The program links the stand-in's `libcuda.so.1` and runs with
//! `LD_LIBRARY_PATH=<stand-in>:<libnccl>`.
#![cfg(feature = "cuda")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

mod common;
use common::{built_library, repo};

/// Where the library is installed and the programs compiled, once for all tests (rewriting a
/// file a running program has mapped would crash it).
static BUILT: Mutex<Option<Built>> = Mutex::new(None);

struct Built {
    dirs: Option<(PathBuf, PathBuf)>,
    programs: HashMap<String, PathBuf>,
}

/// The stand-in driver's directory (`libcuda.so.1`, `libcuda.so`): `<profile>/cuda-standin`,
/// beside the directory of this test's executable; cargo builds it if it has not yet.
fn standin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf();
    let dir = profile.join("cuda-standin");
    if !profile.join("libcuda_standin.so").exists() || !dir.join("libcuda.so.1").exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "topoccl-standin-cuda"])
            .current_dir(repo())
            .status()
            .expect("cargo build of the stand-in driver");
        assert!(status.success(), "building the stand-in driver failed");
    }
    assert!(dir.join("libcuda.so.1").exists(), "no stand-in driver at {}", dir.display());
    dir
}

/// A directory holding our library as NCCL installs it (`libnccl.so.2`, `libnccl.so` → it), and
/// the stand-in's; `None` (after saying why) where this machine cannot build C.
fn install() -> Option<(PathBuf, PathBuf)> {
    let Some(lib) = built_library() else {
        assert!(std::env::var_os("CI").is_none(), "libnccl.so was not built next to the test");
        eprintln!("skipped: libnccl.so was not built next to {:?}", std::env::current_exe());
        return None;
    };
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (`cc`) on this machine");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("topoccl-nccl-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    std::fs::copy(&lib, dir.join("libnccl.so.2")).ok()?;
    let _ = std::fs::remove_file(dir.join("libnccl.so"));
    std::os::unix::fs::symlink("libnccl.so.2", dir.join("libnccl.so")).ok()?;
    Some((dir, standin_dir()))
}

/// `tests/c/device.c` compiled with `includes` (the first holds the `nccl.h` it is built
/// against) as `name`, linked with our library and the stand-in's `libcuda.so.1`; the
/// program, our library's directory and the stand-in's. `None`: skipped (said why).
fn program(includes: &[PathBuf], name: &str) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(|| Built { dirs: install(), programs: HashMap::new() });
    let (dir, standin) = built.dirs.clone()?;
    let prog = built
        .programs
        .entry(name.to_string())
        .or_insert_with(|| {
            let src = repo().join("tests/c/device.c");
            let out = dir.join(name);
            let mut cmd = Command::new("cc");
            cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"]);
            for i in includes {
                cmd.arg("-I").arg(i);
            }
            let status = cmd
                .arg(&src)
                .arg("-o")
                .arg(&out)
                .arg("-L")
                .arg(&dir)
                .arg("-lnccl")
                .arg("-L")
                .arg(&standin)
                .arg("-l:libcuda.so.1")
                .arg("-lpthread")
                .status()
                .unwrap();
            assert!(status.success(), "compiling {}", src.display());
            out
        })
        .clone();
    Some((prog, dir, standin))
}

/// Counts of one summary line: `...: C calls, E elements checked, W wrong`.
fn counts(line: &str) -> Option<(u64, u64, u64)> {
    let tail = line.rsplit(": ").next()?;
    let mut nums = tail.split(", ").map(|part| part.split(' ').next().and_then(|n| n.parse::<u64>().ok()));
    Some((nums.next()??, nums.next()??, nums.next()??))
}

/// Runs `device` with `args` under the stand-in (`delay_us`: its stream delay, `None` for its
/// default), requires success and every summary line to have checked elements and found none
/// wrong; returns the summary lines.
fn run(prog: &(PathBuf, PathBuf, PathBuf), args: &[&str], delay_us: Option<u32>) -> Vec<String> {
    let (prog, nccl, standin) = prog;
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", format!("{}:{}", standin.display(), nccl.display()))
        .env("TOPOCCL_TIMEOUT", "30")
        .env("DEVICE_TEST_TIMEOUT", "100")
        .env("TOPOCCL_CACHE_DIR", std::env::temp_dir().join("topoccl-nccl-cache"))
        // Each ncclCommDestroy logs the debug counter of NCCL's invariant (checked below).
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT");
    for var in [
        "NCCL_ALGO",
        "NCCL_PROTO",
        "TOPOCCL_ALGO",
        "TOPOCCL_STANDIN_DEVICES",
        "TOPOCCL_STANDIN_POISON",
        "DEVICE_TEST_VERBOSE",
    ] {
        cmd.env_remove(var);
    }
    match delay_us {
        Some(d) => cmd.env("TOPOCCL_STANDIN_DELAY_US", d.to_string()),
        None => cmd.env_remove("TOPOCCL_STANDIN_DELAY_US"),
    };
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let summaries: Vec<String> = stdout
        .lines()
        .filter(|l| l.contains(" calls, "))
        .map(|l| format!("{l} [{:.1} s]", t.elapsed().as_secs_f64()))
        .collect();
    println!("{}", summaries.join("\n"));
    assert!(out.status.success(), "device {args:?} failed ({}):\n{stdout}{stderr}", out.status);
    assert!(!summaries.is_empty(), "device {args:?} printed no summary:\n{stdout}{stderr}");
    for line in &summaries {
        let (calls, checked, wrong) = counts(line).unwrap_or_else(|| panic!("unreadable summary: {line}"));
        assert!(calls > 0 && checked > 0 && wrong == 0, "{line}\n{stderr}");
    }
    // No driver call by any library thread but the caller's while a device call was outstanding,
    // on any rank (every communicator's destroy says so, in NCCL's log: standard output).
    const COUNTER: &str = "driver calls by the executor while device calls were outstanding: ";
    let foreign: Vec<&str> = stdout.lines().filter_map(|l| l.split(COUNTER).nth(1)).collect();
    let ranks: usize = args[0].parse().expect("NRANKS");
    assert!(foreign.len() >= ranks, "{} of {ranks} ranks logged the counter:\n{stdout}{stderr}", foreign.len());
    assert!(foreign.iter().all(|n| n.trim() == "0"), "the executor made driver calls during device calls: {foreign:?}");
    summaries
}

fn ours() -> Option<(PathBuf, PathBuf, PathBuf)> {
    program(&[repo().join("ffi/include")], "device")
}

/// Every operator, PreMulSum with its scalar in device memory included.
const OPS: &str = "all";

#[test]
fn every_collective_type_and_operator_on_two_ranks() {
    let Some(prog) = ours() else { return };
    run(&prog, &["2", "primary", "own", "full", OPS], Some(20));
}

#[test]
fn every_collective_type_and_operator_on_four_ranks() {
    let Some(prog) = ours() else { return };
    run(&prog, &["4", "primary", "own", "full", OPS], Some(20));
}

#[test]
fn created_contexts_and_the_legacy_stream() {
    let Some(prog) = ours() else { return };
    run(&prog, &["2", "created", "legacy", "full", OPS], Some(20));
    run(&prog, &["4", "created", "own", "small", OPS], Some(20));
    run(&prog, &["4", "primary", "legacy", "small", OPS], Some(20));
}

/// The stand-in's default delays (up to 200 µs per stream item): fewer types, same checks.
#[test]
fn device_calls_with_the_default_stream_delays() {
    let Some(prog) = ours() else { return };
    run(&prog, &["2", "created", "legacy", "small", OPS], None);
    run(&prog, &["4", "primary", "own", "small", OPS], None);
}

/// Every reduction × datatype with PreMulSum's scalar in device memory (`ncclScalarDevice`),
/// rewritten on the stream before each call.
#[test]
fn premulsum_with_a_device_scalar() {
    let Some(prog) = ours() else { return };
    run(&prog, &["2", "primary", "own", "full", "device-scalar"], Some(20));
}

/// Runs `device` with `args` and its ranks as threads of one process (with a stream delay of
/// 20 µs), requiring the summary to say so.
fn run_threads(prog: &(PathBuf, PathBuf, PathBuf), args: &[&str]) -> Vec<String> {
    let args: Vec<&str> = args.iter().copied().chain(["threads"]).collect();
    let summaries = run(prog, &args, Some(20));
    assert!(summaries[0].contains(" ranks as threads, "), "not run as threads: {summaries:?}");
    summaries
}

/// The ranks as threads of one process — one `cuInit` before they start; each thread makes the
/// primary context current, creates its stream and joins the communicator with
/// `ncclCommInitRank` (the unique id handed over in memory) — on 2 and 4 ranks: every
/// collective × datatype × operator, and the rest of the program, as with processes.
#[test]
fn every_collective_type_and_operator_on_threads_of_one_process() {
    let Some(prog) = ours() else { return };
    run_threads(&prog, &["2", "primary", "own", "full", OPS]);
    run_threads(&prog, &["4", "primary", "own", "full", OPS]);
}

/// Threads with a `cuCtxCreate_v2` context each, on its legacy stream and on a stream of their
/// own. (Threads on the primary context cannot use its legacy stream: they would share it, and
/// each rank's call would wait behind the others', as with NVIDIA's NCCL; the program refuses.)
#[test]
fn threads_with_created_contexts_and_the_legacy_stream() {
    let Some(prog) = ours() else { return };
    run_threads(&prog, &["2", "created", "legacy", "full", OPS]);
    run_threads(&prog, &["4", "created", "legacy", "full", OPS]);
    run_threads(&prog, &["4", "created", "own", "small", OPS]);
}

/// NVIDIA's own `nccl.h` 2.30.7, where `ffi/tests/fetch-nvidia-nccl.sh` put it (CI runs it).
fn nvidia_header() -> Option<PathBuf> {
    let dir = std::env::var_os("TOPOCCL_NVIDIA_NCCL_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/nvidia-nccl-2.30.7/include"));
    if dir.join("nccl.h").exists() {
        return Some(dir);
    }
    assert!(std::env::var_os("CI").is_none(), "NVIDIA's nccl.h is missing: CI runs ffi/tests/fetch-nvidia-nccl.sh");
    eprintln!("skipped: NVIDIA's nccl.h 2.30.7 not found (run ffi/tests/fetch-nvidia-nccl.sh)");
    None
}

#[test]
fn the_program_built_against_nvidias_header_runs_on_ours() {
    let Some(nvidia) = nvidia_header() else { return };
    let Some(prog) = program(&[nvidia, repo().join("tests/c/cuda_stub")], "device-nvidia-header") else { return };
    run(&prog, &["2", "primary", "own", "small", OPS], Some(20));
}

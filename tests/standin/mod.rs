//! Running a test's body under the stand-in CUDA driver (`standins/cuda`): the test runs again
//! in a child process whose `LD_LIBRARY_PATH` finds the stand-in's `libcuda.so.1` (the dynamic
//! loader reads the variable only at start-up, so the parent cannot switch itself).
//!
//! On a machine with a GPU, `TOPOCCL_TEST_DRIVER=real` runs the same bodies in the test's own
//! process on the system's driver instead (`benches/gpu/lease.sh` does, one test per process).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

const CHILD: &str = "TOPOCCL_STANDIN_CHILD";

/// Whether the tests run on the system's own CUDA driver (`TOPOCCL_TEST_DRIVER=real`).
pub fn real_driver() -> bool {
    std::env::var("TOPOCCL_TEST_DRIVER").is_ok_and(|v| v == "real")
}

/// The directory holding the stand-in's `libcuda.so.1`, built if cargo has not yet.
pub fn dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe.parent().and_then(|d| d.parent()).expect("target/<profile>").to_path_buf();
    let dir = profile.join("cuda-standin");
    if !profile.join("libcuda_standin.so").exists() {
        let release = profile.file_name().is_some_and(|n| n == "release");
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "topoccl-standin-cuda"])
            .args(release.then_some("--release"))
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
    if std::env::var_os(CHILD).is_some() || real_driver() {
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

/// True in a rank process (run the body there, joining with `Communicator::from_env`); in the
/// parent, runs the test `name` as `n` rank processes under the stand-in (or the real driver)
/// with `env`, requires every one to pass within `timeout_s`, and returns false.
pub fn ranks(name: &str, n: u32, env: &[(&str, &str)], timeout_s: u64) -> bool {
    ranks_where_one_dies(name, n, u32::MAX, env, timeout_s)
}

/// [`ranks`], where rank `dies` is meant to end without passing (killed mid-call).
pub fn ranks_where_one_dies(name: &str, n: u32, dies: u32, env: &[(&str, &str)], timeout_s: u64) -> bool {
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    match ranks_each(name, n, dies, &|_| env.clone(), timeout_s) {
        None => true,
        Some(all) => {
            print!("{all}");
            false
        }
    }
}

/// `None` in a rank process (run the body there); in the parent, runs the test `name` as `n`
/// rank processes, rank `r` with the environment `env(r)`, requires every one but `dies` to
/// pass within `timeout_s`, and returns their output.
pub fn ranks_each(
    name: &str,
    n: u32,
    dies: u32,
    env: &dyn Fn(u32) -> Vec<(String, String)>,
    timeout_s: u64,
) -> Option<String> {
    if std::env::var_os("TOPOCCL_TEST_RANK").is_some() {
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let exe = std::env::current_exe().expect("test executable");
    let logs = std::env::temp_dir().join(format!("topoccl-ranks-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&logs).expect("log directory");
    let mut children = Vec::new();
    for r in 0..n {
        // Output goes to files, not pipes: a rank that prints much never blocks on a full pipe.
        let log = std::fs::File::create(logs.join(format!("rank{r}"))).expect("rank log");
        let mut c = Command::new(&exe);
        c.args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env("TOPOCCL_TEST_RANK", r.to_string())
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .envs(env(r))
            .stdout(log.try_clone().expect("rank log"))
            .stderr(log);
        if !real_driver() {
            c.env("LD_LIBRARY_PATH", dir());
        }
        children.push(c.spawn().expect("rank process"));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_s);
    let mut failed = Vec::new();
    let mut texts = Vec::new();
    for (r, mut child) in children.into_iter().enumerate() {
        while child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
        }
        let status = child.wait().expect("rank status");
        let text = std::fs::read_to_string(logs.join(format!("rank{r}"))).unwrap_or_default();
        if r as u32 != dies && (!status.success() || !text.contains("1 passed")) {
            failed.push(r);
        }
        texts.push(format!("--- rank {r} ({status}):\n{text}"));
    }
    let _ = std::fs::remove_dir_all(&logs);
    let all = texts.join("\n");
    assert!(failed.is_empty(), "{name}: ranks {failed:?} failed:\n{all}");
    Some(all)
}

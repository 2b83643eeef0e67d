//! `collbench --topology detect` as a user runs it: under the stand-in NVML (`standins/nvml`,
//! found through `LD_LIBRARY_PATH`) it prints the GPUs it found and the machine they are, and
//! simulates or tunes for it; without NVML it prints one line saying so and uses the host model.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>/nvml-standin` (the stand-in is a dev-dependency: cargo builds it).
fn standin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap().join("nvml-standin");
    assert!(dir.join("libnvidia-ml.so.1").exists(), "no stand-in NVML at {}", dir.display());
    dir
}

fn collbench(args: &[&str], lib_dir: &Path, machine: &str) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("TOPOCCL_STANDIN_NVML_MACHINE", machine)
        .env("TOPOCCL_TIMEOUT", "60")
        .env_remove("TOPOCCL_TOPOLOGY")
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn simulating_the_detected_machine_prints_it_and_uses_it() {
    let args = ["--simulate", "--topology", "detect", "--algo", "ring", "-b", "1M", "-e", "1M"];
    let (ok, out, err) = collbench(&args, &standin_dir(), "dgx-h100");
    assert!(ok, "{err}");
    for want in [
        "# detected through NVML (driver 550.90.07): 8 GPUs",
        "NVIDIA H100 80GB HBM3  0000:18:00.0     0  9.0   80 GiB  18 to 4 NVSwitches (5+4+4+5)",
        "# recognised: dgx-h100 (NVLink 4, 25 GB/s per link): using the library's topology dgx-h100",
        "# topology dgx-h100: 8 ranks",
    ] {
        assert!(out.contains(want), "missing `{want}` in\n{out}");
    }
}

#[test]
fn ranks_tune_for_a_subset_of_the_detected_machine() {
    let args = ["--topology", "detect[0,3]", "-n", "2", "-b", "1K", "-e", "1K", "-N", "2", "--compare-sim"];
    let (ok, out, err) = collbench(&args, &standin_dir(), "dgx1");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("# detected through NVML").count(), 1, "printed once:\n{out}");
    assert!(out.contains("recognised: dgx1"), "{out}");
    assert!(out.contains("predictions on topology dgx1[0,3]"), "{out}");
    let (ok, _, err) = collbench(&["--topology", "detect", "-n", "2", "-b", "1K", "-e", "1K"], &standin_dir(), "dgx1");
    assert!(!ok);
    assert!(
        err.contains("topology dgx1 has 8 ranks, but -n is 2 (give -n 8, or a subset: --topology detect[0-1])"),
        "{err}"
    );
}

#[test]
fn without_nvml_one_line_says_so_and_the_host_model_is_used() {
    let empty = std::env::temp_dir().join(format!("collbench-no-nvml-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let args = ["--topology", "detect", "-n", "2", "-b", "1K", "-e", "1K", "-N", "2"];
    let (ok, out, err) = collbench(&args, &empty, "dgx1");
    let _ = std::fs::remove_dir_all(&empty);
    assert!(ok, "{out}\n{err}");
    let said: Vec<&str> = out.lines().filter(|l| l.contains("NVML")).collect();
    if said.iter().any(|l| l.contains("detected through NVML")) {
        eprintln!("this machine has an NVML: the no-NVML test has nothing to show");
        return;
    }
    assert_eq!(said.len(), 1, "{out}");
    assert!(said[0].starts_with("# topology detect: no NVML: cannot load libnvidia-ml.so.1"), "{out}");
    assert!(said[0].ends_with("; using the host model"), "{out}");
    assert!(out.contains("all_reduce"), "the sweep still ran:\n{out}");
    assert!(!err.contains("TOPOCCL_TOPOLOGY"), "the ranks were told the host model, not `detect`:\n{err}");
}

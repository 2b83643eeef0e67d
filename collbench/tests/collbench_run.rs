//! `collbench` on real ranks, as a user runs it: it spawns its ranks, checks every collective,
//! type and operator against the reference, writes the table, JSON, CSV and SVG, and names a
//! rank that dies.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn collbench(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_collbench")).args(args).env("TOPOCCL_TIMEOUT", "60").output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The measured rows of a table: (collective block, fields).
fn rows(table: &str) -> Vec<(String, Vec<String>)> {
    let mut block = String::new();
    let mut out = Vec::new();
    for line in table.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            if rest.contains(" · algorithm ") {
                block = rest.split(' ').next().unwrap_or("").to_string();
            }
        } else if line.starts_with(' ') {
            out.push((block.clone(), line.split_whitespace().map(str::to_string).collect()));
        }
    }
    out
}

#[test]
fn every_collective_type_and_op_is_right_on_both_transports() {
    let (code, out, err) = collbench(&[
        "-n",
        "3",
        "-b",
        "0",
        "-e",
        "70K",
        "-f",
        "7",
        "--collective",
        "all",
        "-d",
        "all",
        "-o",
        "all",
        "-N",
        "1",
        "-w",
        "0",
        "--transport",
        "tcp,shm",
    ]);
    assert_eq!(code, Some(0), "{err}\n{out}");
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    let rows = rows(&out);
    // Sizes 0, 7, 49, 343, 2401, 16807; reductions for 5 ops, 12 types; 2 transports.
    let per_type = |b: &str| if ["all_reduce", "reduce_scatter", "reduce"].contains(&b) { 5 } else { 1 };
    let want: usize = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "sendrecv"]
        .iter()
        .map(|b| 2 * 12 * 6 * per_type(b))
        .sum();
    assert_eq!(rows.len(), want, "{out}");
    for (block, f) in &rows {
        // size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong | ran
        assert_eq!(f[8], "0", "{block}: {f:?}");
        assert!(f[12] == "0" || (block == "sendrecv" && f[12] == "-"), "{block}: {f:?}");
    }
}

#[test]
fn table_json_csv_and_plot_for_several_algorithms() {
    let dir = std::env::temp_dir().join(format!("collbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (svg, csv, json) = (dir.join("bw.svg"), dir.join("bw.csv"), dir.join("bw.json"));
    let (code, out, err) = collbench(&[
        "-n",
        "4",
        "-b",
        "1K",
        "-e",
        "1M",
        "-f",
        "4",
        "--algo",
        "ring,tree,rhd",
        "--compare-sim",
        "--plot",
        svg.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}\n{out}");
    for want in ["algorithm ring", "algorithm tree", "algorithm rhd", "predicted", "# Avg bus bandwidth"] {
        assert!(out.contains(want), "missing `{want}` in\n{out}");
    }
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 3, "{svg}");
    let csv = std::fs::read_to_string(csv).unwrap();
    assert_eq!(csv.lines().count(), 1 + 3 * 6, "{csv}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert_eq!(v["nranks"], 4);
    assert_eq!(v["blocks"].as_array().unwrap().len(), 3);
    assert!(v["blocks"][0]["rows"][0]["predicted"]["busbw"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_dir_all(dir);
}

/// The pid of the child of `parent` that is rank `rank`.
fn rank_pid(parent: u32, rank: u32) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat.rsplit(')').next().and_then(|s| s.split_whitespace().nth(1)).and_then(|p| p.parse().ok());
        if ppid != Some(parent) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|&b| b == 0).any(|kv| kv == format!("TOPOCCL_COLLBENCH_RANK={rank}").as_bytes()) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn a_killed_rank_is_named_with_its_signal() {
    let child = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args(["-n", "3", "-b", "16M", "-e", "16M", "-N", "100000"])
        .env("TOPOCCL_TIMEOUT", "60")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let victim = loop {
        if let Some(p) = rank_pid(child.id(), 2) {
            break p;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "rank 2 never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim), nix::sys::signal::Signal::SIGKILL).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("collbench: rank 2 was killed by signal 9 (SIGKILL)"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
}

//! Emulated topologies (needs root, `ip` and `tc`; skipped with the reason otherwise — CI runs
//! as root): `collbench --emulate` builds a small shaped network, runs checked all-reduces on
//! it, and leaves no namespace behind, also when it is interrupted or a previous run was
//! killed.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use collbench::emu::netns;

fn skip() -> bool {
    match netns::unavailable() {
        Some(why) => {
            eprintln!("skipped: {why}");
            true
        }
        None => false,
    }
}

fn namespaces_of(pid: u32) -> Vec<String> {
    let prefix = format!("topoccl-{pid}-");
    netns::list().unwrap().into_iter().filter(|n| n.starts_with(&prefix)).collect()
}

/// A pid no process has now.
fn dead_pid() -> u32 {
    (4_000_000..).find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).unwrap()
}

/// Runs collbench with `args` to a successful end; its pid and standard output.
fn run_ok(args: &[&str]) -> (u32, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args(args)
        .env("TOPOCCL_TIMEOUT", "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    (pid, stdout.into_owned())
}

/// Starts collbench with `args` and `TOPOCCL_TIMEOUT` = `timeout_s`, and waits until its
/// emulated network (`namespaces` of them) is up; stdout is piped when `stdout` is set.
fn start_emulation(args: &[&str], timeout_s: f64, namespaces: usize, stdout: bool) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args(args)
        .env("TOPOCCL_TIMEOUT", timeout_s.to_string())
        .stdout(if stdout { Stdio::piped() } else { Stdio::null() })
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while namespaces_of(child.id()).len() < namespaces {
        assert!(started.elapsed() < Duration::from_secs(30), "the network never came up");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// How `child` ended, or `None` (and it is killed) if it still runs at `deadline`.
fn ended_by(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_checked_all_reduce_runs_on_an_emulated_line_and_nothing_is_left() {
    if skip() {
        return;
    }
    // What a run killed with SIGKILL would leave: reaped by the next run.
    let stale = format!("topoccl-{}-0", dead_pid());
    netns::add(&stale).unwrap();
    let (pid, stdout) = run_ok(&[
        "--emulate",
        "ring:3",
        "-b",
        "64K",
        "-e",
        "256K",
        "-f",
        "4",
        "-N",
        "2",
        "--algo",
        "ring,tacos",
        "--compare-sim",
    ]);
    assert!(stdout.contains("# emulated ring:3 (3 namespaces, 3 shaped links"), "{stdout}");
    assert!(stdout.contains("latency not emulated"), "{stdout}");
    assert!(stdout.contains("Out of bounds values : 0 OK"), "{stdout}");
    // Two sizes per algorithm, each with a prediction beside it.
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with(' ') && l.contains(" float ")).collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    assert!(namespaces_of(pid).is_empty(), "left behind: {:?}", namespaces_of(pid));
    assert!(!netns::list().unwrap().contains(&stale), "the stale namespace {stale} was not reaped");
}

#[test]
fn an_interrupted_run_tears_the_network_down() {
    if skip() {
        return;
    }
    let args = ["--emulate", "ring:3", "-b", "256M", "-e", "256M", "-N", "50", "--emulate-scale", "1"];
    let mut child = start_emulation(&args, 60.0, 3, false);
    let pid = child.id();
    // Let the ranks start moving data, then Ctrl-C.
    std::thread::sleep(Duration::from_millis(1500));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let status =
        ended_by(&mut child, Instant::now() + Duration::from_secs(20)).expect("collbench did not end after SIGINT");
    assert_eq!(status.code(), Some(130));
    assert!(namespaces_of(pid).is_empty(), "left behind: {:?}", namespaces_of(pid));
}

#[test]
fn a_switched_machine_with_per_pair_classes_on_shared_links_runs_checked() {
    if skip() {
        return;
    }
    // Two nodes of two GPUs: each node's NIC link carries two GPUs' traffic to the other
    // node, so the shaping has one class per rank pair there, filtered by address; `tc`
    // must take every command (the build fails otherwise) and the all-reduces check.
    let (pid, stdout) =
        run_ok(&["--emulate", "cluster:2x2", "-b", "1M", "-e", "1M", "-N", "1", "--algo", "ring,blink"]);
    assert!(stdout.contains("Out of bounds values : 0 OK"), "{stdout}");
    assert!(namespaces_of(pid).is_empty(), "left behind: {:?}", namespaces_of(pid));
}

/// A link of an emulated topology taken down mid-run (carrier lost, no reset: TCP just stops
/// moving): every rank fails within the deadline, no rank reports success or wrong data, and
/// each error names the link's two ends among its culprits.
#[test]
fn a_link_taken_down_mid_run_fails_every_rank_naming_the_link() {
    if skip() {
        return;
    }
    let timeout_s = 3.0;
    let args = ["--emulate", "ring:3", "-b", "1M", "-e", "1M", "-N", "100000", "--algo", "ring", "-c", "1"];
    let mut child = start_emulation(&args, timeout_s, 3, true);
    let pid = child.id();
    // The ranks are moving data; then the link between ranks 0 and 1 goes down.
    std::thread::sleep(Duration::from_millis(3000));
    let ns0 = format!("topoccl-{pid}-0");
    netns::run("ip", &["-n", &ns0, "link", "set", "to1", "down"]).unwrap();
    let down = Instant::now();
    let status = ended_by(&mut child, down + Duration::from_secs_f64(timeout_s * 2.0 + 10.0))
        .unwrap_or_else(|| panic!("collbench still runs {:?} after the link went down", down.elapsed()));
    let took = down.elapsed();
    let mut stdout = String::new();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    eprintln!(
        "{stderr}\nthe run ended {:.2} s after the link went down (TOPOCCL_TIMEOUT {timeout_s} s)",
        took.as_secs_f64()
    );
    assert_ne!(status.code(), Some(0), "the run succeeded over a dead link:\n{stdout}\n{stderr}");
    assert!(!stdout.contains("FAILED") && !stderr.contains("wrong"), "{stdout}\n{stderr}");
    assert!(
        took < Duration::from_secs_f64(timeout_s + 5.0),
        "the ranks failed {took:?} after the link went down:\n{stderr}"
    );
    // Every rank's error names the link: the two ends, or a cycle of waits through it (a
    // ring whose one link is dead leaves every rank waiting for its predecessor).
    for r in 0..3 {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("collbench: rank {r}: ")))
            .unwrap_or_else(|| panic!("no error from rank {r}:\n{stderr}"));
        let named: Vec<u32> = line
            .split_once("ranks [")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(list, _)| list.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_default();
        let link = line.contains("between rank 0 and rank 1") || line.contains("between rank 1 and rank 0");
        assert!(link || (named.contains(&0) && named.contains(&1)), "rank {r} does not name the link: {line}");
    }
    assert!(namespaces_of(pid).is_empty(), "left behind: {:?}", namespaces_of(pid));
}

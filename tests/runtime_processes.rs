//! Ranks as separate processes, started the way launchers start them (environment variables):
//! the README's two-process example, a rank that never comes, and a rank killed mid-call.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use free_port::free_port;
use topoccl::{Communicator, ReduceOp};

mod free_port;
mod verbs_standin;

/// The example's binary. `cargo test` builds examples; a filtered run (`--test`) may not have,
/// so build it then.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("examples").join(name);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let profile_release = exe.to_string_lossy().contains("/release/");
        let mut c = Command::new(cargo);
        c.args(["build", "--example", name]);
        if profile_release {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success(), "building example {name}");
    }
    path
}

fn rank_command(program: &PathBuf, rank: u32, size: u32, port: u16, extra: &[(&str, &str)]) -> Command {
    let mut c = Command::new(program);
    c.env("RANK", rank.to_string())
        .env("WORLD_SIZE", size.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        c.env(k, v);
    }
    c
}

fn wait_with_deadline(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

fn output(child: Child) -> String {
    let o = child.wait_with_output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn the_example_all_reduces_across_two_processes() {
    let exe = example("allreduce");
    assert!(exe.exists(), "{} missing (cargo test builds examples)", exe.display());
    for transport in ["tcp", "shm"] {
        let port = free_port();
        let kids: Vec<Child> = (0..2)
            .map(|r| rank_command(&exe, r, 2, port, &[("TOPOCCL_TRANSPORT", transport)]).spawn().unwrap())
            .collect();
        for (r, k) in kids.into_iter().enumerate() {
            let o = k.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "rank {r}: {text}{}", String::from_utf8_lossy(&o.stderr));
            assert!(text.contains(&format!("rank {r} of 2 ([\"{transport}\"]): all_reduce = [3.0, 3.0")), "{text}");
        }
    }
}

#[test]
fn a_rank_that_never_comes_is_a_clear_failure() {
    let exe = example("allreduce");
    let mut k = rank_command(&exe, 0, 2, free_port(), &[("TOPOCCL_TIMEOUT", "2")]).spawn().unwrap();
    let status = wait_with_deadline(&mut k, Instant::now() + Duration::from_secs(20)).expect("exits");
    let text = output(k);
    assert!(!status.success());
    assert!(text.contains("rank(s) 1 of 2 never reached the rendezvous"), "{text}");
}

/// A rank process for the kill test: all-reduces until something fails.
#[test]
fn child_rank() {
    if std::env::var("TOPOCCL_TEST_CHILD").is_err() {
        return;
    }
    let result = (|| -> topoccl::Result<()> {
        let comm = Communicator::from_env()?;
        let elems = std::env::var("TOPOCCL_TEST_ELEMS").ok().and_then(|v| v.parse().ok()).unwrap_or(1 << 18);
        let send = vec![1.0f32; elems];
        let mut recv = vec![0.0f32; elems];
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
        println!("READY");
        loop {
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
        }
    })();
    if let Err(e) = result {
        println!("ERROR: {e}");
        std::process::exit(3);
    }
}

#[test]
fn a_killed_rank_fails_the_others_promptly() {
    // 1 MiB calls, and 64 MiB ones, which do not fit in what a rank may queue for a peer.
    // On two ranks, the survivor's first step only sends: it waits for room to send to the
    // dead rank, and nothing else tells it that rank died.
    for (transport, elems, nranks) in [
        ("tcp", "262144", 3),
        ("shm", "262144", 3),
        ("ib", "262144", 3),
        ("tcp", "16777216", 2),
        ("shm", "16777216", 2),
        ("ib", "16777216", 2),
    ] {
        killed_rank_fails_the_others(transport, elems, nranks);
    }
}

fn killed_rank_fails_the_others(transport: &str, elems: &str, nranks: u32) {
    let me = std::env::current_exe().unwrap();
    let port = free_port();
    // Over verbs: the stand-in libibverbs, whose emulated NIC would report the dead peer only
    // after NCCL's default retransmissions (~34 s); the liveness line must tell first.
    let lib = verbs_standin::lib();
    let env = [
        ("TOPOCCL_TEST_CHILD", "1"),
        ("TOPOCCL_TRANSPORT", transport),
        ("TOPOCCL_TIMEOUT", "60"),
        ("TOPOCCL_TEST_ELEMS", elems),
        ("TOPOCCL_IBVERBS_LIB", &lib),
    ];
    let mut kids: Vec<Child> = (0..nranks)
        .map(|r| {
            let mut c = rank_command(&me, r, nranks, port, &env);
            c.args(["--exact", "child_rank", "--nocapture", "--test-threads=1"]);
            c.spawn().unwrap()
        })
        .collect();
    // Wait until every rank is in its loop.
    let mut readers: Vec<_> = kids.iter_mut().map(|k| BufReader::new(k.stdout.take().unwrap())).collect();
    for (i, r) in readers.iter_mut().enumerate() {
        let (mut line, mut said) = (String::new(), String::new());
        while !line.contains("READY") {
            line.clear();
            let ended = r.read_line(&mut line).unwrap() == 0;
            said += &line;
            assert!(!ended, "{transport}, {elems} floats: rank {i} ended before it was ready:\n{said}");
        }
    }
    // Stopped first, so that the others fill what they may queue for it and wait for room to
    // send (a peer that died mid-transfer), then killed.
    let last = nranks as usize - 1;
    let stopped = Command::new("kill").args(["-STOP", &kids[last].id().to_string()]).status().unwrap();
    assert!(stopped.success());
    std::thread::sleep(Duration::from_millis(300));
    kids[last].kill().unwrap();
    let killed = Instant::now();
    let mut messages = String::new();
    for (r, k) in kids.iter_mut().take(last).enumerate() {
        let status = wait_with_deadline(k, killed + Duration::from_secs(15));
        assert!(
            status.is_some(),
            "{transport}, {elems} floats: rank {r} still running 15 s after rank {last} was killed"
        );
        assert_eq!(status.unwrap().code(), Some(3), "{transport}, {elems} floats: rank {r}");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut readers[r], &mut rest).unwrap();
        messages += &rest;
    }
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(10), "{transport}, {elems} floats: {took:?}");
    assert!(messages.contains(&format!("rank {last}")), "{transport}, {elems} floats: {messages}");
    let _ = kids[last].wait();
}

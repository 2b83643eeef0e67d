//! `collbench --simulate` as a user runs it: a table, JSON, and one clear line plus a non-zero
//! exit for bad input.

use std::process::Command;

fn collbench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_collbench")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn simulated_sweep_prints_an_nccl_tests_table() {
    let (ok, out, err) =
        collbench(&["--simulate", "--topology", "dgx1", "--algo", "ring,tree,rhd", "-b", "8", "-e", "1M", "-f", "4"]);
    assert!(ok, "{err}");
    for want in ["# topology dgx1: 8 ranks", "algorithm ring", "algorithm tree", "algorithm rhd", "# Avg bus bandwidth"]
    {
        assert!(out.contains(want), "missing `{want}` in\n{out}");
    }
    // 8, 32, …, 512K (×4 up to 1M): 9 sizes per algorithm.
    let rows = out.lines().filter(|l| l.starts_with(' ') && l.contains("float")).count();
    assert_eq!(rows, 3 * 9, "{out}");
}

#[test]
fn json_output_parses() {
    let (ok, out, err) = collbench(&[
        "--simulate",
        "--topology",
        "torus2d:4x4",
        "--algo",
        "all",
        "--collective",
        "all_gather",
        "-b",
        "1K",
        "-e",
        "1M",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["nranks"], 16);
    let sweeps = v["sweeps"].as_array().unwrap();
    assert!(sweeps.len() >= 2);
    for s in sweeps {
        for r in s["rows"].as_array().unwrap() {
            assert!(r["time_us"].as_f64().unwrap() > 0.0);
        }
    }
}

#[test]
fn bad_input_gives_one_line_and_a_failure() {
    for (args, want) in [
        (vec!["--simulate", "--topology", "nonesuch"], "unknown topology"),
        (vec!["--simulate", "--algo", "magic"], "unknown algorithm"),
        (vec!["--simulate", "-b", "12Q"], "bad size"),
        (vec!["--simulate", "--collective", "alltoall", "--algo", "tree"], "cannot build"),
        (vec!["--simulate", "-d", "complex"], "unknown datatype"),
        (vec!["--simulate", "-r", "9"], "root 9 out of range"),
        (vec!["--topology", "dgx1"], "dgx1 has 8 ranks, but -n is 2"),
        (vec!["-b", "1K", "--transport", "rdma"], "unknown transport"),
        // No RDMA port here (a library that fails, or none), and none stands in.
        (vec!["-b", "1K", "--transport", "ib"], "TOPOCCL_TRANSPORT=ib, but there is no RDMA port"),
        (vec!["-n", "2", "-r", "2"], "root 2 out of range"),
    ] {
        let (ok, out, err) = collbench(&args);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// Without `--transport` the library's own `TOPOCCL_TRANSPORT` holds (collbench's default once
/// overrode it: `TOPOCCL_TRANSPORT=ib collbench` ran shared memory); the flag, when given, wins.
#[test]
fn the_transport_variable_holds_unless_the_flag_is_given() {
    let run = |args: &[&str], transport: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_collbench"))
            .args(args)
            .env("TOPOCCL_TRANSPORT", transport)
            .env_remove("TOPOCCL_IBVERBS_LIB")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, out, err) = run(&["-b", "1K", "-e", "1K", "--collective", "all_reduce"], "ib");
    assert!(!ok, "ran without an RDMA port: {out}");
    assert!(err.contains("no RDMA port"), "{err}");
    let (ok, _, err) = run(&["-b", "1K", "-e", "1K"], "carrier-pigeon");
    assert!(!ok && err.contains("TOPOCCL_TRANSPORT") && err.trim().lines().count() == 1, "{err}");
    let (ok, out, err) = run(&["-b", "1K", "-e", "1K", "--collective", "all_reduce", "--transport", "tcp"], "ib");
    assert!(ok, "{err}");
    assert!(out.contains("transport tcp"), "{out}");
}

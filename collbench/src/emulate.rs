//! `collbench --emulate TOPOLOGY`: builds the topology as a real shaped network on this
//! machine ([`crate::emu`]), runs one rank in each rank namespace (as a launcher would: `RANK`,
//! `WORLD_SIZE`, `MASTER_ADDR`), and tears the network down however the run ends — success,
//! a failed rank, or Ctrl-C / SIGTERM (the ranks are stopped first).
//!
//! The ranks reason about the machine as emulated (the same nodes and routes, links at their
//! shaped rates, no latency), so the tuner's choice and `--compare-sim` predict what the
//! emulated network can do, not the real machine it stands for.

use std::io::Write;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use topoccl_synth::topology::{self, file::to_toml};

use super::Args;
use crate::emu::plan::ADDRESS_IFACE;
use crate::emu::Emulation;
use crate::error::{Error, Result};
use crate::launch;

/// Set in a rank started by an emulation (its value describes the network).
pub const EMULATED_VAR: &str = "TOPOCCL_EMULATED";

/// The port rank 0's rendezvous listens on: each rank namespace is a fresh network stack.
const RENDEZVOUS_PORT: u16 = 29400;

/// Whether this process is a rank an emulation started.
pub fn is_emulated_rank() -> bool {
    topoccl::env::var(EMULATED_VAR).is_some()
}

/// Runs the emulation's parent; returns the exit code of the run.
pub fn run(args: &Args, spec: &str, out: &mut dyn Write) -> Result<i32> {
    if args.topology.is_some() {
        return Err(Error::InvalidArgument("--emulate names the topology; --topology cannot be given as well".into()));
    }
    let topo = topology::resolve(spec)?;
    let n = topo.nranks() as u32;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| Error::io("installing signal handlers", e))?;
    }
    let mut emu = Emulation::build(&topo, args.emulate_scale)?;
    let scaled = std::env::temp_dir().join(format!("topoccl-emulated-{}.toml", std::process::id()));
    let result = (|| {
        std::fs::write(&scaled, to_toml(&emu.plan.scaled)?)
            .map_err(|e| Error::io(format!("writing {}", scaled.display()), e))?;
        let about = format!(
            "emulated {} ({} namespaces, {} shaped links, {:.1} Mbit/s per GB/s, latency not emulated)",
            topo.name(),
            emu.namespaces().len(),
            emu.plan.links.len(),
            emu.plan.scale
        );
        if args.json.as_deref() != Some("-") {
            let _ = writeln!(out, "# {about}\n# links (Mbit/s each way):\n{}\n#", emu.plan.describe().trim_end());
            let _ = out.flush();
        }
        let children = spawn_ranks(&emu, n, &scaled, &about)?;
        launch::supervise(children, Some(&stop))
    })();
    let _ = std::fs::remove_file(&scaled);
    let torn = emu.teardown();
    let code = result?;
    torn?;
    Ok(code)
}

/// The arguments a rank gets: the parent's, plus the scaled topology.
fn rank_args(scaled: &std::path::Path) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    a.push("--topology".into());
    a.push(scaled.into());
    a
}

fn spawn_ranks(
    emu: &Emulation,
    n: u32,
    scaled: &std::path::Path,
    about: &str,
) -> Result<Vec<Option<std::process::Child>>> {
    let exe = std::env::current_exe().map_err(|e| Error::io("finding collbench's own executable", e))?;
    let root = emu.rank_ip(0).ok_or_else(|| Error::Internal("emulation without rank 0".into()))?;
    let mut children = Vec::new();
    for r in 0..n {
        let ns = emu.rank_namespace(r).ok_or_else(|| Error::Internal(format!("no namespace for rank {r}")))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .arg(&exe)
            .args(rank_args(scaled))
            .env(EMULATED_VAR, about)
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", root.to_string())
            .env("MASTER_PORT", RENDEZVOUS_PORT.to_string())
            .env("TOPOCCL_SOCKET_IFNAME", format!("={ADDRESS_IFACE}"))
            .env("TOPOCCL_TRANSPORT", "tcp");
        launch::start_rank(cmd, r, &mut children, &format!("in namespace {ns}"))?;
    }
    Ok(children)
}

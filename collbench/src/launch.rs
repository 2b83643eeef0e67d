//! How collbench's ranks come to be: under a launcher (mpirun, srun, torchrun: their variables
//! are set) this process is one rank; otherwise it spawns `-n` copies of itself on this
//! machine, hands them a unique id, keeps rank 0's output, and watches them: a rank that fails
//! to start or dies is named with its exit status, and the survivors (which notice the loss
//! within the communicator's deadline) are stopped if they linger.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use topoccl::comm::{Communicator, Config, UniqueId};
use topoccl::env::{launcher_world_size, var};

/// Variables a spawned rank receives from its parent.
const ID_VAR: &str = "TOPOCCL_COLLBENCH_ID";
const RANK_VAR: &str = "TOPOCCL_COLLBENCH_RANK";
const NRANKS_VAR: &str = "TOPOCCL_COLLBENCH_NRANKS";

/// Exit status of a rank whose sweep found wrong results (it printed why).
pub const WRONG_RESULTS: i32 = 3;

/// How long survivors may take to wind down after a rank failed.
const GRACE: Duration = Duration::from_secs(10);

/// What this process is.
pub enum Role {
    /// One rank of a job, with how it was started and whether its standard output is the
    /// user's own (spawned by collbench; launchers forward output through pseudo-terminals,
    /// so a terminal there is no sign of a person watching).
    Rank(Box<Communicator>, String, bool),
    /// The parent of `n` local ranks it must spawn.
    Spawn(u32),
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>> {
    let bad = || Error::InvalidArgument(format!("{ID_VAR} is not a hex unique id"));
    if s.len() % 2 != 0 {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect()
}

/// Decides the role; joins the communicator when this process is a rank.
pub fn role(nranks: u32, config: &Config) -> Result<Role> {
    if let (Some(id), Some(rank), Some(n)) = (var(ID_VAR), var(RANK_VAR), var(NRANKS_VAR)) {
        let id = UniqueId::from_bytes(&unhex(&id)?)?;
        let parse = |v: &str, name: &str| {
            v.parse::<u32>().map_err(|_| Error::InvalidArgument(format!("{name}={v} is not a number")))
        };
        let (rank, n) = (parse(&rank, RANK_VAR)?, parse(&n, NRANKS_VAR)?);
        let comm = Communicator::init_with(&id, rank, n, config.clone())?;
        return Ok(Role::Rank(Box::new(comm), format!("{n} ranks spawned on this machine"), true));
    }
    match launcher_world_size() {
        Some(size) if size > 1 => {
            let comm = Communicator::from_env_with(config.clone())?;
            let how = match var(super::emulate::EMULATED_VAR) {
                Some(network) => format!("{size} ranks on the {network}"),
                None => format!("{size} ranks started by a launcher"),
            };
            Ok(Role::Rank(Box::new(comm), how, false))
        }
        _ => Ok(Role::Spawn(nranks)),
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => {
            let name = nix::sys::signal::Signal::try_from(s).map(|s| s.as_str()).unwrap_or("?");
            format!("was killed by signal {s} ({name})")
        }
        _ => format!("ended ({status})"),
    }
}

/// Spawns `n` ranks running this program with the same arguments; returns the exit code the
/// whole run should end with, having printed (to standard error) which rank failed first.
pub fn spawn(n: u32) -> Result<i32> {
    if n == 0 {
        return Err(Error::InvalidArgument("-n must be at least 1".into()));
    }
    let exe = std::env::current_exe().map_err(|e| Error::io("finding collbench's own executable", e))?;
    // The rendezvous runs in this process, so no port has to be agreed on.
    let id = UniqueId::new()?;
    let id = hex(&id.to_bytes());
    let mut children: Vec<Option<Child>> = Vec::new();
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(std::env::args_os().skip(1))
            .env(ID_VAR, &id)
            .env(RANK_VAR, r.to_string())
            .env(NRANKS_VAR, n.to_string());
        start_rank(cmd, r, &mut children, &exe.display().to_string())?;
    }
    supervise(children, None)
}

/// Starts rank `r` (only rank 0's standard output is kept) and adds it to `children`; on
/// failure the ranks already started are killed.
pub(crate) fn start_rank(mut cmd: Command, r: u32, children: &mut Vec<Option<Child>>, what: &str) -> Result<()> {
    let child = cmd.stdin(Stdio::null()).stdout(if r == 0 { Stdio::inherit() } else { Stdio::null() }).spawn();
    match child {
        Ok(c) => {
            children.push(Some(c));
            Ok(())
        }
        Err(e) => {
            kill_all(children);
            Err(Error::io(format!("starting rank {r} ({what})"), e))
        }
    }
}

fn kill_all(children: &mut [Option<Child>]) {
    for c in children.iter_mut().flatten() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Waits for every rank. The culprit of a failure is the rank that died of a signal, if one
/// did (the others exit with an error naming a peer that went away), else the first rank seen
/// failing; survivors get [`GRACE`] to notice and end, then are killed. When `stop` is set (a
/// signal arrived), every rank is killed at once and the run ends with status 130.
pub(crate) fn supervise(mut children: Vec<Option<Child>>, stop: Option<&AtomicBool>) -> Result<i32> {
    let mut failures: Vec<(u32, ExitStatus)> = Vec::new();
    let mut failed_at: Option<Instant> = None;
    let mut wrong = false;
    loop {
        let mut running = 0;
        for (r, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    *slot = None;
                    if status.code() == Some(WRONG_RESULTS) {
                        wrong = true;
                    } else if !status.success() {
                        failures.push((r as u32, status));
                        failed_at.get_or_insert_with(Instant::now);
                    }
                }
                Ok(None) => running += 1,
                Err(e) => return Err(Error::io(format!("waiting for rank {r}"), e)),
            }
        }
        if running == 0 {
            break;
        }
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            kill_all(&mut children);
            eprintln!("collbench: interrupted; the ranks were stopped");
            return Ok(130);
        }
        if failed_at.is_some_and(|t| t.elapsed() > GRACE) {
            kill_all(&mut children);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let culprit = failures.iter().find(|(_, s)| s.signal().is_some()).or(failures.first());
    match culprit {
        Some((r, status)) => {
            eprintln!("collbench: rank {r} {}", describe(*status));
            Ok(1)
        }
        None if wrong => Ok(WRONG_RESULTS),
        None => Ok(0),
    }
}

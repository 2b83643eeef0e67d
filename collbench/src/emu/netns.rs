//! The only place that runs iproute2: `ip` and `tc`, in batch mode per namespace (one process
//! per namespace and tool, not one per command), with their error output kept for the message.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// Runs `tool` (`ip` or `tc`) with `args`; its standard error on failure.
pub fn run(tool: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("running `{tool}` (is iproute2 installed?)"), e))?;
    if !out.status.success() {
        return Err(Error::Emulation(format!(
            "`{tool} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Adds the network namespace `name`. The first `ip netns add` on a machine makes `/run/netns`
/// a mount of its own, and two at once race there (one's file ends up hidden under the other's
/// mount: "Bind /proc/self/ns/net -> /run/netns/… failed"), so this process adds one at a time,
/// and one that lost such a race to another process is removed and added again.
pub fn add(name: &str) -> Result<()> {
    static ADDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ADDING.lock().unwrap_or_else(|p| p.into_inner());
    if run("ip", &["netns", "add", name]).is_ok() {
        return Ok(());
    }
    let _ = run("ip", &["netns", "delete", name]);
    std::thread::sleep(std::time::Duration::from_millis(100));
    run("ip", &["netns", "add", name]).map(drop)
}

/// Runs `lines` as one `tool -n namespace -batch -` (or in the initial namespace for `None`).
pub fn batch(tool: &str, namespace: Option<&str>, lines: &[String]) -> Result<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut cmd = Command::new(tool);
    if let Some(ns) = namespace {
        cmd.args(["-n", ns]);
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(format!("running `{tool}` (is iproute2 installed?)"), e))?;
    let script = lines.join("\n") + "\n";
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(|e| Error::io(format!("feeding `{tool} -batch`"), e))?;
    }
    let out = child.wait_with_output().map_err(|e| Error::io(format!("waiting for `{tool}`"), e))?;
    if !out.status.success() {
        return Err(Error::Emulation(format!(
            "`{tool}` in namespace {} failed: {}",
            namespace.unwrap_or("(initial)"),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Sets sysctls inside a namespace.
pub fn sysctl(namespace: &str, settings: &[&str]) -> Result<()> {
    let mut args = vec!["netns", "exec", namespace, "sysctl", "-q", "-w"];
    args.extend_from_slice(settings);
    run("ip", &args).map(|_| ())
}

/// The names of the existing named network namespaces.
pub fn list() -> Result<Vec<String>> {
    Ok(run("ip", &["netns", "list"])?.lines().filter_map(|l| l.split_whitespace().next().map(str::to_string)).collect())
}

/// Deletes a namespace (and with it its veth ends and qdiscs); a missing one is not an error.
pub fn delete(namespace: &str) -> Result<()> {
    match run("ip", &["netns", "delete", namespace]) {
        Err(Error::Emulation(m)) if m.contains("No such file") => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Why this process cannot emulate, if it cannot: it must be root and have `ip` and `tc`.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("emulation needs root (network namespaces, veth pairs and tc qdiscs)".into());
    }
    for tool in ["ip", "tc"] {
        let found = Command::new(tool).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if !found.is_ok_and(|s| s.success()) {
            return Some(format!("emulation needs `{tool}` from iproute2, which is not installed"));
        }
    }
    None
}

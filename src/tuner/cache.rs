//! The tuner's disk cache: decisions per topology, and schedules that took long to synthesize.
//!
//! Files live in `TOPOCCL_CACHE_DIR` (`off` disables the cache), else `$XDG_CACHE_HOME/topoccl`,
//! else `~/.cache/topoccl`: `tuner-<fingerprint>.json` holds the decisions for one topology,
//! `schedule-<fingerprint>-<key hash>.json` one schedule. Every file records the topoccl
//! version and [`TUNER_API_VERSION`](super::TUNER_API_VERSION) it was written by; another
//! version's file is ignored, so an upgrade never runs a stale decision. Writes go to a
//! temporary file renamed into place, so ranks sharing a host never read half a file. The cache
//! is an optimisation: a file that cannot be read or written is treated as absent.
//!
//! A cached schedule runs without being proven again, so the cache trusts only what this user
//! alone could have written: directories are made private (0700), and a file, or a directory
//! holding it, owned by another user or writable by group or others is ignored (as `ssh` treats
//! its keys).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use topoccl_synth::schedule::Schedule;

use super::{Choice, TUNER_API_VERSION};
use crate::env::var;

fn version() -> String {
    format!("{}/{}", env!("CARGO_PKG_VERSION"), TUNER_API_VERSION)
}

#[derive(Serialize, Deserialize, Default)]
struct DecisionFile {
    version: String,
    decisions: BTreeMap<String, Choice>,
}

#[derive(Serialize, Deserialize)]
struct ScheduleFile {
    version: String,
    key: String,
    schedule: Schedule,
}

/// Where the cache lives (or that there is none).
#[derive(Debug, Clone, Default)]
pub struct DiskCache {
    dir: Option<PathBuf>,
}

impl DiskCache {
    /// The directory the environment names (see the module documentation).
    pub fn from_env() -> DiskCache {
        let dir = match var("TOPOCCL_CACHE_DIR") {
            Some(d) if matches!(d.as_str(), "off" | "0" | "none") => None,
            Some(d) => Some(PathBuf::from(d)),
            None => var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
                .map(|base| base.join("topoccl")),
        };
        DiskCache { dir }
    }

    /// A cache in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> DiskCache {
        DiskCache { dir: Some(dir.into()) }
    }

    /// No cache: nothing is read or written.
    pub fn disabled() -> DiskCache {
        DiskCache { dir: None }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn decision_path(&self, fingerprint: u64) -> Option<PathBuf> {
        Some(self.dir.as_ref()?.join(format!("tuner-{fingerprint:016x}.json")))
    }

    fn schedule_path(&self, fingerprint: u64, key: &str) -> Option<PathBuf> {
        Some(self.dir.as_ref()?.join(format!("schedule-{fingerprint:016x}-{:016x}.json", fnv64(key.as_bytes()))))
    }

    /// The decisions stored for a topology (empty when there are none or the file is stale).
    pub fn decisions(&self, fingerprint: u64) -> BTreeMap<String, Choice> {
        self.decision_path(fingerprint)
            .and_then(|p| read_private(&p))
            .and_then(|b| serde_json::from_slice::<DecisionFile>(&b).ok())
            .filter(|f| f.version == version())
            .map(|f| f.decisions)
            .unwrap_or_default()
    }

    /// [`DiskCache::decisions`] less those naming an algorithm this build lacks (`known` says):
    /// another build sharing the cache (an upgrade, a downgrade, a shared home directory) may
    /// have stored one. They are said once, on standard error, and decided again.
    pub fn known_decisions(&self, fingerprint: u64, known: impl Fn(&str) -> bool) -> BTreeMap<String, Choice> {
        let mut decisions = self.decisions(fingerprint);
        let unknown: Vec<String> =
            decisions.values().filter(|c| !known(&c.algorithm)).map(|c| c.algorithm.clone()).collect();
        if !unknown.is_empty() {
            decisions.retain(|_, c| known(&c.algorithm));
            eprintln!(
                "topoccl WARN tuner: ignoring {} cached decision(s) naming algorithms this build lacks ({}); deciding them again",
                unknown.len(),
                unknown.join(", ")
            );
        }
        decisions
    }

    /// Adds one decision (merged with what another process may have written meanwhile).
    pub fn store_decision(&self, fingerprint: u64, key: &str, choice: &Choice) {
        let Some(path) = self.decision_path(fingerprint) else { return };
        let mut decisions = self.decisions(fingerprint);
        decisions.insert(key.to_string(), choice.clone());
        let file = DecisionFile { version: version(), decisions };
        if let Ok(bytes) = serde_json::to_vec_pretty(&file) {
            write_atomically(&path, &bytes);
        }
    }

    /// A stored schedule, if one was written for exactly this key by this version and is
    /// well-formed (`Schedule::validate`); whether it computes the collective is the caller's
    /// to prove.
    pub fn schedule(&self, fingerprint: u64, key: &str) -> Option<Schedule> {
        let bytes = read_private(&self.schedule_path(fingerprint, key)?)?;
        let file: ScheduleFile = serde_json::from_slice(&bytes).ok()?;
        (file.version == version() && file.key == key && file.schedule.validate().is_ok()).then_some(file.schedule)
    }

    pub fn store_schedule(&self, fingerprint: u64, key: &str, schedule: &Schedule) {
        let Some(path) = self.schedule_path(fingerprint, key) else { return };
        let file = ScheduleFile { version: version(), key: key.to_string(), schedule: schedule.clone() };
        if let Ok(bytes) = serde_json::to_vec(&file) {
            write_atomically(&path, &bytes);
        }
    }
}

/// Whether `path` could only have been written by this user: it and its directory belong to
/// the effective user and are not writable by group or others.
fn private(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let mine = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.uid() == me && m.mode() & 0o022 == 0);
    mine(path) && path.parent().is_some_and(mine)
}

/// The contents of `path` if it exists and is [`private`].
fn read_private(path: &Path) -> Option<Vec<u8>> {
    if !private(path) {
        return None;
    }
    std::fs::read(path).ok()
}

/// Writes `bytes` to a temporary file beside `path` and renames it over `path`; failures are
/// ignored (the cache is optional). Directories it makes are private.
fn write_atomically(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let Some(dir) = path.parent() else { return };
    if std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    // Private whatever the umask, or the next read would ignore it.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, bytes));
    if written.is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn fnv64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use topoccl_synth::algorithms::{Registry, Request};
    use topoccl_synth::schedule::Collective;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("topoccl-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn decisions_round_trip_and_merge() {
        let d = tempdir("decisions");
        let c = DiskCache::at(&d);
        c.store_decision(7, "all_reduce/1024", &Choice::new("ring", 1, 0));
        c.store_decision(7, "all_reduce/2048", &Choice::new("blink", 8, 0));
        let got = c.decisions(7);
        assert_eq!(got.len(), 2);
        assert_eq!(got["all_reduce/2048"], Choice::new("blink", 8, 0));
        assert!(c.decisions(8).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn schedules_round_trip_by_exact_key() {
        let d = tempdir("schedules");
        let c = DiskCache::at(&d);
        let t = topoccl_synth::topology::resolve("ring:4").unwrap();
        let s = Registry::builtin().generate("ring", &Request::new(&t, Collective::AllGather)).unwrap();
        c.store_schedule(1, "ring/all_gather", &s);
        assert_eq!(c.schedule(1, "ring/all_gather"), Some(s));
        assert_eq!(c.schedule(1, "ring/all_reduce"), None);
        assert_eq!(DiskCache::disabled().schedule(1, "ring/all_gather"), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn files_others_could_write_are_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempdir("shared");
        let c = DiskCache::at(&d);
        let t = topoccl_synth::topology::resolve("ring:4").unwrap();
        let s = Registry::builtin().generate("ring", &Request::new(&t, Collective::AllGather)).unwrap();
        c.store_schedule(1, "ring/all_gather", &s);
        c.store_decision(1, "all_gather/1024", &Choice::new("ring", 1, 0));
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(c.schedule(1, "ring/all_gather").is_some());
        // A directory anyone may write into: a planted file could be there.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(c.schedule(1, "ring/all_gather"), None);
        assert!(c.decisions(1).is_empty());
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let file = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("schedule-")));
        std::fs::set_permissions(file.unwrap(), std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(c.schedule(1, "ring/all_gather"), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_corrupt_file_reads_as_empty() {
        let d = tempdir("corrupt");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("tuner-{:016x}.json", 3u64)), b"{not json").unwrap();
        assert!(DiskCache::at(&d).decisions(3).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }
}

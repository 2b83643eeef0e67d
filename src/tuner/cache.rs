//! The tuner's disk cache: decisions per topology, and schedules that took long to synthesize.
//!
//! Files live in `TOPOCCL_CACHE_DIR` (`off` disables the cache), else `$XDG_CACHE_HOME/topoccl`,
//! else `~/.cache/topoccl`: `tuner-<fingerprint>.json` holds the decisions for one topology,
//! `schedule-<fingerprint>-<key hash>.json` one schedule. The cache is an optimisation: nothing
//! in it can fail a job, and it cannot fill a disk.
//!
//! - **Validity.** Every file records the cache's format, the topoccl version,
//!   [`TUNER_API_VERSION`](super::TUNER_API_VERSION) and the build's identity (a hash of the
//!   tuner's and the generators' sources, made at build time); a file of any other is ignored, so
//!   neither an upgrade nor another build sharing the directory (a shared home across a cluster)
//!   runs a decision or a schedule this build would not make. A decision naming an algorithm
//!   this build lacks is ignored and made again ([`DiskCache::known_decisions`]); a schedule
//!   must carry the checksum of its contents, its key, and be well-formed.
//! - **Trust.** A cached schedule runs without being proven again, so the cache trusts only what
//!   this user alone could have written: directories are made private (0700), and a file, or a
//!   directory holding it, owned by another user or writable by group or others is ignored (as
//!   `ssh` treats its keys).
//! - **Bounds.** At most `TOPOCCL_CACHE_MAX_BYTES` (default [`DEFAULT_MAX_BYTES`]) in all: after
//!   each write, the least recently written files go until the rest fit. A schedule larger than
//!   an eighth of that is not stored; its decision is, and it is built again when next used.
//! - **Writes** go to a temporary file renamed into place, so ranks sharing a host never read
//!   half a file; a failed write (a full disk, a read-only directory) removes its temporary file
//!   and is otherwise ignored, and a writer killed in between leaves one that the next writer
//!   removes once that process is gone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use topoccl_synth::hash::fnv64;
use topoccl_synth::schedule::Schedule;

use super::{Choice, TUNER_API_VERSION};
use crate::env::var;

/// The layout of the cache's files; bumped when it changes.
const FORMAT: u32 = 2;
/// The cache's size cap by default (`TOPOCCL_CACHE_MAX_BYTES`).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// A temporary file older than this is removed even if its writer still runs.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// What a file must record to be used: the format, the version, the tuner interface and the
/// build.
fn version() -> String {
    format!("{FORMAT}/{}/{TUNER_API_VERSION}/{}", env!("CARGO_PKG_VERSION"), env!("TOPOCCL_BUILD_ID"))
}

#[derive(Serialize, Deserialize, Default)]
struct DecisionFile {
    version: String,
    decisions: BTreeMap<String, Choice>,
}

/// A schedule file's first line; the schedule's JSON follows it.
#[derive(Serialize, Deserialize)]
struct ScheduleHeader {
    version: String,
    key: String,
    /// FNV-1a 64 of the schedule's JSON.
    checksum: u64,
}

/// Where the cache lives (or that there is none), and how large it may grow.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: Option<PathBuf>,
    max_bytes: u64,
}

impl Default for DiskCache {
    fn default() -> DiskCache {
        DiskCache::disabled()
    }
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
        let max_bytes = match var("TOPOCCL_CACHE_MAX_BYTES").map(|v| (v.parse::<u64>(), v)) {
            Some((Ok(b), _)) => b,
            Some((Err(_), v)) => {
                eprintln!("topoccl WARN tuner: TOPOCCL_CACHE_MAX_BYTES={v} is not a number of bytes; using {DEFAULT_MAX_BYTES}");
                DEFAULT_MAX_BYTES
            }
            None => DEFAULT_MAX_BYTES,
        };
        DiskCache { dir, max_bytes }
    }

    /// A cache in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> DiskCache {
        DiskCache { dir: Some(dir.into()), max_bytes: DEFAULT_MAX_BYTES }
    }

    /// No cache: nothing is read or written.
    pub fn disabled() -> DiskCache {
        DiskCache { dir: None, max_bytes: DEFAULT_MAX_BYTES }
    }

    /// This cache, holding at most `bytes` in all.
    pub fn max_bytes(self, bytes: u64) -> DiskCache {
        DiskCache { max_bytes: bytes, ..self }
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
            self.write(&path, &bytes);
        }
    }

    /// A stored schedule, if one was written for exactly this key by this build, is intact (its
    /// checksum) and well-formed (`Schedule::validate`); whether it computes the collective is
    /// the caller's to prove.
    pub fn schedule(&self, fingerprint: u64, key: &str) -> Option<Schedule> {
        let bytes = read_private(&self.schedule_path(fingerprint, key)?)?;
        let split = bytes.iter().position(|&b| b == b'\n')?;
        let header: ScheduleHeader = serde_json::from_slice(&bytes[..split]).ok()?;
        let body = &bytes[split + 1..];
        if header.version != version() || header.key != key || header.checksum != fnv64(body) {
            return None;
        }
        let schedule: Schedule = serde_json::from_slice(body).ok()?;
        schedule.validate().is_ok().then_some(schedule)
    }

    /// Stores `schedule` under `key`, unless it is larger than an eighth of the cache.
    pub fn store_schedule(&self, fingerprint: u64, key: &str, schedule: &Schedule) {
        let Some(path) = self.schedule_path(fingerprint, key) else { return };
        let Ok(body) = serde_json::to_vec(schedule) else { return };
        if body.len() as u64 > self.max_bytes / 8 {
            return;
        }
        let header = ScheduleHeader { version: version(), key: key.to_string(), checksum: fnv64(&body) };
        let Ok(mut bytes) = serde_json::to_vec(&header) else { return };
        bytes.push(b'\n');
        bytes.extend_from_slice(&body);
        self.write(&path, &bytes);
    }

    /// Writes `bytes` to `path` ([`write_atomically`]), then keeps the cache within its bounds.
    fn write(&self, path: &Path, bytes: &[u8]) {
        write_atomically(path, bytes);
        if let Some(dir) = &self.dir {
            tidy(dir, self.max_bytes);
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

/// The temporary file `path` is written to first: hidden, beside it, named by this process.
fn temporary(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_string_lossy();
    Some(path.with_file_name(format!(".{name}.tmp{}", std::process::id())))
}

/// The process that writes the temporary file `name`, if it is one ([`temporary`]).
fn temporary_writer(name: &str) -> Option<i32> {
    let (_, pid) = name.strip_prefix('.')?.rsplit_once(".tmp")?;
    pid.parse().ok()
}

/// Writes `bytes` to a temporary file beside `path` and renames it over `path`; failures are
/// ignored (the cache is optional), and leave no temporary file. Directories it makes are
/// private.
fn write_atomically(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let (Some(dir), Some(tmp)) = (path.parent(), temporary(path)) else { return };
    if std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).is_err() {
        return;
    }
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

/// Keeps the cache in `dir` within `max_bytes`: removes temporary files whose writer is gone
/// (or that are over an hour old), then the least recently written cache files until the rest
/// fit. Anything else in the directory is left alone.
fn tidy(dir: &Path, max_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let now = SystemTime::now();
    let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(meta) = entry.metadata() else { continue };
        let written = meta.modified().unwrap_or(now);
        if let Some(pid) = temporary_writer(&name) {
            let gone = pid <= 0
                || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH);
            if gone || now.duration_since(written).is_ok_and(|age| age > STALE_TEMPORARY) {
                let _ = std::fs::remove_file(entry.path());
            }
            continue;
        }
        let ours = (name.starts_with("tuner-") || name.starts_with("schedule-")) && name.ends_with(".json");
        if ours && meta.is_file() {
            files.push((written, meta.len(), entry.path()));
        }
    }
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort();
    for (_, len, path) in files {
        if total <= max_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use topoccl_synth::generate::Request;
    use topoccl_synth::registry::Registry;
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

    #[test]
    fn a_schedule_whose_contents_changed_is_ignored() {
        let d = tempdir("checksum");
        let c = DiskCache::at(&d);
        let t = topoccl_synth::topology::resolve("ring:4").unwrap();
        let s = Registry::builtin().generate("ring", &Request::new(&t, Collective::AllGather)).unwrap();
        c.store_schedule(1, "ring/all_gather", &s);
        let path = c.schedule_path(1, "ring/all_gather").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        // Still a well-formed schedule, one sender changed: what a flipped bit could leave.
        let changed = text.replacen("\"dst\":\"o6\"", "\"dst\":\"o2\"", 1);
        assert_ne!(changed, text, "the test edits nothing");
        std::fs::write(&path, changed).unwrap();
        assert_eq!(c.schedule(1, "ring/all_gather"), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn files_of_another_build_are_ignored() {
        let d = tempdir("build");
        let c = DiskCache::at(&d);
        c.store_decision(5, "all_reduce/1024", &Choice::new("ring", 1, 0));
        assert_eq!(c.decisions(5).len(), 1);
        // The same version string, another build.
        let path = c.decision_path(5).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let other = text.replace(env!("TOPOCCL_BUILD_ID"), "0123456789abcdef");
        assert_ne!(other, text);
        std::fs::write(&path, other).unwrap();
        assert!(c.decisions(5).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_cache_stays_within_its_size_and_evicts_the_oldest() {
        let d = tempdir("cap");
        let t = topoccl_synth::topology::resolve("ring:8").unwrap();
        let s = Registry::builtin().generate("ring", &Request::new(&t, Collective::AllReduce)).unwrap();
        let one = serde_json::to_vec(&s).unwrap().len() as u64;
        // Room for about seven; a schedule may be an eighth of the cap.
        let c = DiskCache::at(&d).max_bytes(one * 8);
        for i in 0..12u64 {
            c.store_schedule(i, "ring/all_reduce", &s);
            // Distinct write times for the eviction order.
            std::thread::sleep(Duration::from_millis(15));
        }
        let total: u64 = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert!(total <= one * 8, "{total} bytes in a cache of {}", one * 8);
        assert!(c.schedule(11, "ring/all_reduce").is_some(), "the newest was evicted");
        assert!(c.schedule(0, "ring/all_reduce").is_none(), "the oldest was kept");
        // Larger than an eighth of the cache: not stored at all.
        let small = DiskCache::at(&d).max_bytes(one * 4);
        small.store_schedule(99, "ring/all_reduce", &s);
        assert!(small.schedule(99, "ring/all_reduce").is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn temporary_files_of_writers_that_died_are_removed() {
        let d = tempdir("tmp");
        std::fs::create_dir_all(&d).unwrap();
        // A process that has exited: the child's pid, waited for.
        let dead = std::process::Command::new("true").spawn().unwrap();
        let pid = dead.id();
        let mut dead = dead;
        dead.wait().unwrap();
        let left = d.join(format!(".tuner-0000000000000001.json.tmp{pid}"));
        let mine = d.join(format!(".tuner-0000000000000002.json.tmp{}", std::process::id()));
        let foreign = d.join("notes.txt");
        for f in [&left, &mine, &foreign] {
            std::fs::write(f, b"half a file").unwrap();
        }
        DiskCache::at(&d).store_decision(3, "all_reduce/8", &Choice::new("ring", 1, 0));
        assert!(!left.exists(), "a dead writer's temporary file was left behind");
        assert!(mine.exists() && foreign.exists(), "a live writer's file or a stranger was removed");
        let _ = std::fs::remove_dir_all(&d);
    }
}

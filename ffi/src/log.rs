//! NCCL-style logging: `NCCL_DEBUG` (VERSION, WARN, INFO, TRACE), `NCCL_DEBUG_SUBSYS` (a comma
//! list; `^` excludes; default INIT,BOOTSTRAP,ENV as NCCL's) and `NCCL_DEBUG_FILE` (`%h` host,
//! `%p` pid; standard output otherwise). Lines look like NCCL's,
//! `host:pid:tid [rank] NCCL INFO message`, so scripts that read NCCL logs read ours.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    None,
    Version,
    Warn,
    Info,
    Trace,
}

/// NCCL's subsystems, as bits.
#[derive(Debug, Clone, Copy)]
pub enum Subsys {
    Init = 1,
    Coll = 2,
    P2p = 4,
    Shm = 8,
    Net = 16,
    Graph = 32,
    Tuning = 64,
    Env = 128,
    Alloc = 256,
    Call = 512,
    Proxy = 1024,
    Nvls = 2048,
    Bootstrap = 4096,
    Reg = 8192,
}

const SUBSYS_NAMES: [(&str, u32); 14] = [
    ("INIT", Subsys::Init as u32),
    ("COLL", Subsys::Coll as u32),
    ("P2P", Subsys::P2p as u32),
    ("SHM", Subsys::Shm as u32),
    ("NET", Subsys::Net as u32),
    ("GRAPH", Subsys::Graph as u32),
    ("TUNING", Subsys::Tuning as u32),
    ("ENV", Subsys::Env as u32),
    ("ALLOC", Subsys::Alloc as u32),
    ("CALL", Subsys::Call as u32),
    ("PROXY", Subsys::Proxy as u32),
    ("NVLS", Subsys::Nvls as u32),
    ("BOOTSTRAP", Subsys::Bootstrap as u32),
    ("REG", Subsys::Reg as u32),
];

struct Logger {
    /// `Level` as u8 and the subsystem mask: re-read by `ncclResetDebugInit`.
    level: AtomicU8,
    mask: AtomicU32,
    host: String,
    sink: Mutex<Box<dyn Write + Send>>,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

pub fn parse_level(v: Option<&str>) -> Level {
    match v.map(|s| s.trim().to_ascii_uppercase()).as_deref() {
        Some("VERSION") => Level::Version,
        Some("WARN") => Level::Warn,
        Some("INFO") => Level::Info,
        Some("TRACE") => Level::Trace,
        _ => Level::None,
    }
}

/// The subsystem mask `NCCL_DEBUG_SUBSYS` names (unknown names are ignored, as NCCL does).
pub fn parse_subsys(v: Option<&str>) -> u32 {
    let all = SUBSYS_NAMES.iter().fold(0, |m, (_, b)| m | b);
    let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) else {
        return Subsys::Init as u32 | Subsys::Bootstrap as u32 | Subsys::Env as u32;
    };
    let (exclude, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let named = list.split(',').map(|s| s.trim().to_ascii_uppercase()).fold(0, |m, name| {
        if name == "ALL" {
            m | all
        } else {
            m | SUBSYS_NAMES.iter().find(|(n, _)| *n == name).map_or(0, |(_, b)| *b)
        }
    });
    if exclude {
        all & !named
    } else {
        named
    }
}

fn open_sink(pattern: Option<String>, host: &str) -> Box<dyn Write + Send> {
    if let Some(p) = pattern.filter(|p| !p.is_empty()) {
        let path = p.replace("%h", host).replace("%p", &std::process::id().to_string());
        if let Ok(f) = std::fs::OpenOptions::new().create(true).append(true).open(&path) {
            return Box::new(f);
        }
    }
    Box::new(std::io::stdout())
}

fn logger() -> &'static Logger {
    LOGGER.get_or_init(|| {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .map(|h| h.split('.').next().unwrap_or_default().to_string())
            .unwrap_or_else(|| "localhost".into());
        let level = parse_level(topoccl::env::var("NCCL_DEBUG").as_deref());
        let mask = parse_subsys(topoccl::env::var("NCCL_DEBUG_SUBSYS").as_deref());
        let sink = Mutex::new(open_sink(topoccl::env::var("NCCL_DEBUG_FILE"), &host));
        let logger = Logger { level: AtomicU8::new(level as u8), mask: AtomicU32::new(mask), host, sink };
        if level >= Level::Version {
            logger.write(
                None,
                "INFO",
                format_args!(
                    "NCCL version {}+topoccl{} (host buffers)",
                    crate::abi::VERSION_TEXT,
                    env!("CARGO_PKG_VERSION")
                ),
            );
        }
        logger
    })
}

impl Logger {
    fn level(&self) -> Level {
        match self.level.load(Ordering::Relaxed) {
            1 => Level::Version,
            2 => Level::Warn,
            3 => Level::Info,
            4 => Level::Trace,
            _ => Level::None,
        }
    }

    fn write(&self, rank: Option<u32>, kind: &str, msg: fmt::Arguments<'_>) {
        let tid = nix::unistd::gettid();
        let rank = rank.map_or_else(|| "-".to_string(), |r| r.to_string());
        let line = format!("{}:{}:{} [{rank}] NCCL {kind} {msg}\n", self.host, std::process::id(), tid);
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        // A log that cannot be written is not worth failing a collective over.
        let _ = sink.write_all(line.as_bytes()).and_then(|_| sink.flush());
    }
}

/// Starts logging (prints the version line under `NCCL_DEBUG=VERSION` or above).
pub fn init() {
    logger();
}

/// Reads `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS` again (`ncclResetDebugInit`, which programs
/// call after changing them).
pub fn reset() {
    let l = logger();
    l.level.store(parse_level(topoccl::env::var("NCCL_DEBUG").as_deref()) as u8, Ordering::Relaxed);
    l.mask.store(parse_subsys(topoccl::env::var("NCCL_DEBUG_SUBSYS").as_deref()), Ordering::Relaxed);
}

pub fn info_enabled(subsys: Subsys) -> bool {
    let l = logger();
    l.level() >= Level::Info && l.mask.load(Ordering::Relaxed) & subsys as u32 != 0
}

pub fn info(subsys: Subsys, rank: Option<u32>, msg: fmt::Arguments<'_>) {
    if info_enabled(subsys) {
        logger().write(rank, "INFO", msg);
    }
}

pub fn warn(rank: Option<u32>, msg: fmt::Arguments<'_>) {
    let l = logger();
    if l.level() >= Level::Warn {
        l.write(rank, "WARN", msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsystems_parse_like_nccl() {
        assert_eq!(parse_subsys(None), Subsys::Init as u32 | Subsys::Bootstrap as u32 | Subsys::Env as u32);
        assert_eq!(parse_subsys(Some("COLL,p2p")), Subsys::Coll as u32 | Subsys::P2p as u32);
        let not_coll = parse_subsys(Some("^COLL"));
        assert_eq!(not_coll & Subsys::Coll as u32, 0);
        assert_ne!(not_coll & Subsys::Init as u32, 0);
        assert_eq!(parse_level(Some("info")), Level::Info);
        assert_eq!(parse_level(Some("bogus")), Level::None);
    }
}

//! `cuInit` and the environment knobs, read once per process when `cuInit` first runs.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::sys::{CUresult, CuResult};

/// The stand-in's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TOPOCCL_STANDIN_DEVICES` (default 1; 0 makes `cuInit` answer `CUDA_ERROR_NO_DEVICE`).
    pub devices: i32,
    /// `TOPOCCL_STANDIN_SM`: compute capability as major * 10 + minor (default 90).
    pub sm: u32,
    /// `TOPOCCL_STANDIN_DELAY_US`: each stream item first sleeps a random 0..this (default 200).
    pub delay_us: u64,
    /// `TOPOCCL_STANDIN_SEED`: seeds the delays (default: the clock).
    pub seed: u64,
    /// `TOPOCCL_STANDIN_DRIVER_VERSION`: what `cuDriverGetVersion` says, and so the newest PTX
    /// ISA a module may use (default 12090).
    pub driver_version: i32,
    /// `TOPOCCL_STANDIN_POISON`: the byte new device and pinned allocations are filled with
    /// (default 0xff, so a read before any write gives NaN / all-ones; `off` leaves zeros).
    pub poison: Option<u8>,
    /// `TOPOCCL_STANDIN_POOLS`: whether the device says it has memory pools (default 1; 0
    /// makes `MEMORY_POOLS_SUPPORTED` answer 0, as devices without them do, so cudarc
    /// allocates with `cuMemAlloc`, whose memory has IPC handles).
    pub pools: bool,
    /// `TOPOCCL_STANDIN_DMABUF`: whether device memory exports dma-buf file descriptors
    /// (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`; default 1, 0: `CUDA_ERROR_NOT_SUPPORTED`).
    pub dmabuf: bool,
    /// `CUDA_MODULE_LOADING` (CUDA's own variable): `LAZY` (the default since CUDA 12.2) loads
    /// a kernel at its first `cuModuleGetFunction`, `EAGER` every kernel at `cuModuleLoadData`;
    /// either load waits for all of the context's work, the synchronisation CUDA warns lazy
    /// loading may need.
    pub lazy_loading: bool,
    /// `TOPOCCL_STANDIN_QUEUES`: `stream` (each stream its own queue: streams never hold each
    /// other up) or `connections`: a context's streams share `CUDA_DEVICE_MAX_CONNECTIONS`
    /// hardware queues (CUDA's own variable, 1..32, default 8), given round robin as streams
    /// are made, each queue in order (`hwqueue`). `None` for `stream`, else the count.
    pub queues: Option<u32>,
    /// `TOPOCCL_STANDIN_LOCKS`: `observed` (the context lock that a copy into pageable memory
    /// holds while it waits for its stream is taken by stream and event creation, as cuda-gdb
    /// showed on an H200) or `all` (every resource call takes it: allocation and free of
    /// device and host memory, host register and unregister, IPC get/open/close, dma-buf
    /// export, module and function loading, peer access, stream and event creation).
    pub lock_all: bool,
    /// `TOPOCCL_STANDIN_LAZY`: with lazy loading, `lookup` loads a kernel at its first
    /// `cuModuleGetFunction`; `launch` as CUDA 12.4+ may, at its first `cuLaunchKernel` unless
    /// `cuFuncLoad` or `cuFuncGetAttribute` loaded it before. Either load waits for all of the
    /// context's work.
    pub load_at_launch: bool,
    /// `TOPOCCL_STANDIN_DEADLOCK_S`: a resource call or a context synchronisation waiting this
    /// long (where a real driver would deadlock) says so on stderr, once (default 10; it still
    /// waits).
    pub deadlock_report_s: f64,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// `CUDA_DEVICE_MAX_CONNECTIONS` as the driver reads it: 1..32, default 8.
pub fn max_connections(v: Option<&str>) -> u32 {
    v.and_then(|v| v.parse::<u32>().ok()).map_or(8, |n| n.clamp(1, 32))
}

/// Parses `90`, `9.0`, `sm_90`, `sm_90a` as 90.
pub fn parse_sm(s: &str) -> Option<u32> {
    let s = s.trim().trim_start_matches("sm_").trim_start_matches("compute_").trim_end_matches('a');
    match s.split_once('.') {
        Some((major, minor)) => Some(major.parse::<u32>().ok()? * 10 + minor.parse::<u32>().ok()?),
        None => s.parse().ok().filter(|&v| v >= 10),
    }
}

fn parse_poison(s: &str) -> Option<Option<u8>> {
    match s {
        "off" | "none" | "0" | "false" => Some(None),
        _ => {
            let hex = s.trim_start_matches("0x");
            u8::from_str_radix(hex, 16).ok().map(Some)
        }
    }
}

impl Config {
    fn from_env() -> Self {
        // `TOPOCCL_STANDIN_STRICT=1`: the models a real driver deadlocks under, all at once
        // (shared hardware queues, the lock on every resource call, loading at first launch);
        // each knob still overrides.
        let strict = env("TOPOCCL_STANDIN_STRICT").is_some_and(|v| v != "0");
        let clock = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        Config {
            devices: env("TOPOCCL_STANDIN_DEVICES").and_then(|v| v.parse().ok()).filter(|&n| n >= 0).unwrap_or(1),
            sm: env("TOPOCCL_STANDIN_SM").and_then(|v| parse_sm(&v)).unwrap_or(90),
            delay_us: env("TOPOCCL_STANDIN_DELAY_US").and_then(|v| v.parse().ok()).unwrap_or(200),
            seed: env("TOPOCCL_STANDIN_SEED")
                .and_then(|v| v.parse().ok())
                .unwrap_or(clock ^ u64::from(std::process::id())),
            driver_version: env("TOPOCCL_STANDIN_DRIVER_VERSION").and_then(|v| v.parse().ok()).unwrap_or(12090),
            poison: env("TOPOCCL_STANDIN_POISON").and_then(|v| parse_poison(&v)).unwrap_or(Some(0xff)),
            pools: env("TOPOCCL_STANDIN_POOLS").map_or(true, |v| v != "0"),
            dmabuf: env("TOPOCCL_STANDIN_DMABUF").map_or(true, |v| v != "0"),
            lazy_loading: env("CUDA_MODULE_LOADING").map_or(true, |v| !v.eq_ignore_ascii_case("EAGER")),
            queues: match env("TOPOCCL_STANDIN_QUEUES").as_deref().unwrap_or(if strict {
                "connections"
            } else {
                "stream"
            }) {
                "stream" => None,
                _ => Some(max_connections(env("CUDA_DEVICE_MAX_CONNECTIONS").as_deref())),
            },
            lock_all: env("TOPOCCL_STANDIN_LOCKS").map_or(strict, |v| v == "all"),
            load_at_launch: env("TOPOCCL_STANDIN_LAZY").map_or(strict, |v| v == "launch"),
            deadlock_report_s: env("TOPOCCL_STANDIN_DEADLOCK_S").and_then(|v| v.parse().ok()).unwrap_or(10.0),
        }
    }

    /// The newest PTX ISA version (major * 10 + minor) this driver version can JIT.
    pub fn max_ptx_isa(&self) -> u32 {
        // CUDA 12.0 → ISA 8.0 ... 12.5/12.6 → 8.5, 12.8 → 8.7, 12.9 → 8.8, 13.0 → 9.0.
        let (major, minor) = (self.driver_version / 1000, (self.driver_version % 1000) / 10);
        match (major, minor) {
            (..=11, _) => 78,
            (12, m) if m <= 5 => 80 + m as u32,
            (12, 6) => 85,
            (12, 7) => 86,
            (12, 8) => 87,
            (12, _) => 88,
            (m, n) => 90 + (m as u32 - 13) * 10 + n as u32,
        }
    }
}

/// `cuInit`: reads the knobs once; fails with `CUDA_ERROR_NO_DEVICE` when there are none.
pub fn init(flags: u32) -> CuResult<()> {
    if flags != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let config = CONFIG.get_or_init(Config::from_env);
    if config.devices == 0 {
        return Err(CUresult::NO_DEVICE);
    }
    Ok(())
}

/// `cuDriverGetVersion`: answers before `cuInit` too.
pub fn driver_version() -> i32 {
    CONFIG.get().map_or_else(|| Config::from_env().driver_version, |c| c.driver_version)
}

/// The settings, once `cuInit` succeeded; `CUDA_ERROR_NOT_INITIALIZED` before.
pub fn get() -> CuResult<&'static Config> {
    CONFIG.get().filter(|c| c.devices > 0).ok_or(CUresult::NOT_INITIALIZED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sm_spellings() {
        assert_eq!(parse_sm("90"), Some(90));
        assert_eq!(parse_sm("8.6"), Some(86));
        assert_eq!(parse_sm("sm_90a"), Some(90));
        assert_eq!(parse_sm("120"), Some(120));
        assert_eq!(parse_sm("x"), None);
        assert_eq!(parse_poison("off"), Some(None));
        assert_eq!(parse_poison("0xa5"), Some(Some(0xa5)));
        assert_eq!(max_connections(None), 8);
        assert_eq!(max_connections(Some("1")), 1);
        assert_eq!(max_connections(Some("0")), 1);
        assert_eq!(max_connections(Some("64")), 32);
        assert_eq!(max_connections(Some("x")), 8);
    }

    #[test]
    fn ptx_isa_follows_the_driver() {
        let mut c = Config::from_env();
        for (v, isa) in [(12000, 80), (12040, 84), (12060, 85), (12080, 87), (12090, 88), (13000, 90), (13020, 92)] {
            c.driver_version = v;
            assert_eq!(c.max_ptx_isa(), isa, "{v}");
        }
    }
}

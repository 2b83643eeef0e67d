//! Run-time settings, read once from the environment when a communicator is created.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `TOPOCCL_TIMEOUT` | seconds a call may go without any progress before it fails | 300 |
//! | `TOPOCCL_TRANSPORT` | `auto` (CUDA IPC between GPUs of one host that reach each other, shared memory within a host, RDMA verbs across hosts where both ranks have a port, else TCP), `tcp`, `shm`, `ib` (RDMA verbs for every pair, the same host's too) | auto |
//! | `TOPOCCL_IBVERBS_LIB` / `NCCL_IBVERBS_LIB` | the verbs library to open | `libibverbs.so.1`, then `libibverbs.so` |
//! | `TOPOCCL_IB_DISABLE` / `NCCL_IB_DISABLE` | `1`: never RDMA (TCP across hosts) | 0 |
//! | `NCCL_IB_HCA` | RDMA devices and ports to use (`mlx5_0:1,mlx5_1`; `^` excludes, `=` exact names) | every active port |
//! | `NCCL_IB_GID_INDEX` | the GID a RoCE port is addressed by | the first IPv4-mapped GID (RoCE v2), 0 on InfiniBand |
//! | `NCCL_IB_TC`, `NCCL_IB_SL` | traffic class (RoCE), service level (InfiniBand) | 0, 0 |
//! | `NCCL_IB_TIMEOUT`, `NCCL_IB_RETRY_CNT` | local ACK timeout (4.096 µs × 2^n) and retransmissions | 20, 7 |
//! | `NCCL_IB_QPS_PER_CONNECTION` | queue pairs per RDMA connection (1–16), large one-sided writes striped over them | 1 |
//! | `TOPOCCL_IB_BYTES` | RDMA receive ring per peer and direction (registered host memory) | 4 MiB |
//! | `TOPOCCL_ALGO` | force an algorithm (`ring`, `tree`, `rhd`, `rd`, `hier`, `pairwise`, `blink`, `tacos`) | the tuner's choice |
//! | `TOPOCCL_TOPOLOGY` | the machine the ranks run on (a library name, family or file; see `topoccl_synth::topology::resolve`), rank i on its rank i; `detect` (or `detect[0-3]`) asks NVML, rank i on NVML's GPU i, and falls back to the default where there is no NVML (see `crate::detect`) | all-to-all links (`host:N` on one host, `full:N` across hosts) |
//! | `TOPOCCL_TUNE` | `background`: a size's first call runs a quick choice (constructions priced at their default depth) while the full decision is made in the background, and every rank switches to it at the same call; `first-call`: the first call of a size waits for the full decision | background |
//! | `TOPOCCL_TUNER_MESSAGE_US` | time a rank's executor spends on each message, as the tuner's simulator prices it, µs | 4 |
//! | `TOPOCCL_CACHE_DIR` | the tuner's disk cache (`off` disables) | `$XDG_CACHE_HOME/topoccl` or `~/.cache/topoccl` |
//! | `TOPOCCL_CACHE_MAX_BYTES` | the most the tuner's disk cache holds; the least recently written files go first | 268435456 (256 MiB) |
//! | `TOPOCCL_NSOCKS` | TCP sockets per peer | 2 |
//! | `TOPOCCL_SLICE_BYTES` | pipelining slice | 512 KiB |
//! | `TOPOCCL_MAX_BACKLOG` | bytes queued to a peer before sends wait (at least one slice) | 4 MiB |
//! | `TOPOCCL_SHM_BYTES` | shared-memory ring per direction | 4 MiB |
//! | `TOPOCCL_IPC_BYTES` | CUDA IPC receive window per peer and direction (device memory; at least one slice) | 8 MiB |
//! | `TOPOCCL_DEVICE_LL` | small device-resident calls (up to 64 KiB) run as one kernel writing LL lines into the peers' areas (`exec::resident::ll`): `1` where no two ranks share a device; `2` also where they do (thread ranks must then each call on a stream of its own; processes sharing a device spin in turns); `0`: never | 1 |
//! | `TOPOCCL_DEVICE_RESIDENT` | `1`: a device collective whose every peer is a CUDA IPC peer is put whole on the caller's stream by the caller's thread (`exec::resident`); `0`: such calls are staged too (below) | 1 |
//! | `TOPOCCL_DEVICE_STAGED` | `1`: every other device call (network peers, calls larger than the device-resident workspaces, device-scalar PreMulSum, padded schedules) goes through pinned host slots: the caller's stream copies each piece in and out and the progress thread only moves host bytes (`comm::staged`); `0`: host-driven, by the progress thread (the old path, which can deadlock under a real driver: `../shared/gpu-review.md`) | 1 |
//! | `TOPOCCL_SHM_DIRECT` | `1`: shared memory puts large payloads straight into offered receive buffers where the processes may write each other's memory; `0`: always through the ring (faster on all-reduce where measured: see the README) | 0 |
//! | `TOPOCCL_SOCKET_IFNAME` / `NCCL_SOCKET_IFNAME` | interfaces to use (prefixes; `^` excludes, `=` exact) | first non-loopback |
//! | `TOPOCCL_HOSTID` / `NCCL_HOSTID` | stands in for the host name in the host identity (ranks given different ones count as different hosts) | the host name |

use std::time::Duration;

use topoccl_transports::verbs::VerbsSettings;
use topoccl_transports::TransportTable;

use crate::env::var;
use crate::error::{Error, Result};

/// Which transport connects ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportPolicy {
    /// Shared memory between ranks on one host, TCP across hosts.
    Auto,
    Tcp,
    /// Shared memory only; ranks on different hosts are an error.
    Shm,
    /// RDMA verbs for every pair (the same host's too); an error where a rank has no port.
    Ib,
}

impl TransportPolicy {
    pub fn name(self) -> &'static str {
        match self {
            TransportPolicy::Auto => "auto",
            TransportPolicy::Tcp => "tcp",
            TransportPolicy::Shm => "shm",
            TransportPolicy::Ib => "ib",
        }
    }
}

impl std::str::FromStr for TransportPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<TransportPolicy> {
        [TransportPolicy::Auto, TransportPolicy::Tcp, TransportPolicy::Shm, TransportPolicy::Ib]
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| Error::InvalidArgument(format!("unknown transport `{s}` (auto, tcp, shm, ib)")))
    }
}

/// Settings of a communicator.
#[derive(Debug, Clone)]
pub struct Config {
    pub timeout: Duration,
    /// Which built-in transports may connect ranks.
    pub transport: TransportPolicy,
    /// Transports of the user's, asked before the built-in ones (highest priority first), and
    /// a wrapper around every connection (tracing, fault injection). Empty by default.
    pub transports: TransportTable,
    pub algo: Option<String>,
    pub sockets: usize,
    pub slice_bytes: usize,
    pub shm_ring_bytes: usize,
    /// CUDA IPC receive window per peer and direction, device memory (at least one slice).
    pub ipc_window_bytes: usize,
    /// Shared memory puts large payloads straight into offered receive buffers (one-sided)
    /// where the processes may write each other's memory.
    pub shm_direct: bool,
    /// Device collectives between CUDA IPC peers run device-resident (`TOPOCCL_DEVICE_RESIDENT`).
    pub device_resident: bool,
    /// Small device-resident calls run as one kernel (`TOPOCCL_DEVICE_LL`: 0 never, 1 where
    /// no two ranks share a device, 2 also there).
    pub device_ll: u8,
    /// Other device calls are staged through pinned host slots (`TOPOCCL_DEVICE_STAGED`).
    pub device_staged: bool,
    /// A send waits while this many bytes are queued to its peer.
    pub max_backlog: usize,
    /// The machine model the tuner reasons about (`None`: `full:N`).
    pub topology: Option<String>,
    /// Time a rank's executor spends on each message in the tuner's pricing, µs (messages of
    /// one rank are handled one after another by its CPU thread).
    pub tuner_message_us: f64,
    /// The CUDA device whose primary context the communicator binds to at init (`None`: the
    /// context of the first stream it is called with).
    pub cuda_device: Option<u32>,
    /// The RDMA verbs transport's settings (`None`: RDMA disabled).
    pub verbs: Option<VerbsSettings>,
    /// The first call of a size runs a quick choice while the tuner decides it in full in the
    /// background; every rank switches at the same call (`TOPOCCL_TUNE=background`). Off, the
    /// first call of a size waits for the full decision (`first-call`). Every rank must agree.
    pub tune_background: bool,
    /// Holds each background decision back this long (tests: a rank that decides late).
    pub tune_delay: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            timeout: Duration::from_secs(300),
            transport: TransportPolicy::Auto,
            transports: TransportTable::new(),
            algo: None,
            sockets: 2,
            slice_bytes: 512 << 10,
            shm_ring_bytes: topoccl_transports::shm::DEFAULT_RING_BYTES,
            ipc_window_bytes: topoccl_transports::ipc::DEFAULT_WINDOW_BYTES,
            shm_direct: false,
            device_resident: true,
            device_ll: 1,
            device_staged: true,
            max_backlog: 4 << 20,
            topology: None,
            tuner_message_us: 4.0,
            cuda_device: None,
            verbs: Some(VerbsSettings::default()),
            tune_background: true,
            tune_delay: Duration::ZERO,
        }
    }
}

/// The RDMA settings NCCL's users set (NCCL's names, a `TOPOCCL_` one first where both exist).
fn verbs_from_env() -> Result<Option<VerbsSettings>> {
    let either = |ours: &str, nccl: &str| var(ours).or_else(|| var(nccl));
    let disabled = match either("TOPOCCL_IB_DISABLE", "NCCL_IB_DISABLE") {
        Some(v) => {
            v.parse::<u32>().map_err(|_| Error::InvalidArgument(format!("IB_DISABLE={v}: expected 0 or 1")))? != 0
        }
        None => false,
    };
    if disabled {
        return Ok(None);
    }
    let mut v = VerbsSettings {
        library: either("TOPOCCL_IBVERBS_LIB", "NCCL_IBVERBS_LIB"),
        hca: var("NCCL_IB_HCA"),
        ..VerbsSettings::default()
    };
    if let Some(i) = number("NCCL_IB_GID_INDEX", -1.0, 255.0)? {
        // NCCL's -1 asks for its automatic choice.
        v.gid_index = (i >= 0.0).then_some(i as u8);
    }
    if let Some(tc) = number("NCCL_IB_TC", 0.0, 255.0)? {
        v.traffic_class = tc as u8;
    }
    if let Some(sl) = number("NCCL_IB_SL", 0.0, 15.0)? {
        v.service_level = sl as u8;
    }
    if let Some(t) = number("NCCL_IB_TIMEOUT", 1.0, 31.0)? {
        v.timeout = t as u8;
    }
    if let Some(r) = number("NCCL_IB_RETRY_CNT", 0.0, 7.0)? {
        v.retry_cnt = r as u8;
    }
    let max_qps = f64::from(topoccl_transports::verbs::MAX_QPS);
    if let Some(q) = number("NCCL_IB_QPS_PER_CONNECTION", 1.0, max_qps)? {
        v.qps_per_connection = q as u8;
    }
    if let Some(b) = number("TOPOCCL_IB_BYTES", 65536.0, (1u64 << 29) as f64)? {
        v.ring_bytes = b as usize;
    }
    Ok(Some(v))
}

fn number(name: &str, min: f64, max: f64) -> Result<Option<f64>> {
    let Some(v) = var(name) else { return Ok(None) };
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && (min..=max).contains(&x) => Ok(Some(x)),
        _ => Err(Error::InvalidArgument(format!("{name}={v}: expected a number from {min} to {max}"))),
    }
}

impl Config {
    /// Defaults overridden by `TOPOCCL_*` variables; a malformed value is an error.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        if let Some(s) = number("TOPOCCL_TIMEOUT", 0.001, 1e9)? {
            c.timeout = Duration::from_secs_f64(s);
        }
        if let Some(t) = var("TOPOCCL_TRANSPORT") {
            c.transport = t.parse().map_err(|e| Error::InvalidArgument(format!("TOPOCCL_TRANSPORT: {e}")))?;
        }
        c.algo = var("TOPOCCL_ALGO").filter(|a| a != "auto");
        if let Some(t) = var("TOPOCCL_TUNE") {
            c.tune_background = match t.as_str() {
                "background" => true,
                "first-call" => false,
                _ => {
                    return Err(Error::InvalidArgument(format!("TOPOCCL_TUNE={t}: expected background or first-call")))
                }
            };
        }
        if let Some(n) = number("TOPOCCL_NSOCKS", 1.0, 64.0)? {
            c.sockets = n as usize;
        }
        if let Some(b) = number("TOPOCCL_SLICE_BYTES", 64.0, (1u64 << 30) as f64)? {
            c.slice_bytes = (b as usize / 64) * 64;
        }
        if let Some(b) = number("TOPOCCL_SHM_BYTES", 4096.0, topoccl_transports::shm::MAX_RING_BYTES as f64)? {
            c.shm_ring_bytes = b as usize;
        }
        if let Some(b) = number("TOPOCCL_IPC_BYTES", 4096.0, topoccl_transports::ipc::MAX_WINDOW_BYTES as f64)? {
            c.ipc_window_bytes = (b as usize).next_multiple_of(256);
        }
        if let Some(d) = number("TOPOCCL_SHM_DIRECT", 0.0, 1.0)? {
            c.shm_direct = d == 1.0;
        }
        if let Some(d) = number("TOPOCCL_DEVICE_RESIDENT", 0.0, 1.0)? {
            c.device_resident = d == 1.0;
        }
        if let Some(d) = number("TOPOCCL_DEVICE_LL", 0.0, 2.0)? {
            c.device_ll = d as u8;
        }
        if let Some(d) = number("TOPOCCL_DEVICE_STAGED", 0.0, 1.0)? {
            c.device_staged = d == 1.0;
        }
        if let Some(b) = number("TOPOCCL_MAX_BACKLOG", 4096.0, (1u64 << 34) as f64)? {
            c.max_backlog = b as usize;
        }
        c.max_backlog = c.max_backlog.max(c.slice_bytes);
        c.topology = var("TOPOCCL_TOPOLOGY");
        if let Some(us) = number("TOPOCCL_TUNER_MESSAGE_US", 0.0, 1e6)? {
            c.tuner_message_us = us;
        }
        c.verbs = verbs_from_env()?;
        Ok(c)
    }
}

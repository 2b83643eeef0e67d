//! Settings of a communicator made through the C ABI: topoccl's own (`TOPOCCL_*`), NCCL's
//! variables that have a meaning here, and the caller's `ncclConfig_t`.
//!
//! | NCCL | topoccl | notes |
//! |---|---|---|
//! | `NCCL_ALGO` | `TOPOCCL_ALGO` | `Ring` → ring, `Tree` → tree; a list (or `^` exclusion) leaving both is the tuner's choice; CollNet/NVLS need hardware. `TOPOCCL_ALGO` wins. |
//! | `NCCL_PROTO` | — | `LL`, `LL128`, `Simple` are checked; topoccl has one protocol |
//! | `NCCL_P2P_DISABLE=1`, `NCCL_SHM_DISABLE=1` | `TOPOCCL_TRANSPORT=tcp` | `TOPOCCL_TRANSPORT` wins |
//! | `NCCL_SOCKET_IFNAME` | `TOPOCCL_SOCKET_IFNAME` | read by the core |
//! | `ncclConfig_t::blocking = 0` | — | init returns `ncclInProgress` and completes in the background |
//! | `ncclConfig_t::netName` | — | `NULL` or `Socket` |

use crate::raw;

use topoccl::env::var;
use topoccl::{Config, TransportPolicy};

use crate::abi::{ncclConfig_t, CONFIG_MAGIC, CONFIG_UNDEF_INT};
use crate::error::{invalid, Result};
use crate::log::{self, Subsys};

/// What a caller's `ncclConfig_t` asks for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Requested {
    pub blocking: bool,
}

/// NCCL's algorithm names and what each is here (`None`: needs hardware topoccl lacks).
const NCCL_ALGOS: [(&str, Option<&str>); 7] = [
    ("ring", Some("ring")),
    ("tree", Some("tree")),
    ("collnetdirect", None),
    ("collnetchain", None),
    ("nvls", None),
    ("nvlstree", None),
    ("pat", None),
];

/// `NCCL_ALGO` as a forced topoccl algorithm (`None`: the tuner decides).
pub fn nccl_algo(value: &str) -> Result<Option<String>> {
    let (exclude, list) = match value.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, value.trim()),
    };
    let mut named = Vec::new();
    for name in list.split(',').map(|s| s.trim().to_ascii_lowercase()).filter(|s| !s.is_empty()) {
        if !NCCL_ALGOS.iter().any(|(n, _)| *n == name) {
            return Err(invalid(format!(
                "NCCL_ALGO={value}: unknown algorithm `{name}` (Ring, Tree, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT)"
            )));
        }
        named.push(name);
    }
    let allowed: Vec<&str> = NCCL_ALGOS
        .iter()
        .filter(|(n, _)| named.iter().any(|m| m == n) != exclude)
        .filter_map(|(_, ours)| *ours)
        .collect();
    match allowed.as_slice() {
        [] => Err(invalid(format!(
            "NCCL_ALGO={value} leaves only algorithms that need CollNet or NVLink SHARP hardware; topoccl runs Ring or Tree (or its own: TOPOCCL_ALGO)"
        ))),
        [one] => Ok(Some(one.to_string())),
        _ => Ok(None),
    }
}

/// Checks `NCCL_PROTO` (topoccl has one protocol, so a valid value changes nothing).
pub fn nccl_proto(value: &str) -> Result<()> {
    let list = value.trim().trim_start_matches('^');
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if !["ll", "ll128", "simple"].contains(&name.to_ascii_lowercase().as_str()) {
            return Err(invalid(format!("NCCL_PROTO={value}: unknown protocol `{name}` (LL, LL128, Simple)")));
        }
    }
    Ok(())
}

/// The core settings for a new communicator: `TOPOCCL_*`, then NCCL's variables where topoccl's
/// are unset.
pub fn core_config() -> Result<Config> {
    let mut c = Config::from_env()?;
    if var("TOPOCCL_ALGO").is_none() {
        if let Some(v) = var("NCCL_ALGO") {
            c.algo = nccl_algo(&v)?;
            log::info(Subsys::Env, None, format_args!("NCCL_ALGO set by environment to {v}: topoccl {:?}", c.algo));
        }
    }
    if let Some(v) = var("NCCL_PROTO") {
        nccl_proto(&v)?;
        log::info(Subsys::Env, None, format_args!("NCCL_PROTO={v}: topoccl has one protocol (Simple)"));
    }
    let off = |name: &str| var(name).is_some_and(|v| v == "1");
    if var("TOPOCCL_TRANSPORT").is_none() && (off("NCCL_P2P_DISABLE") || off("NCCL_SHM_DISABLE")) {
        c.transport = TransportPolicy::Tcp;
        log::info(Subsys::Env, None, format_args!("NCCL_P2P_DISABLE/NCCL_SHM_DISABLE set: TCP between every pair"));
    }
    Ok(c)
}

/// [`core_config`] for a rank the calling thread joins: bound at init to the device whose
/// primary context is current (`cudaSetDevice`'s), as NCCL binds to the current device. Binding
/// then, not at the first call, keeps a rank's device resources (CUDA IPC streams) made before
/// init returns, while no thread of this process can yet be waiting on its calls.
pub fn rank_config() -> Result<Config> {
    let mut c = core_config()?;
    c.cuda_device = topoccl::cuda::current_primary_device();
    Ok(c)
}

/// Field `$field` of the caller's config when its `size` covers it.
macro_rules! field {
    ($cfg:expr, $field:ident) => {{
        let end = std::mem::offset_of!(ncclConfig_t, $field) + std::mem::size_of_val(&$cfg.$field);
        ($cfg.size >= end).then_some($cfg.$field)
    }};
}

/// Reads a caller's `ncclConfig_t`.
pub fn requested(cfg: Option<&ncclConfig_t>) -> Result<Requested> {
    let Some(cfg) = cfg else { return Ok(Requested { blocking: true }) };
    if cfg.magic != CONFIG_MAGIC || cfg.size < std::mem::offset_of!(ncclConfig_t, blocking) {
        return Err(invalid("ncclConfig_t was not initialised with NCCL_CONFIG_INITIALIZER (bad magic or size)"));
    }
    let blocking = field!(cfg, blocking).unwrap_or(CONFIG_UNDEF_INT);
    if blocking != CONFIG_UNDEF_INT && blocking != 0 && blocking != 1 {
        return Err(invalid(format!("ncclConfig_t.blocking = {blocking}: expected 0 or 1")));
    }
    // GPU launch and network-plugin settings (up to NCCL 2.30's layout): read where the
    // caller's struct has them, and said to have no effect here.
    for (name, v) in [
        ("cgaClusterSize", field!(cfg, cga_cluster_size)),
        ("minCTAs", field!(cfg, min_ctas)),
        ("maxCTAs", field!(cfg, max_ctas)),
        ("splitShare", field!(cfg, split_share)),
        ("trafficClass", field!(cfg, traffic_class)),
        ("collnetEnable", field!(cfg, collnet_enable)),
        ("CTAPolicy", field!(cfg, cta_policy)),
        ("shrinkShare", field!(cfg, shrink_share)),
        ("nvlsCTAs", field!(cfg, nvls_ctas)),
        ("nChannelsPerNetPeer", field!(cfg, n_channels_per_net_peer)),
        ("nvlinkCentricSched", field!(cfg, nvlink_centric_sched)),
        ("graphUsageMode", field!(cfg, graph_usage_mode)),
        ("numRmaCtx", field!(cfg, num_rma_ctx)),
        ("maxP2pPeers", field!(cfg, max_p2p_peers)),
        ("graphStreamOrdering", field!(cfg, graph_stream_ordering)),
    ] {
        if let Some(v) = v.filter(|v| *v != CONFIG_UNDEF_INT) {
            log::info(
                Subsys::Init,
                None,
                format_args!("ncclConfig_t.{name} = {v} has no effect here (host memory, one protocol)"),
            );
        }
    }
    // SAFETY: commName is NULL or a NUL-terminated string (the API's contract).
    if let Some(name) = field!(cfg, comm_name).and_then(|p| unsafe { raw::string(p) }) {
        log::info(Subsys::Init, None, format_args!("ncclConfig_t.commName = {name}"));
    }
    // SAFETY: netName is NULL or a NUL-terminated string (the API's contract).
    if let Some(name) = field!(cfg, net_name).and_then(|p| unsafe { raw::string(p) }) {
        if !name.eq_ignore_ascii_case("socket") {
            return Err(invalid(format!(
                "ncclConfig_t.netName = {name}: topoccl's network is `Socket` (TCP; RDMA comes with the rdma feature)"
            )));
        }
    }
    Ok(Requested { blocking: blocking != 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ncclConfig_t` with `blocking` set, as tests build it.
    fn config_with_blocking(blocking: std::ffi::c_int) -> ncclConfig_t {
        ncclConfig_t {
            size: std::mem::size_of::<ncclConfig_t>(),
            magic: CONFIG_MAGIC,
            version: crate::abi::VERSION_CODE as u32,
            blocking,
            cga_cluster_size: CONFIG_UNDEF_INT,
            min_ctas: CONFIG_UNDEF_INT,
            max_ctas: CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: CONFIG_UNDEF_INT,
            traffic_class: CONFIG_UNDEF_INT,
            comm_name: std::ptr::null(),
            collnet_enable: CONFIG_UNDEF_INT,
            cta_policy: CONFIG_UNDEF_INT,
            shrink_share: CONFIG_UNDEF_INT,
            nvls_ctas: CONFIG_UNDEF_INT,
            n_channels_per_net_peer: CONFIG_UNDEF_INT,
            nvlink_centric_sched: CONFIG_UNDEF_INT,
            graph_usage_mode: CONFIG_UNDEF_INT,
            num_rma_ctx: CONFIG_UNDEF_INT,
            max_p2p_peers: CONFIG_UNDEF_INT,
            graph_stream_ordering: 5,
        }
    }

    #[test]
    fn nccl_algo_maps_onto_ours() {
        assert_eq!(nccl_algo("Ring").unwrap().as_deref(), Some("ring"));
        assert_eq!(nccl_algo("^Ring").unwrap().as_deref(), Some("tree"));
        assert_eq!(nccl_algo("Tree,NVLS").unwrap().as_deref(), Some("tree"));
        assert_eq!(nccl_algo("ring,tree").unwrap(), None);
        assert!(nccl_algo("NVLS").is_err());
        assert!(nccl_algo("Ringg").is_err());
        assert!(nccl_proto("LL,Simple").is_ok());
        assert!(nccl_proto("^LL128").is_ok());
        assert!(nccl_proto("fast").is_err());
    }

    #[test]
    fn configs_are_read_by_size() {
        assert!(requested(None).unwrap().blocking);
        assert!(!requested(Some(&config_with_blocking(0))).unwrap().blocking);
        assert!(requested(Some(&config_with_blocking(CONFIG_UNDEF_INT))).unwrap().blocking);
        assert!(requested(Some(&config_with_blocking(7))).is_err());
        let mut bad = config_with_blocking(1);
        bad.magic = 0;
        assert!(requested(Some(&bad)).is_err());
        let mut short = config_with_blocking(0);
        short.size = 16; // an older header without `blocking`
        assert!(requested(Some(&short)).unwrap().blocking);
        // A 2.21 caller's struct ends after splitShare: the later fields (here garbage) are
        // never read.
        let mut old = config_with_blocking(0);
        old.size = 48;
        old.version = crate::abi::CONFIG_VERSION_2_21;
        old.comm_name = 1 as *const std::ffi::c_char;
        assert!(!requested(Some(&old)).unwrap().blocking);
    }
}

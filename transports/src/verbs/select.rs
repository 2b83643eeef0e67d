//! Which device and port a rank uses, and how its queue pairs are addressed: NCCL's settings
//! (`NCCL_IB_HCA`, `NCCL_IB_GID_INDEX`, `NCCL_IB_TC`, `NCCL_IB_SL`, `NCCL_IB_TIMEOUT`,
//! `NCCL_IB_RETRY_CNT`, `NCCL_IB_QPS_PER_CONNECTION`) with NCCL's meanings, read by the core and handed over as
//! [`VerbsSettings`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::device::{device_names, Context, Endpoint, PathSettings, ProtectionDomain};
use super::library::Verbs;
use super::regions::{probe_odp, Regions};
use super::sys::*;

/// The verbs transport's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsSettings {
    /// The library to open (`TOPOCCL_IBVERBS_LIB`, `NCCL_IBVERBS_LIB`); libibverbs' soname
    /// otherwise.
    pub library: Option<String>,
    /// `NCCL_IB_HCA`: which devices and ports (`mlx5_0:1,mlx5_1`; a leading `^` excludes, a
    /// leading `=` matches names exactly instead of as prefixes).
    pub hca: Option<String>,
    /// `NCCL_IB_GID_INDEX`: the GID a RoCE port is addressed by (the first IPv4-mapped one, as
    /// NCCL picks RoCE v2 over IPv4, when unset).
    pub gid_index: Option<u8>,
    /// `NCCL_IB_TC`: the traffic class of RoCE packets.
    pub traffic_class: u8,
    /// `NCCL_IB_SL`: the InfiniBand service level.
    pub service_level: u8,
    /// `NCCL_IB_TIMEOUT`: local ACK timeout, 4.096 µs × 2^timeout (NCCL's default 20: 4.3 s).
    pub timeout: u8,
    /// `NCCL_IB_RETRY_CNT`: retransmissions before a send fails (7).
    pub retry_cnt: u8,
    /// `NCCL_IB_QPS_PER_CONNECTION`: queue pairs per connection, 1 to
    /// [`MAX_QPS`](super::MAX_QPS) (NCCL's default 1); large one-sided writes are striped
    /// over them.
    pub qps_per_connection: u8,
    /// Receive ring per peer and direction, registered host memory.
    pub ring_bytes: usize,
}

impl Default for VerbsSettings {
    fn default() -> VerbsSettings {
        VerbsSettings {
            library: None,
            hca: None,
            gid_index: None,
            traffic_class: 0,
            service_level: 0,
            timeout: 20,
            retry_cnt: 7,
            qps_per_connection: 1,
            ring_bytes: 4 << 20,
        }
    }
}

/// `NCCL_IB_HCA`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    entries: Vec<(String, Option<u8>)>,
}

impl HcaFilter {
    pub fn parse(spec: &str) -> HcaFilter {
        let mut s = spec.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let entries = s
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| match e.split_once(':') {
                Some((name, port)) => (name.to_string(), port.trim().parse().ok()),
                None => (e.to_string(), None),
            })
            .collect();
        HcaFilter { exclude, exact, entries }
    }

    /// Whether port `port` of device `name` may be used.
    pub fn allows(&self, name: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let listed = self.entries.iter().any(|(n, p)| {
            let named = if self.exact { name == n } else { name.starts_with(n.as_str()) };
            named && p.map_or(true, |p| p == port)
        });
        listed != self.exclude
    }
}

/// The device and port a rank talks through, opened once per process and shared by all its
/// connections.
pub struct Nic {
    pub pd: Arc<ProtectionDomain>,
    pub path: PathSettings,
    pub port: ibv_port_attr,
    pub gid: ibv_gid,
    /// Whether device memory can be registered through dma-buf, or why not (probed once).
    pub dmabuf: std::result::Result<(), String>,
    /// Whether host memory can be offered (on-demand paging), or why not (probed once).
    pub odp: std::result::Result<(), String>,
    /// Host memory registered for one-sided writes, shared by the port's connections.
    pub(crate) regions: Regions,
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.describe())
    }
}

/// Which of the usable ports a rank takes: among those nearest its GPU on the PCI tree (as
/// NCCL pairs each GPU with the NICs behind the same PCIe switch), the `index`-th, round robin,
/// so ranks of one host spread over its NICs. Where the paths are unknown (no GPU, no sysfs),
/// every port is as near as any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortChoice {
    pub index: usize,
    /// The GPU's PCI address, as `DeviceId::pci_bus` gives it (`domain << 16 | bus << 8 |
    /// device`).
    pub gpu_pci: Option<u64>,
}

impl From<usize> for PortChoice {
    fn from(index: usize) -> PortChoice {
        PortChoice { index, gpu_pci: None }
    }
}

/// Where the PCI device at `pci` (`domain << 16 | bus << 8 | device`, function 0) sits in
/// sysfs's device tree, if it is there.
fn gpu_pci_path(pci: u64) -> Option<PathBuf> {
    let bdf = format!("{:04x}:{:02x}:{:02x}.0", pci >> 16, (pci >> 8) & 0xff, pci & 0xff);
    std::fs::canonicalize(format!("/sys/bus/pci/devices/{bdf}")).ok()
}

/// Where RDMA device `name` sits in sysfs's device tree, if it is there.
fn nic_pci_path(name: &str) -> Option<PathBuf> {
    std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device")).ok()
}

/// The indices of `nics` nearest `gpu`: those whose device path shares the most components
/// with the GPU's (the PCIe switch or root port they share); every index where the GPU's
/// path is unknown.
fn nearest(gpu: Option<&Path>, nics: &[Option<PathBuf>]) -> Vec<usize> {
    let Some(gpu) = gpu else { return (0..nics.len()).collect() };
    let shared = |nic: &Option<PathBuf>| {
        nic.as_ref().map_or(0, |n| n.components().zip(gpu.components()).take_while(|(a, b)| a == b).count())
    };
    let best = nics.iter().map(shared).max().unwrap_or(0);
    (0..nics.len()).filter(|&i| shared(&nics[i]) == best).collect()
}

impl Nic {
    /// An active port of the devices `settings` allows, as `choice` picks it.
    pub fn open(verbs: Arc<Verbs>, settings: &VerbsSettings, choice: PortChoice) -> std::result::Result<Nic, String> {
        let filter = HcaFilter::parse(settings.hca.as_deref().unwrap_or(""));
        let names = device_names(&verbs)?;
        let mut candidates = Vec::new();
        let mut seen = Vec::new();
        for name in &names {
            let ctx = match Context::open(verbs.clone(), name) {
                Ok(c) => c,
                Err(e) => {
                    seen.push(format!("{name}: {e}"));
                    continue;
                }
            };
            let ports = ctx.query_device().map(|a| a.phys_port_cnt).unwrap_or(1);
            for port in 1..=ports {
                match ctx.query_port(port) {
                    Ok(attr) if attr.state == PORT_ACTIVE && filter.allows(name, port) => {
                        candidates.push((ctx.clone(), port, attr))
                    }
                    Ok(attr) => seen.push(format!("{name}:{port} state {}", attr.state)),
                    Err(e) => seen.push(format!("{name}:{port}: {e}")),
                }
            }
        }
        if candidates.is_empty() {
            let filter = settings.hca.as_deref().map(|h| format!(" matching NCCL_IB_HCA={h}")).unwrap_or_default();
            return Err(format!("no active RDMA port{filter} (devices: {}; {})", names.join(", "), seen.join("; ")));
        }
        let gpu = choice.gpu_pci.and_then(gpu_pci_path);
        let paths: Vec<Option<PathBuf>> = candidates.iter().map(|(ctx, _, _)| nic_pci_path(&ctx.name)).collect();
        let near = nearest(gpu.as_deref(), &paths);
        let (ctx, port, attr) = candidates.swap_remove(near[choice.index % near.len()]);
        let gid_index = match settings.gid_index {
            Some(i) => i,
            None if attr.link_layer == LINK_LAYER_INFINIBAND => 0,
            None => roce_v2_ipv4(&ctx, port, attr.gid_tbl_len),
        };
        let gid = ctx.query_gid(port, i32::from(gid_index)).map_err(|e| e.to_string())?;
        let path = PathSettings {
            port,
            gid_index,
            traffic_class: settings.traffic_class,
            service_level: settings.service_level,
            timeout: settings.timeout,
            retry_cnt: settings.retry_cnt,
        };
        let pd = ProtectionDomain::new(ctx).map_err(|e| e.to_string())?;
        let dmabuf = pd.dmabuf();
        let odp = probe_odp(&pd);
        Ok(Nic { pd, path, port: attr, gid, dmabuf, odp, regions: Regions::default() })
    }

    /// Where a queue pair numbered `qpn` on this port is reached.
    pub fn endpoint(&self, qpn: u32) -> Endpoint {
        Endpoint { qpn, lid: self.port.lid, gid: self.gid, link_layer: self.port.link_layer, mtu: self.port.active_mtu }
    }

    /// `mlx5_0:1 (RoCE, GID 3, MTU 4096)`, for logs and `collbench`'s header.
    pub fn describe(&self) -> String {
        let link = match self.port.link_layer {
            LINK_LAYER_INFINIBAND => format!("IB, LID {}", self.port.lid),
            _ => format!("RoCE, GID {}", self.path.gid_index),
        };
        let mtu = 128u32 << self.port.active_mtu.clamp(1, 5);
        let dmabuf = match &self.dmabuf {
            Ok(()) => "GPU memory written and read by the NIC where the driver exports dma-bufs".to_string(),
            Err(why) => format!("GPU memory staged through host memory: no dma-buf ({why})"),
        };
        let odp = match &self.odp {
            Ok(()) => "host receives offered (on-demand paging)".to_string(),
            Err(why) => format!("host receives through the ring: {why}"),
        };
        format!("{}:{} ({link}, MTU {mtu}; {odp}; {dmabuf})", self.pd.ctx.name, self.path.port)
    }
}

/// The GID a RoCE port is addressed by when `NCCL_IB_GID_INDEX` is unset: RoCE v2 over IPv4,
/// as NCCL picks it (a v1 GID does not cross subnets). Each index's type comes from sysfs
/// (`gid_attrs/types`); where sysfs does not say, the first IPv4-mapped GID; else 0.
fn roce_v2_ipv4(ctx: &Context, port: u8, table: i32) -> u8 {
    let gids: Vec<(u8, ibv_gid, Option<String>)> = (0..table.clamp(0, 255))
        .filter_map(|i| {
            let gid = ctx.query_gid(port, i).ok()?;
            let path = format!("/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{i}", ctx.name);
            let kind = std::fs::read_to_string(path).ok().map(|t| t.trim().to_string());
            Some((i as u8, gid, kind))
        })
        .collect();
    choose_gid(&gids)
}

/// [`roce_v2_ipv4`]'s choice among `(index, gid, type)`.
fn choose_gid(gids: &[(u8, ibv_gid, Option<String>)]) -> u8 {
    let ipv4 = |g: &ibv_gid| g.raw[..10] == [0; 10] && g.raw[10..12] == [0xff, 0xff];
    let v2 = |t: &Option<String>| t.as_deref().is_some_and(|t| t.eq_ignore_ascii_case("RoCE v2"));
    gids.iter()
        .find(|(_, g, t)| ipv4(g) && v2(t))
        .or_else(|| gids.iter().find(|(_, g, t)| ipv4(g) && t.is_none()))
        .map_or(0, |(i, _, _)| *i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nics_behind_the_gpus_pcie_switch_are_nearest() {
        let p = |s: &str| Some(PathBuf::from(s));
        // Two GPUs' worth of a DGX-like tree: root complexes 0000:17 and 0000:a0, a switch
        // under each, and a storage NIC on the root port.
        let nics = [
            p("/sys/devices/pci0000:a0/0000:a0:01.0/0000:a1:00.0/0000:a2:00.0/0000:a3:00.0"),
            p("/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0"),
            p("/sys/devices/pci0000:17/0000:17:02.0/0000:30:00.0"),
            None,
            p("/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:04.0/0000:1c:00.0"),
        ];
        let gpu = PathBuf::from("/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:01.0/0000:1b:00.0");
        assert_eq!(nearest(Some(&gpu), &nics), vec![1, 4], "the two behind its switch");
        let other = PathBuf::from("/sys/devices/pci0000:a0/0000:a0:01.0/0000:a1:00.0/0000:a2:04.0/0000:a4:00.0");
        assert_eq!(nearest(Some(&other), &nics), vec![0]);
        assert_eq!(nearest(None, &nics), vec![0, 1, 2, 3, 4], "no GPU path: round robin over all");
        let alone = PathBuf::from("/sys/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0");
        assert_eq!(nearest(Some(&alone), &nics), vec![0, 1, 2, 4], "no NIC nearer than the root: every known one");
    }

    #[test]
    fn roce_ports_are_addressed_by_their_ipv4_roce_v2_gid() {
        let mut link_local = ibv_gid::default();
        link_local.raw[..2].copy_from_slice(&[0xfe, 0x80]);
        let mut ipv4 = ibv_gid::default();
        ipv4.raw[10..16].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 7]);
        let t = |s: &str| Some(s.to_string());
        // mlx5's table: each address once as RoCE v1 and once as v2.
        let mlx5 = [
            (0, link_local, t("IB/RoCE v1")),
            (1, link_local, t("RoCE v2")),
            (2, ipv4, t("IB/RoCE v1")),
            (3, ipv4, t("RoCE v2")),
        ];
        assert_eq!(choose_gid(&mlx5), 3);
        // No types known (no sysfs, as under the stand-in): the first IPv4-mapped one.
        assert_eq!(choose_gid(&[(0, link_local, None), (1, ipv4, None)]), 1);
        // Nothing IPv4: index 0.
        assert_eq!(choose_gid(&[(0, link_local, t("RoCE v2"))]), 0);
    }

    #[test]
    fn hca_filters_follow_nccl_syntax() {
        let all = HcaFilter::parse("");
        assert!(all.allows("mlx5_0", 1));
        let f = HcaFilter::parse("mlx5_0:1,mlx5_2");
        assert!(f.allows("mlx5_0", 1) && !f.allows("mlx5_0", 2));
        assert!(f.allows("mlx5_2", 2) && f.allows("mlx5_20", 1) && !f.allows("mlx5_1", 1));
        let exact = HcaFilter::parse("=mlx5_2");
        assert!(exact.allows("mlx5_2", 1) && !exact.allows("mlx5_20", 1));
        let not = HcaFilter::parse("^mlx5_1");
        assert!(not.allows("mlx5_0", 1) && !not.allows("mlx5_1", 1) && !not.allows("mlx5_10", 1));
        let not_exact = HcaFilter::parse("^=mlx5_1:1");
        assert!(not_exact.allows("mlx5_10", 1) && not_exact.allows("mlx5_1", 2) && !not_exact.allows("mlx5_1", 1));
    }
}

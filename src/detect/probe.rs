//! What NVML says about this machine's GPUs, gathered in one pass: each GPU's name, PCI
//! address, compute capability, NUMA node and PCIe link; each active NVLink's far end (another
//! GPU, an NVSwitch, a CPU); and how far apart every two GPUs are on PCIe. Facts only: the
//! model is built from them elsewhere ([`super::model`]).

use super::nvml::{CallError, Device, Nvml, PciAddress, PcieLevel, RemoteKind, NVLINK_MAX_LINKS};

/// Everything detection learnt from NVML.
#[derive(Debug, Clone)]
pub struct Probe {
    /// `nvmlSystemGetDriverVersion`, e.g. `550.90.07`.
    pub driver_version: String,
    /// In NVML's order (PCI bus order): GPU i is rank i of the detected topology.
    pub gpus: Vec<GpuFacts>,
    /// `pcie_levels[i][j]`: the nearest PCIe ancestor GPUs i and j share.
    pub pcie_levels: Vec<Vec<PcieLevel>>,
}

/// One GPU.
#[derive(Debug, Clone)]
pub struct GpuFacts {
    pub name: String,
    pub uuid: String,
    pub pci: PciAddress,
    /// (major, minor).
    pub compute_capability: (u32, u32),
    pub memory_bytes: Option<u64>,
    pub numa_node: Option<u32>,
    /// The GPU's maximum PCIe (generation, width).
    pub max_pcie: Option<(u32, u32)>,
    /// The active NVLinks, by link index.
    pub nvlinks: Vec<NvLink>,
}

/// One active NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvLink {
    /// The GPU's link index.
    pub link: u32,
    pub remote: Remote,
}

/// What an NVLink reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    /// Another GPU of this machine, by index.
    Gpu(usize),
    /// An NVSwitch chip, by its PCI address.
    Switch(PciAddress),
    /// A CPU (IBM POWER's NVLink to the processor).
    Cpu(PciAddress),
    /// A GPU NVML does not list, or a device the driver cannot name.
    Other(PciAddress),
}

impl Probe {
    /// Asks NVML (initialised) about every GPU.
    pub fn gather(nvml: &Nvml) -> Result<Probe, CallError> {
        let driver_version = nvml.driver_version()?;
        let count = nvml.device_count()?;
        let devices = (0..count).map(|i| nvml.device(i)).collect::<Result<Vec<Device>, _>>()?;
        let mut gpus = Vec::with_capacity(devices.len());
        for &d in &devices {
            gpus.push(GpuFacts {
                name: nvml.name(d)?,
                uuid: nvml.uuid(d)?,
                pci: nvml.pci(d)?,
                compute_capability: nvml.compute_capability(d)?,
                memory_bytes: nvml.memory_bytes(d),
                numa_node: nvml.numa_node(d),
                max_pcie: nvml.max_pcie(d),
                nvlinks: Vec::new(),
            });
        }
        // A link's far end is recognised as a GPU by its address, so every address first.
        let addresses: Vec<PciAddress> = gpus.iter().map(|g| g.pci).collect();
        for (i, &d) in devices.iter().enumerate() {
            gpus[i].nvlinks = nvlinks(nvml, d, i, &addresses)?;
        }
        let mut pcie_levels = vec![vec![PcieLevel::Internal; devices.len()]; devices.len()];
        for i in 0..devices.len() {
            for j in i + 1..devices.len() {
                let level = nvml.common_ancestor(devices[i], devices[j])?;
                pcie_levels[i][j] = level;
                pcie_levels[j][i] = level;
            }
        }
        Ok(Probe { driver_version, gpus, pcie_levels })
    }
}

/// The active NVLinks of GPU `me` (device `d`). Link indices a GPU lacks answer "invalid
/// argument" or "not supported" and are skipped: every index NVML may know is asked, as chips
/// differ (6 links on a V100, 12 on an A100, 18 on an H100).
fn nvlinks(nvml: &Nvml, d: Device, me: usize, addresses: &[PciAddress]) -> Result<Vec<NvLink>, CallError> {
    let mut out = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        if nvml.nvlink_active(d, link)? != Some(true) {
            continue;
        }
        let at = nvml.nvlink_remote_pci(d, link)?;
        let gpu = addresses.iter().position(|&a| a == at).filter(|&j| j != me);
        let remote = match (nvml.nvlink_remote_kind(d, link)?, gpu) {
            (Some(RemoteKind::Switch), _) => Remote::Switch(at),
            (Some(RemoteKind::Cpu), _) => Remote::Cpu(at),
            (_, Some(j)) => Remote::Gpu(j),
            (Some(RemoteKind::Gpu), None) => Remote::Other(at),
            // A driver that cannot say what is there: NVLinks end at a GPU, an NVSwitch or a
            // POWER CPU, and the last is a machine of the past; not a GPU here, so a switch.
            (Some(RemoteKind::Unknown) | None, None) => Remote::Switch(at),
        };
        out.push(NvLink { link, remote });
    }
    Ok(out)
}

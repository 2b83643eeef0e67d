//! The machine the stand-in answers as: read from a small TOML file (a shipped one by name, or
//! a path), checked, and turned into what NVML reports per GPU: PCI addresses, NUMA node, PCIe
//! switch, and each NVLink's state and remote end.
//!
//! ```toml
//! name = "pair"
//! driver_version = "550.90.07"
//! bus_ids = ["00000000:18:00.0", "00000000:2A:00.0"]   # one per GPU, NVML's (PCI) order
//! numa_nodes = [0, 0]                 # optional (absent: nvmlDeviceGetNumaNodeId unsupported)
//! pcie_switches = [0, 0]              # optional: GPUs with the same number share a PCIe switch
//! gpu_links = [[0, 1, 4]]             # NVLinks between two GPUs: [gpu, gpu, links]
//! down = [[1, 3]]                     # optional: [gpu, link] present but inactive
//! [gpu]                               # every GPU of the machine is this model
//! name = "NVIDIA H100 80GB HBM3"
//! pci_device_id = 0x233010DE
//! compute_capability = [9, 0]
//! memory_mib = 81559
//! nvlinks = 18                        # NVLinks of the chip: link indices 0..nvlinks
//! pcie = [5, 16]                      # maximum PCIe generation and width
//! [[switch]]                          # an NVSwitch chip, reached by every GPU
//! bus_id = "00000000:C4:00.0"
//! pci_device_id = 0x22A310DE
//! links_per_gpu = 5
//! ```
//!
//! Link indices of a GPU are given in order: its `gpu_links` entries (in file order), then the
//! switches (in file order); indices left over up to `nvlinks` are inactive.

use std::collections::HashSet;

use serde::Deserialize;

use crate::sys::{NVLINK_MAX_LINKS, TOPOLOGY_INTERNAL, TOPOLOGY_NODE, TOPOLOGY_SINGLE, TOPOLOGY_SYSTEM};

/// The machines shipped with the stand-in, by name.
const SHIPPED: &[(&str, &str)] = &[
    ("dgx1", include_str!("../machines/dgx1.toml")),
    ("dgx-a100", include_str!("../machines/dgx-a100.toml")),
    ("dgx-h100", include_str!("../machines/dgx-h100.toml")),
];

/// The machine answered when `TOPOCCL_STANDIN_NVML_MACHINE` is not set.
pub const DEFAULT: &str = "dgx-h100";

/// The most GPUs a machine file may describe (a bound on tables, not NVML's).
const MAX_GPUS: usize = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineFile {
    name: String,
    driver_version: String,
    gpu: GpuModel,
    bus_ids: Vec<String>,
    numa_nodes: Option<Vec<u32>>,
    pcie_switches: Option<Vec<u32>>,
    #[serde(default)]
    gpu_links: Vec<[u32; 3]>,
    #[serde(default)]
    switch: Vec<SwitchFile>,
    #[serde(default)]
    down: Vec<[u32; 2]>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuModel {
    name: String,
    pci_device_id: u32,
    compute_capability: [i32; 2],
    memory_mib: u64,
    nvlinks: u32,
    pcie: [u32; 2],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchFile {
    bus_id: String,
    pci_device_id: u32,
    links_per_gpu: u32,
}

/// A PCI function's address (function 0 always).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

impl PciAddress {
    /// Reads `0000:07:00.0` or `00000000:07:00.0` (hexadecimal, either case).
    pub fn parse(s: &str) -> Result<PciAddress, String> {
        let bad = || format!("`{s}` is not a PCI bus id like 00000000:07:00.0");
        let mut parts = s.split(':');
        let (Some(domain), Some(bus), Some(rest), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let (device, function) = rest.split_once('.').ok_or_else(bad)?;
        let hex = |t: &str, max: u32| u32::from_str_radix(t, 16).ok().filter(|&v| v <= max && !t.is_empty());
        match (hex(domain, u32::MAX), hex(bus, 0xff), hex(device, 0x1f), function) {
            (Some(domain), Some(bus), Some(device), "0") => Ok(PciAddress { domain, bus, device }),
            _ => Err(bad()),
        }
    }

    /// NVML's `busId` (`NVML_DEVICE_PCI_BUS_ID_FMT`).
    pub fn bus_id(&self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// NVML's `busIdLegacy` (`NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT`).
    pub fn bus_id_legacy(&self) -> String {
        format!("{:04X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }
}

/// What one NVLink of a GPU reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    /// Another GPU, by index.
    Gpu(usize),
    /// An NVSwitch chip, by index into [`Machine::switches`].
    Switch(usize),
}

/// One NVLink of a GPU: `None` when nothing is attached (inactive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub remote: Option<Remote>,
    pub active: bool,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub uuid: String,
    pub pci: PciAddress,
    pub numa_node: Option<u32>,
    pub pcie_switch: Option<u32>,
    /// Exactly the chip's `nvlinks` entries.
    pub links: Vec<Link>,
}

/// An NVSwitch chip.
#[derive(Debug, Clone, Copy)]
pub struct Switch {
    pub pci: PciAddress,
    pub pci_device_id: u32,
}

/// The checked machine.
#[derive(Debug, Clone)]
pub struct Machine {
    pub name: String,
    pub driver_version: String,
    pub gpu_name: String,
    pub pci_device_id: u32,
    pub compute_capability: (i32, i32),
    pub memory_bytes: u64,
    /// Maximum PCIe (generation, width).
    pub pcie: (u32, u32),
    pub gpus: Vec<Gpu>,
    pub switches: Vec<Switch>,
}

impl Machine {
    /// The machine `spec` names: a shipped machine's name, or a path to a machine file.
    pub fn load(spec: &str) -> Result<Machine, String> {
        if let Some((_, text)) = SHIPPED.iter().find(|(n, _)| *n == spec) {
            return Machine::parse(text).map_err(|e| format!("shipped machine {spec}: {e}"));
        }
        let text = std::fs::read_to_string(spec).map_err(|e| {
            let names: Vec<&str> = SHIPPED.iter().map(|(n, _)| *n).collect();
            format!("{spec}: {e} (not a file, nor a shipped machine: {})", names.join(", "))
        })?;
        Machine::parse(&text).map_err(|e| format!("{spec}: {e}"))
    }

    /// Reads and checks a machine file's text.
    pub fn parse(text: &str) -> Result<Machine, String> {
        let file: MachineFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let n = file.bus_ids.len();
        if n == 0 || n > MAX_GPUS {
            return Err(format!("{n} GPUs: a machine has 1 to {MAX_GPUS}"));
        }
        let model = &file.gpu;
        if model.nvlinks > NVLINK_MAX_LINKS {
            return Err(format!("{} NVLinks per GPU: NVML knows at most {NVLINK_MAX_LINKS}", model.nvlinks));
        }
        let per_gpu = |what: &str, v: &Option<Vec<u32>>| match v {
            Some(v) if v.len() != n => Err(format!("{what} has {} entries for {n} GPUs", v.len())),
            Some(v) => Ok(v.iter().map(|&x| Some(x)).collect()),
            None => Ok(vec![None; n]),
        };
        let numa: Vec<Option<u32>> = per_gpu("numa_nodes", &file.numa_nodes)?;
        let pcie_switch: Vec<Option<u32>> = per_gpu("pcie_switches", &file.pcie_switches)?;
        let mut addresses = HashSet::new();
        let mut remotes: Vec<Vec<Remote>> = vec![Vec::new(); n];
        let gpu = |g: u32| (g as usize) < n;
        for &[a, b, count] in &file.gpu_links {
            if !gpu(a) || !gpu(b) || a == b || count == 0 {
                return Err(format!("gpu_links entry [{a}, {b}, {count}]: two different GPUs and at least one link"));
            }
            for _ in 0..count {
                remotes[a as usize].push(Remote::Gpu(b as usize));
                remotes[b as usize].push(Remote::Gpu(a as usize));
            }
        }
        let mut switches = Vec::new();
        for (s, sw) in file.switch.iter().enumerate() {
            let pci = PciAddress::parse(&sw.bus_id)?;
            if !addresses.insert(pci) {
                return Err(format!("bus id {} given twice", sw.bus_id));
            }
            switches.push(Switch { pci, pci_device_id: sw.pci_device_id });
            for r in &mut remotes {
                r.extend(std::iter::repeat(Remote::Switch(s)).take(sw.links_per_gpu as usize));
            }
        }
        let down: HashSet<(usize, usize)> = file.down.iter().map(|&[g, l]| (g as usize, l as usize)).collect();
        if let Some(&(g, l)) = down.iter().find(|&&(g, l)| g >= n || l >= model.nvlinks as usize) {
            return Err(format!("down entry [{g}, {l}] names no GPU link"));
        }
        let mut gpus = Vec::with_capacity(n);
        for (i, bus_id) in file.bus_ids.iter().enumerate() {
            let pci = PciAddress::parse(bus_id)?;
            if !addresses.insert(pci) {
                return Err(format!("bus id {bus_id} given twice"));
            }
            if remotes[i].len() > model.nvlinks as usize {
                return Err(format!("GPU {i} has {} NVLinks attached, its chip {}", remotes[i].len(), model.nvlinks));
            }
            let links = (0..model.nvlinks as usize)
                .map(|l| {
                    let remote = remotes[i].get(l).copied();
                    Link { remote, active: remote.is_some() && !down.contains(&(i, l)) }
                })
                .collect();
            gpus.push(Gpu { uuid: uuid(&file.name, i), pci, numa_node: numa[i], pcie_switch: pcie_switch[i], links });
        }
        Ok(Machine {
            name: file.name,
            driver_version: file.driver_version,
            gpu_name: model.name.clone(),
            pci_device_id: model.pci_device_id,
            compute_capability: (model.compute_capability[0], model.compute_capability[1]),
            memory_bytes: model.memory_mib.saturating_mul(1 << 20),
            pcie: (model.pcie[0], model.pcie[1]),
            gpus,
            switches,
        })
    }

    /// `nvmlDeviceGetTopologyCommonAncestor` between GPUs `a` and `b`: the GPU itself, a
    /// shared PCIe switch, a shared NUMA node (or both unknown), else the whole system.
    pub fn common_ancestor(&self, a: usize, b: usize) -> u32 {
        let (ga, gb) = (&self.gpus[a], &self.gpus[b]);
        if a == b {
            TOPOLOGY_INTERNAL
        } else if ga.pcie_switch.is_some() && ga.pcie_switch == gb.pcie_switch {
            TOPOLOGY_SINGLE
        } else if ga.numa_node == gb.numa_node {
            TOPOLOGY_NODE
        } else {
            TOPOLOGY_SYSTEM
        }
    }
}

/// A stable UUID per machine name and GPU (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
fn uuid(machine: &str, gpu: usize) -> String {
    let hash = |seed: u64| {
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
        for b in machine.bytes().chain((gpu as u64).to_le_bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let (hi, lo) = (hash(1), hash(2));
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links_to(m: &Machine, g: usize, remote: Remote) -> usize {
        m.gpus[g].links.iter().filter(|l| l.active && l.remote == Some(remote)).count()
    }

    #[test]
    fn shipped_machines_parse_with_their_nvlinks() {
        let dgx1 = Machine::load("dgx1").unwrap();
        assert_eq!(dgx1.gpus.len(), 8);
        for g in 0..8 {
            let active = dgx1.gpus[g].links.iter().filter(|l| l.active).count();
            assert_eq!(active, 6, "gpu{g}");
        }
        assert_eq!(links_to(&dgx1, 0, Remote::Gpu(3)), 2);
        assert_eq!(links_to(&dgx1, 3, Remote::Gpu(0)), 2);
        let a100 = Machine::load("dgx-a100").unwrap();
        assert_eq!(a100.switches.len(), 6);
        assert!((0..8).all(|g| (0..6).all(|s| links_to(&a100, g, Remote::Switch(s)) == 2)));
        let h100 = Machine::load("dgx-h100").unwrap();
        assert_eq!(h100.switches.len(), 4);
        let per_gpu: usize = (0..4).map(|s| links_to(&h100, 5, Remote::Switch(s))).sum();
        assert_eq!(per_gpu, 18);
        assert_eq!(h100.gpus[0].links.len(), 18);
    }

    #[test]
    fn bus_ids_read_and_print_as_nvml_does() {
        let a = PciAddress::parse("0000:b7:00.0").unwrap();
        assert_eq!(a.bus_id(), "00000000:B7:00.0");
        assert_eq!(a.bus_id_legacy(), "0000:B7:00.0");
        assert_eq!(PciAddress::parse(&a.bus_id()).unwrap(), a);
        for bad in ["", "07:00.0", "0000:07:00.1", "0000:100:00.0", "0000:07:20.0", "x:07:00.0"] {
            assert!(PciAddress::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_files_say_why() {
        let base = "name = \"t\"\ndriver_version = \"1\"\n[gpu]\nname = \"g\"\npci_device_id = 1\ncompute_capability = [9, 0]\nmemory_mib = 1\nnvlinks = 2\npcie = [5, 16]\n";
        let with = |top: &str| Machine::parse(&format!("{top}\n{base}"));
        assert!(with("bus_ids = []").unwrap_err().contains("1 to 64"));
        let two = "bus_ids = [\"0000:01:00.0\", \"0000:02:00.0\"]";
        assert!(with(&format!("{two}\ngpu_links = [[0, 1, 3]]")).unwrap_err().contains("chip 2"));
        assert!(with(&format!("{two}\ngpu_links = [[0, 0, 1]]")).unwrap_err().contains("two different"));
        assert!(with(&format!("{two}\ndown = [[0, 2]]")).unwrap_err().contains("no GPU link"));
        assert!(with(&format!("{two}\nnuma_nodes = [0]")).unwrap_err().contains("1 entries for 2"));
        assert!(with("bus_ids = [\"0000:01:00.0\", \"0000:01:00.0\"]").unwrap_err().contains("twice"));
        let m = with(&format!("{two}\ngpu_links = [[0, 1, 1]]\ndown = [[1, 0]]")).unwrap();
        assert_eq!(
            m.gpus[0].links,
            [Link { remote: Some(Remote::Gpu(1)), active: true }, Link { remote: None, active: false }]
        );
        assert!(!m.gpus[1].links[0].active);
        assert_eq!(m.common_ancestor(0, 1), TOPOLOGY_NODE);
        assert!(Machine::load("nonesuch").unwrap_err().contains("dgx-a100"));
    }
}

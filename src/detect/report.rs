//! What detection found, for people: a table of the GPUs (name, bus id, NUMA node, compute
//! capability, memory, NVLink peers and counts) and a line saying which machine this is. Every
//! line starts with `# `, as collbench's comments do.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::model::nvlink_generation;
use super::probe::Remote;
use super::{recognise, Detected, Recognition};

impl Detected {
    /// The table and the verdict, one line per GPU.
    pub fn table(&self) -> String {
        let p = &self.probe;
        let mut out = String::new();
        let _ = writeln!(out, "# detected through NVML (driver {}): {} GPUs", p.driver_version, p.gpus.len());
        let name_width = p.gpus.iter().map(|g| g.name.len()).max().unwrap_or(4).max(4);
        let _ = writeln!(out, "#  gpu  {:name_width$}  bus id        NUMA  SM    memory  NVLinks", "name");
        for (i, g) in p.gpus.iter().enumerate() {
            let numa = g.numa_node.map_or("-".to_string(), |n| n.to_string());
            let memory =
                g.memory_bytes.map_or("-".to_string(), |b| format!("{:.0} GiB", b as f64 / (1u64 << 30) as f64));
            let (major, minor) = g.compute_capability;
            let _ = writeln!(
                out,
                "#  {i:>3}  {:name_width$}  {}  {numa:>4}  {major}.{minor}  {memory:>7}  {}",
                g.name,
                g.pci.bus_id(),
                nvlinks(self, i)
            );
        }
        let _ = writeln!(out, "# {}", self.verdict());
        out
    }

    /// One line: the machine recognised, or what was found and why it is none of the
    /// library's, and which topology is used.
    pub fn verdict(&self) -> String {
        let p = &self.probe;
        let generation = match recognise::generation(p) {
            Some(v) => {
                let per_link = p.gpus.first().map_or(0.0, |g| nvlink_generation(g.compute_capability).gbps_per_link);
                format!("NVLink {v}, {per_link} GB/s per link")
            }
            None => "mixed NVLink generations".to_string(),
        };
        match &self.recognition {
            Recognition::Library(name) => {
                format!("recognised: {name} ({generation}): using the library's topology {name}")
            }
            Recognition::Unrecognised(why) => format!(
                "unrecognised: {} GPUs, {generation} ({why}): using the detected model `{}`",
                p.gpus.len(),
                self.topology.name()
            ),
        }
    }
}

/// GPU `i`'s NVLinks in words: `gpu3 x2, gpu4 x2`, `12 to 6 NVSwitches (2 each)`, `none`.
fn nvlinks(d: &Detected, i: usize) -> String {
    let g = &d.probe.gpus[i];
    let mut gpus: BTreeMap<usize, u32> = BTreeMap::new();
    let mut switches: BTreeMap<_, u32> = BTreeMap::new();
    let mut others = 0;
    for l in &g.nvlinks {
        match l.remote {
            Remote::Gpu(j) => *gpus.entry(j).or_default() += 1,
            Remote::Switch(at) => *switches.entry(at).or_default() += 1,
            Remote::Cpu(_) | Remote::Other(_) => others += 1,
        }
    }
    let mut parts: Vec<String> = gpus.iter().map(|(j, n)| format!("gpu{j} x{n}")).collect();
    if !switches.is_empty() {
        let total: u32 = switches.values().sum();
        let counts: Vec<u32> = switches.values().copied().collect();
        let each = if counts.windows(2).all(|w| w[0] == w[1]) {
            format!("{} each", counts[0])
        } else {
            counts.iter().map(u32::to_string).collect::<Vec<_>>().join("+")
        };
        let chips = if switches.len() == 1 { "NVSwitch".to_string() } else { format!("{} NVSwitches", switches.len()) };
        parts.push(format!("{total} to {chips} ({each})"));
    }
    if others > 0 {
        parts.push(format!("{others} to other devices"));
    }
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(", ")
    }
}

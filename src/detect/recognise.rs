//! Recognising the library's machines in what NVML found: a detected machine *is* `dgx1`,
//! `dgx-a100` or `dgx-h100` when it has the same GPUs (count and NVLink generation) wired the
//! same way (NVLinks per GPU pair, NVLinks from each GPU into the NVSwitch fabric). Then the
//! library's own file, with its measured and cited figures, describes it better than a model
//! built from generations; PCIe and NUMA placement do not enter (the files model them roughly).
//!
//! The NVLink shape is read from the library's files themselves, so a file and its
//! recognition cannot drift apart.

use std::collections::BTreeMap;

use topoccl_synth::topology::{self, LinkKind, NodeKind, Topology};

use super::model::nvlink_generation;
use super::probe::{Probe, Remote};

/// The library's machines detection can recognise, with their NVLink generation.
pub const LIBRARY: [(&str, u32); 3] = [("dgx1", 2), ("dgx-a100", 3), ("dgx-h100", 4)];

/// How a machine's GPUs are wired by NVLink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub gpus: usize,
    /// NVLinks from GPU a to GPU b (each direction counted on its own).
    pub gpu_links: BTreeMap<(usize, usize), u32>,
    /// NVLinks from each GPU into the NVSwitch fabric.
    pub switch_links: Vec<u32>,
    /// NVLinks from each GPU to anything else (a CPU, a device NVML cannot name).
    pub other_links: Vec<u32>,
}

impl Shape {
    /// The shape NVML reported.
    pub fn of_probe(probe: &Probe) -> Shape {
        let n = probe.gpus.len();
        let mut shape =
            Shape { gpus: n, gpu_links: BTreeMap::new(), switch_links: vec![0; n], other_links: vec![0; n] };
        for (i, g) in probe.gpus.iter().enumerate() {
            for l in &g.nvlinks {
                match l.remote {
                    Remote::Gpu(j) => *shape.gpu_links.entry((i, j)).or_default() += 1,
                    Remote::Switch(_) => shape.switch_links[i] += 1,
                    Remote::Cpu(_) | Remote::Other(_) => shape.other_links[i] += 1,
                }
            }
        }
        shape
    }

    /// The shape of a topology's NVLink links.
    pub fn of_topology(t: &Topology) -> Shape {
        let n = t.nranks();
        let mut shape =
            Shape { gpus: n, gpu_links: BTreeMap::new(), switch_links: vec![0; n], other_links: vec![0; n] };
        for (_, a, b, link) in t.edges() {
            let (from, to) = (t.node(a), t.node(b));
            let Some(ra) = from.rank.map(|r| r as usize) else { continue };
            if link.kind != LinkKind::NvLink || ra >= n {
                continue;
            }
            match (to.rank, to.kind) {
                (Some(rb), _) => *shape.gpu_links.entry((ra, rb as usize)).or_default() += 1,
                (None, NodeKind::Switch) => shape.switch_links[ra] += 1,
                (None, _) => shape.other_links[ra] += 1,
            }
        }
        shape
    }

    /// The first way `self` (found) differs from `other` (a library machine), in words.
    fn difference(&self, other: &Shape) -> Option<String> {
        if self.gpus != other.gpus {
            return Some(format!("{} GPUs, not {}", self.gpus, other.gpus));
        }
        let pairs = self.gpu_links.keys().chain(other.gpu_links.keys());
        for &(a, b) in pairs {
            let (found, want) = (self.gpu_links.get(&(a, b)), other.gpu_links.get(&(a, b)));
            if found != want {
                let (f, w) = (found.copied().unwrap_or(0), want.copied().unwrap_or(0));
                return Some(format!("gpu{a} has {f} NVLinks to gpu{b}, not {w}"));
            }
        }
        for (what, found, want) in
            [("NVSwitch", &self.switch_links, &other.switch_links), ("other", &self.other_links, &other.other_links)]
        {
            if let Some(g) = (0..self.gpus).find(|&g| found[g] != want[g]) {
                return Some(format!("gpu{g} has {} {what} NVLinks, not {}", found[g], want[g]));
            }
        }
        None
    }
}

/// The NVLink generation every GPU shares, if they do.
pub fn generation(probe: &Probe) -> Option<u32> {
    let mut versions = probe.gpus.iter().map(|g| nvlink_generation(g.compute_capability).version);
    let first = versions.next()?;
    versions.all(|v| v == first).then_some(first)
}

/// The library machine the probe is, or why none: the first difference from the closest
/// machine (same GPU count and generation), or a plain "none has N GPUs of NVLink k".
pub fn recognise(probe: &Probe) -> Result<&'static str, String> {
    let found = Shape::of_probe(probe);
    let version = generation(probe);
    let (mut nearest, mut known) = (Vec::new(), Vec::new());
    for (name, machine_version) in LIBRARY {
        let Ok(t) = topology::resolve(name) else { continue };
        let shape = Shape::of_topology(&t);
        known.push(format!("{name} ({} GPUs, NVLink {machine_version})", shape.gpus));
        if shape.gpus != found.gpus || version != Some(machine_version) {
            continue;
        }
        match found.difference(&shape) {
            None => return Ok(name),
            Some(why) => nearest.push(format!("not {name}: {why}")),
        }
    }
    if nearest.is_empty() {
        let generation = version.map_or("mixed NVLink generations".to_string(), |v| format!("NVLink {v}"));
        return Err(format!(
            "no library machine has {} GPUs of {generation}; it knows {}",
            found.gpus,
            known.join(", ")
        ));
    }
    Err(nearest.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_shapes_are_what_their_files_say() {
        let dgx1 = Shape::of_topology(&topology::resolve("dgx1").unwrap());
        assert_eq!(dgx1.gpu_links.get(&(0, 3)), Some(&2));
        assert_eq!(dgx1.gpu_links.get(&(3, 0)), Some(&2));
        assert_eq!(dgx1.gpu_links.get(&(1, 6)), None);
        assert_eq!(dgx1.gpu_links.values().sum::<u32>(), 8 * 6);
        assert!(dgx1.switch_links.iter().all(|&s| s == 0));
        let a100 = Shape::of_topology(&topology::resolve("dgx-a100").unwrap());
        assert_eq!(a100.switch_links, vec![12; 8]);
        assert!(a100.gpu_links.is_empty());
        let h100 = Shape::of_topology(&topology::resolve("dgx-h100").unwrap());
        assert_eq!(h100.switch_links, vec![18; 8]);
        assert_eq!(a100.difference(&h100).unwrap(), "gpu0 has 12 NVSwitch NVLinks, not 18");
        assert_eq!(dgx1.difference(&dgx1), None);
    }
}

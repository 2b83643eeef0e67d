//! The topology of a machine the library does not know, built from what NVML said: a node per
//! GPU (rank i is NVML's GPU i), one `nvswitch` node for all NVSwitch chips (as the library's
//! DGX files model them: the chips together are one non-blocking fabric), a PCIe switch node
//! per group of GPUs that share one, a CPU node per NUMA node, and the links between them.
//!
//! Bandwidths come from the hardware's generation, with the per-link figures of the library's
//! machine files (`topologies/dgx*.toml`, whose sources they cite); latencies are theirs too.
//! A recognised machine does not come through here: it gets the library's own file.

use topoccl_synth::topology::{Link, LinkKind, Node, NodeKind, Topology};

use super::nvml::PcieLevel;
use super::probe::{Probe, Remote};
use crate::error::Result;

/// The name a detected, unrecognised machine's topology has (and the host of its nodes).
pub const NAME: &str = "detected";

/// An NVLink generation and what one link of it carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NvLinkGeneration {
    /// 1 (P100) … 5 (B200).
    pub version: u32,
    /// GB/s per link per direction.
    pub gbps_per_link: f64,
}

/// The NVLink generation of a GPU of compute capability `major.x`: 2.0 on Volta (25 GB/s per
/// link, `topologies/dgx1.toml`), 3.0 on Ampere and 4.0 on Hopper (both 25 GB/s,
/// `dgx-a100.toml`, `dgx-h100.toml`), 1.0 on Pascal (20 GB/s, P100 whitepaper), 5.0 from
/// Blackwell on (50 GB/s: 18 links, 1.8 TB/s both ways, B200 datasheet).
pub fn nvlink_generation(compute_capability: (u32, u32)) -> NvLinkGeneration {
    let (version, gbps_per_link) = match compute_capability.0 {
        ..=6 => (1, 20.0),
        7 => (2, 25.0),
        8 => (3, 25.0),
        9 => (4, 25.0),
        _ => (5, 50.0),
    };
    NvLinkGeneration { version, gbps_per_link }
}

/// GB/s per direction of a PCIe link: 15.75 for Gen3 x16, 31.5 for Gen4, 63 for Gen5 (the
/// library's files: 8, 16, 32 GT/s per lane with 128b/130b coding), doubling per generation.
pub fn pcie_gbps(generation: u32, width: u32) -> f64 {
    let x16 = match generation {
        0 | 1 => 4.0,
        2 => 8.0,
        g => 15.75 * f64::from(1u32 << (g.min(7) - 3)),
    };
    x16 * f64::from(width.clamp(1, 32)) / 16.0
}

/// A GPU's PCIe link: what NVML said, else what its generation shipped with (x16).
fn pcie_of(probe: &Probe, gpu: usize) -> f64 {
    let g = &probe.gpus[gpu];
    let (generation, width) = g.max_pcie.unwrap_or(match g.compute_capability.0 {
        ..=7 => (3, 16),
        8 => (4, 16),
        _ => (5, 16),
    });
    pcie_gbps(generation, width)
}

/// Latencies, µs, as the library's machine files give them.
const NVLINK_DIRECT_US: f64 = 1.0;
const NVLINK_SWITCH_US: f64 = 0.5;
const PCIE_US: f64 = 0.5;
const SMP_US: f64 = 0.3;
/// Between two CPUs (or NUMA nodes): two links of 20 GB/s, about a dual-socket server's
/// UPI/xGMI (approximate; only traffic between CPUs uses it).
const SMP_LINKS: usize = 2;
const SMP_GBPS: f64 = 20.0;

/// Groups `0..n` into the connected components of `related` (each GPU its own group first).
fn components(n: usize, related: impl Fn(usize, usize) -> bool) -> Vec<usize> {
    let mut group: Vec<usize> = (0..n).collect();
    for i in 0..n {
        for j in i + 1..n {
            if related(i, j) {
                let (from, to) = (group[j].max(group[i]), group[j].min(group[i]));
                group.iter_mut().filter(|g| **g == from).for_each(|g| *g = to);
            }
        }
    }
    group
}

/// Renumbers group labels densely (0, 1, … in order of first appearance).
fn dense(labels: &[usize]) -> Vec<usize> {
    let mut seen: Vec<usize> = Vec::new();
    labels
        .iter()
        .map(|l| match seen.iter().position(|s| s == l) {
            Some(i) => i,
            None => {
                seen.push(*l);
                seen.len() - 1
            }
        })
        .collect()
}

/// Builds the topology of the probed machine.
pub fn build(probe: &Probe) -> Result<Topology> {
    let n = probe.gpus.len();
    let mut nodes: Vec<Node> = Vec::new();
    let mut links: Vec<(usize, usize, Link)> = Vec::new();
    let mut add = |name: String, kind: NodeKind, rank: Option<u32>| {
        nodes.push(Node { name, kind, rank, host: NAME.into(), forwards: !kind.holds_rank() });
        nodes.len() - 1
    };
    let duplex = |links: &mut Vec<(usize, usize, Link)>, a: usize, b: usize, link: Link| {
        links.push((a, b, link));
        links.push((b, a, link));
    };
    let gpu_nodes: Vec<usize> = (0..n).map(|i| add(format!("gpu{i}"), NodeKind::Gpu, Some(i as u32))).collect();

    // CPUs: NUMA nodes where NVML says them for every GPU, else the GPUs within one node's
    // reach on PCIe.
    let numa: Option<Vec<u32>> = probe.gpus.iter().map(|g| g.numa_node).collect();
    let (cpu_of, cpu_names): (Vec<usize>, Vec<String>) = match &numa {
        Some(ids) => {
            let groups = dense(&ids.iter().map(|&i| i as usize).collect::<Vec<_>>());
            let mut names = vec![String::new(); groups.iter().max().map_or(0, |m| m + 1)];
            for (g, &id) in groups.iter().zip(ids) {
                names[*g] = format!("numa{id}");
            }
            (groups, names)
        }
        None => {
            let groups = dense(&components(n, |i, j| probe.pcie_levels[i][j] <= PcieLevel::Node));
            let count = groups.iter().max().map_or(0, |m| m + 1);
            (groups, (0..count).map(|c| format!("cpu{c}")).collect())
        }
    };
    let cpu_nodes: Vec<usize> = cpu_names.into_iter().map(|name| add(name, NodeKind::Cpu, None)).collect();
    let smp = Link { bandwidth: SMP_GBPS, latency: SMP_US, kind: LinkKind::Smp };
    for a in 0..cpu_nodes.len() {
        for b in a + 1..cpu_nodes.len() {
            for _ in 0..SMP_LINKS {
                duplex(&mut links, cpu_nodes[a], cpu_nodes[b], smp);
            }
        }
    }

    // PCIe: GPUs that share a switch (no host bridge between them) hang off one switch node.
    let pcie_group = dense(&components(n, |i, j| probe.pcie_levels[i][j] <= PcieLevel::Multiple));
    let groups = pcie_group.iter().max().map_or(0, |m| m + 1);
    for group in 0..groups {
        let members: Vec<usize> = (0..n).filter(|&i| pcie_group[i] == group).collect();
        let Some(&first) = members.first() else { continue };
        let cpu = cpu_nodes[cpu_of[first]];
        if members.len() == 1 {
            let pcie = Link { bandwidth: pcie_of(probe, first), latency: PCIE_US, kind: LinkKind::Pcie };
            duplex(&mut links, gpu_nodes[first], cpu, pcie);
            continue;
        }
        let switch = add(format!("pcie{group}"), NodeKind::Switch, None);
        for &g in &members {
            let pcie = Link { bandwidth: pcie_of(probe, g), latency: PCIE_US, kind: LinkKind::Pcie };
            duplex(&mut links, gpu_nodes[g], switch, pcie);
        }
        let uplink = Link { bandwidth: pcie_of(probe, first), latency: PCIE_US, kind: LinkKind::Pcie };
        duplex(&mut links, switch, cpu, uplink);
    }

    // NVLink: each GPU's own view of its links, so a link seen from both ends is one link
    // each way.
    let any_switch = probe.gpus.iter().flat_map(|g| &g.nvlinks).any(|l| matches!(l.remote, Remote::Switch(_)));
    let nvswitch = any_switch.then(|| add("nvswitch".into(), NodeKind::Switch, None));
    for (i, gpu) in probe.gpus.iter().enumerate() {
        let per_link = nvlink_generation(gpu.compute_capability).gbps_per_link;
        let direct = Link { bandwidth: per_link, latency: NVLINK_DIRECT_US, kind: LinkKind::NvLink };
        let switched = Link { latency: NVLINK_SWITCH_US, ..direct };
        for l in &gpu.nvlinks {
            match l.remote {
                Remote::Gpu(j) => links.push((gpu_nodes[i], gpu_nodes[j], direct)),
                Remote::Switch(_) => {
                    if let Some(s) = nvswitch {
                        duplex(&mut links, gpu_nodes[i], s, switched);
                    }
                }
                Remote::Cpu(_) => duplex(&mut links, gpu_nodes[i], cpu_nodes[cpu_of[i]], direct),
                Remote::Other(_) => {}
            }
        }
    }
    Ok(Topology::new(NAME, nodes, links)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_agree_with_the_library_files() {
        use topoccl_synth::topology::resolve;
        for (machine, sm) in [("dgx1", (7, 0)), ("dgx-a100", (8, 0)), ("dgx-h100", (9, 0))] {
            let t = resolve(machine).unwrap();
            let nvlink = t.edges().find(|(_, _, _, l)| l.kind == LinkKind::NvLink).unwrap().3;
            assert_eq!(nvlink_generation(sm).gbps_per_link, nvlink.bandwidth, "{machine}");
            // The first PCIe link of each file is GPU 0's.
            let pcie = t.edges().find(|(_, _, _, l)| l.kind == LinkKind::Pcie).unwrap().3;
            let generation = [(7, 3), (8, 4), (9, 5)].iter().find(|(m, _)| *m == sm.0).unwrap().1;
            assert_eq!(pcie_gbps(generation, 16), pcie.bandwidth, "{machine}");
        }
        assert_eq!(nvlink_generation((10, 0)).version, 5);
        assert_eq!(pcie_gbps(4, 8), 15.75);
    }

    #[test]
    fn components_join_transitively() {
        let g = components(4, |i, j| (i, j) == (0, 2) || (i, j) == (2, 3));
        assert_eq!(dense(&g), [0, 1, 0, 0]);
    }
}

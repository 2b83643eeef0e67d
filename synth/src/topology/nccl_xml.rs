//! NCCL's topology XML (what `NCCL_TOPO_DUMP_FILE` writes and `NCCL_TOPO_FILE` reads) as a
//! topoccl [`Topology`], so a dump of a real machine can be used wherever a topology file is.
//!
//! The mapping follows NCCL's own reading of the file (`src/graph/topo.cc`): `<cpu>` elements
//! are NUMA nodes joined pairwise by the inter-CPU link; a `<pci>` with a `<gpu>` is a GPU, one
//! with a `<nic>` a NIC (one node per `<net>` port), one with `<pci>` children a PCIe switch,
//! and a bare `<pci>` is a GPU or NIC by its class (`0x03…`, `0x02…`); each device hangs off
//! its parent by a PCIe link of the bandwidth its `link_speed` × `link_width` give. `<nvlink>`
//! elements become `count` parallel NVLinks to another GPU (by bus id), to the NVSwitch fabric
//! (all NVSwitch targets are one switch, as in NCCL and in `topologies/dgx-*.toml`) or to the
//! GPU's CPU. Bandwidths per link are the figures the repository's machine files already use,
//! so a dump of a DGX and the built-in `dgx-*` price alike. `topologies/README.md` documents
//! what is read and what is ignored for users.

mod elements;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use elements::Element;

use super::{Link, LinkKind, Node, NodeKind, Rank, Topology, MAX_RANKS};
use crate::error::{Error, Result};

/// Most parallel NVLinks one `<nvlink>` may declare (a B200 has 18; the bound keeps a typo
/// from building millions of links).
const MAX_NVLINK_COUNT: u32 = 1024;

/// Approximate latencies, µs, the same as the machine files in `topologies/`.
const NVLINK_PEER_LATENCY: f64 = 1.0;
const NVLINK_SWITCH_LATENCY: f64 = 0.5;
const PCIE_LATENCY: f64 = 0.5;
const SMP_LATENCY: f64 = 0.3;

/// Whether a file should be read as NCCL XML: its name ends in `.xml`, or its text starts with
/// `<system` after an optional prolog and comments.
pub fn is_nccl_xml(path: &Path, text: &str) -> bool {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("xml")) {
        return true;
    }
    let mut rest = text.trim_start_matches('\u{feff}').trim_start();
    loop {
        let end = if rest.starts_with("<?") {
            "?>"
        } else if rest.starts_with("<!--") {
            "-->"
        } else if rest.starts_with("<!") {
            ">"
        } else {
            return rest.starts_with("<system");
        };
        match rest.find(end) {
            Some(at) => rest = rest[at + end.len()..].trim_start(),
            None => return false,
        }
    }
}

/// Reads an NCCL topology XML file; the topology is named after the file.
pub fn load(path: &Path) -> Result<Topology> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.into(), source })?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    parse(&text, path, &stem)
}

/// Parses an NCCL topology document; `origin` names it in errors, `name` names the topology
/// (and the host of every node, unless the file's `<cpu host_hash>` says otherwise).
pub fn parse(text: &str, origin: &Path, name: &str) -> Result<Topology> {
    let at = |line: usize, message: String| Error::TopologyFile { file: origin.to_path_buf(), line, message };
    let root = elements::parse(text.trim_start_matches('\u{feff}')).map_err(|e| at(e.line, e.message))?;
    if root.name != "system" {
        return Err(at(root.line, format!("the root element is `<{}>`, not NCCL's `<system>`", root.name)));
    }
    let mut builder = Builder::new(name, &root);
    builder.read(&root).map_err(|(line, message)| at(line, message))?;
    let (nodes, links) = builder.finish().map_err(|(line, message)| at(line, message))?;
    Topology::new(name, nodes, links).map_err(|e| match e {
        Error::InvalidTopology { message, .. } => at(0, message),
        other => other,
    })
}

/// A problem found while mapping: (1-based line, message).
type Problem = (usize, String);

/// Directed links as [`Topology::new`] takes them: (from node, to node, link).
type Links = Vec<(usize, usize, Link)>;

/// A GPU found in the file, kept until ranks are numbered and NVLinks can find their targets.
struct GpuEntry<'e> {
    node: usize,
    bus: String,
    /// The `<gpu>` element, if the file has one (a bare `<pci class="0x03…">` has none).
    detail: Option<&'e Element>,
    cpu: usize,
    line: usize,
}

/// Collects nodes and links while walking the element tree.
struct Builder<'e> {
    name: String,
    /// Whether `<cpu host_hash>` names more than one host, so node names carry the host.
    multi_host: bool,
    nodes: Vec<Node>,
    names: HashSet<String>,
    links: Links,
    gpus: Vec<GpuEntry<'e>>,
    /// (node, host, link to another CPU of its host) of every CPU, in file order.
    cpus: Vec<(usize, String, CpuLink)>,
    nvswitch: Option<usize>,
    nics: usize,
}

impl<'e> Builder<'e> {
    fn new(name: &str, root: &Element) -> Builder<'e> {
        let hosts: HashSet<&str> = root.children_named("cpu").filter_map(|c| c.attribute("host_hash")).collect();
        Builder {
            name: name.to_string(),
            multi_host: hosts.len() > 1,
            nodes: Vec::new(),
            names: HashSet::new(),
            links: Vec::new(),
            gpus: Vec::new(),
            cpus: Vec::new(),
            nvswitch: None,
            nics: 0,
        }
    }

    fn read(&mut self, root: &'e Element) -> Result<(), Problem> {
        for cpu in root.children_named("cpu") {
            let numa = required(cpu, "numaid")?;
            let host = cpu.attribute("host_hash").unwrap_or(&self.name).to_string();
            let node = self.add_node(format!("cpu{numa}"), NodeKind::Cpu, &host, cpu.line)?;
            self.cpus.push((node, host.clone(), inter_cpu_link(cpu)?));
            for child in &cpu.children {
                match child.name.as_str() {
                    "pci" => self.add_pci(child, node, node, &host)?,
                    "nic" => self.add_ports(child, node, None, &host)?,
                    _ => {}
                }
            }
        }
        if self.gpus.is_empty() {
            return Err((root.line, "no GPU in the file (no `<gpu>` and no `<pci>` of class 0x03…)".into()));
        }
        Ok(())
    }

    /// Adds the device or switch of one `<pci>` below node `up`, and everything under it.
    fn add_pci(&mut self, pci: &'e Element, up: usize, cpu: usize, host: &str) -> Result<(), Problem> {
        let bus = required(pci, "busid")?.to_ascii_lowercase();
        let bandwidth = pci_bandwidth(pci).map_err(|m| (pci.line, format!("`<pci busid=\"{bus}\">`: {m}")))?;
        let class = pci.attribute("class").unwrap_or("").to_ascii_lowercase();
        let gpu_details: Vec<&Element> = pci.children_named("gpu").collect();
        if gpu_details.len() > 1 {
            return Err((
                pci.line,
                format!("several `<gpu>` in `<pci busid=\"{bus}\">` (MIG or MLOPart devices) are not supported"),
            ));
        }
        if !gpu_details.is_empty() || (class.starts_with("0x03") && pci.children.is_empty()) {
            let node = self.add_node(format!("gpu@{bus}"), NodeKind::Gpu, host, pci.line)?;
            self.duplex(node, up, pcie(bandwidth));
            self.gpus.push(GpuEntry { node, bus, detail: gpu_details.first().copied(), cpu, line: pci.line });
        } else if let Some(nic) = pci.children_named("nic").next() {
            self.add_ports(nic, up, Some((bandwidth, &bus)), host)?;
        } else if pci.children_named("pci").next().is_some() {
            let switch = self.add_node(format!("pci@{bus}"), NodeKind::Switch, host, pci.line)?;
            self.duplex(switch, up, pcie(bandwidth));
            for child in pci.children_named("pci") {
                self.add_pci(child, switch, cpu, host)?;
            }
        } else if class.starts_with("0x02") {
            let node = self.add_nic(host, pci.line)?;
            self.duplex(node, up, pcie(bandwidth));
        }
        // Anything else (an NVSwitch's own PCI function, a bridge with nothing below, a device
        // of another class) carries no traffic between ranks and is left out.
        Ok(())
    }

    /// Adds one NIC node per `<net>` port of `nic`. A single port hangs off `up` directly at
    /// the smaller of its speed and its PCIe link; several ports share their device's PCIe link
    /// (`pci` = its bandwidth and bus id), modelled as a switch node for the device.
    fn add_ports(&mut self, nic: &Element, up: usize, pci: Option<(f64, &str)>, host: &str) -> Result<(), Problem> {
        let ports: Vec<&Element> = nic.children_named("net").collect();
        let hub = match (pci, ports.len()) {
            (Some((bandwidth, bus)), n) if n > 1 => {
                let hub = self.add_node(format!("pci@{bus}"), NodeKind::Switch, host, nic.line)?;
                self.duplex(hub, up, pcie(bandwidth));
                Some(hub)
            }
            _ => None,
        };
        if ports.is_empty() {
            // A `<nic>` whose ports NCCL would detect at run time: one port at the PCIe speed.
            let node = self.add_nic(host, nic.line)?;
            let bandwidth = pci.map_or(NCCL_DEFAULT_NET_MBPS / 8000.0, |(b, _)| b);
            self.duplex(node, up, pcie(bandwidth));
        }
        for port in ports {
            let speed = net_bandwidth(port).map_err(|m| (port.line, m))?;
            let node = self.add_nic(host, port.line)?;
            match (hub, pci) {
                (Some(hub), _) => {
                    self.duplex(node, hub, Link { bandwidth: speed, latency: 0.0, kind: LinkKind::Other })
                }
                (None, Some((bandwidth, _))) => self.duplex(node, up, pcie(speed.min(bandwidth))),
                (None, None) => self.duplex(node, up, pcie(speed)),
            }
        }
        Ok(())
    }

    fn add_nic(&mut self, host: &str, line: usize) -> Result<usize, Problem> {
        self.nics += 1;
        self.add_node(format!("nic{}", self.nics - 1), NodeKind::Nic, host, line)
    }

    fn add_node(&mut self, name: String, kind: NodeKind, host: &str, line: usize) -> Result<usize, Problem> {
        let name = if self.multi_host { format!("{host}/{name}") } else { name };
        if !self.names.insert(name.clone()) {
            return Err((line, format!("`{name}` appears twice (a repeated numaid or busid)")));
        }
        self.nodes.push(Node { name, kind, rank: None, host: host.to_string(), forwards: kind != NodeKind::Gpu });
        Ok(self.nodes.len() - 1)
    }

    fn duplex(&mut self, a: usize, b: usize, link: Link) {
        self.links.push((a, b, link));
        self.links.push((b, a, link));
    }

    /// Numbers the ranks, adds NVLinks and the inter-CPU links.
    fn finish(mut self) -> Result<(Vec<Node>, Links), Problem> {
        self.number_ranks()?;
        let by_bus: HashMap<(String, String), usize> =
            self.gpus.iter().map(|g| ((self.nodes[g.node].host.clone(), bus_key(&g.bus)), g.node)).collect();
        let mut nvlinks = Vec::new();
        for gpu in &self.gpus {
            let Some(detail) = gpu.detail else { continue };
            for nvlink in detail.children_named("nvlink") {
                nvlinks.push((gpu.node, gpu.cpu, detail, nvlink));
            }
        }
        for (gpu, cpu, detail, nvlink) in nvlinks {
            self.add_nvlink(gpu, cpu, detail, nvlink, &by_bus)?;
        }
        for (i, (a, host_a, link)) in self.cpus.iter().enumerate() {
            for (b, host_b, _) in &self.cpus[i + 1..] {
                if host_a == host_b {
                    let smp = Link { bandwidth: link.bandwidth, latency: SMP_LATENCY, kind: LinkKind::Smp };
                    for _ in 0..link.count {
                        self.links.push((*a, *b, smp));
                        self.links.push((*b, *a, smp));
                    }
                }
            }
        }
        Ok((self.nodes, self.links))
    }

    /// Ranks from `<gpu rank>`; GPUs without one follow, in order of `dev`, then of the file.
    fn number_ranks(&mut self) -> Result<(), Problem> {
        let mut given: HashMap<Rank, usize> = HashMap::new();
        let mut unranked = Vec::new();
        for (i, gpu) in self.gpus.iter().enumerate() {
            let detail = gpu.detail;
            match detail.map(|d| number::<Rank>(d, "rank")).transpose()?.flatten() {
                Some(rank) if rank as usize >= MAX_RANKS => {
                    return Err((gpu.line, format!("rank {rank} is beyond the {MAX_RANKS} ranks a topology may have")));
                }
                Some(rank) => {
                    if let Some(&other) = given.get(&rank) {
                        let first = &self.gpus[other];
                        return Err((
                            gpu.line,
                            format!("rank {rank} is given to {} and to {} (line {})", gpu.bus, first.bus, first.line),
                        ));
                    }
                    given.insert(rank, i);
                }
                None => {
                    let dev = detail.map(|d| number::<u32>(d, "dev")).transpose()?.flatten().unwrap_or(u32::MAX);
                    unranked.push((dev, i));
                }
            }
        }
        unranked.sort_unstable();
        let first_free = given.keys().max().map_or(0, |&r| r + 1);
        let mut ranks: Vec<(usize, Rank)> = given.into_iter().map(|(r, i)| (i, r)).collect();
        ranks.extend(unranked.into_iter().zip(first_free..).map(|((_, i), rank)| (i, rank)));
        for (i, rank) in ranks {
            let node = &mut self.nodes[self.gpus[i].node];
            node.rank = Some(rank);
            node.name = if self.multi_host { format!("{}/gpu{rank}", node.host) } else { format!("gpu{rank}") };
        }
        Ok(())
    }

    fn add_nvlink(
        &mut self,
        gpu: usize,
        cpu: usize,
        detail: &Element,
        nvlink: &Element,
        by_bus: &HashMap<(String, String), usize>,
    ) -> Result<(), Problem> {
        let target = required(nvlink, "target")?;
        let class = required(nvlink, "tclass")?.to_ascii_lowercase();
        let count = number::<u32>(nvlink, "count")?.ok_or_else(|| missing(nvlink, "count"))?;
        if count == 0 || count > MAX_NVLINK_COUNT {
            return Err((nvlink.line, format!("count must be from 1 to {MAX_NVLINK_COUNT}, got {count}")));
        }
        let sm = number::<u32>(detail, "sm")?
            .ok_or_else(|| (detail.line, "a `<gpu>` with NVLinks needs `sm` to tell their generation".into()))?;
        let bandwidth = nvlink_bandwidth(sm).ok_or_else(|| (detail.line, format!("sm {sm} has no NVLink")))?;
        if class.starts_with("0x03") {
            let peer = *by_bus.get(&(self.nodes[gpu].host.clone(), bus_key(target))).ok_or_else(|| {
                (nvlink.line, format!("nvlink target `{target}` is not the bus id of a GPU in the file"))
            })?;
            // A GPU's nvlink to itself connects nothing (Azure's current NCv4 file has them).
            if peer != gpu {
                let link = Link { bandwidth, latency: NVLINK_PEER_LATENCY, kind: LinkKind::NvLink };
                // One direction: the peer's own `<nvlink>` lists the other, as NCCL reads it.
                self.links.extend(std::iter::repeat((gpu, peer, link)).take(count as usize));
            }
            return Ok(());
        }
        let far = if class == "0x068001" {
            cpu
        } else {
            match self.nvswitch {
                Some(switch) => switch,
                None => {
                    let host = self.nodes[gpu].host.clone();
                    let switch = self.add_node("nvswitch".into(), NodeKind::Switch, &host, nvlink.line)?;
                    self.nvswitch = Some(switch);
                    switch
                }
            }
        };
        let link = Link { bandwidth, latency: NVLINK_SWITCH_LATENCY, kind: LinkKind::NvLink };
        for _ in 0..count {
            self.duplex(gpu, far, link);
        }
        Ok(())
    }
}

fn pcie(bandwidth: f64) -> Link {
    Link { bandwidth, latency: PCIE_LATENCY, kind: LinkKind::Pcie }
}

fn required<'a>(element: &'a Element, key: &str) -> Result<&'a str, Problem> {
    element.attribute(key).ok_or_else(|| missing(element, key))
}

fn missing(element: &Element, key: &str) -> Problem {
    (element.line, format!("`<{}>` has no `{key}` attribute", element.name))
}

/// An optional numeric attribute: absent or empty is `None`, anything else must parse.
fn number<T: std::str::FromStr>(element: &Element, key: &str) -> Result<Option<T>, Problem> {
    match element.attribute(key).map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| (element.line, format!("`{key}=\"{text}\"` of `<{}>` is not a valid number", element.name))),
    }
}

/// Bus ids compare as NCCL compares them: as hex numbers, whatever their case or the width of
/// their domain (`0000:07:00.0` and `07:00.0` are the same device).
fn bus_key(bus: &str) -> String {
    let digits: String = bus.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    match u64::from_str_radix(&digits, 16) {
        Ok(value) if !digits.is_empty() => format!("{value:x}"),
        _ => bus.to_ascii_lowercase(),
    }
}

/// GB/s per direction of a PCIe link: `link_speed` (GT/s per lane) × `link_width` (lanes) ×
/// the line encoding (8b/10b up to Gen2, 128b/130b from Gen3) / 8 bits. As in NCCL, a width of
/// 0 or none means 16 lanes and a speed the kernel did not report means Gen3 (8 GT/s): VMs
/// often report neither.
fn pci_bandwidth(pci: &Element) -> std::result::Result<f64, String> {
    let width = match pci.attribute("link_width").map(str::trim) {
        None | Some("") | Some("0") => 16,
        Some(text) => match text.parse::<u32>() {
            Ok(lanes) if lanes <= 64 => lanes,
            _ => return Err(format!("link_width `{text}` is not a number of PCIe lanes")),
        },
    };
    let speed = match pci.attribute("link_speed").map(str::trim) {
        None | Some("") => 8.0,
        Some(text) if text.to_ascii_lowercase().starts_with("unknown") => 8.0,
        Some(text) => {
            let figure = text.split(|c: char| c.is_whitespace() || c == 'G').next().unwrap_or("");
            match figure.parse::<f64>() {
                Ok(gts) if gts.is_finite() && gts > 0.0 && gts <= 1024.0 && text.contains("GT/s") => gts,
                _ => return Err(format!("link_speed `{text}` is not a PCIe speed like \"16.0 GT/s PCIe\"")),
            }
        }
    };
    let encoding = if speed < 8.0 { 8.0 / 10.0 } else { 128.0 / 130.0 };
    Ok(speed * f64::from(width) * encoding / 8.0)
}

/// NCCL's speed for a port that reports none or a negative one ("some NICs define
/// speed = -1"): 10 Gb/s.
const NCCL_DEFAULT_NET_MBPS: f64 = 10_000.0;

/// GB/s of one `<net>` port from its `speed` in Mb/s.
fn net_bandwidth(port: &Element) -> std::result::Result<f64, String> {
    let mbps = match port.attribute("speed").map(str::trim) {
        None | Some("") => NCCL_DEFAULT_NET_MBPS,
        Some(text) => match text.parse::<i64>() {
            Ok(m) if m > 0 => m as f64,
            Ok(_) => NCCL_DEFAULT_NET_MBPS,
            Err(_) => return Err(format!("`speed=\"{text}\"` of `<net>` is not a number of Mb/s")),
        },
    };
    Ok(mbps / 8000.0)
}

/// GB/s per direction of one NVLink of a GPU of compute capability `sm`:
/// - sm 6x (P100, NVLink 1): 20 GB/s ("four NVLinks … 160 GB/s bidirectional", Tesla P100
///   whitepaper, 2016);
/// - sm 7x (V100, NVLink 2): 25 GB/s, as `topologies/dgx1.toml`;
/// - sm 8x (A100, NVLink 3): 25 GB/s, as `topologies/dgx-a100.toml`;
/// - sm 9x (H100, NVLink 4): 25 GB/s, as `topologies/dgx-h100.toml`;
/// - sm 10x and later (B200, NVLink 5): 50 GB/s (18 links, "1.8 TB/s" bidirectional per GPU,
///   NVIDIA DGX B200 datasheet).
///
/// Below sm 60 there is no NVLink.
fn nvlink_bandwidth(sm: u32) -> Option<f64> {
    match sm {
        60..=69 => Some(20.0),
        70..=99 => Some(25.0),
        100.. => Some(50.0),
        _ => None,
    }
}

/// The link between two CPUs (NUMA nodes) of one host: how many and GB/s each per direction.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuLink {
    count: u32,
    bandwidth: f64,
}

/// The inter-CPU link by CPU generation, with the figures of the repository's machine files:
/// Intel from Sapphire Rapids on (family 6, model ≥ 0x8f): 4 UPI × 32 GB/s (`dgx-h100.toml`);
/// Intel Skylake/Cascade Lake (model ≥ 0x55): 3 UPI × 20.8 GB/s (`ndv2.toml`); older Intel:
/// 2 QPI × 19.2 GB/s (`dgx1.toml`); AMD: 4 xGMI × 24 GB/s (`dgx-a100.toml`). Anything else
/// (ARM, POWER, no vendor) gets the smallest of these, the DGX-1's QPI.
fn inter_cpu_link(cpu: &Element) -> std::result::Result<CpuLink, Problem> {
    let family = number::<u32>(cpu, "familyid")?;
    let model = number::<u32>(cpu, "modelid")?.unwrap_or(0);
    let x86 = cpu.attribute("arch").unwrap_or("x86_64") == "x86_64";
    let (count, bandwidth) = match cpu.attribute("vendor") {
        Some("GenuineIntel") if x86 && family == Some(6) && model >= 0x8f => (4, 32.0),
        Some("GenuineIntel") if x86 && family == Some(6) && model >= 0x55 => (3, 20.8),
        Some("AuthenticAMD") if x86 => (4, 24.0),
        _ => (2, 19.2),
    };
    Ok(CpuLink { count, bandwidth })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn element(attributes: &[(&str, &str)]) -> Element {
        Element {
            name: "pci".into(),
            attributes: attributes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            children: Vec::new(),
            line: 1,
        }
    }

    #[test]
    fn pcie_bandwidth_from_speed_and_width() {
        let bw = |speed: &str, width: &str| pci_bandwidth(&element(&[("link_speed", speed), ("link_width", width)]));
        assert!((bw("8 GT/s", "16").unwrap() - 15.754).abs() < 1e-3);
        assert!((bw("16.0 GT/s PCIe", "16").unwrap() - 31.508).abs() < 1e-3);
        assert!((bw("32.0 GT/s PCIe", "16").unwrap() - 63.015).abs() < 1e-3);
        assert!((bw("2.5 GT/s PCIe", "1").unwrap() - 0.25).abs() < 1e-9);
        assert!((bw("16.0 GT/s PCIe", "8").unwrap() - 15.754).abs() < 1e-3);
        assert_eq!(bw("", "0").unwrap(), bw("8 GT/s", "16").unwrap());
        assert_eq!(bw("Unknown", "").unwrap(), bw("8 GT/s", "16").unwrap());
        assert!(bw("fast", "16").unwrap_err().contains("link_speed"));
        assert!(bw("16 GT/s", "x16").unwrap_err().contains("link_width"));
        assert!(bw("16 GT/s", "-1").is_err());
    }

    #[test]
    fn bus_ids_compare_as_numbers() {
        assert_eq!(bus_key("0000:07:00.0"), bus_key("07:00.0"));
        assert_eq!(bus_key("0000:0A:00.0"), bus_key("0000:0a:00.0"));
        assert_ne!(bus_key("0000:07:00.0"), bus_key("0000:08:00.0"));
    }

    #[test]
    fn sniffs_nccl_xml() {
        let toml = Path::new("machine.toml");
        assert!(is_nccl_xml(Path::new("machine.XML"), ""));
        assert!(is_nccl_xml(toml, "<system version=\"1\"></system>"));
        assert!(is_nccl_xml(toml, "\u{feff}<?xml version=\"1.0\"?>\n<!-- dump -->\n<system>"));
        assert!(!is_nccl_xml(toml, "name = \"x\"\n"));
        assert!(!is_nccl_xml(toml, "<!-- never closed"));
    }
}

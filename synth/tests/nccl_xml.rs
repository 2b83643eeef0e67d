//! NCCL topology XML read as topoccl topologies: the public dumps under
//! `tests/fixtures/nccl-xml/` (sources and licences in each file's first comment) come out with
//! the GPUs, NVLinks, NICs and placement the files describe, price sensibly, and malformed
//! files give errors naming file and line rather than panics.

use std::path::{Path, PathBuf};

use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::topology::{nccl_xml, resolve, LinkKind, NodeIndex, NodeKind, Topology};
use topoccl_synth::{bound, sim, verify};

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nccl-xml").join(name)
}

fn fixture(name: &str) -> Topology {
    let path = fixture_path(name);
    resolve(path.to_str().unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn node(t: &Topology, name: &str) -> NodeIndex {
    t.graph().node_indices().find(|&i| t.node(i).name == name).unwrap_or_else(|| panic!("no node `{name}`"))
}

fn of_kind(t: &Topology, kind: NodeKind) -> Vec<NodeIndex> {
    t.graph().node_indices().filter(|&i| t.node(i).kind == kind).collect()
}

/// (parallel links, summed GB/s) from `a` to `b` of the given kind.
fn links(t: &Topology, a: NodeIndex, b: NodeIndex, kind: LinkKind) -> (usize, f64) {
    t.edges()
        .filter(|(_, from, to, l)| *from == a && *to == b && l.kind == kind)
        .fold((0, 0.0), |(n, bw), (_, _, _, l)| (n + 1, bw + l.bandwidth))
}

/// The nodes `a` has a link to, by name, sorted.
fn neighbours(t: &Topology, a: NodeIndex) -> Vec<String> {
    let mut names: Vec<String> =
        t.edges().filter(|(_, from, _, _)| *from == a).map(|(_, _, to, _)| t.node(to).name.clone()).collect();
    names.sort();
    names.dedup();
    names
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-3 * b.abs().max(1.0)
}

/// PCIe GB/s per direction for GT/s × lanes with 128b/130b encoding.
fn gen3plus(gts: f64, lanes: f64) -> f64 {
    gts * lanes * 128.0 / 130.0 / 8.0
}

fn ring_allreduce_us(t: &Topology, bytes: u64) -> f64 {
    let ring = Registry::builtin().generate("ring", &Request::new(t, Collective::AllReduce)).unwrap();
    verify::verify(&ring).unwrap();
    sim::simulate(t, &ring, bytes).unwrap().time_us
}

#[test]
fn hgx_b200_dump_has_eight_gpus_on_one_nvswitch_and_thirteen_nic_ports() {
    let t = fixture("hgx-b200-vm.xml");
    assert_eq!(t.name(), "hgx-b200-vm");
    assert_eq!(t.nranks(), 8);
    assert_eq!(t.graph().node_count(), 8 + 2 + 3 + 13 + 1);
    let switches = of_kind(&t, NodeKind::Switch);
    assert_eq!(switches.len(), 4, "the NVSwitch and three multi-port NIC devices");
    let nvswitch = node(&t, "nvswitch");
    for r in 0..8 {
        let gpu = t.rank_node(r);
        assert_eq!(t.node(gpu).name, format!("gpu{r}"));
        assert_eq!(t.node(gpu).host, "0xf1e4069fb3f6c40f");
        // 18 NVLink 5 links of 50 GB/s each way.
        assert_eq!(links(&t, gpu, nvswitch, LinkKind::NvLink), (18, 900.0));
        assert_eq!(links(&t, nvswitch, gpu, LinkKind::NvLink), (18, 900.0));
        // GPUs 0-3 hang off NUMA node 0, 4-7 off node 1, at PCIe Gen5 x16.
        let cpu = node(&t, if r < 4 { "cpu0" } else { "cpu1" });
        let (n, bw) = links(&t, gpu, cpu, LinkKind::Pcie);
        assert!(n == 1 && close(bw, gen3plus(32.0, 16.0)), "gpu{r}: {n} {bw}");
        for o in 0..8 {
            assert_eq!(t.direct_bandwidth(r, o), 0.0, "GPUs meet only through the NVSwitch");
        }
    }
    let nics = of_kind(&t, NodeKind::Nic);
    assert_eq!(nics.len(), 13);
    // mlx5_0..4 (4×100G + 200G) share host bridge 0000:00:00.0 and mlx5_5..8 (4×400G) share
    // 0002:00:00.0, both on NUMA node 0; mlx5_9..12 (4×400G) share 0003:00:00.0 on node 1.
    let placement =
        [("pci@0000:00:00.0", "cpu0", 0..5), ("pci@0002:00:00.0", "cpu0", 5..9), ("pci@0003:00:00.0", "cpu1", 9..13)];
    for (hub, cpu, ports) in placement {
        let hub = node(&t, hub);
        // The bridges report no link speed or width: NCCL's default, Gen3 x16.
        let (n, bw) = links(&t, hub, node(&t, cpu), LinkKind::Pcie);
        assert!(n == 1 && close(bw, gen3plus(8.0, 16.0)), "{n} {bw}");
        let mut expected: Vec<String> = ports.clone().map(|p| format!("nic{p}")).collect();
        expected.push(cpu.to_string());
        expected.sort();
        assert_eq!(neighbours(&t, hub), expected);
    }
    let speed = |p: usize, hub: &str| links(&t, node(&t, &format!("nic{p}")), node(&t, hub), LinkKind::Other).1;
    assert_eq!(speed(0, "pci@0000:00:00.0"), 12.5);
    assert_eq!(speed(4, "pci@0000:00:00.0"), 25.0);
    assert_eq!(speed(5, "pci@0002:00:00.0"), 50.0);
    assert_eq!(speed(12, "pci@0003:00:00.0"), 50.0);
    // Emerald Rapids (family 6, model 207): four UPI links of 32 GB/s, as dgx-h100.toml.
    assert_eq!(links(&t, node(&t, "cpu0"), node(&t, "cpu1"), LinkKind::Smp), (4, 128.0));
}

#[test]
fn hgx_b200_dump_prices_like_a_dgx_with_twice_the_nvlink_bandwidth() {
    let b200 = fixture("hgx-b200-vm.xml");
    let h100 = resolve("dgx-h100").unwrap();
    let bytes = 1 << 30;
    let (b200_us, h100_us) = (ring_allreduce_us(&b200, bytes), ring_allreduce_us(&h100, bytes));
    let ratio = b200_us / h100_us;
    assert!((0.45..=0.55).contains(&ratio), "ring all-reduce of 1 GiB: B200 {b200_us:.0} µs, H100 {h100_us:.0} µs");
    let b200_bound = bound::bound(&b200, Collective::AllReduce);
    let h100_bound = bound::bound(&h100, Collective::AllReduce);
    // All-reduce moves 2(n-1)/n of the buffer through each GPU's links: NVLink plus PCIe.
    let per_gpu = |bw: f64| bw * 8.0 / 14.0;
    assert!(close(b200_bound.rate_gbps, per_gpu(18.0 * 50.0 + gen3plus(32.0, 16.0))), "{b200_bound:?}");
    assert!(close(h100_bound.rate_gbps, per_gpu(18.0 * 25.0 + 63.0)), "{h100_bound:?}");
    assert!(b200_bound.time_us(bytes) <= b200_us);
}

#[test]
fn azure_ncv4_has_two_nvlink_bridged_pairs_and_one_nic_on_numa_node_0() {
    let t = fixture("azure-ncv4.xml");
    assert_eq!(t.nranks(), 4);
    assert!(of_kind(&t, NodeKind::Switch).is_empty(), "no PCIe switch and no NVSwitch");
    // 12 NVLink 3 links of 25 GB/s each way between 0-1 and 2-3, none across the pairs.
    for (a, b) in [(0, 1), (1, 0), (2, 3), (3, 2)] {
        assert_eq!(links(&t, t.rank_node(a), t.rank_node(b), LinkKind::NvLink), (12, 300.0));
        assert_eq!(t.direct_bandwidth(a, b), 300.0);
    }
    for (a, b) in [(0, 2), (0, 3), (1, 2), (1, 3)] {
        assert_eq!(t.direct_bandwidth(a, b), 0.0);
    }
    // One GPU per NUMA node, its PCIe speed and width unreported: Gen3 x16.
    for r in 0..4 {
        let (n, bw) = links(&t, t.rank_node(r), node(&t, &format!("cpu{r}")), LinkKind::Pcie);
        assert!(n == 1 && close(bw, gen3plus(8.0, 16.0)), "gpu{r}: {n} {bw}");
    }
    let nics = of_kind(&t, NodeKind::Nic);
    assert_eq!(nics.len(), 1);
    assert_eq!(neighbours(&t, nics[0]), ["cpu0"]);
    assert_eq!(links(&t, nics[0], node(&t, "cpu0"), LinkKind::Pcie), (1, 12.5));
    // Four AMD NUMA nodes, each pair joined like dgx-a100.toml's sockets (4 × 24 GB/s).
    for (a, b) in [(0, 1), (0, 3), (1, 2), (2, 3)] {
        let (a, b) = (node(&t, &format!("cpu{a}")), node(&t, &format!("cpu{b}")));
        assert_eq!(links(&t, a, b, LinkKind::Smp), (4, 96.0));
    }
    assert!(ring_allreduce_us(&t, 1 << 26) > 0.0);
}

#[test]
fn azure_ndv4_numbers_bare_gpus_in_file_order_with_two_nics_per_switch() {
    let t = fixture("azure-ndv4.xml");
    assert_eq!(t.nranks(), 8);
    assert_eq!(of_kind(&t, NodeKind::Nic).len(), 8);
    assert_eq!(of_kind(&t, NodeKind::Switch).len(), 4);
    assert_eq!(of_kind(&t, NodeKind::Cpu).len(), 4);
    assert_eq!(t.edges().filter(|(_, _, _, l)| l.kind == LinkKind::NvLink).count(), 0, "the file lists no NVLink");
    // Ranks follow the file: the bridge under NUMA node 0 holds ranks 0 and 1 and NICs 0 and 1.
    for (switch, cpu, ranks, nics) in [
        ("pci@ffff:ff:01.0", "cpu0", [0, 1], [0, 1]),
        ("pci@ffff:ff:02.0", "cpu1", [2, 3], [2, 3]),
        ("pci@ffff:ff:03.0", "cpu2", [4, 5], [4, 5]),
        ("pci@ffff:ff:04.0", "cpu3", [6, 7], [6, 7]),
    ] {
        let switch = node(&t, switch);
        let mut expected = vec![cpu.to_string()];
        expected.extend(ranks.iter().map(|r| format!("gpu{r}")));
        expected.extend(nics.iter().map(|n| format!("nic{n}")));
        expected.sort();
        assert_eq!(neighbours(&t, switch), expected);
        for r in ranks {
            let (n, bw) = links(&t, t.rank_node(r), switch, LinkKind::Pcie);
            assert!(n == 1 && close(bw, gen3plus(16.0, 16.0)), "gpu{r}: {n} {bw}");
        }
    }
    assert_eq!(t.hosts().1, ["azure-ndv4"]);
    // The tuner's bound and a ring both work on the PCIe-only machine.
    let rate = bound::bound(&t, Collective::AllReduce).rate_gbps;
    assert!(rate > 0.0 && rate.is_finite(), "{rate}");
    assert!(ring_allreduce_us(&t, 1 << 26) > 0.0);
}

#[test]
fn aws_p4d_has_four_switches_of_two_gpus_and_a_nic() {
    let t = fixture("aws-p4d-24xl.xml");
    assert_eq!(t.nranks(), 8);
    assert_eq!(of_kind(&t, NodeKind::Nic).len(), 4);
    for (k, cpu) in ["cpu0", "cpu0", "cpu1", "cpu1"].iter().enumerate() {
        let switch = node(&t, &format!("pci@ffff:ff:0{}.0", k + 1));
        let expected = [format!("gpu{}", 2 * k), format!("gpu{}", 2 * k + 1), format!("nic{k}"), cpu.to_string()];
        let mut expected = expected.to_vec();
        expected.sort();
        assert_eq!(neighbours(&t, switch), expected);
        let (n, bw) = links(&t, switch, node(&t, cpu), LinkKind::Pcie);
        assert!(n == 1 && close(bw, gen3plus(8.0, 16.0)), "{n} {bw}");
    }
    // Cascade Lake (family 6, model 85): three UPI links as ndv2.toml.
    assert_eq!(links(&t, node(&t, "cpu0"), node(&t, "cpu1"), LinkKind::Smp), (3, 3.0 * 20.8));
}

#[test]
fn xml_is_recognised_by_content_and_works_with_subsets() {
    let dir = std::env::temp_dir().join(format!("topoccl-nccl-xml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(fixture_path("aws-p4d-24xl.xml")).unwrap();
    let prolog = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{text}");
    let path = dir.join("p4d.topo");
    std::fs::write(&path, &prolog).unwrap();
    assert!(nccl_xml::is_nccl_xml(&path, &prolog));
    let t = resolve(path.to_str().unwrap()).unwrap();
    assert_eq!(t.nranks(), 8);
    let subset = resolve(&format!("{}[0,2,4-5]", fixture_path("azure-ndv4.xml").display())).unwrap();
    assert_eq!(subset.nranks(), 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Parses `text` as `bad.xml` and returns the error message.
fn error_of(text: &str) -> String {
    match nccl_xml::parse(text, Path::new("bad.xml"), "bad") {
        Ok(t) => panic!("{text}\nparsed into {} ranks", t.nranks()),
        Err(e) => e.to_string(),
    }
}

const GPU_PAIR: &str = r#"<system version="1">
  <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="80" rank="0" gdr="1">
        <nvlink target="0000:02:00.0" count="4" tclass="0x030200"/>
      </gpu>
    </pci>
    <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="1" sm="80" rank="1" gdr="1">
        <nvlink target="0000:01:00.0" count="4" tclass="0x030200"/>
      </gpu>
    </pci>
  </cpu>
</system>
"#;

#[test]
fn a_minimal_pair_parses() {
    let t = nccl_xml::parse(GPU_PAIR, Path::new("pair.xml"), "pair").unwrap();
    assert_eq!(t.nranks(), 2);
    assert_eq!(t.direct_bandwidth(0, 1), 100.0);
}

#[test]
fn malformed_files_name_file_line_and_problem() {
    let cases: &[(&str, &str, &str)] = &[
        // (what to replace in GPU_PAIR, with what, expected start of the message)
        (
            "count=\"4\" tclass=\"0x030200\"/>\n      </gpu>\n    </pci>\n    <pci",
            "count=\"4\" tclass",
            "bad.xml:5: attribute `tclass` of `<nvlink>` has no `=value`",
        ),
        (
            "target=\"0000:02:00.0\"",
            "target=\"0000:09:00.0\"",
            "bad.xml:5: nvlink target `0000:09:00.0` is not the bus id of a GPU",
        ),
        ("<cpu numaid=\"0\"", "<cpu", "bad.xml:2: `<cpu>` has no `numaid` attribute"),
        (
            "<nvlink target=\"0000:02:00.0\" count=\"4\"",
            "<nvlink target=\"0000:02:00.0\"",
            "bad.xml:5: `<nvlink>` has no `count`",
        ),
        ("<pci busid=\"0000:02:00.0\"", "<pci", "bad.xml:8: `<pci>` has no `busid`"),
        (
            "target=\"0000:01:00.0\" count=\"4\"",
            "target=\"0000:01:00.0\" count=\"many\"",
            "bad.xml:10: `count=\"many\"` of `<nvlink>` is not a valid number",
        ),
        (
            "target=\"0000:01:00.0\" count=\"4\"",
            "target=\"0000:01:00.0\" count=\"0\"",
            "bad.xml:10: count must be from 1 to 1024",
        ),
        ("rank=\"1\"", "rank=\"-1\"", "bad.xml:9: `rank=\"-1\"`"),
        ("rank=\"1\"", "rank=\"0\"", "bad.xml:8: rank 0 is given to 0000:02:00.0 and to 0000:01:00.0 (line 3)"),
        ("rank=\"1\"", "rank=\"2\"", "bad.xml:0: ranks are not dense: rank 1 is missing"),
        ("dev=\"1\" sm=\"80\"", "dev=\"1\" sm=\"ninety\"", "bad.xml:9: `sm=\"ninety\"`"),
        ("dev=\"1\" sm=\"80\"", "dev=\"1\"", "bad.xml:9: a `<gpu>` with NVLinks needs `sm`"),
        ("dev=\"1\" sm=\"80\"", "dev=\"1\" sm=\"50\"", "bad.xml:9: sm 50 has no NVLink"),
        (
            "link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n      <gpu dev=\"1\"",
            "link_speed=\"fast\" link_width=\"16\">\n      <gpu dev=\"1\"",
            "bad.xml:8: `<pci busid=\"0000:02:00.0\">`: link_speed `fast`",
        ),
        (
            "link_width=\"16\">\n      <gpu dev=\"1\"",
            "link_width=\"x16\">\n      <gpu dev=\"1\"",
            "bad.xml:8: `<pci busid=\"0000:02:00.0\">`: link_width `x16`",
        ),
        ("familyid=\"6\"", "familyid=\"six\"", "bad.xml:2: `familyid=\"six\"`"),
        ("<system version=\"1\">", "<topology>", "bad.xml:14: `</system>` closes `<topology>` of line 1"),
        ("</system>\n", "", "bad.xml:14: the file ends inside `<system>` of line 1 (is it truncated?)"),
        ("</cpu>", "</gpu>", "bad.xml:13: `</gpu>` closes `<cpu>` of line 2"),
        ("<pci busid=\"0000:02:00.0\"", "<pci busid=\"0000:01:00.0\"", "bad.xml:8: `gpu@0000:01:00.0` appears twice"),
    ];
    for (from, to, expected) in cases {
        assert!(GPU_PAIR.contains(from), "{from}");
        let message = error_of(&GPU_PAIR.replacen(from, to, 1));
        assert!(message.starts_with(expected), "{from} -> {to}:\n  got      {message}\n  expected {expected}");
    }
    let truncated = &GPU_PAIR[..GPU_PAIR.find("tclass").unwrap()];
    assert_eq!(error_of(truncated), "bad.xml:5: the file ends inside the tag `<nvlink` (is it truncated?)");
    assert!(error_of("<topology/>").contains("not NCCL's `<system>`"));
    assert!(error_of("<system version=\"1\"><cpu numaid=\"0\"/></system>").contains("no GPU in the file"));
    assert!(error_of("<system><cpu numaid=\"0\"><pci busid=\"1\" class=\"0x030200\"/><pci busid=\"2\" class=\"0x030200\"/></cpu></system>\n<cpu/>").contains("after the end of the root"));
    let net = "<system><cpu numaid=\"0\"><pci busid=\"1\" class=\"0x030200\"/><nic><net speed=\"fast\"/></nic></cpu></system>";
    assert!(error_of(net).contains("`speed=\"fast\"` of `<net>`"));
    let disconnected = "<system><cpu numaid=\"0\" host_hash=\"a\"><pci busid=\"1\" class=\"0x030200\"/></cpu><cpu numaid=\"0\" host_hash=\"b\"><pci busid=\"1\" class=\"0x030200\"/></cpu></system>";
    assert!(error_of(disconnected).contains("cannot reach"), "two hosts joined by nothing in the file");
}

#[test]
fn damaged_fixtures_give_errors_or_topologies_never_panics() {
    for name in ["hgx-b200-vm.xml", "azure-ncv4.xml", "aws-p4d-24xl.xml"] {
        let text = std::fs::read_to_string(fixture_path(name)).unwrap();
        let boundaries: Vec<usize> = (0..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let origin = Path::new(name);
        for &cut in boundaries.iter().step_by(3) {
            let truncated = nccl_xml::parse(&text[..cut], origin, "t");
            if let Err(e) = truncated {
                assert!(e.to_string().starts_with(name), "{e}");
            }
        }
        for &at in boundaries.iter().step_by(11) {
            for with in ["<", ">", "\"", "/", "x", ""] {
                let mut damaged = text.clone();
                let end = text[at..].chars().next().map_or(at, |c| at + c.len_utf8());
                damaged.replace_range(at..end, with);
                let _ = nccl_xml::parse(&damaged, origin, "t");
            }
        }
    }
}

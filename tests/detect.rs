//! Topology detection through NVML, against the stand-in `libnvidia-ml.so.1` (`standins/nvml`)
//! answering as the library's machines and as others, and on a machine with no NVML at all.
//! Each body runs in a child process whose `LD_LIBRARY_PATH` finds the stand-in (the dynamic
//! loader reads it only at start-up) and whose `TOPOCCL_STANDIN_NVML_MACHINE` names the machine.

mod common;

use std::path::PathBuf;
use std::process::Command;

use topoccl::detect::{self, Recognition};
use topoccl::{Config, TransportPolicy};

const CHILD: &str = "TOPOCCL_DETECT_TEST_CHILD";

/// `target/<profile>/nvml-standin`, laid out by the stand-in's build script (it is a
/// dev-dependency, so cargo builds it with this test).
fn standin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>").join("nvml-standin");
    assert!(dir.join("libnvidia-ml.so.1").exists(), "no stand-in NVML at {}", dir.display());
    dir
}

/// True in the child (run the body); in the parent, runs test `name` in a child with
/// `LD_LIBRARY_PATH=lib_dir` and `env`, requires it to pass, and returns false.
fn child(name: &str, lib_dir: &std::path::Path, env: &[(&str, &str)]) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let out = Command::new(std::env::current_exe().expect("test executable"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", lib_dir)
        .env_remove("TOPOCCL_TOPOLOGY")
        .envs(env.iter().copied())
        .output()
        .expect("running the test's child");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} in its child failed ({}):\n{text}", out.status);
    assert!(text.contains("1 passed"), "{name} did not run in the child:\n{text}");
    print!("{text}");
    false
}

/// Runs test `name` in a child under the stand-in answering as `machine`.
fn as_machine(name: &str, machine: &str) -> bool {
    child(name, &standin_dir(), &[("TOPOCCL_STANDIN_NVML_MACHINE", machine)])
}

/// A machine file in the temporary directory, named after the test.
fn machine_file(test: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("topoccl-detect-{test}-{}.toml", std::process::id()));
    std::fs::write(&path, text).expect("machine file");
    path.display().to_string()
}

fn shipped(machine: &str) -> String {
    let path = format!("{}/standins/nvml/machines/{machine}.toml", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).expect("shipped machine file")
}

#[test]
fn a_dgx1_is_recognised_with_its_cube_mesh() {
    if !as_machine("a_dgx1_is_recognised_with_its_cube_mesh", "dgx1") {
        return;
    }
    let d = detect::detect().expect("detection under the stand-in");
    assert_eq!(d.recognition, Recognition::Library("dgx1"));
    assert_eq!(d.topology.name(), "dgx1");
    let shape = d.shape();
    assert_eq!(shape.gpus, 8);
    for (pair, links) in [((0, 3), 2), ((3, 0), 2), ((0, 1), 1), ((1, 5), 2), ((2, 6), 1), ((6, 7), 2)] {
        assert_eq!(shape.gpu_links.get(&pair), Some(&links), "{pair:?}");
    }
    assert_eq!(shape.gpu_links.get(&(1, 6)), None, "gpu1-gpu6: no NVLink");
    for g in 0..8 {
        let links: u32 = shape.gpu_links.iter().filter(|((a, _), _)| *a == g).map(|(_, n)| n).sum();
        assert_eq!(links, 6, "gpu{g}");
    }
    assert!(shape.switch_links.iter().all(|&n| n == 0));
    let gpu0 = &d.probe.gpus[0];
    assert_eq!(
        (gpu0.name.as_str(), gpu0.pci.bus_id(), gpu0.numa_node),
        ("Tesla V100-SXM2-32GB", "0000:06:00.0".into(), Some(0))
    );
    assert_eq!(d.probe.gpus[4].numa_node, Some(1));
    assert_eq!(d.probe.driver_version, "535.183.01");
    let table = d.table();
    assert!(table.contains("recognised: dgx1 (NVLink 2, 25 GB/s per link)"), "{table}");
    assert!(table.contains("gpu1 x1, gpu2 x1, gpu3 x2, gpu4 x2"), "{table}");
    // A subset of the detected machine, as TOPOCCL_TOPOLOGY=detect[...] names it.
    let four = detect::resolve("detect[0,1,3,6]").unwrap();
    assert_eq!(four.nranks(), 4);
    assert_eq!(four.direct_bandwidth(0, 2), 50.0, "gpu0-gpu3 is a double NVLink");
    assert!(detect::resolve("detect[0,9]").unwrap_err().to_string().contains("rank 9"));
}

#[test]
fn a_dgx_a100_is_recognised_with_twelve_links_into_six_nvswitches() {
    if !as_machine("a_dgx_a100_is_recognised_with_twelve_links_into_six_nvswitches", "dgx-a100") {
        return;
    }
    let d = detect::detect().expect("detection under the stand-in");
    assert_eq!(d.recognition, Recognition::Library("dgx-a100"));
    assert_eq!(d.topology.name(), "dgx-a100");
    let shape = d.shape();
    assert_eq!(shape.switch_links, vec![12; 8]);
    assert!(shape.gpu_links.is_empty());
    let numa: Vec<Option<u32>> = d.probe.gpus.iter().map(|g| g.numa_node).collect();
    assert_eq!(numa, [3, 3, 1, 1, 7, 7, 5, 5].map(Some));
    assert_eq!(d.probe.gpus[7].memory_bytes, Some(80 << 30));
    let table = d.table();
    assert!(table.contains("12 to 6 NVSwitches (2 each)"), "{table}");
    assert!(table.contains("recognised: dgx-a100 (NVLink 3"), "{table}");
}

#[test]
fn a_dgx_h100_is_recognised_with_eighteen_links_into_four_nvswitches() {
    if !as_machine("a_dgx_h100_is_recognised_with_eighteen_links_into_four_nvswitches", "dgx-h100") {
        return;
    }
    let d = detect::detect().expect("detection under the stand-in");
    assert_eq!(d.recognition, Recognition::Library("dgx-h100"));
    let shape = d.shape();
    assert_eq!(shape.switch_links, vec![18; 8]);
    assert_eq!(d.probe.gpus[0].nvlinks.len(), 18);
    assert_eq!(d.probe.gpus[0].compute_capability, (9, 0));
    let table = d.table();
    assert!(table.contains("18 to 4 NVSwitches (5+4+4+5)"), "{table}");
    assert!(table.contains("recognised: dgx-h100 (NVLink 4, 25 GB/s per link)"), "{table}");
}

const PAIR: &str = r#"
name = "pair"
driver_version = "550.90.07"
bus_ids = ["0000:18:00.0", "0000:2a:00.0"]
numa_nodes = [0, 1]
gpu_links = [[0, 1, 4]]
[gpu]
name = "NVIDIA H100 80GB HBM3"
pci_device_id = 0x233010DE
compute_capability = [9, 0]
memory_mib = 81559
nvlinks = 18
pcie = [5, 16]
"#;

#[test]
fn two_gpus_with_four_nvlinks_are_modelled_not_recognised() {
    if std::env::var_os(CHILD).is_none() {
        let file = machine_file("pair", PAIR);
        as_machine("two_gpus_with_four_nvlinks_are_modelled_not_recognised", &file);
        let _ = std::fs::remove_file(file);
        return;
    }
    let d = detect::detect().expect("detection under the stand-in");
    let Recognition::Unrecognised(why) = &d.recognition else { panic!("recognised: {:?}", d.recognition) };
    assert!(why.contains("no library machine has 2 GPUs of NVLink 4"), "{why}");
    let t = &d.topology;
    assert_eq!((t.name(), t.nranks()), ("detected", 2));
    assert_eq!(d.shape().gpu_links.get(&(0, 1)), Some(&4));
    assert_eq!(t.direct_bandwidth(0, 1), 100.0, "4 links of NVLink 4");
    assert_eq!(t.direct_bandwidth(1, 0), 100.0);
    // Each GPU on its own NUMA node: Gen5 x16 to its CPU, the CPUs linked to each other.
    let names: Vec<&str> = t.graph().node_weights().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["gpu0", "gpu1", "numa0", "numa1"]);
    let table = d.table();
    assert!(table.contains("unrecognised: 2 GPUs, NVLink 4"), "{table}");
    assert!(table.contains("gpu1 x4"), "{table}");
}

#[test]
fn a_dgx_a100_with_a_link_down_is_not_the_library_machine() {
    if std::env::var_os(CHILD).is_none() {
        let file = machine_file("a100-down", &format!("down = [[3, 5]]\n{}", shipped("dgx-a100")));
        as_machine("a_dgx_a100_with_a_link_down_is_not_the_library_machine", &file);
        let _ = std::fs::remove_file(file);
        return;
    }
    let d = detect::detect().expect("detection under the stand-in");
    assert_eq!(d.recognition, Recognition::Unrecognised("not dgx-a100: gpu3 has 11 NVSwitch NVLinks, not 12".into()));
    assert_eq!(d.shape().switch_links, [12, 12, 12, 11, 12, 12, 12, 12]);
    let t = &d.topology;
    assert_eq!(t.nranks(), 8);
    let nvswitch = t.graph().node_indices().find(|&n| t.node(n).name == "nvswitch").expect("one NVSwitch node");
    let gpu3 = t.rank_node(3);
    let group = t.group_between(gpu3, nvswitch).expect("gpu3 to the NVSwitch fabric");
    assert_eq!((t.group(group).count, t.group(group).bandwidth), (11, 275.0));
    // Two GPUs per PCIe switch, as the stand-in's machine has them.
    assert_eq!(t.graph().node_weights().filter(|n| n.name.starts_with("pcie")).count(), 4);
}

#[test]
fn nvml_init_failing_is_no_nvml() {
    if !child(
        "nvml_init_failing_is_no_nvml",
        &standin_dir(),
        &[("TOPOCCL_STANDIN_NVML_INIT", "driver_not_loaded"), ("TOPOCCL_STANDIN_NVML_MACHINE", "dgx1")],
    ) {
        return;
    }
    let e = detect::detect().expect_err("nvmlInit_v2 fails");
    assert_eq!(e.to_string(), "no NVML: nvmlInit_v2 failed: Driver Not Loaded (NVML error 9)");
    assert!(detect::unavailable(&e));
}

/// A directory with no `libnvidia-ml.so.1` (the system's, if any, is still found).
fn empty_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("topoccl-detect-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("empty directory");
    dir
}

#[test]
fn without_nvml_detection_says_so_and_the_library_uses_the_host_model() {
    if !child("without_nvml_detection_says_so_and_the_library_uses_the_host_model", &empty_dir(), &[]) {
        return;
    }
    let e = match detect::detect() {
        Err(e) => e,
        Ok(_) => {
            eprintln!("this machine has an NVML: the no-NVML test has nothing to show");
            return;
        }
    };
    let text = e.to_string();
    assert!(
        text.starts_with("no NVML: cannot load libnvidia-ml.so.1 or libnvidia-ml.so: libnvidia-ml.so.1: cannot open"),
        "{text}"
    );
    let cfg = Config { topology: Some("detect".into()), ..common::config(TransportPolicy::Auto, 20.0) };
    let names = common::on_ranks(2, &cfg, |comm| comm.topology().name().to_string());
    assert_eq!(names, ["host:2", "host:2"]);
}

#[test]
fn communicators_tune_for_the_detected_machine() {
    if !as_machine("communicators_tune_for_the_detected_machine", "dgx1") {
        return;
    }
    let cfg = Config { topology: Some("detect[0,3]".into()), ..common::config(TransportPolicy::Auto, 20.0) };
    let found = common::on_ranks(2, &cfg, |comm| {
        let t = comm.topology();
        (t.name().to_string(), t.direct_bandwidth(0, 1))
    });
    assert_eq!(found, [("dgx1[0,3]".to_string(), 50.0), ("dgx1[0,3]".to_string(), 50.0)]);
    let cfg = Config { topology: Some("detect".into()), ..common::config(TransportPolicy::Auto, 20.0) };
    let id = topoccl::UniqueId::new().expect("unique id");
    let Err(err) = topoccl::Communicator::init_with(&id, 0, 1, cfg) else { panic!("8 GPUs for 1 rank") };
    assert!(err.to_string().contains("TOPOCCL_TOPOLOGY=detect has 8 ranks, the communicator 1"), "{err}");
}

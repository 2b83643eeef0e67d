//! NVML's rules as the stand-in enforces them, each body in a child process of its own (NVML's
//! reference count and the machine are per process): nothing before `nvmlInit_v2`; NULL
//! pointers, unknown handles, indices and links out of range are invalid arguments; short
//! buffers are too small, never truncated; and the answers describe the machine named.

#[macro_use]
mod common;

use std::ffi::{c_char, c_int, c_uint};

use common::*;

fn machine(name: &str) -> Vec<(&'static str, String)> {
    vec![(state::MACHINE_VAR, name.to_string())]
}

#[test]
fn nothing_answers_before_nvml_init() {
    run_child("child", "before_init", &machine("dgx-a100"));
}

#[test]
fn bad_arguments_are_invalid_and_short_buffers_too_small() {
    run_child("child", "arguments", &machine("dgx1"));
}

#[test]
fn a_dgx1_answers_with_its_cube_mesh() {
    run_child("child", "dgx1", &machine("dgx1"));
}

#[test]
fn a_dgx_a100_answers_with_its_nvswitches() {
    run_child("child", "dgx_a100", &machine("dgx-a100"));
}

#[test]
fn a_machine_file_with_a_link_down_and_no_numa() {
    let file = std::env::temp_dir().join(format!("topoccl-standin-nvml-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        r#"
name = "pair"
driver_version = "550.90.07"
bus_ids = ["0000:18:00.0", "0000:2a:00.0"]
gpu_links = [[0, 1, 4]]
down = [[1, 2]]
[gpu]
name = "NVIDIA H100 80GB HBM3"
pci_device_id = 0x233010DE
compute_capability = [9, 0]
memory_mib = 81559
nvlinks = 18
pcie = [5, 16]
"#,
    )
    .unwrap();
    run_child("child", "pair", &machine(&file.display().to_string()));
    let _ = std::fs::remove_file(&file);
}

#[test]
fn init_fails_when_told_to_or_when_the_machine_is_bad() {
    let env = vec![(state::INIT_VAR, "driver_not_loaded".to_string())];
    run_child("child", "init_fails_9", &env);
    run_child("child", "init_fails_999", &machine("/nonexistent/machine.toml"));
}

fn before_init() {
    let mut n: c_uint = 0;
    let mut h = std::ptr::null_mut();
    let mut buf = [0 as c_char; 96];
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut n)), nvmlReturn_t::UNINITIALIZED);
    assert_eq!(nv!(nvmlDeviceGetHandleByIndex_v2(0, &mut h)), nvmlReturn_t::UNINITIALIZED);
    assert_eq!(nv!(nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 96)), nvmlReturn_t::UNINITIALIZED);
    assert_eq!(nv!(nvmlShutdown()), nvmlReturn_t::UNINITIALIZED, "a shutdown before any init");
    // Error strings need no init.
    assert_eq!(text_of(nv!(nvmlErrorString(nvmlReturn_t::UNINITIALIZED))), "Uninitialized");
    ok!(nvmlInit_v2());
    ok!(nvmlDeviceGetCount_v2(&mut n));
    assert_eq!(n, 8);
    let h = gpu(0);
    // Reference counted: two inits need two shutdowns.
    ok!(nvmlInit_v2());
    ok!(nvmlShutdown());
    ok!(nvmlDeviceGetName(h, buf.as_mut_ptr(), 96));
    ok!(nvmlShutdown());
    // A handle from before is refused once NVML is shut down, as every other call.
    assert_eq!(nv!(nvmlDeviceGetName(h, buf.as_mut_ptr(), 96)), nvmlReturn_t::UNINITIALIZED);
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut n)), nvmlReturn_t::UNINITIALIZED);
    ok!(nvmlShutdown()); // more shutdowns than inits: not an error
    ok!(nvmlInit_v2());
    ok!(nvmlDeviceGetName(h, buf.as_mut_ptr(), 96));
}

fn text_of(p: *const c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: nvmlErrorString returns a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn arguments() {
    ok!(nvmlInit_v2());
    let bad = nvmlReturn_t::INVALID_ARGUMENT;
    let null: nvmlDevice_t = std::ptr::null_mut();
    let mut h = null;
    assert_eq!(nv!(nvmlDeviceGetCount_v2(null.cast())), bad);
    assert_eq!(nv!(nvmlDeviceGetHandleByIndex_v2(0, null.cast())), bad);
    assert_eq!(nv!(nvmlDeviceGetHandleByIndex_v2(8, &mut h)), bad, "index 8 of 8 GPUs");
    assert_eq!(nv!(nvmlDeviceGetHandleByIndex_v2(u32::MAX, &mut h)), bad);
    let g = gpu(7);
    let mut local = 0u8;
    let stranger: nvmlDevice_t = (&mut local as *mut u8).cast();
    let mut buf = [0 as c_char; 96];
    let mut pci = std::mem::MaybeUninit::<nvmlPciInfo_t>::uninit();
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    let mut word: c_uint = 0;
    for device in [null, stranger] {
        assert_eq!(nv!(nvmlDeviceGetName(device, buf.as_mut_ptr(), 96)), bad);
        assert_eq!(nv!(nvmlDeviceGetPciInfo_v3(device, pci.as_mut_ptr())), bad);
        assert_eq!(nv!(nvmlDeviceGetCudaComputeCapability(device, &mut major, &mut minor)), bad);
        assert_eq!(nv!(nvmlDeviceGetNvLinkState(device, 0, &mut word)), bad);
        assert_eq!(nv!(nvmlDeviceGetTopologyCommonAncestor(g, device, &mut word)), bad);
    }
    assert_eq!(nv!(nvmlDeviceGetName(g, null.cast(), 96)), bad);
    assert_eq!(nv!(nvmlDeviceGetPciInfo_v3(g, null.cast())), bad);
    assert_eq!(nv!(nvmlDeviceGetCudaComputeCapability(g, &mut major, null.cast())), bad);
    assert_eq!(nv!(nvmlDeviceGetMemoryInfo(g, null.cast())), bad);
    assert_eq!(nv!(nvmlDeviceGetNumaNodeId(g, null.cast())), bad);
    assert_eq!(nv!(nvmlDeviceGetNvLinkState(g, 0, null.cast())), bad);
    assert_eq!(nv!(nvmlDeviceGetNvLinkRemotePciInfo_v2(g, 0, null.cast())), bad);
    assert_eq!(nv!(nvmlDeviceGetNvLinkRemoteDeviceType(g, 0, null.cast())), bad);
    // Buffers: exactly the text and its NUL fits, one byte less is too small (never truncated).
    let name = "Tesla V100-SXM2-32GB";
    let fits = name.len() as u32 + 1;
    assert_eq!(nv!(nvmlDeviceGetName(g, buf.as_mut_ptr(), fits - 1)), nvmlReturn_t::INSUFFICIENT_SIZE);
    assert_eq!(buf[0], 0, "nothing written into a short buffer");
    ok!(nvmlDeviceGetName(g, buf.as_mut_ptr(), fits));
    assert_eq!(text(&buf), name);
    assert_eq!(nv!(nvmlDeviceGetUUID(g, buf.as_mut_ptr(), 10)), nvmlReturn_t::INSUFFICIENT_SIZE);
    assert_eq!(nv!(nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 4)), nvmlReturn_t::INSUFFICIENT_SIZE);
    ok!(nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 80));
    assert_eq!(text(&buf), "535.183.01");
    // A V100 has links 0..6: link 6 (and NVML_NVLINK_MAX_LINKS and beyond) is no link of it.
    ok!(nvmlDeviceGetNvLinkState(g, 5, &mut word));
    for link in [6, 17, NVLINK_MAX_LINKS, u32::MAX] {
        assert_eq!(nv!(nvmlDeviceGetNvLinkState(g, link, &mut word)), bad, "link {link}");
        assert_eq!(nv!(nvmlDeviceGetNvLinkRemotePciInfo_v2(g, link, pci.as_mut_ptr())), bad, "link {link}");
        assert_eq!(nv!(nvmlDeviceGetNvLinkRemoteDeviceType(g, link, &mut word)), bad, "link {link}");
    }
}

/// Every active link of `g`, as (remote bus id, remote device type).
fn remotes(g: nvmlDevice_t) -> Vec<(String, c_uint)> {
    let mut out = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        let mut state: c_uint = 0;
        match nv!(nvmlDeviceGetNvLinkState(g, link, &mut state)) {
            nvmlReturn_t::INVALID_ARGUMENT => break,
            r => assert_eq!(r, nvmlReturn_t::SUCCESS),
        }
        if state != FEATURE_ENABLED {
            continue;
        }
        let mut pci = std::mem::MaybeUninit::<nvmlPciInfo_t>::uninit();
        ok!(nvmlDeviceGetNvLinkRemotePciInfo_v2(g, link, pci.as_mut_ptr()));
        // SAFETY: written by the successful call.
        let pci = unsafe { pci.assume_init() };
        let mut kind: c_uint = 99;
        ok!(nvmlDeviceGetNvLinkRemoteDeviceType(g, link, &mut kind));
        out.push((text(&pci.busId), kind));
    }
    out
}

fn bus_id(g: nvmlDevice_t) -> nvmlPciInfo_t {
    let mut pci = std::mem::MaybeUninit::<nvmlPciInfo_t>::uninit();
    ok!(nvmlDeviceGetPciInfo_v3(g, pci.as_mut_ptr()));
    // SAFETY: written by the successful call.
    unsafe { pci.assume_init() }
}

fn dgx1() {
    ok!(nvmlInit_v2());
    let pci = bus_id(gpu(3));
    assert_eq!(text(&pci.busId), "00000000:0B:00.0");
    assert_eq!(text(&pci.busIdLegacy), "0000:0B:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device, pci.pciDeviceId), (0, 0x0b, 0, 0x1DB5_10DE));
    let from0 = remotes(gpu(0));
    assert_eq!(from0.len(), 6);
    assert!(from0.iter().all(|(_, kind)| *kind == NVLINK_DEVICE_TYPE_GPU));
    assert_eq!(from0.iter().filter(|(id, _)| *id == text(&pci.busId)).count(), 2, "gpu0-gpu3 is NV2");
    let (mut major, mut minor) = (0, 0);
    ok!(nvmlDeviceGetCudaComputeCapability(gpu(0), &mut major, &mut minor));
    assert_eq!((major, minor), (7, 0));
    let mut level: c_uint = 0;
    ok!(nvmlDeviceGetTopologyCommonAncestor(gpu(0), gpu(1), &mut level));
    assert_eq!(level, TOPOLOGY_SINGLE);
    ok!(nvmlDeviceGetTopologyCommonAncestor(gpu(0), gpu(2), &mut level));
    assert_eq!(level, TOPOLOGY_NODE);
    ok!(nvmlDeviceGetTopologyCommonAncestor(gpu(0), gpu(4), &mut level));
    assert_eq!(level, TOPOLOGY_SYSTEM);
    let mut node: c_uint = 9;
    ok!(nvmlDeviceGetNumaNodeId(gpu(5), &mut node));
    assert_eq!(node, 1);
}

fn dgx_a100() {
    ok!(nvmlInit_v2());
    for g in 0..8 {
        let r = remotes(gpu(g));
        assert_eq!(r.len(), 12, "gpu{g}");
        assert!(r.iter().all(|(_, kind)| *kind == NVLINK_DEVICE_TYPE_SWITCH));
        let mut switches: Vec<&str> = r.iter().map(|(id, _)| id.as_str()).collect();
        switches.dedup();
        assert_eq!(switches.len(), 6, "two links to each of six NVSwitches");
    }
    let mut mem = nvmlMemory_t::default();
    ok!(nvmlDeviceGetMemoryInfo(gpu(0), &mut mem));
    assert_eq!(mem.total, 80 << 30);
    assert_eq!(mem.free + mem.used, mem.total);
    let mut buf = [0 as c_char; 96];
    ok!(nvmlDeviceGetUUID(gpu(0), buf.as_mut_ptr(), 96));
    let uuid0 = text(&buf);
    ok!(nvmlDeviceGetUUID(gpu(1), buf.as_mut_ptr(), 96));
    assert!(uuid0.starts_with("GPU-") && uuid0.len() == 40 && uuid0 != text(&buf), "{uuid0}");
    let (mut gen, mut width) = (0, 0);
    ok!(nvmlDeviceGetMaxPcieLinkGeneration(gpu(0), &mut gen));
    ok!(nvmlDeviceGetMaxPcieLinkWidth(gpu(0), &mut width));
    assert_eq!((gen, width), (4, 16));
}

fn pair() {
    ok!(nvmlInit_v2());
    let mut state: c_uint = 9;
    ok!(nvmlDeviceGetNvLinkState(gpu(1), 2, &mut state));
    assert_eq!(state, FEATURE_DISABLED);
    let mut pci = std::mem::MaybeUninit::<nvmlPciInfo_t>::uninit();
    let r = nv!(nvmlDeviceGetNvLinkRemotePciInfo_v2(gpu(1), 2, pci.as_mut_ptr()));
    assert_eq!(r, nvmlReturn_t::NOT_SUPPORTED, "the remote end of a link that is down");
    ok!(nvmlDeviceGetNvLinkState(gpu(1), 4, &mut state));
    assert_eq!(state, FEATURE_DISABLED, "link 4: nothing attached");
    assert_eq!(remotes(gpu(0)).len(), 4);
    assert_eq!(remotes(gpu(1)).len(), 3);
    let mut node: c_uint = 0;
    assert_eq!(nv!(nvmlDeviceGetNumaNodeId(gpu(0), &mut node)), nvmlReturn_t::NOT_SUPPORTED);
}

fn init_fails(code: u32) {
    assert_eq!(nv!(nvmlInit_v2()), nvmlReturn_t(code));
    let mut n: c_uint = 0;
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut n)), nvmlReturn_t::UNINITIALIZED);
}

#[test]
fn child() {
    match child_body().as_deref() {
        None => {}
        Some("before_init") => before_init(),
        Some("arguments") => arguments(),
        Some("dgx1") => dgx1(),
        Some("dgx_a100") => dgx_a100(),
        Some("pair") => pair(),
        Some("init_fails_9") => init_fails(9),
        Some("init_fails_999") => init_fails(999),
        Some(other) => panic!("unknown child body {other}"),
    }
}

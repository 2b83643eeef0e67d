//! The stand-in libibverbs (`standins/ibverbs`) that the RDMA tests open by path
//! (`TOPOCCL_IBVERBS_LIB`, or `Config::verbs`): an emulated RC NIC per process, so queue
//! pairs of separate processes (or of one) exchange RDMA writes on a machine without a NIC.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use topoccl::transports::verbs::VerbsSettings;
use topoccl::{Config, TransportPolicy};

/// The stand-in's shared library, built if cargo has not yet.
pub fn lib() -> String {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe.parent().and_then(|d| d.parent()).expect("target/<profile>").to_path_buf();
    let lib: PathBuf = profile.join("libibverbs_standin.so");
    if !lib.exists() {
        let release = profile.file_name().is_some_and(|n| n == "release");
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "topoccl-standin-ibverbs"])
            .args(release.then_some("--release"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build of the stand-in libibverbs");
        assert!(status.success(), "building the stand-in libibverbs failed");
    }
    lib.display().to_string()
}

/// Settings that open the stand-in, with receive rings of `ring_bytes`.
pub fn settings(ring_bytes: usize) -> VerbsSettings {
    VerbsSettings { library: Some(lib()), ring_bytes, ..VerbsSettings::default() }
}

/// A rank's settings with every pair over RDMA verbs (the stand-in's).
pub fn config(timeout_s: f64) -> Config {
    Config {
        transport: TransportPolicy::Ib,
        timeout: std::time::Duration::from_secs_f64(timeout_s),
        verbs: Some(settings(256 << 10)),
        ..Config::default()
    }
}

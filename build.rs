//! The build's identity, for the tuner's disk cache (`src/tuner/cache.rs`): a hash of the sources
//! that make its decisions and schedules — the tuner's, and the generators' crate where it lies
//! beside this one — so that another build sharing a cache directory (an upgrade, a downgrade,
//! a shared home directory across a cluster) never has this one run what it would not make.

use std::path::{Path, PathBuf};

fn main() {
    let mut files = Vec::new();
    for dir in ["src/tuner", "synth/src"] {
        println!("cargo:rerun-if-changed={dir}");
        collect(Path::new(dir), &mut files);
    }
    files.sort();
    // FNV-1a 64, as `topoccl_synth::hash` (a build script cannot use the crates it builds).
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    feed(env!("CARGO_PKG_VERSION").as_bytes());
    for file in &files {
        feed(file.to_string_lossy().as_bytes());
        feed(&std::fs::read(file).unwrap_or_default());
    }
    println!("cargo:rustc-env=TOPOCCL_BUILD_ID={hash:016x}");
}

/// Every `.rs` file under `dir`.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

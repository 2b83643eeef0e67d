//! Gives the shared library NCCL's soname, so that programs linked against it (or against
//! NVIDIA's NCCL) look for `libnccl.so.2` and `LD_LIBRARY_PATH` decides whose they get; and
//! puts a `libnccl.so.2` link beside the `libnccl.so` cargo writes (target/<profile>/), so the
//! build itself yields NCCL's file name. `ffi/install.sh` lays out a full prefix.

use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    let profile_dir =
        std::env::var_os("OUT_DIR").map(PathBuf::from).and_then(|p| p.ancestors().nth(3).map(PathBuf::from));
    if let Some(dir) = profile_dir {
        let link = dir.join("libnccl.so.2");
        if std::fs::symlink_metadata(&link).is_err() {
            if let Err(e) = std::os::unix::fs::symlink("libnccl.so", &link) {
                println!("cargo:warning=could not create {}: {e}", link.display());
            }
        }
    }
}

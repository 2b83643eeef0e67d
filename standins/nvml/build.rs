//! Gives the shared library NVML's soname, and lays out
//! `target/<profile>/nvml-standin/{libnvidia-ml.so.1,libnvidia-ml.so}` as links to the
//! `deps/libnvml_standin.so` cargo writes (also when the crate is only a dev-dependency, which
//! cargo does not copy up to `target/<profile>/`), so a test can put that directory on
//! `LD_LIBRARY_PATH` and `dlopen("libnvidia-ml.so.1")` finds the stand-in.

use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    let profile_dir =
        std::env::var_os("OUT_DIR").map(PathBuf::from).and_then(|p| p.ancestors().nth(3).map(PathBuf::from));
    let Some(dir) = profile_dir.map(|d| d.join("nvml-standin")) else { return };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        println!("cargo:warning=could not create {}: {e}", dir.display());
        return;
    }
    for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            if let Err(e) = std::os::unix::fs::symlink("../deps/libnvml_standin.so", &link) {
                println!("cargo:warning=could not create {}: {e}", link.display());
            }
        }
    }
}

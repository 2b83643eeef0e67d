//! Gives the shared library the CUDA driver's soname, and lays out
//! `target/<profile>/cuda-standin/{libcuda.so.1,libcuda.so}` as links to the
//! `libcuda_standin.so` cargo writes beside it, so a test can put that directory on
//! `LD_LIBRARY_PATH` and the driver loader (cudarc's, or `dlopen("libcuda.so.1")`) finds it.

use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    let profile_dir =
        std::env::var_os("OUT_DIR").map(PathBuf::from).and_then(|p| p.ancestors().nth(3).map(PathBuf::from));
    let Some(dir) = profile_dir.map(|d| d.join("cuda-standin")) else { return };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        println!("cargo:warning=could not create {}: {e}", dir.display());
        return;
    }
    for name in ["libcuda.so.1", "libcuda.so"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            if let Err(e) = std::os::unix::fs::symlink("../libcuda_standin.so", &link) {
                println!("cargo:warning=could not create {}: {e}", link.display());
            }
        }
    }
}

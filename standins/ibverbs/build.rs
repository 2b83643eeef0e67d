//! Gives the shared library libibverbs' soname, and lays out
//! `target/<profile>/ibverbs-standin/{libibverbs.so.1,libibverbs.so}` as links to the
//! `libibverbs_standin.so` cargo writes beside it, so a test can point `TOPOCCL_IBVERBS_LIB`
//! (or a child's `LD_LIBRARY_PATH`) there.

use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    let profile_dir =
        std::env::var_os("OUT_DIR").map(PathBuf::from).and_then(|p| p.ancestors().nth(3).map(PathBuf::from));
    let Some(dir) = profile_dir.map(|d| d.join("ibverbs-standin")) else { return };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        println!("cargo:warning=could not create {}: {e}", dir.display());
        return;
    }
    for name in ["libibverbs.so.1", "libibverbs.so"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            if let Err(e) = std::os::unix::fs::symlink("../libibverbs_standin.so", &link) {
                println!("cargo:warning=could not create {}: {e}", link.display());
            }
        }
    }
}

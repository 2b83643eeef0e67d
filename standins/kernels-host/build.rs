//! Compiles `kernels/topoccl.cu` as host C++ through `kernels/host_shim.h`: the same source the
//! shipped images come from, so the host build tests what runs on the GPU.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let kernels = manifest.join("../../kernels");
    for file in ["topoccl.cu", "numerics.cuh", "ops.cuh", "ll.cuh", "host_shim.h"] {
        println!("cargo:rerun-if-changed={}", kernels.join(file).display());
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        // Always optimised as the GPU build is (the test profile would give -O1), and never
        // contracted into FMAs, which would round differently from `CpuOps`.
        .opt_level(2)
        .flag("-x")
        .flag("c++")
        .flag("-ffp-contract=off")
        // The 16-byte path reads elements through a struct of them.
        .flag("-fno-strict-aliasing")
        .flag("-include")
        .flag(kernels.join("host_shim.h").to_string_lossy().as_ref())
        .file(kernels.join("topoccl.cu"))
        .compile("topoccl_kernels_host");
}

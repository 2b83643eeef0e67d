//! Gives the shared library NCCL's soname, so that programs linked against it (or against
//! NVIDIA's NCCL) look for `libnccl.so.2` and `LD_LIBRARY_PATH` decides whose they get.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}

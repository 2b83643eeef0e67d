//! topoccl's CUDA kernels (`kernels/topoccl.cu`) compiled as host C++ and run on the CPU.
//!
//! A test tool, never shipped: it lets tests compare what the kernels compute with
//! `CpuOps` bit for bit, and lets a stand-in CUDA driver run real launches, on machines without
//! a GPU. The source is the one NVRTC compiles into the shipped images; `kernels/host_shim.h`
//! turns its CUDA qualifiers and thread coordinates into plain C++, and a launch runs every
//! thread of every block in turn. It says nothing about anything warp-level or about speed.

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

/// The argument block every kernel takes (`topoccl_args` in kernels/topoccl.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelArgs {
    /// Where the result goes.
    pub dst: u64,
    /// A second copy of the result, or 0.
    pub dst2: u64,
    /// The first operand (copy: the source; scale, divide: the input).
    pub a: u64,
    /// The second operand (reduce only), else 0.
    pub b: u64,
    /// Elements (copy: bytes).
    pub count: u64,
    /// scale: the scalar's bits in the low bytes (element-sized, little endian); divide: n.
    pub scalar: u64,
}

// The ABI is fixed: 48 bytes, six 8-byte fields, no padding.
const _: () = assert!(std::mem::size_of::<KernelArgs>() == 48 && std::mem::align_of::<KernelArgs>() == 8);

/// One kernel of the host build.
#[derive(Debug)]
pub struct HostKernel {
    pub name: &'static str,
    /// Bytes per element (1 for `topoccl_copy`).
    pub elem_bytes: usize,
    /// Whether it reads `b` (reduce kernels).
    pub reads_b: bool,
    /// Whether it is a one-launch kernel (`topoccl_ll_<t>`, taking [`LL_ARGS_BYTES`] of
    /// `topoccl_ll_args`, whose first [`LL_REGIONS`] pairs of words are its memory regions:
    /// address, bytes).
    pub ll: bool,
    /// Its place in its C++ table: what `topoccl_host_launch` (or `_ll_launch`) runs.
    index: u64,
}

/// Bytes of a one-launch kernel's argument block (`topoccl_ll_args`).
pub const LL_ARGS_BYTES: usize = 3928;
/// Regions at the start of that block: `{ptr: u64, len: u64}` each, `ptr` 0 when unused.
pub const LL_REGIONS: usize = 19;

/// An entry of the C++ table (`topoccl_host_kernel` in kernels/topoccl.cu).
#[repr(C)]
struct RawKernel {
    name: *const c_char,
    elem_bytes: u64,
    reads_b: u32,
    entry: *const std::ffi::c_void,
}

extern "C" {
    fn topoccl_host_kernel_count() -> u64;
    fn topoccl_host_kernel_table() -> *const RawKernel;
    fn topoccl_host_launch(index: u64, grid: *const u32, block: *const u32, args: *const KernelArgs);
    fn topoccl_host_ll_kernel_count() -> u64;
    fn topoccl_host_ll_kernel_table() -> *const RawKernel;
    fn topoccl_host_ll_args_bytes() -> u64;
    fn topoccl_host_ll_launch(index: u64, grid: *const u32, block: *const u32, args: *const u8);
}

impl HostKernel {
    /// Runs the kernel over the whole grid as the device would (each thread of each block, in
    /// turn). Launches on different threads may run at the same time.
    ///
    /// # Safety
    /// The pointers in `args` must be valid host memory for what the kernel reads and writes
    /// (`count` elements of `elem_bytes` at `a`, at `b` when it reads `b`, at `dst`, and at
    /// `dst2` unless it is 0), and nothing else may use the written memory meanwhile.
    pub unsafe fn launch(&self, grid: [u32; 3], block: [u32; 3], args: &KernelArgs) {
        // SAFETY: `index` came from the table; the grid and block arrays hold 3 values each;
        // the memory `args` names is valid (this fn's contract).
        unsafe { topoccl_host_launch(self.index, grid.as_ptr(), block.as_ptr(), args) }
    }

    /// Runs a one-launch kernel over the whole grid, with the argument block `args`.
    ///
    /// # Safety
    /// Every region of `args` must be valid host memory of its length (the kernel touches
    /// nothing else), the peers' regions written by their own kernels only as the protocol
    /// allows; `args` must be [`LL_ARGS_BYTES`] long.
    pub unsafe fn launch_ll(&self, grid: [u32; 3], block: [u32; 3], args: &[u8; LL_ARGS_BYTES]) {
        // SAFETY: as for `launch`; the block has the C struct's size (checked by `ll_kernels`).
        unsafe { topoccl_host_ll_launch(self.index, grid.as_ptr(), block.as_ptr(), args.as_ptr()) }
    }
}

/// The kernels of one C++ table (`count` entries at `table`), `ll` as its kind.
fn read_table(table: *const RawKernel, count: u64, ll: bool) -> Vec<HostKernel> {
    (0..count)
        .filter_map(|index| {
            let i = usize::try_from(index).ok()?;
            // SAFETY: `i` is below the table's length; the table is static.
            let raw = unsafe { &*table.add(i) };
            // SAFETY: `name` is a NUL-terminated string literal, alive for the program.
            let name: &'static CStr = unsafe { CStr::from_ptr(raw.name) };
            Some(HostKernel {
                name: name.to_str().ok()?,
                elem_bytes: usize::try_from(raw.elem_bytes).ok()?,
                reads_b: raw.reads_b != 0,
                ll,
                index,
            })
        })
        .collect()
}

/// Every kernel of the host build (all 73), in the source's order.
pub fn kernels() -> &'static [HostKernel] {
    static KERNELS: OnceLock<Vec<HostKernel>> = OnceLock::new();
    KERNELS.get_or_init(|| {
        // SAFETY: the C++ side returns its static table and that table's length.
        let (table, count) = unsafe { (topoccl_host_kernel_table(), topoccl_host_kernel_count()) };
        read_table(table, count, false)
    })
}

/// The one-launch kernels (one per datatype), empty if the C++ block's size is not
/// [`LL_ARGS_BYTES`].
pub fn ll_kernels() -> &'static [HostKernel] {
    static KERNELS: OnceLock<Vec<HostKernel>> = OnceLock::new();
    KERNELS.get_or_init(|| {
        // SAFETY: plain queries of the C++ side's static table.
        let (table, count, bytes) =
            unsafe { (topoccl_host_ll_kernel_table(), topoccl_host_ll_kernel_count(), topoccl_host_ll_args_bytes()) };
        if bytes != LL_ARGS_BYTES as u64 {
            return Vec::new();
        }
        read_table(table, count, true)
    })
}

/// The kernel called `name` (`topoccl_reduce_sum_f32`, `topoccl_ll_f32`, …).
pub fn find(name: &str) -> Option<&'static HostKernel> {
    kernels().iter().chain(ll_kernels()).find(|k| k.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_kernel_once() {
        let all = kernels();
        assert_eq!(all.len(), 73);
        let types = ["i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16", "f8e4m3", "f8e5m2"];
        let sizes = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];
        for (t, size) in types.iter().zip(sizes) {
            for op in ["reduce_sum", "reduce_prod", "reduce_min", "reduce_max", "scale", "divide"] {
                let k = find(&format!("topoccl_{op}_{t}")).unwrap();
                assert_eq!(k.elem_bytes, size, "{}", k.name);
                assert_eq!(k.reads_b, op.starts_with("reduce"), "{}", k.name);
            }
        }
        let copy = find("topoccl_copy").unwrap();
        assert_eq!((copy.elem_bytes, copy.reads_b), (1, false));
        assert!(find("topoccl_reduce_avg_f32").is_none());
        assert_eq!(ll_kernels().len(), 12);
        for (t, size) in types.iter().zip(sizes) {
            let k = find(&format!("topoccl_ll_{t}")).unwrap();
            assert!(k.ll && k.elem_bytes == size, "{}", k.name);
        }
    }

    #[test]
    fn launches_run_every_thread_and_in_parallel() {
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                std::thread::spawn(move || {
                    let a: Vec<f32> = (0..1001).map(|i| (i * (t + 1)) as f32).collect();
                    let b = vec![0.5f32; a.len()];
                    let mut d = vec![0f32; a.len()];
                    let mut d2 = vec![0f32; a.len()];
                    let args = KernelArgs {
                        dst: d.as_mut_ptr() as u64,
                        dst2: d2.as_mut_ptr() as u64,
                        a: a.as_ptr() as u64,
                        b: b.as_ptr() as u64,
                        count: a.len() as u64,
                        scalar: 0,
                    };
                    // SAFETY: every pointer is a live vector of `count` f32s.
                    unsafe { find("topoccl_reduce_sum_f32").unwrap().launch([2, 3, 1], [5, 1, 2], &args) };
                    assert!(d.iter().enumerate().all(|(i, x)| *x == (i as u32 * (t + 1)) as f32 + 0.5));
                    assert_eq!(d, d2);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}

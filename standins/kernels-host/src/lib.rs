//! Placeholder for topoccl's kernels compiled for the host.
//!
//! The real crate (built from the same CUDA source as the GPU kernels) replaces this one
//! wholesale; until then this implements the crate's API with three kernels written in Rust:
//! `topoccl_copy`, `topoccl_reduce_sum_f32` and `topoccl_reduce_sum_u8`. Only the API below is
//! relied upon by the stand-in CUDA driver (`standins/cuda`).

/// The one by-value parameter of every kernel (48 bytes). Pointer fields hold addresses the
/// host can dereference (the stand-in driver translates device pointers before a launch).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelArgs {
    pub dst: u64,
    pub dst2: u64,
    pub a: u64,
    pub b: u64,
    pub count: u64,
    pub scalar: u64,
}

/// A kernel of the CUDA source, compiled for the host.
pub struct HostKernel {
    /// The kernel's name in the CUDA source (`extern "C"`, so also its symbol).
    pub name: &'static str,
    /// Bytes per element of `count` (1 for `topoccl_copy`).
    pub elem_bytes: usize,
    /// Whether the kernel reads `b`.
    pub reads_b: bool,
    /// Computes element `i`.
    element: unsafe fn(&KernelArgs, u64),
}

impl HostKernel {
    /// Runs every thread of every block, each over its grid-stride share of `args.count`.
    ///
    /// # Safety
    /// Every pointer the kernel uses (`dst`, `dst2` when non-zero, `a`, `b` when
    /// [`HostKernel::reads_b`]) must be valid for `count * elem_bytes` bytes.
    pub unsafe fn launch(&self, grid: [u32; 3], block: [u32; 3], args: &KernelArgs) {
        let threads = grid.iter().chain(block.iter()).map(|&d| u64::from(d)).product::<u64>();
        if threads == 0 {
            return;
        }
        // Threads past `count` have nothing to do.
        for thread in 0..threads.min(args.count) {
            let mut i = thread;
            while i < args.count {
                // SAFETY: `i < count`, and the caller vouches for the pointers over `count`.
                unsafe { (self.element)(args, i) };
                i += threads;
            }
        }
    }
}

/// Copies byte `i` of `a` to `dst` (and `dst2`).
unsafe fn copy(args: &KernelArgs, i: u64) {
    // SAFETY: the caller of `launch` vouches for `a`, `dst`, `dst2` over `count` bytes.
    unsafe {
        let v = *((args.a + i) as *const u8);
        *((args.dst + i) as *mut u8) = v;
        if args.dst2 != 0 {
            *((args.dst2 + i) as *mut u8) = v;
        }
    }
}

/// `dst[i] = a[i] + b[i]` over `f32`.
unsafe fn sum_f32(args: &KernelArgs, i: u64) {
    // SAFETY: as `copy`, over `count` f32 elements; the stand-in hands out aligned memory.
    unsafe {
        let at = |p: u64| (p as *mut f32).add(i as usize);
        let v = at(args.a).read_unaligned() + at(args.b).read_unaligned();
        at(args.dst).write_unaligned(v);
        if args.dst2 != 0 {
            at(args.dst2).write_unaligned(v);
        }
    }
}

/// `dst[i] = a[i] + b[i]` over `u8`, wrapping.
unsafe fn sum_u8(args: &KernelArgs, i: u64) {
    // SAFETY: as `copy`.
    unsafe {
        let at = |p: u64| (p as *mut u8).add(i as usize);
        let v = at(args.a).read().wrapping_add(at(args.b).read());
        at(args.dst).write(v);
        if args.dst2 != 0 {
            at(args.dst2).write(v);
        }
    }
}

static KERNELS: [HostKernel; 3] = [
    HostKernel { name: "topoccl_copy", elem_bytes: 1, reads_b: false, element: copy },
    HostKernel { name: "topoccl_reduce_sum_f32", elem_bytes: 4, reads_b: true, element: sum_f32 },
    HostKernel { name: "topoccl_reduce_sum_u8", elem_bytes: 1, reads_b: true, element: sum_u8 },
];

/// Every kernel this build has.
pub fn kernels() -> &'static [HostKernel] {
    &KERNELS
}

/// The kernel named `name`, if this build has it.
pub fn find(name: &str) -> Option<&'static HostKernel> {
    KERNELS.iter().find(|k| k.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_and_copy_cover_every_element() {
        let a: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let b = vec![0.5f32; 1000];
        let mut d = vec![0f32; 1000];
        let mut d2 = vec![0f32; 1000];
        let args = KernelArgs {
            dst: d.as_mut_ptr() as u64,
            dst2: d2.as_mut_ptr() as u64,
            a: a.as_ptr() as u64,
            b: b.as_ptr() as u64,
            count: 1000,
            scalar: 0,
        };
        // SAFETY: every pointer is valid for 1000 f32.
        unsafe { find("topoccl_reduce_sum_f32").unwrap().launch([3, 1, 1], [7, 1, 1], &args) };
        assert!(d.iter().enumerate().all(|(i, &v)| v == i as f32 + 0.5));
        assert_eq!(d, d2);
        let mut c = vec![0u8; 10];
        let src: Vec<u8> = (1..=10).collect();
        let args = KernelArgs { dst: c.as_mut_ptr() as u64, a: src.as_ptr() as u64, count: 10, ..Default::default() };
        // SAFETY: valid for 10 bytes.
        unsafe { find("topoccl_copy").unwrap().launch([1, 1, 1], [4, 1, 1], &args) };
        assert_eq!(c, src);
        assert_eq!(std::mem::size_of::<KernelArgs>(), 48);
        assert!(find("nope").is_none());
    }
}

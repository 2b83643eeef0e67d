//! The device kernels: `kernels/topoccl.cu` as NVRTC built it (cubins for sm_80 and sm_90, PTX
//! for newer devices, shipped in the library so that only the driver is needed, as NCCL's are),
//! loaded into a context, and launched.
//!
//! Every kernel takes one argument block ([`KernelArgs`], `topoccl_args` in the source) and
//! runs a grid-stride loop, so any grid covers any count.
//!
//! **Loaded once per context, every function at once, before any call waits.** Since CUDA
//! 12.2 the driver loads a module's kernels lazily, at `cuModuleGetFunction`, and loading one
//! may synchronise the whole context (CUDA's "Lazy Loading: potential hazards"). A caller's
//! stream waits for the executor's completion word from the call on ([`super::Binding`]), so a
//! kernel looked up by the executor after that wait was queued waits for the caller's stream,
//! which waits for the executor: every device call hung so on an H200, where the stand-in
//! driver (which then loaded without synchronising) passed. [`Kernels::of`] looks every
//! function up when a communicator binds to its device (before any wait on the binding exists)
//! and shares them among the communicators of one context; nothing is loaded during a call.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::sys::{self, CUfunction, CUmodule};

use super::context::Context;
use super::driver::check;
use super::stream::StreamRef;
use crate::error::{Error, Result};
use crate::types::{Dtype, ReduceOp};

/// NVRTC's cubin for sm_80 (runs on every 8.x device).
static SM_80: &[u8] = include_bytes!("../../kernels/images/sm_80.cubin");
/// NVRTC's cubin for sm_90.
static SM_90: &[u8] = include_bytes!("../../kernels/images/sm_90.cubin");
/// PTX for compute_90, which the driver compiles for devices newer than any cubin.
static PTX_90: &[u8] = include_bytes!("../../kernels/images/compute_90.ptx");

/// The argument block every kernel takes (`topoccl_args`): 48 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelArgs {
    /// Where the result goes.
    pub dst: u64,
    /// A second copy of the result, or 0.
    pub dst2: u64,
    /// The first operand (a copy's source; scale's and divide's input).
    pub a: u64,
    /// The second operand of a reduction, else 0.
    pub b: u64,
    /// Elements (a copy: bytes).
    pub count: u64,
    /// Scale: the scalar's bits; divide: the divisor.
    pub scalar: u64,
}

/// What a kernel does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    Reduce(Dtype, ReduceOp),
    Scale(Dtype),
    Divide(Dtype),
    /// The one-launch kernel of small calls (`topoccl_ll_<t>`, `kernels/ll.cuh`).
    Ll(Dtype),
}

/// The kernel source's short name of a datatype.
fn type_name(d: Dtype) -> &'static str {
    match d {
        Dtype::Int8 => "i8",
        Dtype::Uint8 => "u8",
        Dtype::Int32 => "i32",
        Dtype::Uint32 => "u32",
        Dtype::Int64 => "i64",
        Dtype::Uint64 => "u64",
        Dtype::Float16 => "f16",
        Dtype::Float32 => "f32",
        Dtype::Float64 => "f64",
        Dtype::Bfloat16 => "bf16",
        Dtype::Float8e4m3 => "f8e4m3",
        Dtype::Float8e5m2 => "f8e5m2",
    }
}

impl Kernel {
    /// The kernel's name in the images. An average reduces as a sum (the division comes last).
    pub fn name(self) -> String {
        match self {
            Kernel::Reduce(d, op) => {
                let op = match op {
                    ReduceOp::Sum | ReduceOp::Avg => "sum",
                    ReduceOp::Prod => "prod",
                    ReduceOp::Min => "min",
                    ReduceOp::Max => "max",
                };
                format!("topoccl_reduce_{op}_{}", type_name(d))
            }
            Kernel::Scale(d) => format!("topoccl_scale_{}", type_name(d)),
            Kernel::Divide(d) => format!("topoccl_divide_{}", type_name(d)),
            Kernel::Ll(d) => format!("topoccl_ll_{}", type_name(d)),
        }
    }
}

impl Kernel {
    /// Bytes of one of the elements its `count` counts.
    fn elem_bytes(self) -> u64 {
        match self {
            Kernel::Reduce(d, _) | Kernel::Scale(d) | Kernel::Divide(d) | Kernel::Ll(d) => d.size() as u64,
        }
    }

    /// Every kernel the executor launches (an average is a sum's kernel under another key).
    fn all() -> impl Iterator<Item = Kernel> {
        Dtype::ALL.into_iter().flat_map(|d| {
            ReduceOp::ALL.into_iter().map(move |op| Kernel::Reduce(d, op)).chain([
                Kernel::Scale(d),
                Kernel::Divide(d),
                Kernel::Ll(d),
            ])
        })
    }
}

/// The image for a device of compute capability `sm`.
fn image_for(sm: (i32, i32)) -> Result<(&'static [u8], &'static str)> {
    match sm.0 {
        8 => Ok((SM_80, "sm_80 cubin")),
        9 => Ok((SM_90, "sm_90 cubin")),
        m if m > 9 => Ok((PTX_90, "compute_90 PTX")),
        _ => Err(Error::Cuda(format!(
            "the device's compute capability {}.{} is older than the kernels' oldest (8.0)",
            sm.0, sm.1
        ))),
    }
}

/// The kernels loaded into one context, every function looked up.
#[derive(Debug)]
pub struct Kernels {
    module: CUmodule,
    /// Every [`Kernel::all`], filled at load and never changed, with the blocks of it the
    /// device runs at once (a launch's largest grid).
    functions: HashMap<Kernel, (CUfunction, u32)>,
    ctx: Arc<Context>,
}

// SAFETY: module and function handles are driver handles usable from any thread of their
// context (each launch enters it); the map is only read after `load`.
unsafe impl Send for Kernels {}
// SAFETY: as above: shared use only reads the handles.
unsafe impl Sync for Kernels {}

/// The kernels of each context of the process that some communicator still uses.
static LOADED: Mutex<Vec<(usize, Weak<Kernels>)>> = Mutex::new(Vec::new());

/// Threads per block of every launch.
const BLOCK: u32 = 256;
/// Bytes each thread handles before the grid is made larger: one 16-byte pack, so a small
/// launch spreads over as many multiprocessors as it can; past the device's resident blocks
/// the grid stays there and each thread loops, several packs in flight (`kernels/topoccl.cu`).
const PER_THREAD_BYTES: u64 = 16;

impl Kernels {
    /// The kernels of `ctx`: those another user of the context loaded, or loaded now (which
    /// may wait for all of the context's work: call it before queueing any wait on this
    /// process's calls, as a binding does).
    pub fn of(ctx: &Arc<Context>) -> Result<Arc<Kernels>> {
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        loaded.retain(|(_, k)| k.strong_count() > 0);
        // A live entry holds its context, so its handle cannot have been reused.
        let key = ctx.raw() as usize;
        if let Some(k) = loaded.iter().find(|(c, _)| *c == key).and_then(|(_, k)| k.upgrade()) {
            return Ok(k);
        }
        let k = Arc::new(Kernels::load(ctx)?);
        loaded.push((key, Arc::downgrade(&k)));
        Ok(k)
    }

    /// Loads the image that suits the context's device and looks up every kernel.
    fn load(ctx: &Arc<Context>) -> Result<Kernels> {
        let (image, what) = image_for(ctx.sm)?;
        if image.is_empty() {
            return Err(Error::Cuda(format!("the {what} of the kernels is missing from this build")));
        }
        // The driver wants PTX NUL-terminated; a cubin is read by its own headers.
        let owned;
        let image = if image.starts_with(b"\x7fELF") {
            image
        } else {
            owned = [image, &[0]].concat();
            &owned[..]
        };
        let _current = ctx.enter()?;
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: the context is current; `image` is a complete image that outlives the call.
        check(unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) }, "cuModuleLoadData")
            .map_err(|e| Error::Cuda(format!("loading the kernels' {what}: {e}")))?;
        // Unloads the module should a lookup fail.
        let mut kernels = Kernels { module, functions: HashMap::new(), ctx: ctx.clone() };
        let mut by_name: HashMap<String, (CUfunction, u32)> = HashMap::new();
        for k in Kernel::all() {
            let name = k.name();
            let f = match by_name.get(&name) {
                Some(f) => *f,
                None => {
                    let c = CString::new(name.clone()).map_err(|e| Error::Internal(e.to_string()))?;
                    let mut f: CUfunction = std::ptr::null_mut();
                    // SAFETY: a live module of the current context (entered above); the name
                    // is NUL-terminated.
                    check(unsafe { sys::cuModuleGetFunction(&mut f, module, c.as_ptr()) }, "cuModuleGetFunction")
                        .map_err(|e| Error::Cuda(format!("kernel {name}: {e}")))?;
                    // With lazy loading (CUDA 12.4+) the lookup may return a partly loaded
                    // function whose first launch loads it, synchronising the context — during
                    // a call, a deadlock. Asking an attribute loads it now (as NCCL does at init).
                    let mut local: std::ffi::c_int = 0;
                    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES;
                    // SAFETY: a live function of the current context; the out-pointer is a local.
                    check(unsafe { sys::cuFuncGetAttribute(&mut local, attr, f) }, "cuFuncGetAttribute")
                        .map_err(|e| Error::Cuda(format!("loading kernel {name}: {e}")))?;
                    let mut regs: std::ffi::c_int = 0;
                    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS;
                    // SAFETY: as above.
                    check(unsafe { sys::cuFuncGetAttribute(&mut regs, attr, f) }, "cuFuncGetAttribute")
                        .map_err(|e| Error::Cuda(format!("kernel {name}'s registers: {e}")))?;
                    let f = (f, ctx.resident_blocks(BLOCK, u32::try_from(regs).unwrap_or(255)));
                    by_name.insert(name, f);
                    f
                }
            };
            kernels.functions.insert(k, f);
        }
        Ok(kernels)
    }

    /// Launches `k` over `args.count` elements on `stream`.
    ///
    /// # Safety
    /// The context must be current; the pointers in `args` must be memory the device reaches,
    /// valid for the elements the kernel reads and writes until it has run.
    pub unsafe fn launch(&self, k: Kernel, args: KernelArgs, stream: StreamRef) -> Result<()> {
        if args.count == 0 {
            return Ok(());
        }
        let (f, resident) =
            *self.functions.get(&k).ok_or_else(|| Error::Internal(format!("kernel {} not loaded", k.name())))?;
        let bytes = args.count.saturating_mul(k.elem_bytes());
        let grid = bytes.div_ceil(u64::from(BLOCK) * PER_THREAD_BYTES).clamp(1, u64::from(resident.max(1))) as u32;
        let mut block_args = args;
        let mut params = [(&mut block_args as *mut KernelArgs).cast::<std::ffi::c_void>()];
        // SAFETY: the kernel takes exactly one `topoccl_args`, whose bytes the driver copies at
        // the call; the rest is this fn's contract.
        check(
            unsafe {
                sys::cuLaunchKernel(f, grid, 1, 1, BLOCK, 1, 1, 0, stream.0, params.as_mut_ptr(), std::ptr::null_mut())
            },
            "cuLaunchKernel",
        )
        .map_err(|e| Error::Cuda(format!("kernel {}: {e}", k.name())))
    }
}

impl Kernels {
    /// Launches the one-launch kernel of `dtype` with `args`, one block of `threads`.
    ///
    /// # Safety
    /// The context must be current; every region of `args` must be memory the device reaches,
    /// valid until the kernel has run, its pair areas shared with peers that follow the
    /// protocol of `kernels/ll.cuh`.
    pub(crate) unsafe fn launch_ll(
        &self,
        dtype: Dtype,
        args: &crate::exec::resident::ll::LlArgs,
        threads: u32,
        stream: StreamRef,
    ) -> Result<()> {
        let k = Kernel::Ll(dtype);
        let (f, _) =
            *self.functions.get(&k).ok_or_else(|| Error::Internal(format!("kernel {} not loaded", k.name())))?;
        let mut block_args = *args;
        let mut params = [(&mut block_args as *mut crate::exec::resident::ll::LlArgs).cast::<std::ffi::c_void>()];
        // SAFETY: the kernel takes exactly one `topoccl_ll_args` (the same layout, asserted
        // beside `LlArgs`), whose bytes the driver copies at the call; the rest is this fn's
        // contract.
        check(
            unsafe {
                sys::cuLaunchKernel(f, 1, 1, 1, threads, 1, 1, 0, stream.0, params.as_mut_ptr(), std::ptr::null_mut())
            },
            "cuLaunchKernel",
        )
        .map_err(|e| Error::Cuda(format!("kernel {}: {e}", k.name())))
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        let _current = self.ctx.enter();
        // SAFETY: loaded by `load`, unloaded once; no launch of ours is pending on a stream
        // the module's owner still uses (the executor drops its stream work first).
        let _ = unsafe { sys::cuModuleUnload(self.module) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_kernel_source() {
        assert_eq!(Kernel::Reduce(Dtype::Bfloat16, ReduceOp::Avg).name(), "topoccl_reduce_sum_bf16");
        assert_eq!(Kernel::Reduce(Dtype::Float8e5m2, ReduceOp::Max).name(), "topoccl_reduce_max_f8e5m2");
        assert_eq!(Kernel::Scale(Dtype::Uint64).name(), "topoccl_scale_u64");
        assert_eq!(Kernel::Divide(Dtype::Int8).name(), "topoccl_divide_i8");
        assert_eq!(std::mem::size_of::<KernelArgs>(), 48);
        assert_eq!(Kernel::all().count(), 12 * 8);
        assert_eq!(Kernel::Ll(Dtype::Float32).name(), "topoccl_ll_f32");
        assert!(image_for((7, 5)).is_err());
        assert_eq!(image_for((8, 9)).unwrap().1, "sm_80 cubin");
        assert_eq!(image_for((12, 0)).unwrap().1, "compute_90 PTX");
    }
}

//! `cuLaunchKernel`: the 48 argument bytes are copied at call time; the stream's worker later
//! checks that every pointer the kernel uses lies wholly inside memory the launching context
//! may touch, translates device pointers to the stand-in's read-write alias and runs the
//! host-compiled kernel. A bad pointer does not fail the launch (a GPU faults
//! asynchronously): the context gets the sticky `CUDA_ERROR_ILLEGAL_ADDRESS` and the kernel
//! does not run.

use std::ffi::c_void;
use std::sync::Arc;

use topoccl_kernels_host::{HostKernel, KernelArgs, LL_ARGS_BYTES, LL_REGIONS};

use crate::context::{self, CtxCore};
use crate::memory::{self, Region};
use crate::module;
use crate::stream;
use crate::sys::{CUresult, CuResult};

/// Grid and block dimensions, checked against the device's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

impl Dims {
    pub fn check(&self) -> CuResult<()> {
        let [bx, by, bz] = self.block;
        let [gx, gy, gz] = self.grid;
        let zero = self.grid.contains(&0) || self.block.contains(&0);
        let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
        let too_big = threads > 1024 || bx > 1024 || by > 1024 || bz > 64;
        let grid_too_big = gx > i32::MAX as u32 || gy > 65535 || gz > 65535;
        if zero || too_big || grid_too_big || self.shared_bytes > 48 << 10 {
            Err(CUresult::INVALID_VALUE)
        } else {
            Ok(())
        }
    }
}

/// One pointer argument at run time: `len` bytes the context may touch, or the fault.
fn translate(addr: u64, len: usize, ctx: &CtxCore, write: bool) -> CuResult<Region> {
    let r = memory::region(addr, len).ok_or(CUresult::ILLEGAL_ADDRESS)?;
    if r.alloc.accessible(ctx, write) {
        Ok(r)
    } else {
        Err(CUresult::ILLEGAL_ADDRESS)
    }
}

/// `cuLaunchKernel`. The function's module and the stream must belong to the current
/// context (`CUDA_ERROR_INVALID_HANDLE` otherwise); `extra` is not supported.
///
/// # Safety
/// `params`, if not NULL, must point at an array whose first entry, if not NULL, points at
/// the kernel's 48-byte `KernelArgs`.
pub unsafe fn launch(
    function: usize,
    dims: Dims,
    stream: usize,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult<()> {
    let ctx = context::current()?;
    let f = module::function(function)?;
    let s = stream::resolve(stream)?;
    if f.ctx != ctx.handle() || !Arc::ptr_eq(&s.core, &ctx.core) {
        return Err(CUresult::INVALID_HANDLE);
    }
    dims.check()?;
    // A kernel only looked up (`TOPOCCL_STANDIN_LAZY=launch`) is loaded now, synchronising the
    // context.
    module::load(&f, "cuLaunchKernel of a kernel not yet loaded (lazy loading) synchronises the context")?;
    if !extra.is_null() || params.is_null() {
        return Err(CUresult::INVALID_VALUE);
    }
    // SAFETY: `params` is a non-NULL array of at least one entry (the caller's contract).
    let first = unsafe { *params };
    if first.is_null() {
        return Err(CUresult::INVALID_VALUE);
    }
    let kernel = f.kernel;
    let core = s.core.clone();
    if kernel.ll {
        // SAFETY: the first parameter is the one-launch kernel's argument block; copied now.
        let args = unsafe { first.cast::<[u8; LL_ARGS_BYTES]>().read_unaligned() };
        s.submit_kernel(Vec::new(), Arc::new(move || run_ll(kernel, dims, &core, args)))?;
        return Ok(());
    }
    // SAFETY: the first parameter is the 48-byte argument struct; copied now, at call time.
    let args = unsafe { first.cast::<KernelArgs>().read_unaligned() };
    s.submit_kernel(
        Vec::new(),
        Arc::new(move || {
            let Some(len) = args.count.checked_mul(kernel.elem_bytes as u64).and_then(|n| usize::try_from(n).ok())
            else {
                return Err(CUresult::ILLEGAL_ADDRESS);
            };
            if len == 0 {
                return Ok(());
            }
            let mut run = args;
            let mut held = Vec::with_capacity(4);
            let mut map = |addr: u64, write: bool| -> CuResult<u64> {
                let r = translate(addr, len, &core, write)?;
                let p = r.ptr() as u64;
                held.push(r);
                Ok(p)
            };
            run.dst = map(args.dst, true)?;
            if args.dst2 != 0 {
                run.dst2 = map(args.dst2, true)?;
            }
            run.a = map(args.a, false)?;
            if kernel.reads_b {
                run.b = map(args.b, false)?;
            }
            // SAFETY: every pointer the kernel uses now names `len` bytes of the stand-in's
            // read-write view of memory the context may touch, kept mapped by `held`.
            unsafe { kernel.launch(dims.grid, dims.block, &run) };
            drop(held);
            Ok(())
        }),
    )?;
    Ok(())
}

/// Runs a one-launch kernel: each region of its block (address, bytes) must lie wholly in
/// memory the context may touch (the first, the call's input, for reading; the rest for
/// writing), and is translated to the stand-in's view; the kernel touches nothing else.
fn run_ll(kernel: &'static HostKernel, dims: Dims, core: &CtxCore, mut args: [u8; LL_ARGS_BYTES]) -> CuResult<()> {
    let mut held = Vec::with_capacity(LL_REGIONS);
    for i in 0..LL_REGIONS {
        let word = |at: usize| -> u64 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&args[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let (ptr, len) = (word(16 * i), word(16 * i + 8));
        if ptr == 0 {
            continue;
        }
        let len = usize::try_from(len).map_err(|_| CUresult::ILLEGAL_ADDRESS)?;
        let r = translate(ptr, len.max(1), core, i != 0)?;
        args[16 * i..16 * i + 8].copy_from_slice(&(r.ptr() as u64).to_le_bytes());
        held.push(r);
    }
    // SAFETY: every region the kernel may touch now names its bytes of the stand-in's
    // read-write view of memory the context may touch, kept mapped by `held`.
    unsafe { kernel.launch_ll(dims.grid, dims.block, &args) };
    drop(held);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        let ok = Dims { grid: [1, 1, 1], block: [1024, 1, 1], shared_bytes: 0 };
        assert_eq!(ok.check(), Ok(()));
        assert!(Dims { block: [1025, 1, 1], ..ok }.check().is_err());
        assert!(Dims { block: [32, 32, 2], ..ok }.check().is_err());
        assert!(Dims { grid: [0, 1, 1], ..ok }.check().is_err());
        assert!(Dims { grid: [1, 65536, 1], ..ok }.check().is_err());
        assert!(Dims { shared_bytes: 1 << 20, ..ok }.check().is_err());
    }
}

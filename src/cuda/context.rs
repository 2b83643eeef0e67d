//! CUDA contexts: the device a communicator's device work runs on, and making it current on
//! whichever thread runs that work (the progress thread, or a caller running a job inline).
//!
//! A communicator uses the context the caller's memory and streams belong to: the device's
//! primary context (what the CUDA runtime, and so PyTorch, uses) or a context the caller made
//! with the driver API, which is borrowed and never destroyed here.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdevice_attribute};

use super::driver::{check, driver};
use crate::error::{Error, Result};

/// A context and its device.
#[derive(Debug)]
pub struct Context {
    raw: CUcontext,
    ordinal: u32,
    /// Compute capability (major, minor).
    pub sm: (i32, i32),
    /// Streaming multiprocessors (sizes kernel grids).
    pub multiprocessors: u32,
    /// What one multiprocessor holds at once: threads, 32-bit registers, blocks (with a
    /// kernel's registers per thread, how many of its blocks run at once: [`Context::resident_blocks`]).
    pub per_multiprocessor: (u32, u32, u32),
    /// The primary context's device, released on drop; `None` for a borrowed context.
    primary: Option<CUdevice>,
}

// SAFETY: a CUcontext is a driver handle usable from any thread (each thread makes it current
// before use, which `enter` does); the struct holds no thread-bound state.
unsafe impl Send for Context {}
// SAFETY: as above; every method only reads the handle.
unsafe impl Sync for Context {}

impl Context {
    /// The primary context of device `ordinal`, retained until dropped.
    pub fn primary(ordinal: u32) -> Result<Arc<Context>> {
        driver()?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "CUDA device {ordinal} does not exist ({count} device{} visible)",
                if count == 1 { "" } else { "s" }
            )));
        }
        let mut dev: CUdevice = 0;
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: the driver is initialised; both out-pointers are valid locals.
        unsafe {
            check(sys::cuDeviceGet(&mut dev, ordinal as i32), "cuDeviceGet")?;
            check(sys::cuDevicePrimaryCtxRetain(&mut raw, dev), "cuDevicePrimaryCtxRetain")?;
        }
        let mut ctx =
            Context { raw, ordinal, sm: (0, 0), multiprocessors: 0, per_multiprocessor: (0, 0, 0), primary: Some(dev) };
        ctx.describe(dev)?;
        Ok(Arc::new(ctx))
    }

    /// The caller's context `raw`, borrowed: never destroyed here.
    ///
    /// # Safety
    /// `raw` must be a live context that outlives every use of the returned value.
    pub unsafe fn borrowed(raw: CUcontext) -> Result<Arc<Context>> {
        driver()?;
        if raw.is_null() {
            return Err(Error::InvalidArgument("no CUDA context".into()));
        }
        let mut ctx =
            Context { raw, ordinal: 0, sm: (0, 0), multiprocessors: 0, per_multiprocessor: (0, 0, 0), primary: None };
        let dev = {
            let _current = ctx.enter()?;
            let mut dev: CUdevice = 0;
            // SAFETY: the context is current on this thread (entered above).
            check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
            dev
        };
        ctx.ordinal = u32::try_from(dev).map_err(|_| Error::Cuda(format!("device handle {dev}")))?;
        ctx.describe(dev)?;
        Ok(Arc::new(ctx))
    }

    /// The context `raw` as a communicator keeps it: the device's primary context (retained)
    /// when it is that, else borrowed.
    ///
    /// # Safety
    /// As for [`Context::borrowed`].
    pub unsafe fn adopt(raw: CUcontext) -> Result<Arc<Context>> {
        // SAFETY: this fn's contract.
        let borrowed = unsafe { Context::borrowed(raw) }?;
        let primary = Context::primary(borrowed.ordinal)?;
        Ok(if primary.raw == raw { primary } else { borrowed })
    }

    /// The context current on this thread, if any (without initialising anything: `None` when
    /// the driver is missing or nobody made one current).
    pub fn current() -> Result<Option<CUcontext>> {
        driver()?;
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: the driver is initialised; the out-pointer is a valid local.
        check(unsafe { sys::cuCtxGetCurrent(&mut raw) }, "cuCtxGetCurrent")?;
        Ok((!raw.is_null()).then_some(raw))
    }

    fn describe(&mut self, dev: CUdevice) -> Result<()> {
        let attr = |a: CUdevice_attribute| -> Result<i32> {
            let mut v = 0;
            // SAFETY: `dev` is a device handle of the initialised driver.
            check(unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) }, "cuDeviceGetAttribute")?;
            Ok(v)
        };
        self.sm = (
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        self.multiprocessors = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        let positive = |v: i32| u32::try_from(v).unwrap_or(0);
        self.per_multiprocessor = (
            positive(attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?),
            positive(attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?),
            positive(attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)?),
        );
        Ok(())
    }

    /// Blocks of `block` threads using `regs` registers per thread that the whole device runs
    /// at once (registers are allocated per warp in units of 256, as on every device since
    /// sm_50), at least one per multiprocessor. A grid larger than this only queues behind
    /// itself; the kernels' grid-stride loops cover any count with it.
    pub fn resident_blocks(&self, block: u32, regs: u32) -> u32 {
        let (threads, registers, blocks) = self.per_multiprocessor;
        let warps = block.div_ceil(32).max(1);
        let per_warp = (regs.max(1) * 32).div_ceil(256) * 256;
        let by_threads = threads / block.max(1);
        let by_registers = registers / (per_warp * warps);
        let per_sm = by_threads.min(by_registers).min(if blocks == 0 { u32::MAX } else { blocks }).max(1);
        self.multiprocessors.saturating_mul(per_sm)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    pub fn raw(&self) -> CUcontext {
        self.raw
    }

    /// Makes this context current on the calling thread until the guard drops (then the one
    /// current before is again); nothing changes if it already is.
    pub fn enter(&self) -> Result<Entered> {
        let mut cur: CUcontext = std::ptr::null_mut();
        // SAFETY: a context exists, so the driver is initialised; the out-pointer is a local.
        check(unsafe { sys::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
        if cur == self.raw {
            return Ok(Entered { pushed: false, _thread_bound: std::marker::PhantomData });
        }
        // SAFETY: `raw` is a live context (this value's invariant).
        check(unsafe { sys::cuCtxPushCurrent_v2(self.raw) }, "cuCtxPushCurrent")?;
        Ok(Entered { pushed: true, _thread_bound: std::marker::PhantomData })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Some(dev) = self.primary {
            // SAFETY: the primary context was retained once by `primary`; released once here.
            // A failure cannot be reported from a drop and leaves only the retain count high.
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
        }
    }
}

/// A context made current by [`Context::enter`]; restores the previous one when dropped (on
/// the thread that entered it: the guard cannot move to another).
#[must_use = "the context is current only while the guard lives"]
pub struct Entered {
    pushed: bool,
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: this guard pushed a context on this thread's stack; popping it restores
            // the previous one. Nothing can be reported from a drop.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

/// Devices the driver sees.
pub fn device_count() -> Result<u32> {
    driver()?;
    let mut n = 0;
    // SAFETY: the driver is initialised; the out-pointer is a valid local.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as u32)
}

/// The device whose primary context is current on this thread, when that is what is current:
/// what `cudaSetDevice` leaves current, and so the device NCCL binds a communicator to at init.
/// `None` without a driver or a current context (the driver is not initialised then), or when
/// the current context is one the caller made (a communicator binds to that at its first call).
pub fn current_primary_device() -> Option<u32> {
    super::driver::loaded().ok()?;
    let mut raw: CUcontext = std::ptr::null_mut();
    // SAFETY: the library and its symbols are loaded; before `cuInit` the call answers
    // CUDA_ERROR_NOT_INITIALIZED, which means no context.
    if unsafe { sys::cuCtxGetCurrent(&mut raw) } != sys::CUresult::CUDA_SUCCESS || raw.is_null() {
        return None;
    }
    // SAFETY: the context is current on this thread, so alive for this call.
    let ctx = unsafe { Context::adopt(raw) }.ok()?;
    ctx.primary.is_some().then_some(ctx.ordinal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_blocks_follow_threads_registers_and_the_block_limit() {
        // An H200: 132 multiprocessors of 2048 threads, 64 Ki registers, 32 blocks.
        let ctx = Context {
            raw: std::ptr::null_mut(),
            ordinal: 0,
            sm: (9, 0),
            multiprocessors: 132,
            per_multiprocessor: (2048, 65536, 32),
            primary: None,
        };
        assert_eq!(ctx.resident_blocks(256, 32), 132 * 8); // threads bound
        assert_eq!(ctx.resident_blocks(256, 56), 132 * 4); // 56 x 32 = 1792 per warp, 14336 a block
        assert_eq!(ctx.resident_blocks(256, 123), 132 * 2); // 123 -> 4096 per warp
        assert_eq!(ctx.resident_blocks(32, 16), 132 * 32); // the block limit
        assert_eq!(ctx.resident_blocks(1024, 255), 132); // never fewer than one per multiprocessor
        let unknown = Context { per_multiprocessor: (0, 0, 0), ..ctx };
        assert_eq!(unknown.resident_blocks(256, 32), 132);
    }
}

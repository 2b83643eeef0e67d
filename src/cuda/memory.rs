//! Memory the driver knows: device allocations, pinned host memory, and telling which kind a
//! caller's pointer is.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUmemorytype, CUpointer_attribute, CUresult};
use topoccl_transports::registration::Allocation;
use topoccl_transports::MemSpace;

use super::context::Context;
use super::driver::{check, loaded};
use super::stream::StreamRef;
use crate::error::{Error, Result};

/// Where `addr` lies, from the driver's own records: device memory (or managed memory) of a
/// device, or host memory (pinned or not). No driver, or a driver nobody initialised in this
/// process, means host memory: device memory cannot exist without `cuInit`.
pub fn space_of(addr: usize) -> MemSpace {
    if addr == 0 || loaded().is_err() {
        return MemSpace::Host;
    }
    let mut kind: u32 = 0;
    let mut ordinal: i32 = -1;
    let mut managed: u32 = 0;
    let mut attrs = [
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
    ];
    let mut data: [*mut std::ffi::c_void; 3] =
        [(&mut kind as *mut u32).cast(), (&mut ordinal as *mut i32).cast(), (&mut managed as *mut u32).cast()];
    // SAFETY: the library is loaded with this entry point (`loaded`); the three out-pointers match the attributes' types (a
    // memory type and a flag are 32-bit, an ordinal an int). `cuPointerGetAttributes` leaves
    // defaults for a pointer it does not know, and fails before `cuInit`.
    let r =
        unsafe { sys::cuPointerGetAttributes(attrs.len() as u32, attrs.as_mut_ptr(), data.as_mut_ptr(), addr as u64) };
    if r != CUresult::CUDA_SUCCESS {
        return MemSpace::Host;
    }
    let device = kind == CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 || managed != 0;
    match u32::try_from(ordinal) {
        Ok(d) if device => MemSpace::Device(d),
        _ => MemSpace::Host,
    }
}

/// The allocation of device memory `addr` lies in, with the device's ordinal: its base, length
/// and the driver's buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`, which no later allocation at
/// the same address shares). `None` for host memory, managed memory and unknown pointers.
pub fn allocation_of(addr: usize) -> Option<(u32, Allocation)> {
    if addr == 0 || loaded().is_err() {
        return None;
    }
    let (mut kind, mut ordinal, mut base, mut size, mut id) = (0u32, -1i32, 0u64, 0usize, 0u64);
    let mut attrs = [
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
    ];
    let mut data: [*mut std::ffi::c_void; 5] = [
        (&mut kind as *mut u32).cast(),
        (&mut ordinal as *mut i32).cast(),
        (&mut base as *mut u64).cast(),
        (&mut size as *mut usize).cast(),
        (&mut id as *mut u64).cast(),
    ];
    // SAFETY: the library is loaded with this entry point (`loaded`); each out-pointer matches
    // its attribute's type (a memory type is 32-bit, an ordinal an int, a range start a
    // CUdeviceptr, a range size a size_t, a buffer id 64-bit).
    let r =
        unsafe { sys::cuPointerGetAttributes(attrs.len() as u32, attrs.as_mut_ptr(), data.as_mut_ptr(), addr as u64) };
    let inside = base <= addr as u64 && (addr as u64) < base.saturating_add(size as u64);
    if r != CUresult::CUDA_SUCCESS || kind != CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 || !inside {
        return None;
    }
    Some((u32::try_from(ordinal).ok()?, Allocation { base, len: size as u64, buffer_id: id }))
}

/// Device memory from `cuMemAlloc` (not a pool: such memory can later be shared by IPC).
#[derive(Debug)]
pub struct DeviceMemory {
    ptr: u64,
    len: usize,
    ctx: Arc<Context>,
}

impl DeviceMemory {
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<DeviceMemory> {
        let _current = ctx.enter()?;
        let mut ptr = 0u64;
        // SAFETY: the context is current; the out-pointer is a local.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) }, "cuMemAlloc")?;
        Ok(DeviceMemory { ptr, len, ctx: ctx.clone() })
    }

    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Zeroes `len` bytes of `ctx`'s device memory at `addr`, and waits until every device and
/// stream sees the zeros (on a stream of its own: the context's other work is not waited for).
pub(super) fn zero_device(ctx: &Arc<Context>, addr: u64, len: usize) -> Result<()> {
    let zeroing = super::stream::Stream::new(ctx)?;
    let _current = ctx.enter()?;
    // SAFETY: `len` bytes of a live allocation of this context (the caller's), on a stream of
    // it; waited for below, before anything else may touch them.
    check(unsafe { sys::cuMemsetD8Async(addr, 0, len, zeroing.handle().0) }, "cuMemsetD8Async")?;
    // SAFETY: a live stream of the current context.
    check(unsafe { sys::cuStreamSynchronize(zeroing.handle().0) }, "cuStreamSynchronize")
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        let _current = self.ctx.enter();
        // SAFETY: allocated by `new`, freed once; every user of the memory is done (owners
        // drop it only after the work using it has completed or the executor is gone).
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Pinned host memory, mapped for the device (`cuMemHostAlloc`, portable and device-mapped):
/// copies to and from it run asynchronously, and kernels and stream memory operations reach it.
#[derive(Debug)]
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
    device_ptr: u64,
    ctx: Arc<Context>,
}

// SAFETY: plain memory owned by this value; the pointer is not tied to a thread.
unsafe impl Send for Pinned {}
// SAFETY: as above; shared use only reads the pointer values.
unsafe impl Sync for Pinned {}

impl Pinned {
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Pinned> {
        let _current = ctx.enter()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: the context is current; the out-pointer is a local.
        check(unsafe { sys::cuMemHostAlloc(&mut p, len.max(1), flags) }, "cuMemHostAlloc")?;
        let mut device_ptr = 0u64;
        // SAFETY: `p` is the mapped allocation just made.
        let r = check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, p, 0) }, "cuMemHostGetDevicePointer");
        let pinned = Pinned { ptr: p.cast(), len, device_ptr, ctx: ctx.clone() };
        r?;
        // SAFETY: `len` bytes of fresh memory we own.
        unsafe { std::ptr::write_bytes(pinned.ptr, 0, len) };
        Ok(pinned)
    }

    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// The address the device uses for it.
    pub fn device_addr(&self) -> u64 {
        self.device_ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _current = self.ctx.enter();
        // SAFETY: allocated by `new`, freed once.
        let _ = unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
    }
}

/// Submits a copy of `len` bytes from `src` to `dst` (any two addresses the driver can reach,
/// found by unified addressing) on `stream`.
///
/// # Safety
/// Both ranges must be valid for the copy until it has run (a pageable host source only until
/// this returns: the driver stages it), and the stream's context current.
pub unsafe fn copy_async(dst: usize, src: usize, len: usize, stream: StreamRef) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: this fn's contract.
    check(unsafe { sys::cuMemcpyAsync(dst as u64, src as u64, len, stream.0) }, "cuMemcpyAsync")
}

/// Refuses a region of `len` bytes at `addr` that is not of element alignment `align`
/// (device loads of an element must be aligned).
pub fn aligned(addr: usize, align: usize, what: &str) -> Result<()> {
    if align > 1 && addr % align != 0 {
        return Err(Error::InvalidArgument(format!(
            "the {what} at {addr:#x} is not aligned to its {align}-byte elements (device memory needs it)"
        )));
    }
    Ok(())
}

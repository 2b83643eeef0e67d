//! Memory the stand-in knows: device allocations (`cuMemAlloc_v2`, pool `cuMemAllocAsync`,
//! IPC mappings) and pinned host memory (`cuMemHostAlloc`, `cuMemHostRegister_v2`).
//!
//! Device memory is a memfd mapped twice: the address handed out as the `CUdeviceptr` is
//! `PROT_NONE` (host code dereferencing a device pointer crashes, as on a GPU) and a private
//! read-write alias, followed by a guard page, is what stream workers and kernels use. The
//! allocation sits at the end of its pages (256-byte aligned), so an overrun by the stand-in's
//! own kernels hits the guard. Addresses are real mappings, hence unique in the process (UVA).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::config;
use crate::context::{self, Context, CtxCore};
use crate::device::TOTAL_MEM;
use crate::mapping::{page, round_up, Mapping, SharedFile};
use crate::stream;
use crate::sys::MEMHOSTREGISTER_READ_ONLY;
use crate::sys::{CUresult, CuResult, MEMHOSTALLOC_DEVICEMAP, MEMHOSTALLOC_PORTABLE, MEMHOSTALLOC_WRITECOMBINED};
use crate::sys::{MEMHOSTREGISTER_DEVICEMAP, MEMHOSTREGISTER_IOMEMORY, MEMHOSTREGISTER_PORTABLE};

/// Alignment of device allocations (as `cuMemAlloc` guarantees).
const ALIGN: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `cuMemAlloc_v2`: has an IPC handle.
    Device,
    /// `cuMemAllocAsync`: stream-ordered pool memory, no legacy IPC handle.
    Pool,
    /// Another process's device memory, opened with `cuIpcOpenMemHandle_v2`.
    Ipc,
    /// `cuMemHostAlloc`.
    HostAlloc,
    /// `cuMemHostRegister_v2`.
    HostRegistered,
}

/// The file behind device memory and where the allocation sits in it.
pub struct DeviceBacking {
    pub file: SharedFile,
    /// Offset of the allocation in the file (it sits at the file's end).
    pub pad: usize,
    _visible: Mapping,
    alias: Mapping,
}

enum Backing {
    Device(DeviceBacking),
    /// Owns the mapping (unmapped on drop).
    Host {
        _map: Mapping,
    },
    Borrowed,
}

pub struct Allocation {
    pub base: u64,
    pub size: usize,
    pub kind: Kind,
    /// The context it was allocated (IPC: opened; host: allocated or registered) in.
    pub ctx: usize,
    pub device: i32,
    /// `cuMemHostAlloc` / `cuMemHostRegister_v2` flags.
    pub flags: u32,
    pub id: u64,
    live: AtomicBool,
    /// A `cuMemFreeAsync` is queued.
    freeing: AtomicBool,
    backing: Backing,
}

impl Allocation {
    pub fn is_device(&self) -> bool {
        matches!(self.kind, Kind::Device | Kind::Pool | Kind::Ipc)
    }

    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub fn device_backing(&self) -> Option<&DeviceBacking> {
        match &self.backing {
            Backing::Device(d) => Some(d),
            _ => None,
        }
    }

    /// Whether a kernel or copy of `ctx` may touch this memory (`write`: store into it).
    pub fn accessible(&self, ctx: &CtxCore, write: bool) -> bool {
        match self.kind {
            Kind::Device | Kind::Pool | Kind::Ipc => ctx.may_touch(self.device),
            Kind::HostAlloc => true,
            Kind::HostRegistered => !write || self.flags & MEMHOSTREGISTER_READ_ONLY == 0,
        }
    }

    /// Where the stand-in itself reads and writes byte `addr` of this allocation.
    fn rw(&self, addr: u64) -> *mut u8 {
        let offset = (addr - self.base) as usize;
        match &self.backing {
            Backing::Device(d) => d.alias.ptr().wrapping_add(d.pad + offset),
            Backing::Host { .. } | Backing::Borrowed => addr as *mut u8,
        }
    }
}

/// `len` bytes at `addr`, wholly inside one allocation, which it keeps alive.
pub struct Region {
    pub alloc: Arc<Allocation>,
    pub addr: u64,
    pub len: usize,
}

impl Region {
    /// The stand-in's read-write view of the region.
    pub fn ptr(&self) -> *mut u8 {
        self.alloc.rw(self.addr)
    }

    /// At run time: the memory must not have been freed since the call.
    pub fn check_live(&self) -> CuResult<()> {
        if self.alloc.is_live() {
            Ok(())
        } else {
            Err(CUresult::ILLEGAL_ADDRESS)
        }
    }
}

static ALLOCS: RwLock<BTreeMap<u64, Arc<Allocation>>> = RwLock::new(BTreeMap::new());
static IDS: AtomicU64 = AtomicU64::new(1);

fn read_map() -> std::sync::RwLockReadGuard<'static, BTreeMap<u64, Arc<Allocation>>> {
    ALLOCS.read().unwrap_or_else(|e| e.into_inner())
}

fn write_map() -> std::sync::RwLockWriteGuard<'static, BTreeMap<u64, Arc<Allocation>>> {
    ALLOCS.write().unwrap_or_else(|e| e.into_inner())
}

/// The allocation containing `addr`.
pub fn find(addr: u64) -> Option<Arc<Allocation>> {
    let map = read_map();
    let (_, a) = map.range(..=addr).next_back()?;
    (addr - a.base < a.size as u64).then(|| a.clone())
}

/// `len` (> 0) bytes at `addr`, if wholly inside one allocation.
pub fn region(addr: u64, len: usize) -> Option<Region> {
    let alloc = find(addr)?;
    let end = addr.checked_add(len as u64)?;
    (len > 0 && end <= alloc.base + alloc.size as u64).then_some(Region { alloc, addr, len })
}

/// A device-side range for `ctx` (device memory or host-mapped pinned memory), checked at
/// call time: `CUDA_ERROR_INVALID_VALUE` unless wholly inside one allocation it may touch.
pub fn device_region(addr: u64, len: usize, ctx: &CtxCore, write: bool) -> CuResult<Region> {
    let r = region(addr, len).ok_or(CUresult::INVALID_VALUE)?;
    if r.alloc.accessible(ctx, write) && !r.alloc.freeing.load(Ordering::Acquire) {
        Ok(r)
    } else {
        Err(CUresult::INVALID_VALUE)
    }
}

fn insert(alloc: Allocation) -> u64 {
    let base = alloc.base;
    write_map().insert(base, Arc::new(alloc));
    base
}

/// Removes the allocation starting at `base` if `pred` accepts it.
fn remove(base: u64, pred: impl Fn(&Allocation) -> bool) -> CuResult<Arc<Allocation>> {
    let mut map = write_map();
    if !map.get(&base).is_some_and(|a| pred(a)) {
        return Err(CUresult::INVALID_VALUE);
    }
    let a = map.remove(&base).ok_or(CUresult::INVALID_VALUE)?;
    a.live.store(false, Ordering::Release);
    Ok(a)
}

fn poison(ptr: *mut u8, len: usize) {
    if let Ok(Some(byte)) = config::get().map(|c| c.poison) {
        // SAFETY: `ptr` is the start of a fresh read-write mapping of at least `len` bytes.
        unsafe { std::ptr::write_bytes(ptr, byte, len) };
    }
}

/// A device mapping of `size` bytes over `file` (new, or imported through IPC) at `pad`.
pub fn map_device(file: SharedFile, pad: usize) -> CuResult<(u64, DeviceBacking)> {
    let visible = Mapping::file(&file, libc::PROT_NONE).map_err(|_| CUresult::MAP_FAILED)?;
    let alias = Mapping::file_with_guard(&file).map_err(|_| CUresult::MAP_FAILED)?;
    let base = visible.ptr() as u64 + pad as u64;
    Ok((base, DeviceBacking { file, pad, _visible: visible, alias }))
}

fn new_device(size: usize, kind: Kind, ctx: &Context) -> CuResult<u64> {
    if size == 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    if size > TOTAL_MEM {
        return Err(CUresult::OUT_OF_MEMORY);
    }
    let data = round_up(size, ALIGN).ok_or(CUresult::OUT_OF_MEMORY)?;
    let file_len = round_up(data, page()).ok_or(CUresult::OUT_OF_MEMORY)?;
    let file = SharedFile::create("topoccl-standin-device", file_len).map_err(|_| CUresult::OUT_OF_MEMORY)?;
    let (base, backing) = map_device(file, file_len - data)?;
    poison(backing.alias.ptr().wrapping_add(backing.pad), size);
    Ok(insert(Allocation {
        base,
        size,
        kind,
        ctx: ctx.handle(),
        device: ctx.device(),
        flags: 0,
        id: IDS.fetch_add(1, Ordering::Relaxed),
        live: AtomicBool::new(true),
        freeing: AtomicBool::new(false),
        backing: Backing::Device(backing),
    }))
}

/// Registers an IPC mapping opened in `ctx`.
pub fn insert_ipc(base: u64, size: usize, backing: DeviceBacking, ctx: &Context) -> u64 {
    insert(Allocation {
        base,
        size,
        kind: Kind::Ipc,
        ctx: ctx.handle(),
        device: ctx.device(),
        flags: 0,
        id: IDS.fetch_add(1, Ordering::Relaxed),
        live: AtomicBool::new(true),
        freeing: AtomicBool::new(false),
        backing: Backing::Device(backing),
    })
}

/// Forgets an IPC mapping (`cuIpcCloseMemHandle`).
pub fn remove_ipc(base: u64) -> CuResult<()> {
    remove(base, |a| a.kind == Kind::Ipc).map(drop)
}

/// `cuMemAlloc_v2`.
pub fn alloc(size: usize) -> CuResult<u64> {
    crate::capture::unsafe_call()?;
    let ctx = context::current()?;
    ctx.core.resource_call("cuMemAlloc", false);
    new_device(size, Kind::Device, &ctx)
}

/// Waits for all work of the context owning `alloc` (freeing synchronises, as in CUDA).
fn drain_owner(alloc: &Allocation) {
    if let Ok(owner) = context::lookup(alloc.ctx) {
        owner.drain();
    }
}

/// `cuMemFree_v2`: the base of a device or pool allocation; synchronises its context first.
pub fn free(ptr: u64) -> CuResult<()> {
    crate::capture::unsafe_call()?;
    context::current()?.core.resource_call("cuMemFree", false);
    let a = find(ptr).filter(|a| a.base == ptr && matches!(a.kind, Kind::Device | Kind::Pool));
    let a = a.ok_or(CUresult::INVALID_VALUE)?;
    drain_owner(&a);
    remove(ptr, |a| matches!(a.kind, Kind::Device | Kind::Pool)).map(drop)
}

/// `cuMemAllocAsync`: pool memory, usable in stream order.
pub fn alloc_async(size: usize, stream: usize) -> CuResult<u64> {
    let s = stream::resolve(stream)?;
    // Graph-owned memory (allocation and free nodes) is not modelled.
    if s.capture().is_some() {
        return Err(CUresult::NOT_SUPPORTED);
    }
    new_device(size, Kind::Pool, &*s.context()?)
}

/// `cuMemFreeAsync`: the memory goes when the stream reaches the free; work that touches it
/// after that (on any stream) faults with `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub fn free_async(ptr: u64, stream: usize) -> CuResult<()> {
    let s = stream::resolve(stream)?;
    // Graph-owned memory (allocation and free nodes) is not modelled.
    if s.capture().is_some() {
        return Err(CUresult::NOT_SUPPORTED);
    }
    let a = find(ptr).filter(|a| a.base == ptr && a.kind == Kind::Pool).ok_or(CUresult::INVALID_VALUE)?;
    if a.freeing.swap(true, Ordering::AcqRel) {
        return Err(CUresult::INVALID_VALUE);
    }
    s.submit_always(Vec::new(), Arc::new(move || remove(ptr, |a| a.kind == Kind::Pool).map(drop)))?;
    Ok(())
}

/// `cuMemHostAlloc`: pinned, portable and device-mapped (as with UVA), page-aligned, with a
/// guard page after it.
pub fn host_alloc(size: usize, flags: u32) -> CuResult<*mut c_void> {
    crate::capture::unsafe_call()?;
    let ctx = context::current()?;
    ctx.core.resource_call("cuMemHostAlloc", false);
    if flags & !(MEMHOSTALLOC_PORTABLE | MEMHOSTALLOC_DEVICEMAP | MEMHOSTALLOC_WRITECOMBINED) != 0 || size == 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let len = round_up(size, page()).ok_or(CUresult::OUT_OF_MEMORY)?;
    let map = Mapping::anonymous_with_guard(len).map_err(|_| CUresult::OUT_OF_MEMORY)?;
    poison(map.ptr(), size);
    let base = map.ptr() as u64;
    insert(Allocation {
        base,
        size,
        kind: Kind::HostAlloc,
        ctx: ctx.handle(),
        device: ctx.device(),
        flags,
        id: IDS.fetch_add(1, Ordering::Relaxed),
        live: AtomicBool::new(true),
        freeing: AtomicBool::new(false),
        backing: Backing::Host { _map: map },
    });
    Ok(base as *mut c_void)
}

/// `cuMemFreeHost`.
pub fn free_host(p: *mut c_void) -> CuResult<()> {
    crate::capture::unsafe_call()?;
    context::current()?.core.resource_call("cuMemFreeHost", false);
    let a = find(p as u64).filter(|a| a.base == p as u64 && a.kind == Kind::HostAlloc);
    let a = a.ok_or(CUresult::INVALID_VALUE)?;
    drain_owner(&a);
    remove(p as u64, |a| a.kind == Kind::HostAlloc).map(drop)
}

/// `cuMemHostGetDevicePointer_v2`: the same address (UVA).
pub fn host_device_pointer(p: *mut c_void, flags: u32) -> CuResult<u64> {
    context::current()?;
    find(p as u64).filter(|a| !a.is_device()).ok_or(CUresult::INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    Ok(p as u64)
}

/// `cuMemHostRegister_v2`: the caller's range becomes pinned memory.
pub fn host_register(p: *mut c_void, size: usize, flags: u32) -> CuResult<()> {
    crate::capture::unsafe_call()?;
    let ctx = context::current()?;
    ctx.core.resource_call("cuMemHostRegister", false);
    let known = MEMHOSTREGISTER_PORTABLE | MEMHOSTREGISTER_DEVICEMAP | MEMHOSTREGISTER_READ_ONLY;
    if p.is_null() || size == 0 || flags & !(known | MEMHOSTREGISTER_IOMEMORY) != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    if flags & MEMHOSTREGISTER_IOMEMORY != 0 {
        return Err(CUresult::NOT_SUPPORTED);
    }
    let base = p as u64;
    let end = base.checked_add(size as u64).ok_or(CUresult::INVALID_VALUE)?;
    let mut map = write_map();
    let overlaps = map.range(..end).next_back().is_some_and(|(_, a)| a.base + a.size as u64 > base);
    if overlaps {
        return Err(CUresult::HOST_MEMORY_ALREADY_REGISTERED);
    }
    let alloc = Allocation {
        base,
        size,
        kind: Kind::HostRegistered,
        ctx: ctx.handle(),
        device: ctx.device(),
        flags,
        id: IDS.fetch_add(1, Ordering::Relaxed),
        live: AtomicBool::new(true),
        freeing: AtomicBool::new(false),
        backing: Backing::Borrowed,
    };
    map.insert(base, Arc::new(alloc));
    Ok(())
}

/// `cuMemHostUnregister`: synchronises the registering context first (its workers may still
/// read the caller's memory).
pub fn host_unregister(p: *mut c_void) -> CuResult<()> {
    crate::capture::unsafe_call()?;
    context::current()?.core.resource_call("cuMemHostUnregister", false);
    let a = find(p as u64).filter(|a| a.base == p as u64 && a.kind == Kind::HostRegistered);
    let a = a.ok_or(CUresult::HOST_MEMORY_NOT_REGISTERED)?;
    drain_owner(&a);
    remove(p as u64, |a| a.kind == Kind::HostRegistered).map(drop).map_err(|_| CUresult::HOST_MEMORY_NOT_REGISTERED)
}

/// Frees what a destroyed context owned (registered host ranges are only forgotten).
pub fn release_context(ctx: usize) {
    let mut map = write_map();
    map.retain(|_, a| {
        let keep = a.ctx != ctx;
        if !keep {
            a.live.store(false, Ordering::Release);
        }
        keep
    });
}

/// `cuMemGetHandleForAddressRange` for `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`: a file descriptor
/// for the page-aligned range `[dptr, dptr + size)` of one device allocation of the current
/// context's device (as the driver requires: both page aligned, the range within the pages
/// of one `cuMemAlloc` or pool allocation).
///
/// A real dma-buf stands for exactly the range; here it is the allocation's memfd, opened
/// anew through procfs (an open file description of its own) and **positioned at the range's
/// first byte**: the stand-in libibverbs reads that position back in `ibv_reg_dmabuf_mr`.
pub fn dmabuf(dptr: u64, size: usize) -> CuResult<OwnedFd> {
    let ctx = context::current()?;
    ctx.core.resource_call("cuMemGetHandleForAddressRange", false);
    if !config::get()?.dmabuf {
        return Err(CUresult::NOT_SUPPORTED);
    }
    let page = page() as u64;
    if size == 0 || dptr % page != 0 || size as u64 % page != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let end = dptr.checked_add(size as u64).ok_or(CUresult::INVALID_VALUE)?;
    // The allocation whose pages hold the range's last byte (it may start inside its first page).
    let alloc = read_map().range(..end).next_back().map(|(_, a)| a.clone()).ok_or(CUresult::INVALID_VALUE)?;
    let backing = alloc.device_backing().ok_or(CUresult::INVALID_VALUE)?;
    let first_page = alloc.base - backing.pad as u64;
    let inside = first_page <= dptr && end <= first_page + backing.file.len as u64;
    if !inside || !matches!(alloc.kind, Kind::Device | Kind::Pool) || alloc.device != ctx.device() || !alloc.is_live() {
        return Err(CUresult::INVALID_VALUE);
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", backing.file.raw_fd()))
        .map_err(|_| CUresult::OUT_OF_MEMORY)?;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(dptr - first_page)).map_err(|_| CUresult::UNKNOWN)?;
    Ok(file.into())
}

static RDMA_FLUSHES: AtomicU64 = AtomicU64::new(0);

/// Counts a `cuFlushGPUDirectRDMAWrites`.
pub fn count_rdma_flush() {
    RDMA_FLUSHES.fetch_add(1, Ordering::Relaxed);
}

/// How many `cuFlushGPUDirectRDMAWrites` calls this process made.
pub fn rdma_flushes() -> u64 {
    RDMA_FLUSHES.load(Ordering::Relaxed)
}

/// `cuMemGetInfo_v2`: (free, total) of the current context's device.
pub fn info() -> CuResult<(usize, usize)> {
    let ctx = context::current()?;
    let used: usize = read_map().values().filter(|a| a.is_device() && a.device == ctx.device()).map(|a| a.size).sum();
    Ok((TOTAL_MEM.saturating_sub(used), TOTAL_MEM))
}

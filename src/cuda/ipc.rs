//! The GPU side of the CUDA IPC transport ([`topoccl_transports::ipc`]): its
//! [`DeviceAccess`] on the driver — exportable windows (`cuMemAlloc` memory and its IPC handle),
//! opening a peer's, registering the pair's signal page, and a stream for the copies — and the
//! identity ranks compare their devices by (UUID, PCI bus id).
//!
//! Everything runs in the device's primary context (the one PyTorch and the CUDA runtime use):
//! the executor's own operations, in the communicator's context, read the windows from there.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self, CUdevice, CUdevice_attribute, CUresult, CUuuid};
use topoccl_transports::ipc::device::IPC_HANDLE_BYTES;
use topoccl_transports::ipc::{DeviceAccess, DeviceId, DeviceQueue, ExportedMemory, ImportedMemory, RegisteredHost};
use topoccl_transports::registration::Allocation;
use topoccl_transports::Error as TransportError;

use super::context::Context;
use super::driver::{check, driver, loaded};
use super::memory::{allocation_of, zero_device, DeviceMemory};
use super::stream::Stream;
use crate::error::{Error, Result};

fn transport_error(e: Error) -> TransportError {
    TransportError::Unsupported(e.to_string())
}

type TResult<T> = std::result::Result<T, TransportError>;

fn device_handle(ordinal: u32) -> Result<CUdevice> {
    let mut dev: CUdevice = 0;
    let o = i32::try_from(ordinal).map_err(|_| Error::Cuda(format!("no CUDA device {ordinal}")))?;
    // SAFETY: the driver is initialised (callers hold a context or called `driver`); the
    // out-pointer is a local.
    check(unsafe { sys::cuDeviceGet(&mut dev, o) }, "cuDeviceGet")?;
    Ok(dev)
}

/// How ranks tell device `ordinal` of this process apart from others.
pub fn device_id(ordinal: u32) -> Result<DeviceId> {
    driver()?;
    let dev = device_handle(ordinal)?;
    let mut uuid = CUuuid { bytes: [0; 16] };
    // SAFETY: a device of the initialised driver; the out-pointer is a local.
    check(unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, dev) }, "cuDeviceGetUuid")?;
    let attr = |a: CUdevice_attribute| -> Result<u64> {
        let mut v = 0;
        // SAFETY: as above.
        check(unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) }, "cuDeviceGetAttribute")?;
        Ok(u64::from(v.max(0) as u32))
    };
    let pci_bus = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)? << 16
        | (attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)? & 0xff) << 8
        | (attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)? & 0xff);
    Ok(DeviceId { uuid: uuid.bytes.map(|b| b as u8), pci_bus, ordinal })
}

/// The device a rank joining a communicator drives: `requested`, else that of the context
/// current on this thread; `None` without a driver or a context. Never initialises the driver
/// for a process that has not (a host-only program pays nothing).
pub fn device_at_init(requested: Option<u32>) -> Option<DeviceId> {
    if let Some(d) = requested {
        return device_id(d).ok();
    }
    loaded().ok()?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: the library and its symbols are loaded (`loaded`); before `cuInit` the call
    // answers CUDA_ERROR_NOT_INITIALIZED, which means no context.
    if unsafe { sys::cuCtxGetCurrent(&mut raw) } != CUresult::CUDA_SUCCESS || raw.is_null() {
        return None;
    }
    // SAFETY: the context is current on this thread, so alive for this call.
    let ordinal = unsafe { Context::borrowed(raw) }.ok()?.ordinal();
    device_id(ordinal).ok()
}

/// A device as the IPC and verbs transports use it.
struct CudaIpc {
    ctx: Arc<Context>,
    id: DeviceId,
    /// Whether the device exports dma-bufs (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`), asked once.
    dmabuf: OnceLock<bool>,
    /// Whether NIC writes into its memory need a flush before its work reads them, asked once.
    flush: OnceLock<bool>,
}

/// The IPC transport's access to device `id` of this process.
pub fn ipc_access(id: DeviceId) -> Result<Arc<dyn DeviceAccess>> {
    Ok(Arc::new(CudaIpc { ctx: Context::primary(id.ordinal)?, id, dmabuf: OnceLock::new(), flush: OnceLock::new() }))
}

struct Window {
    memory: DeviceMemory,
    handle: [u8; IPC_HANDLE_BYTES],
}

impl ExportedMemory for Window {
    fn addr(&self) -> u64 {
        self.memory.addr() as u64
    }
    fn handle(&self) -> [u8; IPC_HANDLE_BYTES] {
        self.handle
    }
}

/// A handle opened in this process: the driver maps a handle once per context, and several
/// connections (ranks of one process importing one peer buffer) may use the mapping.
struct OpenHandle {
    ctx: usize,
    handle: [u8; IPC_HANDLE_BYTES],
    ptr: u64,
    users: usize,
}

static OPENED: Mutex<Vec<OpenHandle>> = Mutex::new(Vec::new());

fn opened() -> std::sync::MutexGuard<'static, Vec<OpenHandle>> {
    // Every critical section leaves the list consistent, so a poisoned lock is usable.
    OPENED.lock().unwrap_or_else(|p| p.into_inner())
}

struct Opened {
    ptr: u64,
    ctx: Arc<Context>,
}

impl ImportedMemory for Opened {
    fn addr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        let key = self.ctx.raw() as usize;
        {
            let mut list = opened();
            let Some(i) = list.iter().position(|o| o.ctx == key && o.ptr == self.ptr) else { return };
            list[i].users -= 1;
            if list[i].users > 0 {
                return;
            }
            list.swap_remove(i);
        }
        // Unmapping may wait for the device: not while holding the list others open with.
        let _current = self.ctx.enter();
        // SAFETY: opened once by `open` in this context, closed once, by its last user; the
        // connections dropped their queues (which wait for their copies) first. Nothing can be
        // reported from a drop.
        let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
    }
}

struct Registered {
    host: usize,
    device: u64,
    ctx: Arc<Context>,
}

impl RegisteredHost for Registered {
    fn device_addr(&self) -> u64 {
        self.device
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let _current = self.ctx.enter();
        // SAFETY: registered once by `register`, unregistered once, before the memory unmaps
        // (`register`'s contract).
        let _ = unsafe { sys::cuMemHostUnregister(self.host as *mut std::ffi::c_void) };
    }
}

struct Queue {
    stream: Stream,
    ctx: Arc<Context>,
}

impl DeviceQueue for Queue {
    unsafe fn copy(&mut self, dst: u64, src: u64, len: usize) -> TResult<()> {
        let _current = self.ctx.enter().map_err(transport_error)?;
        // SAFETY: device ranges valid until the copy has run (this fn's contract), on a live
        // stream of the current context.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, self.stream.handle().0) }, "cuMemcpyDtoDAsync")
            .map_err(transport_error)
    }

    unsafe fn write_value(&mut self, addr: u64, value: u32) -> TResult<()> {
        // SAFETY: an aligned word of registered memory (this fn's contract).
        unsafe { self.stream.handle().write_value(addr, value) }.map_err(transport_error)
    }

    fn finish(&mut self) -> TResult<()> {
        self.synchronize().map_err(transport_error)
    }
}

impl Queue {
    fn synchronize(&self) -> Result<()> {
        let _current = self.ctx.enter()?;
        // SAFETY: a live stream of ours.
        check(unsafe { sys::cuStreamSynchronize(self.stream.handle().0) }, "cuStreamSynchronize")
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // Its copies write the peer's window, which must not be closed under them. Nothing can
        // be reported from a drop.
        let _ = self.synchronize();
    }
}

impl DeviceAccess for CudaIpc {
    fn device(&self) -> DeviceId {
        self.id
    }

    fn can_reach(&self, peer: &DeviceId) -> bool {
        if peer.uuid == self.id.uuid {
            return true;
        }
        let Ok(n) = super::context::device_count() else { return false };
        let Some(theirs) = (0..n).find(|&o| device_id(o).is_ok_and(|d| d.uuid == peer.uuid)) else { return false };
        let (Ok(mine), Ok(theirs)) = (device_handle(self.id.ordinal), device_handle(theirs)) else { return false };
        let mut can = 0;
        // SAFETY: two devices of the initialised driver; the out-pointer is a local.
        let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, mine, theirs) };
        r == CUresult::CUDA_SUCCESS && can == 1
    }

    fn enable_peer(&self, ordinal: u32) -> TResult<()> {
        if ordinal == self.id.ordinal {
            return Ok(());
        }
        let peer = Context::primary(ordinal).map_err(transport_error)?;
        let _current = self.ctx.enter().map_err(transport_error)?;
        // SAFETY: both contexts are live; peer access stays enabled for the process's life (the
        // peer's primary context is retained by the peer's own rank).
        match unsafe { sys::cuCtxEnablePeerAccess(peer.raw(), 0) } {
            CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            r => check(r, "cuCtxEnablePeerAccess").map_err(transport_error),
        }
    }

    fn alloc(&self, len: usize) -> TResult<Box<dyn ExportedMemory>> {
        let memory = DeviceMemory::new(&self.ctx, len).map_err(transport_error)?;
        // Zeroed before a peer can learn of it: the one-launch areas in it must hold no flag
        // (a reused allocation may hold an earlier communicator's lines).
        zero_device(&self.ctx, memory.addr() as u64, len).map_err(transport_error)?;
        let _current = self.ctx.enter().map_err(transport_error)?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        // SAFETY: the base of a live `cuMemAlloc` allocation; the out-pointer is a local.
        check(unsafe { sys::cuIpcGetMemHandle(&mut handle, memory.addr() as u64) }, "cuIpcGetMemHandle")
            .map_err(transport_error)?;
        Ok(Box::new(Window { memory, handle: handle.reserved.map(|b| b as u8) }))
    }

    fn allocation(&self, addr: u64) -> TResult<Option<Allocation>> {
        let Ok(addr) = usize::try_from(addr) else { return Ok(None) };
        Ok(allocation_of(addr).and_then(|(ordinal, a)| (ordinal == self.id.ordinal).then_some(a)))
    }

    fn export(&self, base: u64) -> TResult<Option<[u8; IPC_HANDLE_BYTES]>> {
        let _current = self.ctx.enter().map_err(transport_error)?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        // SAFETY: the context is current; the driver checks that `base` starts an allocation
        // it can export (pool memory cannot: an error, answered as no handle).
        let r = unsafe { sys::cuIpcGetMemHandle(&mut handle, base) };
        Ok((r == CUresult::CUDA_SUCCESS).then(|| handle.reserved.map(|b| b as u8)))
    }

    fn open(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> TResult<Box<dyn ImportedMemory>> {
        let key = self.ctx.raw() as usize;
        let mut list = opened();
        if let Some(o) = list.iter_mut().find(|o| o.ctx == key && o.handle == *handle) {
            o.users += 1;
            return Ok(Box::new(Opened { ptr: o.ptr, ctx: self.ctx.clone() }));
        }
        let _current = self.ctx.enter().map_err(transport_error)?;
        let h = sys::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut ptr = 0u64;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the context is current; the handle is plain bytes the driver validates.
        check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) }, "cuIpcOpenMemHandle")
            .map_err(transport_error)?;
        list.push(OpenHandle { ctx: key, handle: *handle, ptr, users: 1 });
        Ok(Box::new(Opened { ptr, ctx: self.ctx.clone() }))
    }

    unsafe fn register(&self, addr: usize, len: usize) -> TResult<Box<dyn RegisteredHost>> {
        let _current = self.ctx.enter().map_err(transport_error)?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        let host = addr as *mut std::ffi::c_void;
        // SAFETY: mapped host memory that outlives the registration (this fn's contract).
        check(unsafe { sys::cuMemHostRegister_v2(host, len, flags) }, "cuMemHostRegister").map_err(transport_error)?;
        // Unregisters on drop, should the next call fail.
        let mut registered = Registered { host: addr, device: 0, ctx: self.ctx.clone() };
        check(
            // SAFETY: registered just now; the out-pointer is a field of a local.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut registered.device, host, 0) },
            "cuMemHostGetDevicePointer",
        )
        .map_err(transport_error)?;
        Ok(Box::new(registered))
    }

    fn queue(&self) -> TResult<Box<dyn DeviceQueue>> {
        let stream = Stream::new(&self.ctx).map_err(transport_error)?;
        Ok(Box::new(Queue { stream, ctx: self.ctx.clone() }))
    }

    fn dmabuf(&self, base: u64, len: u64) -> TResult<Option<OwnedFd>> {
        let supported = *self
            .dmabuf
            .get_or_init(|| self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) == Some(1));
        if !supported {
            return Ok(None);
        }
        let Ok(len) = usize::try_from(len) else { return Ok(None) };
        let _current = self.ctx.enter().map_err(transport_error)?;
        let mut fd: std::ffi::c_int = -1;
        let kind = sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
        // SAFETY: the context is current; the out-pointer is a local `int`, as the handle type
        // asks; the driver checks the range (page aligned, inside its memory).
        let r =
            unsafe { sys::cuMemGetHandleForAddressRange((&mut fd as *mut std::ffi::c_int).cast(), base, len, kind, 0) };
        // Memory the driver does not export (an error) is received through host memory.
        if r != CUresult::CUDA_SUCCESS || fd < 0 {
            return Ok(None);
        }
        // SAFETY: a descriptor the driver just opened for the caller, owned by nothing else.
        Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn flush_rdma_writes(&self) -> TResult<()> {
        // A device that orders GPUDirect RDMA writes for its own work needs no flush (NCCL asks
        // the same two attributes); one that does not, and cannot flush from the host, is left
        // as it is (NCCL's fallback, an RDMA read through a loopback queue pair, is not built).
        let needed = *self.flush.get_or_init(|| {
            let ordering = self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING);
            let options = self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS);
            let owner = sys::CUGPUDirectRDMAWritesOrdering::CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER as i32;
            let host = sys::CUflushGPUDirectRDMAWritesOptions::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST as i32;
            ordering.is_some_and(|o| o < owner) && options.is_some_and(|o| o & host != 0)
        });
        if !needed {
            return Ok(());
        }
        let _current = self.ctx.enter().map_err(transport_error)?;
        let target = sys::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX;
        let scope = sys::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER;
        // SAFETY: the context is current; the call takes no pointers.
        check(unsafe { sys::cuFlushGPUDirectRDMAWrites(target, scope) }, "cuFlushGPUDirectRDMAWrites")
            .map_err(transport_error)
    }
}

impl CudaIpc {
    /// Device attribute `a`, if the driver answers.
    fn attribute(&self, a: CUdevice_attribute) -> Option<i32> {
        let dev = device_handle(self.id.ordinal).ok()?;
        let mut v = 0;
        // SAFETY: a device of the initialised driver; the out-pointer is a local.
        let r = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
        (r == CUresult::CUDA_SUCCESS).then_some(v)
    }
}

//! Allocations, copies, memsets and pointer queries.

use std::ffi::{c_uchar, c_uint, c_void};

use super::{edge, Out};
use crate::copy::{self, Mode};
use crate::sys::{CUdeviceptr, CUresult, CUstream};
use crate::{attributes, memory};

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(dptr) }?;
        out.set(memory::alloc(bytesize)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    edge(|| memory::free(dptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(dptr) }?;
        out.set(memory::alloc_async(bytesize, stream as usize)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    edge(|| memory::free_async(dptr, stream as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pp) }?;
        out.set(memory::host_alloc(bytesize, flags)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuMemHostAlloc(pp, bytesize, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    edge(|| memory::free_host(p))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pdptr) }?;
        out.set(memory::host_device_pointer(p, flags)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    edge(|| memory::host_register(p, bytesize, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    edge(|| memory::host_unregister(p))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) -> CUresult {
    edge(|| copy::htod(dst, src, n, s as usize, Mode::Async))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult {
    edge(|| copy::dtoh(dst, src, n, s as usize, Mode::Async))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult {
    edge(|| copy::dtod(dst, src, n, s as usize, Mode::Async))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult {
    edge(|| copy::unified(dst, src, n, s as usize, Mode::Async))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    edge(|| copy::htod(dst, src, n, 0, Mode::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    edge(|| copy::dtoh(dst, src, n, 0, Mode::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    edge(|| copy::dtod(dst, src, n, 0, Mode::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    edge(|| copy::unified(dst, src, n, 0, Mode::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, value: c_uchar, n: usize, s: CUstream) -> CUresult {
    edge(|| copy::memset_d8(dst, value, n, s as usize, Mode::Async))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: c_uchar, n: usize) -> CUresult {
    edge(|| copy::memset_d8(dst, value, n, 0, Mode::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    edge(|| {
        let (base, size) = attributes::address_range(dptr)?;
        // Either out-pointer may be NULL.
        if !pbase.is_null() {
            // SAFETY: a non-NULL out-pointer from the caller.
            unsafe { Out::new(pbase) }?.set(base);
        }
        if !psize.is_null() {
            // SAFETY: as above.
            unsafe { Out::new(psize) }?.set(size);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointers.
        let (free, total) = unsafe { (Out::new(free)?, Out::new(total)?) };
        let (f, t) = memory::info()?;
        free.set(f);
        total.set(t);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_uint, ptr: CUdeviceptr) -> CUresult {
    edge(|| {
        if data.is_null() {
            return Err(CUresult::INVALID_VALUE);
        }
        let v = attributes::get(attribute, ptr)?;
        // SAFETY: `data` is the caller's variable of the attribute's type.
        unsafe { v.write(data) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    num: c_uint,
    attributes: *mut c_uint,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    edge(|| {
        if num == 0 || attributes.is_null() || data.is_null() {
            return Err(CUresult::INVALID_VALUE);
        }
        // SAFETY: the caller passes `num` attributes and `num` data pointers.
        let (attrs, data) = unsafe {
            (std::slice::from_raw_parts(attributes, num as usize), std::slice::from_raw_parts(data, num as usize))
        };
        if data.iter().any(|d| d.is_null()) {
            return Err(CUresult::INVALID_VALUE);
        }
        for (v, &d) in attributes::get_many(attrs, ptr)?.into_iter().zip(data) {
            // SAFETY: each data pointer is the caller's variable of its attribute's type.
            unsafe { v.write(d) };
        }
        Ok(())
    })
}

/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const RANGE_HANDLE_DMA_BUF_FD: u32 = 1;
/// `CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE` (CUDA 12.8): the only flag there is.
const RANGE_FLAG_MAPPING_TYPE_PCIE: u64 = 1;

/// The caller owns the descriptor written to `handle` (an `int`) and closes it.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetHandleForAddressRange(
    handle: *mut c_void,
    dptr: CUdeviceptr,
    size: usize,
    handle_type: c_uint,
    flags: u64,
) -> CUresult {
    edge(|| {
        if handle_type != RANGE_HANDLE_DMA_BUF_FD || flags & !RANGE_FLAG_MAPPING_TYPE_PCIE != 0 {
            return Err(CUresult::INVALID_VALUE);
        }
        // SAFETY: the caller's out-pointer, an `int` for this handle type.
        let out = unsafe { Out::new(handle.cast::<std::ffi::c_int>()) }?;
        out.set(std::os::fd::IntoRawFd::into_raw_fd(memory::dmabuf(dptr, size)?));
        Ok(())
    })
}

/// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX`, `_TO_OWNER`, `_TO_ALL_DEVICES`.
const FLUSH_TARGET_CURRENT_CTX: c_uint = 0;
const FLUSH_TO_OWNER: c_uint = 100;
const FLUSH_TO_ALL_DEVICES: c_uint = 200;

/// The stand-in NIC's writes land in the memfd at once: nothing to wait for, but the rules of
/// the call are the driver's (a current context, known target and scope), and calls are
/// counted (`memory::rdma_flushes`).
#[no_mangle]
pub unsafe extern "C" fn cuFlushGPUDirectRDMAWrites(target: c_uint, scope: c_uint) -> CUresult {
    edge(|| {
        crate::context::current()?;
        if target != FLUSH_TARGET_CURRENT_CTX || !matches!(scope, FLUSH_TO_OWNER | FLUSH_TO_ALL_DEVICES) {
            return Err(CUresult::INVALID_VALUE);
        }
        memory::count_rdma_flush();
        Ok(())
    })
}

//! The exported C functions, with rdma-core's signatures and error conventions: calls returning
//! a pointer answer NULL and set `errno`; calls returning `int` answer 0 or an errno value
//! (`ibv_query_gid`: -1 with `errno`, as rdma-core). Every body runs behind `fence` (no panic
//! reaches C) and refuses pointers that are not live objects of ours with `EINVAL`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::device::{self, GID_TBL_LEN};
use crate::sys::*;
use crate::util::{fence, set_errno};
use crate::{cq, modify, mr, qp, registry};

/// A pointer result: the pointer, or NULL with `errno`.
fn ptr_result<T>(r: Result<*mut T, c_int>) -> *mut T {
    r.unwrap_or_else(|e| {
        set_errno(e);
        std::ptr::null_mut()
    })
}

/// # Safety
/// `num_devices` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    fence("ibv_get_device_list", std::ptr::null_mut(), || {
        let set_num = |n: c_int| {
            if !num_devices.is_null() {
                // SAFETY: non-null, and the caller's to write (rdma-core's contract).
                unsafe { *num_devices = n };
            }
        };
        let devices = match device::list() {
            Ok(d) => d,
            Err(e) => {
                set_num(0);
                set_errno(e);
                return std::ptr::null_mut();
            }
        };
        // SAFETY: calloc of n + 1 pointers; checked for NULL below.
        let list = unsafe { libc::calloc(devices.len() + 1, std::mem::size_of::<*mut ibv_device>()) };
        let list = list.cast::<*mut ibv_device>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return list.cast();
        }
        for (i, d) in devices.iter().enumerate() {
            // SAFETY: i < n and the allocation holds n + 1 pointers (the last stays NULL).
            unsafe { *list.add(i) = device::device_ptr(d) };
        }
        set_num(devices.len() as c_int);
        list
    })
}

/// # Safety
/// `list` comes from `ibv_get_device_list` (or is NULL).
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the list was calloc'ed by ibv_get_device_list (free(NULL) is a no-op).
    fence("ibv_free_device_list", (), || unsafe { libc::free(list.cast()) })
}

/// # Safety
/// None: foreign pointers are refused.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    fence("ibv_get_device_name", std::ptr::null(), || match device::device(device) {
        Some(d) => d.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            std::ptr::null()
        }
    })
}

/// The node GUID, big-endian (`__be64`).
///
/// # Safety
/// None: foreign pointers are refused (answering 0).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    fence("ibv_get_device_guid", 0, || {
        device::device(device).map_or(0, |d| u64::from_ne_bytes(device::guid_bytes(d.index)))
    })
}

/// # Safety
/// None: foreign pointers are refused.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    fence("ibv_open_device", std::ptr::null_mut(), || ptr_result(device::open_device(device)))
}

/// # Safety
/// None: foreign pointers are refused.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    fence("ibv_close_device", libc::EIO, || device::close_device(context))
}

/// # Safety
/// `attr` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    fence("ibv_query_device", libc::EIO, || {
        let Some(ctx) = registry::ctx(context) else { return libc::EINVAL };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-null, and the caller's to write.
        unsafe { attr.write(device::device_attr(ctx.dev)) };
        0
    })
}

/// # Safety
/// `attr` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(context: *mut ibv_context, port_num: u8, attr: *mut ibv_port_attr) -> c_int {
    fence("ibv_query_port", libc::EIO, || {
        let Some(ctx) = registry::ctx(context) else { return libc::EINVAL };
        if port_num != 1 || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-null, and the caller's to write.
        unsafe { attr.write(device::port_attr(ctx.dev)) };
        0
    })
}

/// 0, or -1 with `errno` (as rdma-core's `ibv_query_gid`).
///
/// # Safety
/// `gid` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    fence("ibv_query_gid", -1, || {
        let found = registry::ctx(context).filter(|_| port_num == 1 && !gid.is_null() && index < GID_TBL_LEN);
        match found.and_then(|ctx| device::gid(ctx.dev, index)) {
            Some(g) => {
                // SAFETY: non-null, and the caller's to write.
                unsafe { gid.write(g) };
                0
            }
            None => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })
}

/// # Safety
/// None: foreign pointers are refused.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    fence("ibv_alloc_pd", std::ptr::null_mut(), || ptr_result(mr::alloc_pd(context)))
}

/// `EBUSY` while MRs or QPs use the PD.
///
/// # Safety
/// None: foreign pointers are refused.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    fence("ibv_dealloc_pd", libc::EIO, || mr::dealloc_pd(pd))
}

/// # Safety
/// None: the range is checked against the process's mappings.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    fence("ibv_reg_mr", std::ptr::null_mut(), || ptr_result(mr::reg_mr(pd, addr, length, access)))
}

/// Only `iova == addr` is emulated (else `EINVAL`).
///
/// # Safety
/// None: the range is checked against the process's mappings.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    fence("ibv_reg_mr_iova2", std::ptr::null_mut(), || {
        if iova != addr as u64 {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        ptr_result(mr::reg_mr(pd, addr, length, access as c_int))
    })
}

/// A dma-buf registration: the descriptor is mapped (as the kernel attaches the buffer) and
/// the NIC reaches the memory through that mapping; `iova` is the region's address on the
/// wire. The stand-in CUDA driver's dma-bufs are memfds positioned at the range's first byte,
/// and `offset` counts from that position. `EOPNOTSUPP` under `TOPOCCL_STANDIN_IB_DMABUF=0`.
///
/// # Safety
/// None: the descriptor and range are checked.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    fence("ibv_reg_dmabuf_mr", std::ptr::null_mut(), || {
        ptr_result(mr::reg_dmabuf_mr(pd, offset, length, iova, fd, access))
    })
}

/// # Safety
/// None: foreign pointers are refused.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    fence("ibv_dereg_mr", libc::EIO, || mr::dereg_mr(mr))
}

/// Completion channels are not emulated (`channel` must be NULL, `comp_vector` 0).
///
/// # Safety
/// None: foreign pointers are refused.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    fence("ibv_create_cq", std::ptr::null_mut(), || {
        ptr_result(cq::create_cq(context, cqe, cq_context, channel, comp_vector))
    })
}

/// `EBUSY` while a QP uses the CQ.
///
/// # Safety
/// None: foreign pointers are refused.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    fence("ibv_destroy_cq", libc::EIO, || cq::destroy_cq(cq))
}

/// RC only. The granted capabilities (exactly those asked) are written back.
///
/// # Safety
/// `init_attr` is valid and writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    fence("ibv_create_qp", std::ptr::null_mut(), || {
        if init_attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: non-null, and the caller's (rdma-core's contract).
        ptr_result(qp::create_qp(pd, unsafe { &mut *init_attr }))
    })
}

/// # Safety
/// `attr` is valid.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int {
    fence("ibv_modify_qp", libc::EIO, || {
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-null, and the caller's (rdma-core's contract).
        modify::modify_qp(qp, unsafe { &*attr }, attr_mask)
    })
}

/// Fills every attribute whatever the mask (as mlx5 does).
///
/// # Safety
/// `attr` and `init_attr` are valid and writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    fence("ibv_query_qp", libc::EIO, || {
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-null, and the caller's to write (rdma-core's contract).
        qp::query_qp(qp, unsafe { &mut *attr }, unsafe { &mut *init_attr })
    })
}

/// # Safety
/// None: foreign pointers are refused.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    fence("ibv_destroy_qp", libc::EIO, || qp::destroy_qp(qp))
}

/// Nothing to prepare: 0.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// rdma-core's names of completion statuses.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    let s: &'static CStr = match status as u32 {
        WC_SUCCESS => c"success",
        WC_LOC_LEN_ERR => c"local length error",
        WC_LOC_QP_OP_ERR => c"local QP operation error",
        3 => c"local EE context operation error",
        WC_LOC_PROT_ERR => c"local protection error",
        WC_WR_FLUSH_ERR => c"Work Request Flushed Error",
        6 => c"memory management operation error",
        7 => c"bad response error",
        8 => c"local access error",
        WC_REM_INV_REQ_ERR => c"remote invalid request error",
        WC_REM_ACCESS_ERR => c"remote access error",
        WC_REM_OP_ERR => c"remote operation error",
        WC_RETRY_EXC_ERR => c"transport retry counter exceeded",
        WC_RNR_RETRY_EXC_ERR => c"RNR retry counter exceeded",
        14 => c"local RDD violation error",
        15 => c"remote invalid RD request",
        16 => c"aborted error",
        17 => c"invalid EE context number",
        18 => c"invalid EE context state",
        19 => c"fatal error",
        20 => c"response timeout error",
        WC_GENERAL_ERR => c"general error",
        22 => c"TM error",
        23 => c"TM Rendezvous error",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// Asynchronous events are not emulated: none ever comes. Blocks until the context is closed,
/// then answers -1 with `EBADF` (as when rdma-core's async fd is closed).
///
/// # Safety
/// None: the event is never written.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(context: *mut ibv_context, _event: *mut c_void) -> c_int {
    fence("ibv_get_async_event", -1, || {
        while registry::ctx(context).is_some() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        set_errno(libc::EBADF);
        -1
    })
}

/// Nothing to acknowledge (no event is ever handed out).
#[no_mangle]
pub extern "C" fn ibv_ack_async_event(_event: *mut c_void) {}

/// rdma-core's names of asynchronous event types.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    let names: [&'static CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    usize::try_from(event).ok().and_then(|i| names.get(i)).map_or(c"unknown".as_ptr(), |s| s.as_ptr())
}

//! Windows and one-sided operations on host memory (see `crate::window` for the protocol).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

use topoccl::Buffer;

use super::{dtype_of, export, guard, no_stream, rank_of};
use crate::abi::*;
use crate::error::{invalid, Result};
use crate::handle::{self, Handle};
use crate::log::{self, Subsys};
use crate::raw;
use crate::window::{self, Put};

/// What an `ncclWindow_t` points at.
struct WindowHandle {
    comm: usize,
    number: u32,
}

fn live() -> MutexGuard<'static, Vec<usize>> {
    static LIVE: OnceLock<Mutex<Vec<usize>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new())).lock().unwrap_or_else(|p| p.into_inner())
}

/// The window behind a caller's handle, checked to be live and of `comm`: its number.
fn window_of(win: ncclWindow_t, comm: ncclComm_t) -> Result<u32> {
    if win.is_null() || !live().contains(&(win as usize)) {
        return Err(invalid(format!("{win:p} is not a registered window")));
    }
    // SAFETY: the pointer is in the live table, so it came from `Box::into_raw` in `register`
    // and has not been freed (deregistration removes it from the table first, under its lock;
    // a window is deregistered by the thread that owns it, as NCCL requires).
    let w = unsafe { &*(win as *const WindowHandle) };
    if w.comm != comm as usize {
        return Err(invalid(format!("window {win:p} belongs to another communicator")));
    }
    Ok(w.number)
}

fn register(comm: ncclComm_t, buff: *mut c_void, size: usize, out: *mut ncclWindow_t, flags: c_int) -> ncclResult_t {
    guard("ncclCommWindowRegister", || {
        let h = handle::lookup(comm)?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, std::ptr::null_mut(), "win") }?;
        if buff.is_null() || size == 0 {
            return Err(invalid("buff is NULL or size is 0"));
        }
        if !(0..=3).contains(&flags) {
            return Err(invalid(format!("winFlags {flags:#x}: NCCL_WIN_DEFAULT, _COLL_SYMMETRIC, _STRICT_ORDERING")));
        }
        h.identity()?;
        let number = h.windows.lock().unwrap_or_else(|p| p.into_inner()).register(buff as usize, size)?;
        let ptr = Box::into_raw(Box::new(WindowHandle { comm: comm as usize, number })) as ncclWindow_t;
        live().push(ptr as usize);
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, ptr, "win") }?;
        log::info(Subsys::Reg, Some(h.rank_hint()), format_args!("window {number}: {size} bytes at {buff:p}"));
        Ok(NCCL_SUCCESS)
    })
}

fn deregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    guard("ncclCommWindowDeregister", || {
        let h = handle::lookup(comm)?;
        let number = window_of(win, comm)?;
        h.windows.lock().unwrap_or_else(|p| p.into_inner()).deregister(number)?;
        let mut table = live();
        if let Some(i) = table.iter().position(|&p| p == win as usize) {
            table.swap_remove(i);
            // SAFETY: it was in the live table (checked under this lock), so it is a
            // `Box<WindowHandle>` not yet freed; removing the entry frees it exactly once.
            drop(unsafe { Box::from_raw(win as *mut WindowHandle) });
        }
        Ok(NCCL_SUCCESS)
    })
}

fn user_ptr(comm: ncclComm_t, win: ncclWindow_t, out: *mut *mut c_void) -> ncclResult_t {
    guard("ncclWinGetUserPtr", || {
        let h = handle::lookup(comm)?;
        let number = window_of(win, comm)?;
        let (base, _) = h.windows.lock().unwrap_or_else(|p| p.into_inner()).get(number)?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, base as *mut c_void, "outUserPtr") }?;
        Ok(NCCL_SUCCESS)
    })
}

/// Signal indices and contexts are non-negative ints; `flags` are reserved (0).
fn signal_args(sig_idx: c_int, ctx: c_int, flags: c_uint) -> Result<(u32, u32)> {
    if flags != 0 {
        return Err(invalid(format!("flags {flags:#x}: reserved, must be 0")));
    }
    let sig = u32::try_from(sig_idx).map_err(|_| invalid(format!("sigIdx {sig_idx} is negative")))?;
    let ctx = u32::try_from(ctx).map_err(|_| invalid(format!("ctx {ctx} is negative")))?;
    Ok((sig, ctx))
}

fn peer_of(h: &Handle, peer: c_int) -> Result<u32> {
    rank_of("peer", peer, h.identity()?.1)
}

#[allow(clippy::too_many_arguments)]
fn put_signal(
    local: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    win: ncclWindow_t,
    offset: usize,
    sig_idx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclPutSignal", || {
        let h = handle::lookup(comm)?;
        no_stream(stream)?;
        let dtype = dtype_of(datatype)?;
        let peer = peer_of(&h, peer)?;
        let window = window_of(win, comm)?;
        let (signal, ctx) = signal_args(sig_idx, ctx, flags)?;
        let bytes = count.checked_mul(dtype.size()).ok_or_else(|| invalid(format!("count {count} overflows")))?;
        if bytes > 0 && local.is_null() {
            return Err(invalid("localbuff is NULL"));
        }
        let put = Put { window, signal, ctx, offset: offset as u64, bytes: bytes as u64 };
        h.with_comm(|c| {
            // SAFETY: the caller's buffer holds `count` elements for the call (NCCL's contract);
            // `send` returns once the bytes are sent.
            unsafe { window::send(c, &h.windows, peer, put, Buffer::host(local)) }
        })?;
        Ok(NCCL_SUCCESS)
    })
}

fn signal(
    peer: c_int,
    sig_idx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclSignal", || {
        let h = handle::lookup(comm)?;
        no_stream(stream)?;
        let peer = peer_of(&h, peer)?;
        let (signal, ctx) = signal_args(sig_idx, ctx, flags)?;
        h.with_comm(|c| {
            // SAFETY: a signal carries no data.
            unsafe { window::send(c, &h.windows, peer, window::signal_only(signal, ctx), Buffer::NULL) }
        })?;
        Ok(NCCL_SUCCESS)
    })
}

fn wait_signal(
    n_desc: c_int,
    descs: *mut ncclWaitSignalDesc_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclWaitSignal", || {
        let h = handle::lookup(comm)?;
        no_stream(stream)?;
        let n = usize::try_from(n_desc).map_err(|_| invalid(format!("nDesc {n_desc} is negative")))?;
        if n == 0 {
            return Ok(NCCL_SUCCESS);
        }
        // SAFETY: `descs` is NULL or an array of `nDesc` descriptors (the API's contract).
        let list = unsafe { raw::array(descs, n, "signalDescs") }?;
        for d in list {
            let peer = peer_of(&h, d.peer)?;
            let (signal, ctx) = signal_args(d.sig_idx, d.ctx, 0)?;
            let count = u64::try_from(d.op_cnt).map_err(|_| invalid(format!("opCnt {} is negative", d.op_cnt)))?;
            h.with_comm(|c| window::wait(c, &h.windows, peer, signal, ctx, count))?;
        }
        Ok(NCCL_SUCCESS)
    })
}

export! {
    /// Registers a window (collective: every rank registers its own, in the same order).
    ncclCommWindowRegister / pncclCommWindowRegister (comm: ncclComm_t, buff: *mut c_void, size: usize, win: *mut ncclWindow_t, win_flags: c_int) -> ncclResult_t = register
}
export! {
    /// Ends a window registration.
    ncclCommWindowDeregister / pncclCommWindowDeregister (comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t = deregister
}
export! {
    /// The address this rank registered the window at.
    ncclWinGetUserPtr / pncclWinGetUserPtr (comm: ncclComm_t, win: ncclWindow_t, out_user_ptr: *mut *mut c_void) -> ncclResult_t = user_ptr
}
export! {
    /// Writes `count` elements into `peer`'s window at `peerWinOffset` bytes and signals `sigIdx`.
    ncclPutSignal / pncclPutSignal (localbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, peer_win: ncclWindow_t, peer_win_offset: usize, sig_idx: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = put_signal
}
export! {
    /// Signals `sigIdx` at `peer` without data.
    ncclSignal / pncclSignal (peer: c_int, sig_idx: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = signal
}
export! {
    /// Waits for the signals described (and the data of the puts that carried them).
    ncclWaitSignal / pncclWaitSignal (n_desc: c_int, signal_descs: *mut ncclWaitSignalDesc_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = wait_signal
}

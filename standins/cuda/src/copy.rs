//! Copies and memsets, with CUDA's rules on when host memory is read or written:
//!
//! - an async copy from pageable host memory is staged (copied aside) at call time, so the
//!   caller may reuse the source at once; from pinned memory it is read when the copy runs;
//! - an async copy to pageable host memory returns after the stream ran it (and everything
//!   before it), holding the context's blocking lock while it waits (stream and event creation
//!   wait for it, as on a GPU); to pinned memory it lands when it runs; host to host is
//!   synchronous;
//! - the synchronous copies use the legacy default stream: from pageable memory they wait for
//!   the stream, stage and return (the copy itself may not have run yet), from pinned memory
//!   or to host memory they return after the copy ran, device to device they do not wait.
//!
//! Every device range must lie wholly inside one allocation that the stream's context may
//! touch (`CUDA_ERROR_INVALID_VALUE` at call time); memory freed before the copy runs makes
//! the context fail with `CUDA_ERROR_ILLEGAL_ADDRESS`.

use std::ffi::c_void;
use std::sync::Arc;

use crate::context::{self, CtxCore};
use crate::memory::{self, Region};
use crate::stream::{self, Stream};
use crate::sys::{CUresult, CuResult};

/// Which host-synchronisation rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `cuMemcpy*Async`, `cuMemsetD8Async`.
    Async,
    /// `cuMemcpyHtoD_v2`, `cuMemcpyDtoH_v2`, `cuMemcpyDtoD_v2`, `cuMemsetD8_v2`.
    Sync,
}

/// One end of a copy.
enum End {
    /// Device memory (own, pool or IPC).
    Device(Region),
    /// Pinned host memory: also reachable by the device.
    Pinned(Region),
    /// Host memory the driver does not know.
    Pageable(u64),
}

impl End {
    fn is_host(&self) -> bool {
        !matches!(self, End::Device(_))
    }
}

fn known(r: Region) -> End {
    if r.alloc.is_device() {
        End::Device(r)
    } else {
        End::Pinned(r)
    }
}

/// A device-side end: device memory, or pinned memory through its (identical) device address.
fn device_end(addr: u64, len: usize, ctx: &CtxCore, write: bool) -> CuResult<End> {
    memory::device_region(addr, len, ctx, write).map(known)
}

/// A host-side end of a typed copy: pinned if the driver knows it, else pageable; a device
/// pointer passed as host memory is `CUDA_ERROR_INVALID_VALUE`.
fn host_end(addr: u64, len: usize, ctx: &CtxCore, write: bool) -> CuResult<End> {
    if addr == 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    match memory::find(addr) {
        None => Ok(End::Pageable(addr)),
        Some(a) if a.is_device() => Err(CUresult::INVALID_VALUE),
        Some(_) => device_end(addr, len, ctx, write),
    }
}

/// An end of `cuMemcpyAsync`: whatever the address is.
fn any_end(addr: u64, len: usize, ctx: &CtxCore, write: bool) -> CuResult<End> {
    match memory::find(addr) {
        None if addr != 0 => Ok(End::Pageable(addr)),
        None => Err(CUresult::INVALID_VALUE),
        Some(_) => device_end(addr, len, ctx, write),
    }
}

/// Where a copy reads from when it runs.
enum Source {
    Staged(Vec<u8>),
    /// Pageable memory read when the copy runs (a captured copy).
    Host(u64),
    Region(Region),
}

/// The stream a copy goes on: the legacy stream for synchronous calls. Copies need a current
/// context even with an explicit stream (the progress-thread rule).
fn stream_for(stream: usize, mode: Mode) -> CuResult<std::sync::Arc<Stream>> {
    context::current()?;
    stream::resolve(if mode == Mode::Sync { 0 } else { stream })
}

fn copy(dst: End, src: End, len: usize, s: &Stream, mode: Mode) -> CuResult<()> {
    let (host_src, host_dst) = (src.is_host(), dst.is_host());
    let pageable_src = matches!(src, End::Pageable(_));
    let pageable_dst = matches!(dst, End::Pageable(_));
    let wait = match mode {
        Mode::Async => pageable_dst || (host_src && host_dst),
        Mode::Sync => host_dst || (host_src && !pageable_src),
    };
    let captured = s.capture().is_some();
    if mode == Mode::Sync && pageable_src {
        // "A stream sync is performed before the copy is initiated."
        s.wait_idle();
    }
    let source = match src {
        // A captured copy is a graph node: it reads pageable memory when each launch runs it.
        End::Pageable(addr) if captured => Source::Host(addr),
        End::Pageable(addr) => {
            // SAFETY: the caller passes `len` readable bytes at `addr` (the driver's contract);
            // they are read now, at call time, which is the point of staging.
            Source::Staged(unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec())
        }
        End::Device(r) | End::Pinned(r) => Source::Region(r),
    };
    let seq = s.submit(
        Vec::new(),
        Arc::new(move || {
            let from = match &source {
                Source::Staged(v) => v.as_ptr(),
                Source::Host(addr) => *addr as *const u8,
                Source::Region(r) => {
                    r.check_live()?;
                    r.ptr().cast_const()
                }
            };
            let to = match &dst {
                End::Device(r) | End::Pinned(r) => {
                    r.check_live()?;
                    r.ptr()
                }
                End::Pageable(addr) => *addr as *mut u8,
            };
            // SAFETY: both ranges were checked to hold `len` bytes (regions: inside a live
            // allocation, kept mapped by `Region`; the staging buffer: `len` long; a pageable
            // destination: the caller is blocked in the call until this ran; pageable memory
            // of a captured copy: the caller keeps it valid while the graph may run, as CUDA
            // requires of a graph's memory).
            unsafe { std::ptr::copy(from, to, len) };
            Ok(())
        }),
    )?;
    if wait && !captured {
        let _blocking = pageable_dst.then(|| s.core.blocking.read().unwrap_or_else(|e| e.into_inner()));
        s.wait_for(seq);
        s.core.check()?;
    }
    Ok(())
}

/// `cuMemcpyHtoD(Async)_v2`.
pub fn htod(dst: u64, src: *const c_void, len: usize, stream: usize, mode: Mode) -> CuResult<()> {
    let s = stream_for(stream, mode)?;
    if len == 0 {
        return Ok(());
    }
    let dst = device_end(dst, len, &s.core, true)?;
    let src = host_end(src as u64, len, &s.core, false)?;
    copy(dst, src, len, &s, mode)
}

/// `cuMemcpyDtoH(Async)_v2`.
pub fn dtoh(dst: *mut c_void, src: u64, len: usize, stream: usize, mode: Mode) -> CuResult<()> {
    let s = stream_for(stream, mode)?;
    if len == 0 {
        return Ok(());
    }
    let src = device_end(src, len, &s.core, false)?;
    let dst = host_end(dst as u64, len, &s.core, true)?;
    copy(dst, src, len, &s, mode)
}

/// `cuMemcpyDtoD(Async)_v2`.
pub fn dtod(dst: u64, src: u64, len: usize, stream: usize, mode: Mode) -> CuResult<()> {
    let s = stream_for(stream, mode)?;
    if len == 0 {
        return Ok(());
    }
    let src = device_end(src, len, &s.core, false)?;
    let dst = device_end(dst, len, &s.core, true)?;
    copy(dst, src, len, &s, mode)
}

/// `cuMemcpyAsync` / `cuMemcpy`: directions found from the pointers.
pub fn unified(dst: u64, src: u64, len: usize, stream: usize, mode: Mode) -> CuResult<()> {
    let s = stream_for(stream, mode)?;
    if len == 0 {
        return Ok(());
    }
    let src = any_end(src, len, &s.core, false)?;
    let dst = any_end(dst, len, &s.core, true)?;
    copy(dst, src, len, &s, mode)
}

/// `cuMemsetD8(Async)`: the synchronous one waits only for pinned memory.
pub fn memset_d8(dst: u64, value: u8, len: usize, stream: usize, mode: Mode) -> CuResult<()> {
    let s = stream_for(stream, mode)?;
    if len == 0 {
        return Ok(());
    }
    let r = memory::device_region(dst, len, &s.core, true)?;
    let wait = mode == Mode::Sync && !r.alloc.is_device();
    let seq = s.submit(
        Vec::new(),
        Arc::new(move || {
            r.check_live()?;
            // SAFETY: `r` is `len` bytes inside a live allocation that `r` keeps mapped.
            unsafe { std::ptr::write_bytes(r.ptr(), value, len) };
            Ok(())
        }),
    )?;
    if wait {
        s.wait_for(seq);
        s.core.check()?;
    }
    Ok(())
}

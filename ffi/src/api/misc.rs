//! The version, error strings, memory, buffer registration and PreMulSum operators.

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

use topoccl::{Buffer, Scalar};

use super::{export, guard};
use crate::abi::*;
use crate::error::{describe, invalid, Error};
use crate::handle::{self, PreMulSum};
use crate::log::{self, Subsys};
use crate::raw;

fn version(out: *mut c_int) -> ncclResult_t {
    guard("ncclGetVersion", || {
        log::init();
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, VERSION_CODE, "version") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn error_string(code: ncclResult_t) -> *const c_char {
    describe(code).as_ptr()
}

fn last_error(comm: ncclComm_t) -> *const c_char {
    // NCCL keeps one last-error text (the comm argument is not used); ours is per thread, so
    // concurrent threads do not overwrite each other's.
    let _ = comm;
    super::last_error()
}

/// Allocation granularity of `ncclMemAlloc` on the host (a page, as NCCL's is at least).
const ALIGN: usize = 4096;

/// What `ncclMemAlloc` handed out.
enum Allocation {
    /// Device memory (`cuMemAlloc`, never pool memory: it can be shared by IPC).
    Device(topoccl::cuda::DeviceMemory),
    /// Host memory of this many bytes (no CUDA driver).
    Host(usize),
}

fn allocations() -> MutexGuard<'static, HashMap<usize, Allocation>> {
    static ALLOCS: OnceLock<Mutex<HashMap<usize, Allocation>>> = OnceLock::new();
    ALLOCS.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner())
}

/// Device memory in the context current on this thread, else device 0's primary context (the
/// device a CUDA runtime program that never chose one uses).
fn device_alloc(size: usize) -> topoccl::Result<topoccl::cuda::DeviceMemory> {
    use topoccl::cuda::Context;
    let ctx = match Context::current()? {
        // SAFETY: the caller's current context outlives its allocations (CUDA's own rule).
        Some(raw) => unsafe { Context::adopt(raw) }?,
        None => Context::primary(0)?,
    };
    topoccl::cuda::DeviceMemory::new(&ctx, size)
}

fn mem_alloc(out: *mut *mut c_void, size: usize) -> ncclResult_t {
    guard("ncclMemAlloc", || {
        if out.is_null() {
            return Err(invalid("ptr is NULL"));
        }
        if size == 0 {
            return Err(invalid("size is 0"));
        }
        if topoccl::cuda::driver().is_ok() {
            let m = device_alloc(size)?;
            let p = m.addr() as *mut c_void;
            allocations().insert(m.addr(), Allocation::Device(m));
            // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
            unsafe { raw::put(out, p, "ptr") }?;
            log::info(Subsys::Alloc, None, format_args!("ncclMemAlloc: {size} bytes of device memory at {p:p}"));
            return Ok(NCCL_SUCCESS);
        }
        let layout = Layout::from_size_align(size, ALIGN).map_err(|e| invalid(format!("size {size}: {e}")))?;
        // SAFETY: the layout's size is non-zero (checked above).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(Error::System(format!("out of memory allocating {size} bytes")));
        }
        allocations().insert(p as usize, Allocation::Host(size));
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, p.cast::<c_void>(), "ptr") }?;
        log::info(
            Subsys::Alloc,
            None,
            format_args!("ncclMemAlloc: {size} bytes of host memory at {p:p} (no CUDA driver)"),
        );
        Ok(NCCL_SUCCESS)
    })
}

fn mem_free(ptr: *mut c_void) -> ncclResult_t {
    guard("ncclMemFree", || {
        if ptr.is_null() {
            return Ok(NCCL_SUCCESS);
        }
        let a = allocations()
            .remove(&(ptr as usize))
            .ok_or_else(|| invalid(format!("{ptr:p} was not allocated by ncclMemAlloc (or was freed already)")))?;
        match a {
            // Freed as it goes out of scope (the caller has finished its work on the memory,
            // as NCCL requires of ncclMemFree).
            Allocation::Device(m) => log::info(
                Subsys::Alloc,
                None,
                format_args!("ncclMemFree: {} bytes of device memory at {ptr:p}", m.len()),
            ),
            Allocation::Host(size) => {
                let layout = Layout::from_size_align(size, ALIGN).map_err(|e| invalid(e.to_string()))?;
                // SAFETY: `ptr` was returned by `alloc_zeroed` with this layout (it was in the
                // table, which holds exactly those) and is removed from the table, so freed once.
                unsafe { std::alloc::dealloc(ptr.cast::<u8>(), layout) };
            }
        }
        Ok(NCCL_SUCCESS)
    })
}

fn register(comm: ncclComm_t, buff: *mut c_void, size: usize, out: *mut *mut c_void) -> ncclResult_t {
    guard("ncclCommRegister", || {
        let h = handle::lookup(comm)?;
        if buff.is_null() || size == 0 {
            return Err(invalid("buff is NULL or size is 0"));
        }
        if out.is_null() {
            return Err(invalid("handle is NULL"));
        }
        let space = Buffer::at(buff.cast_const()).space;
        let mut regs = h.registrations.lock().unwrap_or_else(|p| p.into_inner());
        regs.push(Some((buff as usize, size)));
        // Handles are 1-based indices, so none is NULL.
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, regs.len() as *mut c_void, "handle") }?;
        log::info(
            Subsys::Reg,
            Some(h.rank_hint()),
            format_args!(
                "ncclCommRegister: {size} bytes of {space} at {buff:p}, recorded (transfers over shared memory and TCP stage device data through pinned memory and need no registration)"
            ),
        );
        Ok(NCCL_SUCCESS)
    })
}

fn deregister(comm: ncclComm_t, reg: *mut c_void) -> ncclResult_t {
    guard("ncclCommDeregister", || {
        let h = handle::lookup(comm)?;
        let mut regs = h.registrations.lock().unwrap_or_else(|p| p.into_inner());
        let slot = (reg as usize).checked_sub(1).and_then(|i| regs.get_mut(i)).filter(|s| s.is_some());
        match slot {
            Some(s) => *s = None,
            None => return Err(invalid(format!("{reg:p} is not a registration of this communicator"))),
        }
        Ok(NCCL_SUCCESS)
    })
}

fn create_premulsum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: c_int,
    comm: ncclComm_t,
) -> ncclResult_t {
    guard("ncclRedOpCreatePreMulSum", || {
        let h = handle::lookup(comm)?;
        let dtype = super::dtype_of(datatype)?;
        if op.is_null() || scalar.is_null() {
            return Err(invalid("op or scalar is NULL"));
        }
        let scalar = match residence {
            SCALAR_HOST_IMMEDIATE => {
                let mut v = [0u8; 8];
                // SAFETY: a host-immediate scalar points at one element, read now (the API's
                // contract).
                v[..dtype.size()].copy_from_slice(&unsafe { raw::read_bytes(scalar as usize, dtype.size()) }?);
                Scalar::Value(v)
            }
            SCALAR_DEVICE => Scalar::At(Buffer::at(scalar.cast_const())),
            other => return Err(invalid(format!("residence {other} is not an ncclScalarResidence_t"))),
        };
        let mut ops = h.ops.lock().unwrap_or_else(|p| p.into_inner());
        let index = match ops.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                ops.push(None);
                ops.len() - 1
            }
        };
        let id = c_int::try_from(index).ok().and_then(|i| i.checked_add(BUILTIN_OPS)).filter(|i| *i <= 127);
        let Some(id) = id else { return Err(invalid("too many PreMulSum operators on this communicator")) };
        ops[index] = Some(PreMulSum { dtype, scalar });
        // SAFETY: `op` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(op, id, "op") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn destroy_op(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    guard("ncclRedOpDestroy", || {
        let h = handle::lookup(comm)?;
        if (0..BUILTIN_OPS).contains(&op) {
            return Err(invalid(format!("op {op} is built in and cannot be destroyed")));
        }
        let mut ops = h.ops.lock().unwrap_or_else(|p| p.into_inner());
        let slot = usize::try_from(op - BUILTIN_OPS).ok().and_then(|i| ops.get_mut(i)).filter(|s| s.is_some());
        match slot {
            Some(s) => *s = None,
            None => return Err(invalid(format!("op {op} is not an operator of this communicator"))),
        }
        Ok(NCCL_SUCCESS)
    })
}

export! {
    /// `NCCL_VERSION_CODE` of the API this library implements (2.21.5).
    ncclGetVersion / pncclGetVersion (out: *mut c_int) -> ncclResult_t = version
}
export! {
    /// A result code in NCCL's words.
    ncclGetErrorString / pncclGetErrorString (result: ncclResult_t) -> *const c_char = error_string
}
export! {
    /// Why this thread's last failing call failed ("" if none did).
    ncclGetLastError / pncclGetLastError (comm: ncclComm_t) -> *const c_char = last_error
}
export! {
    /// Page-aligned, zeroed host memory (without CUDA every buffer is host memory).
    ncclMemAlloc / pncclMemAlloc (ptr: *mut *mut c_void, size: usize) -> ncclResult_t = mem_alloc
}
export! {
    /// Frees memory from `ncclMemAlloc`.
    ncclMemFree / pncclMemFree (ptr: *mut c_void) -> ncclResult_t = mem_free
}
export! {
    /// Records a buffer registration (host buffers need none; the range is kept and checked).
    ncclCommRegister / pncclCommRegister (comm: ncclComm_t, buff: *mut c_void, size: usize, out: *mut *mut c_void) -> ncclResult_t = register
}
export! {
    /// Ends a registration.
    ncclCommDeregister / pncclCommDeregister (comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t = deregister
}
export! {
    /// An operator that multiplies inputs by `scalar` before summing.
    ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum (op: *mut ncclRedOp_t, scalar: *mut c_void, datatype: ncclDataType_t, residence: c_int, comm: ncclComm_t) -> ncclResult_t = create_premulsum
}
export! {
    /// Frees a PreMulSum operator.
    ncclRedOpDestroy / pncclRedOpDestroy (op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t = destroy_op
}

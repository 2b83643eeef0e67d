//! Streams, events and stream memory operations.

use std::ffi::{c_float, c_int, c_uint};

use super::{edge, Out};
use crate::sys::{CUcontext, CUdeviceptr, CUevent, CUresult, CUstream};
use crate::{event, memop, stream};

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(phstream: *mut CUstream, flags: c_uint) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(phstream) }?;
        out.set(stream::create(flags)? as CUstream);
        Ok(())
    })
}

/// Priorities are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    phstream: *mut CUstream,
    flags: c_uint,
    _priority: c_int,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuStreamCreate(phstream, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: CUstream) -> CUresult {
    edge(|| stream::destroy(s as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    edge(|| stream::lookup(s as usize)?.synchronize())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(s: CUstream) -> CUresult {
    edge(|| stream::lookup(s as usize)?.query())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(s: CUstream, ev: CUevent, flags: c_uint) -> CUresult {
    edge(|| event::wait(s as usize, ev as usize, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(s: CUstream, pctx: *mut CUcontext) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pctx) }?;
        out.set(stream::lookup(s as usize)?.core.handle as CUcontext);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(s: CUstream, flags: *mut c_uint) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(flags) }?;
        out.set(stream::lookup(s as usize)?.flags);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitValue32_v2(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) -> CUresult {
    edge(|| memop::wait_value(s as usize, addr, value, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitValue32(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) -> CUresult {
    edge(|| memop::wait_value(s as usize, addr, value, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWriteValue32_v2(
    s: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> CUresult {
    edge(|| memop::write_value(s as usize, addr, value, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWriteValue32(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) -> CUresult {
    edge(|| memop::write_value(s as usize, addr, value, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(phevent: *mut CUevent, flags: c_uint) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(phevent) }?;
        out.set(event::create(flags)? as CUevent);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(ev: CUevent, s: CUstream) -> CUresult {
    edge(|| event::record(ev as usize, s as usize))
}

/// `CU_EVENT_RECORD_EXTERNAL` (1) is accepted and treated as a plain record.
#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(ev: CUevent, s: CUstream, flags: c_uint) -> CUresult {
    edge(|| {
        if flags > 1 {
            return Err(CUresult::INVALID_VALUE);
        }
        event::record(ev as usize, s as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    edge(|| event::query(ev as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    edge(|| event::synchronize(ev as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(ev: CUevent) -> CUresult {
    edge(|| event::destroy(ev as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut c_float, start: CUevent, end: CUevent) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(ms) }?;
        out.set(event::elapsed_ms(start as usize, end as usize)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut c_float, start: CUevent, end: CUevent) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

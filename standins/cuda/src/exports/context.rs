//! Contexts: primary and created ones, the per-thread current context, peer access.

use std::ffi::{c_int, c_uint, c_void};

use super::{edge, Out};
use crate::context;
use crate::sys::{CUcontext, CUdevice, CUresult};

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pctx) }?;
        out.set(context::primary_retain(dev)? as CUcontext);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    edge(|| context::primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointers.
        let (flags, active) = unsafe { (Out::new(flags)?, Out::new(active)?) };
        let (f, a) = context::primary_state(dev)?;
        flags.set(f);
        active.set(c_int::from(a));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pctx) }?;
        out.set(context::create(flags, dev)? as CUcontext);
        Ok(())
    })
}

/// `cuCtxCreate_v4`: only without creation parameters (no execution affinity, no CIG).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    if !params.is_null() {
        return CUresult::NOT_SUPPORTED;
    }
    // SAFETY: same contract.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    edge(|| context::destroy(ctx as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pctx) }?;
        out.set(context::get_current()? as CUcontext);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    edge(|| context::set_current(ctx as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    edge(|| context::push(ctx as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    edge(|| {
        let popped = context::pop()?;
        if !pctx.is_null() {
            // SAFETY: a non-NULL out-pointer from the caller (NULL is allowed here).
            unsafe { Out::new(pctx) }?.set(popped as CUcontext);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(dev) }?;
        out.set(context::current()?.device());
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    edge(|| context::current()?.synchronize())
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    edge(|| context::enable_peer(peer as usize, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    edge(|| context::disable_peer(peer as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> CUresult {
    edge(|| {
        context::current()?;
        // NULL is allowed for either.
        if !least.is_null() {
            // SAFETY: a non-NULL out-pointer from the caller.
            unsafe { Out::new(least) }?.set(0);
        }
        if !greatest.is_null() {
            // SAFETY: as above.
            unsafe { Out::new(greatest) }?.set(-5);
        }
        Ok(())
    })
}

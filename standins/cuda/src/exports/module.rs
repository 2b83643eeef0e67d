//! Modules, functions and kernel launches.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use super::{edge, Out};
use crate::launch::{self, Dims};
use crate::module;
use crate::sys::{CUfunction, CUmodule, CUresult, CUstream};

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(pmodule: *mut CUmodule, image: *const c_void) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pmodule) }?;
        // SAFETY: the caller's image (a cubin, fatbin or NUL-terminated PTX).
        out.set(unsafe { module::load_data(image.cast()) }? as CUmodule);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(pfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pfunc) }?;
        if name.is_null() {
            return Err(CUresult::INVALID_VALUE);
        }
        // SAFETY: a non-NULL C string from the caller.
        let name = unsafe { CStr::from_ptr(name) };
        out.set(module::get_function(hmod as usize, name)? as CUfunction);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    edge(|| module::unload(hmod as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let dims = Dims { grid: [grid_x, grid_y, grid_z], block: [block_x, block_y, block_z], shared_bytes };
    // SAFETY: the caller's kernel parameter array.
    edge(|| unsafe { launch::launch(f as usize, dims, s as usize, params, extra) })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncLoad(f: CUfunction) -> CUresult {
    edge(|| module::func_load(f as usize))
}

/// `CU_FUNCTION_LOADING_STATE_UNLOADED` (0) or `_LOADED` (1).
#[no_mangle]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut c_int, f: CUfunction) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(state) }?;
        let func = module::function(f as usize)?;
        out.set(c_int::from(module::is_loaded(&func)));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(value: *mut c_int, attrib: c_int, f: CUfunction) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(value) }?;
        out.set(module::attribute(f as usize, attrib)?);
        Ok(())
    })
}

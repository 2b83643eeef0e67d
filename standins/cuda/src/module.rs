//! Modules and functions: `cuModuleLoadData` refuses what the device could not run (a cubin
//! of another SM major or a newer SM, PTX for a newer SM or of a newer ISA than the driver
//! knows); `cuModuleGetFunction` finds only kernels that are both in the image and among the
//! host-compiled kernels (`topoccl_kernels_host::find`).
//!
//! Loading kernels synchronises the context, as CUDA's lazy loading may ("Lazy Loading:
//! potential hazards"): the first `cuModuleGetFunction` of each kernel waits for all of the
//! context's work (with `CUDA_MODULE_LOADING=EAGER`, `cuModuleLoadData` does, once). With
//! `TOPOCCL_STANDIN_LAZY=launch`, as CUDA 12.4+ documents it ("the function retrieved may be
//! partially loaded"), the lookup loads nothing and the kernel's first `cuLaunchKernel` loads
//! it, unless `cuFuncLoad` or `cuFuncGetAttribute` did before. A library that loads a kernel
//! while a stream of the context waits for that library's own later work hangs here as it
//! does on a GPU.

use std::collections::HashSet;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use topoccl_kernels_host::HostKernel;

use crate::config;
use crate::context;
use crate::handle::{fresh, lock, Registry};
use crate::image::{self, Image};
use crate::sys::{CUresult, CuResult};

pub struct Module {
    pub handle: usize,
    pub ctx: usize,
    names: Vec<String>,
    /// Kernels loaded so far (all of them once loaded eagerly).
    loaded: Mutex<HashSet<String>>,
}

pub struct Function {
    pub handle: usize,
    pub module: usize,
    pub ctx: usize,
    pub kernel: &'static HostKernel,
    name: String,
}

static MODULES: Registry<Module> = Registry::new();
static FUNCTIONS: Registry<Function> = Registry::new();

/// Whether a device of compute capability `device_sm` can run `image`.
pub fn check_target(image: &Image, device_sm: u32, max_isa: u32) -> CuResult<()> {
    match *image {
        Image::Cubin { sm, .. } if sm / 10 != device_sm / 10 || sm > device_sm => Err(CUresult::NO_BINARY_FOR_GPU),
        Image::Ptx { isa, .. } if isa > max_isa => Err(CUresult::UNSUPPORTED_PTX_VERSION),
        Image::Ptx { target, arch_specific, .. } if target > device_sm || (arch_specific && target != device_sm) => {
            Err(CUresult::NO_BINARY_FOR_GPU)
        }
        _ => Ok(()),
    }
}

/// `cuModuleLoadData`.
///
/// # Safety
/// `image` must point at a complete cubin or NUL-terminated PTX.
pub unsafe fn load_data(image: *const u8) -> CuResult<usize> {
    let ctx = context::current()?;
    ctx.core.resource_call("cuModuleLoadData", false);
    // SAFETY: passed on from the caller.
    let img = unsafe { image::read(image) }?;
    let c = config::get()?;
    check_target(&img, c.sm, c.max_ptx_isa())?;
    let names = img.names().to_vec();
    let loaded = if c.lazy_loading {
        HashSet::new()
    } else {
        ctx.drain_for("cuModuleLoadData (CUDA_MODULE_LOADING=EAGER) synchronises the context");
        names.iter().cloned().collect()
    };
    let handle = fresh();
    MODULES.insert(handle, Arc::new(Module { handle, ctx: ctx.handle(), names, loaded: Mutex::new(loaded) }));
    Ok(handle)
}

/// `cuModuleGetFunction`: `CUDA_ERROR_NOT_FOUND` unless the name is in the image and has a
/// host-compiled kernel.
pub fn get_function(module: usize, name: &CStr) -> CuResult<usize> {
    let c = config::get()?;
    let m = MODULES.get(module).ok_or(CUresult::INVALID_HANDLE)?;
    context::lookup(m.ctx)?.core.resource_call("cuModuleGetFunction", false);
    let name = name.to_str().map_err(|_| CUresult::NOT_FOUND)?;
    if !m.names.iter().any(|n| n == name) {
        return Err(CUresult::NOT_FOUND);
    }
    let kernel = topoccl_kernels_host::find(name).ok_or(CUresult::NOT_FOUND)?;
    let f = Function { handle: fresh(), module, ctx: m.ctx, kernel, name: name.to_string() };
    if !c.load_at_launch {
        load(&f, "cuModuleGetFunction's lazy load of a kernel synchronises the context")?;
    }
    let handle = f.handle;
    FUNCTIONS.insert(handle, Arc::new(f));
    Ok(handle)
}

/// Whether `f`'s kernel is loaded (`cuFuncIsLoaded`).
pub fn is_loaded(f: &Function) -> bool {
    MODULES.get(f.module).is_some_and(|m| lock(&m.loaded).contains(&f.name))
}

/// Loads `f`'s kernel unless it is: every stream of its context runs dry first (`why` says,
/// if that takes the deadlock time, what waits).
pub fn load(f: &Function, why: &str) -> CuResult<()> {
    let m = MODULES.get(f.module).ok_or(CUresult::INVALID_HANDLE)?;
    if lock(&m.loaded).contains(&f.name) {
        return Ok(());
    }
    context::lookup(m.ctx)?.drain_for(why);
    lock(&m.loaded).insert(f.name.clone());
    Ok(())
}

/// `cuFuncLoad`.
pub fn func_load(handle: usize) -> CuResult<()> {
    let f = function(handle)?;
    context::lookup(f.ctx)?.core.resource_call("cuFuncLoad", false);
    load(&f, "cuFuncLoad synchronises the context")
}

/// `cuFuncGetAttribute`: loads the kernel (as NCCL relies on: `cudaFuncGetAttributes` at
/// init); the host-compiled kernels use no shared, constant or local memory.
pub fn attribute(handle: usize, attr: i32) -> CuResult<i32> {
    let f = function(handle)?;
    load(&f, "cuFuncGetAttribute loads the kernel, which synchronises the context")?;
    let sm = config::get()?.sm as i32;
    match attr {
        0 => Ok(1024),   // MAX_THREADS_PER_BLOCK
        1..=3 => Ok(0),  // SHARED_SIZE_BYTES, CONST_SIZE_BYTES, LOCAL_SIZE_BYTES
        4 => Ok(32),     // NUM_REGS
        5 | 6 => Ok(sm), // PTX_VERSION, BINARY_VERSION
        _ => Err(CUresult::INVALID_VALUE),
    }
}

/// `cuModuleUnload`: its functions go with it.
pub fn unload(module: usize) -> CuResult<()> {
    config::get()?;
    MODULES.remove(module).ok_or(CUresult::INVALID_HANDLE)?;
    FUNCTIONS.remove_where(|f| f.module == module);
    Ok(())
}

pub fn function(handle: usize) -> CuResult<Arc<Function>> {
    config::get()?;
    FUNCTIONS.get(handle).ok_or(CUresult::INVALID_HANDLE)
}

/// Forgets the modules of a destroyed context.
pub fn release_context(ctx: usize) {
    MODULES.remove_where(|m| m.ctx == ctx);
    FUNCTIONS.remove_where(|f| f.ctx == ctx);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cubin(sm: u32) -> Image {
        Image::Cubin { sm, names: vec![] }
    }

    fn ptx(target: u32, arch_specific: bool, isa: u32) -> Image {
        Image::Ptx { target, arch_specific, isa, names: vec![] }
    }

    #[test]
    fn targets() {
        assert_eq!(check_target(&cubin(90), 90, 88), Ok(()));
        assert_eq!(check_target(&cubin(80), 90, 88), Err(CUresult::NO_BINARY_FOR_GPU));
        assert_eq!(check_target(&cubin(86), 89, 88), Ok(()));
        assert_eq!(check_target(&cubin(89), 86, 88), Err(CUresult::NO_BINARY_FOR_GPU));
        assert_eq!(check_target(&cubin(90), 100, 88), Err(CUresult::NO_BINARY_FOR_GPU));
        assert_eq!(check_target(&ptx(80, false, 88), 90, 88), Ok(()));
        assert_eq!(check_target(&ptx(100, false, 88), 90, 88), Err(CUresult::NO_BINARY_FOR_GPU));
        assert_eq!(check_target(&ptx(90, true, 88), 100, 88), Err(CUresult::NO_BINARY_FOR_GPU));
        assert_eq!(check_target(&ptx(80, false, 95), 90, 88), Err(CUresult::UNSUPPORTED_PTX_VERSION));
    }
}

//! What the driver says about a pointer: `cuPointerGetAttribute(s)` and
//! `cuMemGetAddressRange_v2`. Each attribute is written with the size the headers give it.

use std::ffi::c_void;

use crate::config;
use crate::memory::{self, Allocation, Kind};
use crate::sys::pointer_attribute as pa;
use crate::sys::{CUresult, CuResult, MEMHOSTREGISTER_READ_ONLY, MEMORYTYPE_DEVICE, MEMORYTYPE_HOST};

/// An attribute's value, sized as the caller's variable is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// `unsigned int` / `int` / boolean attributes.
    U32(u32),
    /// `CUdeviceptr`, `unsigned long long`, `size_t` and pointer attributes.
    U64(u64),
}

impl Value {
    /// Writes the value to `data`.
    ///
    /// # Safety
    /// `data` must be valid for a write of the value's size.
    pub unsafe fn write(self, data: *mut c_void) {
        // SAFETY: the caller vouches for `data`; unaligned writes accept any address.
        unsafe {
            match self {
                Value::U32(v) => data.cast::<u32>().write_unaligned(v),
                Value::U64(v) => data.cast::<u64>().write_unaligned(v),
            }
        }
    }
}

/// A stand-in value for pool handles: one per device, never dereferenced.
pub fn pool_handle(device: i32) -> u64 {
    0x7e00_0000 + device as u64 * 0x40
}

/// The size class of each attribute the stand-in knows (`None`: unknown attribute).
fn zero(attr: u32) -> Option<Value> {
    Some(match attr {
        pa::MEMORY_TYPE
        | pa::SYNC_MEMOPS
        | pa::IS_MANAGED
        | pa::DEVICE_ORDINAL
        | pa::IS_LEGACY_CUDA_IPC_CAPABLE
        | pa::MAPPED
        | pa::ALLOWED_HANDLE_TYPES
        | pa::IS_GPU_DIRECT_RDMA_CAPABLE
        | pa::ACCESS_FLAGS => Value::U32(0),
        pa::CONTEXT
        | pa::DEVICE_POINTER
        | pa::HOST_POINTER
        | pa::BUFFER_ID
        | pa::RANGE_START_ADDR
        | pa::RANGE_SIZE
        | pa::MEMPOOL_HANDLE
        | pa::MAPPING_SIZE
        | pa::MAPPING_BASE_ADDR
        | pa::MEMORY_BLOCK_ID => Value::U64(0),
        _ => return None,
    })
}

/// Attribute `attr` of `ptr` inside `a`; `Err(INVALID_VALUE)` where the driver has none (the
/// host pointer of device memory, the mapping of non-VMM memory).
fn of(a: &Allocation, attr: u32, ptr: u64) -> CuResult<Value> {
    let host = !a.is_device();
    Ok(match attr {
        // Pool memory belongs to no context.
        pa::CONTEXT => Value::U64(if a.kind == Kind::Pool { 0 } else { a.ctx as u64 }),
        pa::MEMORY_TYPE => Value::U32(if host { MEMORYTYPE_HOST } else { MEMORYTYPE_DEVICE }),
        pa::DEVICE_POINTER => Value::U64(ptr),
        pa::HOST_POINTER if host => Value::U64(ptr),
        pa::SYNC_MEMOPS => Value::U32(0),
        pa::BUFFER_ID | pa::MEMORY_BLOCK_ID => Value::U64(a.id),
        pa::IS_MANAGED => Value::U32(0),
        pa::DEVICE_ORDINAL => Value::U32(a.device as u32),
        pa::IS_LEGACY_CUDA_IPC_CAPABLE => Value::U32(u32::from(a.kind == Kind::Device)),
        pa::RANGE_START_ADDR => Value::U64(a.base),
        pa::RANGE_SIZE => Value::U64(a.size as u64),
        pa::MAPPED => Value::U32(1),
        pa::ALLOWED_HANDLE_TYPES | pa::IS_GPU_DIRECT_RDMA_CAPABLE => Value::U32(0),
        // CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ = 1, _READWRITE = 3.
        pa::ACCESS_FLAGS => {
            Value::U32(if a.kind == Kind::HostRegistered && a.flags & MEMHOSTREGISTER_READ_ONLY != 0 { 1 } else { 3 })
        }
        pa::MEMPOOL_HANDLE => Value::U64(if a.kind == Kind::Pool { pool_handle(a.device) } else { 0 }),
        _ => return Err(CUresult::INVALID_VALUE),
    })
}

/// `cuPointerGetAttribute`: an unknown pointer is `CUDA_ERROR_INVALID_VALUE`.
pub fn get(attr: u32, ptr: u64) -> CuResult<Value> {
    config::get()?;
    zero(attr).ok_or(CUresult::INVALID_VALUE)?;
    let a = memory::find(ptr).ok_or(CUresult::INVALID_VALUE)?;
    of(&a, attr, ptr)
}

/// `cuPointerGetAttributes`: an unknown pointer gives memory type 0 and zeros, with success;
/// an attribute the memory lacks reads as zero.
pub fn get_many(attrs: &[u32], ptr: u64) -> CuResult<Vec<Value>> {
    config::get()?;
    let a = memory::find(ptr);
    attrs
        .iter()
        .map(|&attr| {
            let zero = zero(attr).ok_or(CUresult::INVALID_VALUE)?;
            Ok(a.as_ref().and_then(|a| of(a, attr, ptr).ok()).unwrap_or(zero))
        })
        .collect()
}

/// `cuMemGetAddressRange_v2`: (base, size) of the allocation holding `ptr`.
pub fn address_range(ptr: u64) -> CuResult<(u64, usize)> {
    crate::context::current()?;
    let a = memory::find(ptr).ok_or(CUresult::NOT_FOUND)?;
    Ok((a.base, a.size))
}

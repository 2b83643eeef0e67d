//! The driver API's C types and constants, with the values of cudarc 0.19.10's `driver::sys`
//! (CUDA 12.9 headers). Enums the caller passes in are plain integers here: a value outside a
//! Rust enum would be undefined behaviour, an unknown integer is just an error.

#![allow(non_camel_case_types)]

use std::ffi::c_void;

/// `CUresult`: an `int`-sized C enum. Only ever returned, so a newtype over `u32` is exact.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CUresult(pub u32);

impl CUresult {
    pub const SUCCESS: Self = Self(0);
    pub const INVALID_VALUE: Self = Self(1);
    pub const OUT_OF_MEMORY: Self = Self(2);
    pub const NOT_INITIALIZED: Self = Self(3);
    pub const NO_DEVICE: Self = Self(100);
    pub const INVALID_DEVICE: Self = Self(101);
    pub const INVALID_IMAGE: Self = Self(200);
    pub const INVALID_CONTEXT: Self = Self(201);
    pub const MAP_FAILED: Self = Self(205);
    pub const ALREADY_MAPPED: Self = Self(208);
    pub const NO_BINARY_FOR_GPU: Self = Self(209);
    pub const INVALID_PTX: Self = Self(218);
    pub const UNSUPPORTED_PTX_VERSION: Self = Self(222);
    pub const INVALID_HANDLE: Self = Self(400);
    pub const ILLEGAL_STATE: Self = Self(401);
    pub const NOT_FOUND: Self = Self(500);
    pub const NOT_READY: Self = Self(600);
    pub const ILLEGAL_ADDRESS: Self = Self(700);
    pub const PEER_ACCESS_ALREADY_ENABLED: Self = Self(704);
    pub const PEER_ACCESS_NOT_ENABLED: Self = Self(705);
    pub const LAUNCH_FAILED: Self = Self(719);
    pub const HOST_MEMORY_ALREADY_REGISTERED: Self = Self(712);
    pub const HOST_MEMORY_NOT_REGISTERED: Self = Self(713);
    pub const NOT_SUPPORTED: Self = Self(801);
    pub const STREAM_CAPTURE_UNSUPPORTED: Self = Self(900);
    pub const STREAM_CAPTURE_INVALIDATED: Self = Self(901);
    pub const STREAM_CAPTURE_MERGE: Self = Self(902);
    pub const STREAM_CAPTURE_UNMATCHED: Self = Self(903);
    pub const STREAM_CAPTURE_UNJOINED: Self = Self(904);
    pub const STREAM_CAPTURE_ISOLATION: Self = Self(905);
    pub const STREAM_CAPTURE_IMPLICIT: Self = Self(906);
    pub const CAPTURED_EVENT: Self = Self(907);
    pub const STREAM_CAPTURE_WRONG_THREAD: Self = Self(908);
    pub const UNKNOWN: Self = Self(999);
}

/// What the stand-in's internals return: `Err` carries the code for the C caller.
pub type CuResult<T> = Result<T, CUresult>;

/// Folds a result into the code the C caller sees.
pub fn code(r: CuResult<()>) -> CUresult {
    r.err().unwrap_or(CUresult::SUCCESS)
}

pub type CUdevice = i32;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUmemoryPool = *mut c_void;

/// `CU_STREAM_LEGACY`: the context's legacy default stream, as `NULL` is.
pub const STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream of the current context.
pub const STREAM_PER_THREAD: usize = 0x2;
pub const STREAM_NON_BLOCKING: u32 = 1;

pub const EVENT_BLOCKING_SYNC: u32 = 1;
pub const EVENT_DISABLE_TIMING: u32 = 2;
pub const EVENT_INTERPROCESS: u32 = 4;

pub const MEMHOSTALLOC_PORTABLE: u32 = 1;
pub const MEMHOSTALLOC_DEVICEMAP: u32 = 2;
pub const MEMHOSTALLOC_WRITECOMBINED: u32 = 4;
pub const MEMHOSTREGISTER_PORTABLE: u32 = 1;
pub const MEMHOSTREGISTER_DEVICEMAP: u32 = 2;
pub const MEMHOSTREGISTER_IOMEMORY: u32 = 4;
pub const MEMHOSTREGISTER_READ_ONLY: u32 = 8;

pub const IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// `CUstreamWaitValue_flags`: the comparison in the low bits, and `FLUSH`.
pub const WAIT_VALUE_GEQ: u32 = 0;
pub const WAIT_VALUE_EQ: u32 = 1;
pub const WAIT_VALUE_AND: u32 = 2;
pub const WAIT_VALUE_NOR: u32 = 3;
pub const WAIT_VALUE_FLUSH: u32 = 1 << 30;
/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`.
pub const WRITE_VALUE_NO_MEMORY_BARRIER: u32 = 1;

/// `CUmemorytype`.
pub const MEMORYTYPE_HOST: u32 = 1;
pub const MEMORYTYPE_DEVICE: u32 = 2;

/// `CUpointer_attribute` values the stand-in answers.
pub mod pointer_attribute {
    pub const CONTEXT: u32 = 1;
    pub const MEMORY_TYPE: u32 = 2;
    pub const DEVICE_POINTER: u32 = 3;
    pub const HOST_POINTER: u32 = 4;
    pub const SYNC_MEMOPS: u32 = 6;
    pub const BUFFER_ID: u32 = 7;
    pub const IS_MANAGED: u32 = 8;
    pub const DEVICE_ORDINAL: u32 = 9;
    pub const IS_LEGACY_CUDA_IPC_CAPABLE: u32 = 10;
    pub const RANGE_START_ADDR: u32 = 11;
    pub const RANGE_SIZE: u32 = 12;
    pub const MAPPED: u32 = 13;
    pub const ALLOWED_HANDLE_TYPES: u32 = 14;
    pub const IS_GPU_DIRECT_RDMA_CAPABLE: u32 = 15;
    pub const ACCESS_FLAGS: u32 = 16;
    pub const MEMPOOL_HANDLE: u32 = 17;
    pub const MAPPING_SIZE: u32 = 18;
    pub const MAPPING_BASE_ADDR: u32 = 19;
    pub const MEMORY_BLOCK_ID: u32 = 20;
}

/// `CUipcMemHandle` / `CUipcEventHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUipcHandle {
    pub reserved: [u8; 64],
}

pub type CUipcMemHandle = CUipcHandle;
pub type CUipcEventHandle = CUipcHandle;

/// `CUuuid`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_headers() {
        assert_eq!(std::mem::size_of::<CUipcHandle>(), 64);
        assert_eq!(std::mem::size_of::<CUuuid>(), 16);
        assert_eq!(std::mem::size_of::<CUresult>(), 4);
    }
}

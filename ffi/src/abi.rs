//! NCCL's C types and values (NCCL 2.21.5, `include/nccl.h`), as Rust sees them. C enums
//! arrive as plain `int`s and are checked before use: an out-of-range value must be an
//! `ncclInvalidArgument`, never undefined behaviour.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
pub const NCCL_SUCCESS: ncclResult_t = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: ncclResult_t = 1;
pub const NCCL_SYSTEM_ERROR: ncclResult_t = 2;
pub const NCCL_INTERNAL_ERROR: ncclResult_t = 3;
pub const NCCL_INVALID_ARGUMENT: ncclResult_t = 4;
pub const NCCL_INVALID_USAGE: ncclResult_t = 5;
pub const NCCL_REMOTE_ERROR: ncclResult_t = 6;
pub const NCCL_IN_PROGRESS: ncclResult_t = 7;

/// `ncclDataType_t` and `ncclRedOp_t` values are ints (checked with `Dtype::from_raw` and
/// [`BUILTIN_OPS`]).
pub type ncclDataType_t = c_int;
pub type ncclRedOp_t = c_int;
/// `ncclNumOps`: ids from here up are PreMulSum operators of a communicator.
pub const BUILTIN_OPS: c_int = 5;
/// `ncclScalarResidence_t`.
pub const SCALAR_DEVICE: c_int = 0;
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;

/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_CONFIG_UNDEF_INT`.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `ncclConfig_t::magic` as `NCCL_CONFIG_INITIALIZER` sets it.
pub const CONFIG_MAGIC: c_uint = 0xcafe_beef;

/// `NCCL_VERSION_CODE` of the API implemented here.
pub const VERSION_CODE: c_int = 22105;
pub const VERSION_TEXT: &str = "2.21.5";

/// The opaque `struct ncclComm`; `ncclComm_t` points at one (see `handle`).
#[repr(C)]
pub struct ncclComm {
    _private: [u8; 0],
}
pub type ncclComm_t = *mut ncclComm;

/// `cudaStream_t`: must be NULL without CUDA.
pub type cudaStream_t = *mut c_void;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; topoccl::comm::UNIQUE_ID_BYTES],
}

/// `ncclConfig_t` (`ncclConfig_v21700`). A caller's struct may be shorter (an older header):
/// `size` says which fields it has.
#[repr(C)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_header() {
        assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
        // size_t, 2 × unsigned, 4 × int, a pointer, an int (padded): 48 bytes on LP64.
        assert_eq!(std::mem::size_of::<ncclConfig_t>(), 48);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, net_name), 32);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, split_share), 40);
    }
}

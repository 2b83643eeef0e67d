//! NCCL's C types and values (NCCL 2.30.7, `include/nccl.h`), as Rust sees them. C enums
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
/// NCCL 2.29: a call (or init) ran past its deadline.
pub const NCCL_TIMEOUT: ncclResult_t = 8;
pub const NCCL_NUM_RESULTS: ncclResult_t = 9;

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
pub const VERSION_CODE: c_int = 23007;
pub const VERSION_TEXT: &str = "2.30.7";
/// `ncclConfig_t::version` of the 2.21 layout (the fields up to `splitShare`).
pub const CONFIG_VERSION_2_21: c_uint = 22105;

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

/// `ncclConfig_t` (`ncclConfig_v23000`). A caller's struct may be shorter (an older header):
/// `size` and `version` say which fields it has.
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
    pub traffic_class: c_int,
    pub comm_name: *const c_char,
    pub collnet_enable: c_int,
    pub cta_policy: c_int,
    pub shrink_share: c_int,
    pub nvls_ctas: c_int,
    pub n_channels_per_net_peer: c_int,
    pub nvlink_centric_sched: c_int,
    pub graph_usage_mode: c_int,
    pub num_rma_ctx: c_int,
    pub max_p2p_peers: c_int,
    pub graph_stream_ordering: c_int,
}

/// `ncclSimInfo_t` (`ncclSimInfo_v22200`), for `ncclGroupSimulateEnd`.
#[repr(C)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    /// The simulator's estimate of the group's time, in microseconds.
    pub estimated_time: f32,
}
/// `ncclSimInfo_t::magic` as `NCCL_SIM_INFO_INITIALIZER` sets it.
pub const SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclWaitSignalDesc_t {
    pub op_cnt: c_int,
    pub peer: c_int,
    pub sig_idx: c_int,
    pub ctx: c_int,
}

/// The opaque `struct ncclWindow_vidmem`; `ncclWindow_t` points at one (see `window`).
#[repr(C)]
pub struct ncclWindow {
    _private: [u8; 0],
}
pub type ncclWindow_t = *mut ncclWindow;

/// `ncclCommShrink` flags.
pub const SHRINK_DEFAULT: c_int = 0;
pub const SHRINK_ABORT: c_int = 1;
/// `ncclCommSuspend` flags.
pub const SUSPEND_MEM: c_int = 1;
/// `ncclCommMemStat_t` values.
pub const STAT_GPU_MEM_SUSPEND: c_int = 0;
pub const STAT_GPU_MEM_SUSPENDED: c_int = 1;
pub const STAT_GPU_MEM_PERSIST: c_int = 2;
pub const STAT_GPU_MEM_TOTAL: c_int = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_header() {
        assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
        // size_t, 2 × unsigned, 4 × int, a pointer, 2 × int, a pointer, 10 × int: 96 bytes
        // on LP64 (the 2.21 layout ends after splitShare, at 44).
        assert_eq!(std::mem::size_of::<ncclConfig_t>(), 96);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, net_name), 32);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, split_share), 40);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, comm_name), 48);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, graph_stream_ordering), 92);
        assert_eq!(std::mem::size_of::<ncclSimInfo_t>(), 24);
        assert_eq!(std::mem::size_of::<ncclWaitSignalDesc_t>(), 16);
    }
}

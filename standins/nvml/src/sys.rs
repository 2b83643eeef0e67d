//! NVML's C types and constants, as NVIDIA's `nvml.h` declares them (checked against the
//! header of NVIDIA/go-nvml's `gen/nvml/nvml.h`, CUDA 13 era). Enums the caller passes in are
//! plain integers here: a value outside a Rust enum would be undefined behaviour, an unknown
//! integer is just an error.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_void};

/// `nvmlReturn_t`: an `int`-sized C enum. Only ever returned, so a newtype over `u32` is exact.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct nvmlReturn_t(pub u32);

impl nvmlReturn_t {
    pub const SUCCESS: Self = Self(0);
    pub const UNINITIALIZED: Self = Self(1);
    pub const INVALID_ARGUMENT: Self = Self(2);
    pub const NOT_SUPPORTED: Self = Self(3);
    pub const NO_PERMISSION: Self = Self(4);
    pub const ALREADY_INITIALIZED: Self = Self(5);
    pub const NOT_FOUND: Self = Self(6);
    pub const INSUFFICIENT_SIZE: Self = Self(7);
    pub const DRIVER_NOT_LOADED: Self = Self(9);
    pub const LIBRARY_NOT_FOUND: Self = Self(12);
    pub const FUNCTION_NOT_FOUND: Self = Self(13);
    pub const GPU_IS_LOST: Self = Self(15);
    pub const UNKNOWN: Self = Self(999);
}

/// What the stand-in's internals return: `Err` carries the code for the C caller.
pub type NvmlResult<T> = Result<T, nvmlReturn_t>;

/// Folds a result into the code the C caller sees.
pub fn code(r: NvmlResult<()>) -> nvmlReturn_t {
    r.err().unwrap_or(nvmlReturn_t::SUCCESS)
}

/// `nvmlDevice_t`: an opaque pointer (`struct nvmlDevice_st *`).
pub type nvmlDevice_t = *mut c_void;

/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE`.
pub const PCI_BUS_ID_BUFFER_SIZE: usize = 32;
/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE`.
pub const PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;
/// `NVML_NVLINK_MAX_LINKS`: 36 in current headers (18 before Blackwell); the API's bound on a
/// link index, beyond any one chip's links.
pub const NVLINK_MAX_LINKS: u32 = 36;

/// `nvmlPciInfo_t` (68 bytes, 4-aligned).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct nvmlPciInfo_t {
    /// `"%04X:%02X:%02X.0"` (domain, bus, device), NUL-terminated.
    pub busIdLegacy: [c_char; PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    /// Device id in the high 16 bits, vendor id (0x10DE) in the low.
    pub pciDeviceId: u32,
    pub pciSubSystemId: u32,
    /// `"%08X:%02X:%02X.0"` (domain, bus, device), NUL-terminated.
    pub busId: [c_char; PCI_BUS_ID_BUFFER_SIZE],
}

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlEnableState_t`.
pub const FEATURE_DISABLED: u32 = 0;
pub const FEATURE_ENABLED: u32 = 1;

/// `nvmlIntNvLinkDeviceType_t`.
pub const NVLINK_DEVICE_TYPE_GPU: u32 = 0x00;
pub const NVLINK_DEVICE_TYPE_IBMNPU: u32 = 0x01;
pub const NVLINK_DEVICE_TYPE_SWITCH: u32 = 0x02;
pub const NVLINK_DEVICE_TYPE_UNKNOWN: u32 = 0xff;

/// `nvmlGpuTopologyLevel_t`.
pub const TOPOLOGY_INTERNAL: u32 = 0;
pub const TOPOLOGY_SINGLE: u32 = 10;
pub const TOPOLOGY_MULTIPLE: u32 = 20;
pub const TOPOLOGY_HOSTBRIDGE: u32 = 30;
pub const TOPOLOGY_NODE: u32 = 40;
pub const TOPOLOGY_SYSTEM: u32 = 50;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn layouts_match_the_header() {
        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(align_of::<nvmlPciInfo_t>(), 4);
        assert_eq!(offset_of!(nvmlPciInfo_t, domain), 16);
        assert_eq!(offset_of!(nvmlPciInfo_t, pciDeviceId), 28);
        assert_eq!(offset_of!(nvmlPciInfo_t, busId), 36);
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(size_of::<nvmlReturn_t>(), 4);
    }
}

//! NVML's C types, constants and entry points, as NVIDIA's `nvml.h` declares them (checked
//! against the header in NVIDIA/go-nvml, `gen/nvml/nvml.h`), and finding the library at run
//! time: `libnvidia-ml.so.1` (what the driver installs), then `libnvidia-ml.so` (a development
//! link). Nothing links against NVML, so a machine without a driver builds and runs.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use libloading::Library;

/// `nvmlReturn_t`, an `int`-sized C enum read as the integer it is (a code this crate does not
/// know is just another error).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct nvmlReturn_t(pub u32);

impl nvmlReturn_t {
    pub const SUCCESS: Self = Self(0);
    pub const INVALID_ARGUMENT: Self = Self(2);
    pub const NOT_SUPPORTED: Self = Self(3);
}

/// `nvmlDevice_t`: opaque.
pub type nvmlDevice_t = *mut c_void;

/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE` and `NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE`.
pub const PCI_BUS_ID_BUFFER_SIZE: usize = 32;
pub const PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;
/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE` (names and UUIDs fit) and
/// `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`.
pub const NAME_BUFFER_SIZE: usize = 96;
pub const DRIVER_VERSION_BUFFER_SIZE: usize = 80;
/// `NVML_NVLINK_MAX_LINKS` of current headers (36; 18 before Blackwell, whose drivers answer
/// the larger indices with `NVML_ERROR_INVALID_ARGUMENT`, as for any link a chip lacks).
pub const NVLINK_MAX_LINKS: u32 = 36;

/// `nvmlPciInfo_t`: 68 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; PCI_BUS_ID_BUFFER_SIZE],
}

impl nvmlPciInfo_t {
    /// All zeros: what a call fills in.
    pub const ZERO: nvmlPciInfo_t = nvmlPciInfo_t {
        busIdLegacy: [0; PCI_BUS_ID_BUFFER_V2_SIZE],
        domain: 0,
        bus: 0,
        device: 0,
        pciDeviceId: 0,
        pciSubSystemId: 0,
        busId: [0; PCI_BUS_ID_BUFFER_SIZE],
    };
}

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlEnableState_t`'s `NVML_FEATURE_ENABLED`.
pub const FEATURE_ENABLED: c_uint = 1;

/// `nvmlIntNvLinkDeviceType_t`.
pub const NVLINK_DEVICE_TYPE_GPU: c_uint = 0x00;
pub const NVLINK_DEVICE_TYPE_IBMNPU: c_uint = 0x01;
pub const NVLINK_DEVICE_TYPE_SWITCH: c_uint = 0x02;

/// `nvmlGpuTopologyLevel_t`: how far apart two GPUs are on PCIe (`NVML_TOPOLOGY_SYSTEM`, 50, is
/// any other value to `checked`).
pub const TOPOLOGY_INTERNAL: c_uint = 0;
pub const TOPOLOGY_SINGLE: c_uint = 10;
pub const TOPOLOGY_MULTIPLE: c_uint = 20;
pub const TOPOLOGY_HOSTBRIDGE: c_uint = 30;
pub const TOPOLOGY_NODE: c_uint = 40;

type Ret = nvmlReturn_t;
type Dev = nvmlDevice_t;

/// The entry points detection calls; the optional ones are newer than some drivers still in
/// use (or only refine the picture), and their absence is not an error.
pub struct Api {
    pub init: unsafe extern "C" fn() -> Ret,
    pub shutdown: unsafe extern "C" fn() -> Ret,
    pub error_string: unsafe extern "C" fn(Ret) -> *const c_char,
    pub driver_version: unsafe extern "C" fn(*mut c_char, c_uint) -> Ret,
    pub device_count: unsafe extern "C" fn(*mut c_uint) -> Ret,
    pub handle_by_index: unsafe extern "C" fn(c_uint, *mut Dev) -> Ret,
    pub name: unsafe extern "C" fn(Dev, *mut c_char, c_uint) -> Ret,
    pub uuid: unsafe extern "C" fn(Dev, *mut c_char, c_uint) -> Ret,
    pub pci_info: unsafe extern "C" fn(Dev, *mut nvmlPciInfo_t) -> Ret,
    pub compute_capability: unsafe extern "C" fn(Dev, *mut c_int, *mut c_int) -> Ret,
    pub nvlink_state: unsafe extern "C" fn(Dev, c_uint, *mut c_uint) -> Ret,
    pub nvlink_remote_pci: unsafe extern "C" fn(Dev, c_uint, *mut nvmlPciInfo_t) -> Ret,
    pub common_ancestor: unsafe extern "C" fn(Dev, Dev, *mut c_uint) -> Ret,
    pub nvlink_remote_type: Option<unsafe extern "C" fn(Dev, c_uint, *mut c_uint) -> Ret>,
    pub numa_node: Option<unsafe extern "C" fn(Dev, *mut c_uint) -> Ret>,
    pub memory_info: Option<unsafe extern "C" fn(Dev, *mut nvmlMemory_t) -> Ret>,
    pub max_pcie_generation: Option<unsafe extern "C" fn(Dev, *mut c_uint) -> Ret>,
    pub max_pcie_width: Option<unsafe extern "C" fn(Dev, *mut c_uint) -> Ret>,
    /// Kept loaded for the process (as NCCL does): the function pointers above point into it.
    _library: Library,
}

/// The names tried, in order.
pub const LIBRARY_NAMES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// NVML's entry points, loaded on first use; why not, if there is no NVML or it lacks a
/// required entry point.
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let mut tried = Vec::new();
    for name in LIBRARY_NAMES {
        // SAFETY: loading runs the library's initialisers. NVML's (the driver's, or the
        // stand-in's in tests) set up nothing that touches this process's state; NCCL and
        // nvidia-smi load it the same way.
        match unsafe { Library::new(name) } {
            Ok(library) => return bind(library).map_err(|missing| format!("{name} has no {missing}")),
            // libloading's message is "dlopen failed"; dlerror's words are its source.
            Err(e) => tried.push(std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string())),
        }
    }
    Err(format!("cannot load {}: {}", LIBRARY_NAMES.join(" or "), tried.join("; ")))
}

/// Looks up `name` as a function of type `F`.
///
/// # Safety
/// `F` must be the C signature `nvml.h` gives `name`.
unsafe fn symbol<F: Copy>(library: &Library, name: &str) -> Option<F> {
    // SAFETY: the caller vouches for the signature; the pointer is copied out, and stays valid
    // as long as `library` stays loaded (the `Api` keeps it).
    unsafe { library.get::<F>(name).ok().map(|s| *s) }
}

fn bind(library: Library) -> Result<Api, String> {
    macro_rules! required {
        ($name:literal) => {
            // SAFETY: the field's type is the function's signature in nvml.h.
            unsafe { symbol(&library, $name) }.ok_or($name)?
        };
    }
    macro_rules! optional {
        ($name:literal) => {
            // SAFETY: the field's type is the function's signature in nvml.h.
            unsafe { symbol(&library, $name) }
        };
    }
    Ok(Api {
        init: required!("nvmlInit_v2"),
        shutdown: required!("nvmlShutdown"),
        error_string: required!("nvmlErrorString"),
        driver_version: required!("nvmlSystemGetDriverVersion"),
        device_count: required!("nvmlDeviceGetCount_v2"),
        handle_by_index: required!("nvmlDeviceGetHandleByIndex_v2"),
        name: required!("nvmlDeviceGetName"),
        uuid: required!("nvmlDeviceGetUUID"),
        pci_info: required!("nvmlDeviceGetPciInfo_v3"),
        compute_capability: required!("nvmlDeviceGetCudaComputeCapability"),
        nvlink_state: required!("nvmlDeviceGetNvLinkState"),
        nvlink_remote_pci: required!("nvmlDeviceGetNvLinkRemotePciInfo_v2"),
        common_ancestor: required!("nvmlDeviceGetTopologyCommonAncestor"),
        nvlink_remote_type: optional!("nvmlDeviceGetNvLinkRemoteDeviceType"),
        numa_node: optional!("nvmlDeviceGetNumaNodeId"),
        memory_info: optional!("nvmlDeviceGetMemoryInfo"),
        max_pcie_generation: optional!("nvmlDeviceGetMaxPcieLinkGeneration"),
        max_pcie_width: optional!("nvmlDeviceGetMaxPcieLinkWidth"),
        _library: library,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_header() {
        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(offset_of!(nvmlPciInfo_t, domain), 16);
        assert_eq!(offset_of!(nvmlPciInfo_t, pciDeviceId), 28);
        assert_eq!(offset_of!(nvmlPciInfo_t, busId), 36);
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
    }
}

//! Every NVML call detection makes, checked: a code other than success is an error naming the
//! call, the GPU and NVML's own words; strings are read only up to the NUL inside the buffer;
//! counts and levels are checked before use. The only `unsafe` of detection's calls is here.

use std::ffi::{c_char, c_int, c_uint, CStr};

use super::sys::{self, nvmlDevice_t, nvmlMemory_t, nvmlPciInfo_t, nvmlReturn_t, Api};

/// The most GPUs detection accepts from `nvmlDeviceGetCount_v2` (a bound on what a reply may
/// size, far above any machine: NVSwitch systems have 8 or 16 GPUs, a GB200 NVL72 tray 4).
pub const MAX_GPUS: u32 = 1024;

/// A failed call: which, on what, and why (NVML's words and code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub code: nvmlReturn_t,
    pub message: String,
}

pub type CallResult<T> = Result<T, CallError>;

/// An initialised NVML; shut down (one reference given back) when dropped.
pub struct Nvml {
    api: &'static Api,
}

/// A GPU's handle, valid while the `Nvml` it came from lives.
#[derive(Debug, Clone, Copy)]
pub struct Device {
    handle: nvmlDevice_t,
    index: u32,
}

impl Device {
    pub fn index(&self) -> u32 {
        self.index
    }
}

impl Nvml {
    /// Loads NVML and calls `nvmlInit_v2`; the error says why not (no library, a missing
    /// entry point, or the initialisation's own error, e.g. no driver loaded).
    pub fn open() -> Result<Nvml, String> {
        let api = sys::api()?;
        // SAFETY: nvmlInit_v2 takes no arguments; any thread may call it.
        let code = unsafe { (api.init)() };
        if code != nvmlReturn_t::SUCCESS {
            // Not initialised: no shutdown is owed, so no `Nvml` exists to drop.
            return Err(format!("nvmlInit_v2 failed: {}", describe(api, code)));
        }
        Ok(Nvml { api })
    }

    /// `Ok` for success, else the error of `call` on `device`.
    fn check(&self, code: nvmlReturn_t, call: &str, device: Option<Device>) -> CallResult<()> {
        if code == nvmlReturn_t::SUCCESS {
            return Ok(());
        }
        let on = device.map(|d| format!(" (GPU {})", d.index)).unwrap_or_default();
        Err(CallError { code, message: format!("{call}{on}: {}", describe(self.api, code)) })
    }

    /// Fills a string buffer with `fill` and reads it up to its NUL.
    fn string<const N: usize>(
        &self,
        call: &str,
        device: Option<Device>,
        fill: impl FnOnce(*mut c_char, c_uint) -> nvmlReturn_t,
    ) -> CallResult<String> {
        let mut buf = [0u8; N];
        self.check(fill(buf.as_mut_ptr().cast(), N as c_uint), call, device)?;
        Ok(text(&buf))
    }

    pub fn driver_version(&self) -> CallResult<String> {
        self.string::<{ sys::DRIVER_VERSION_BUFFER_SIZE }>("nvmlSystemGetDriverVersion", None, |buf, len| {
            // SAFETY: `buf` is `len` writable bytes.
            unsafe { (self.api.driver_version)(buf, len) }
        })
    }

    /// The GPUs NVML sees (all of the machine's: NVML ignores `CUDA_VISIBLE_DEVICES`).
    pub fn device_count(&self) -> CallResult<u32> {
        let mut n: c_uint = 0;
        // SAFETY: a valid out-pointer.
        self.check(unsafe { (self.api.device_count)(&mut n) }, "nvmlDeviceGetCount_v2", None)?;
        if n > MAX_GPUS {
            return Err(CallError {
                code: nvmlReturn_t::SUCCESS,
                message: format!("nvmlDeviceGetCount_v2 says {n} GPUs, more than the {MAX_GPUS} detection accepts"),
            });
        }
        Ok(n)
    }

    pub fn device(&self, index: u32) -> CallResult<Device> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let code = unsafe { (self.api.handle_by_index)(index, &mut handle) };
        let device = Device { handle, index };
        self.check(code, "nvmlDeviceGetHandleByIndex_v2", Some(device))?;
        Ok(device)
    }

    pub fn name(&self, d: Device) -> CallResult<String> {
        self.string::<{ sys::NAME_BUFFER_SIZE }>("nvmlDeviceGetName", Some(d), |buf, len| {
            // SAFETY: a handle NVML gave; `buf` is `len` writable bytes.
            unsafe { (self.api.name)(d.handle, buf, len) }
        })
    }

    pub fn uuid(&self, d: Device) -> CallResult<String> {
        self.string::<{ sys::NAME_BUFFER_SIZE }>("nvmlDeviceGetUUID", Some(d), |buf, len| {
            // SAFETY: a handle NVML gave; `buf` is `len` writable bytes.
            unsafe { (self.api.uuid)(d.handle, buf, len) }
        })
    }

    pub fn pci(&self, d: Device) -> CallResult<PciAddress> {
        let mut info = nvmlPciInfo_t::ZERO;
        // SAFETY: a handle NVML gave and a valid out-pointer.
        let code = unsafe { (self.api.pci_info)(d.handle, &mut info) };
        self.check(code, "nvmlDeviceGetPciInfo_v3", Some(d))?;
        Ok(PciAddress::of(&info))
    }

    /// (major, minor); a pair outside 1.0 ..= 99.9 is an error.
    pub fn compute_capability(&self, d: Device) -> CallResult<(u32, u32)> {
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: a handle NVML gave and valid out-pointers.
        let code = unsafe { (self.api.compute_capability)(d.handle, &mut major, &mut minor) };
        self.check(code, "nvmlDeviceGetCudaComputeCapability", Some(d))?;
        match (u32::try_from(major), u32::try_from(minor)) {
            (Ok(ma @ 1..=99), Ok(mi @ 0..=9)) => Ok((ma, mi)),
            _ => Err(CallError {
                code,
                message: format!("nvmlDeviceGetCudaComputeCapability (GPU {}): {major}.{minor}", d.index),
            }),
        }
    }

    /// Whether NVLink `link` is up; `None` when the GPU has no such link (or no NVLink).
    pub fn nvlink_active(&self, d: Device, link: u32) -> CallResult<Option<bool>> {
        let mut state: c_uint = 0;
        // SAFETY: a handle NVML gave and a valid out-pointer; NVML checks the link index.
        let code = unsafe { (self.api.nvlink_state)(d.handle, link, &mut state) };
        if code == nvmlReturn_t::INVALID_ARGUMENT || code == nvmlReturn_t::NOT_SUPPORTED {
            return Ok(None);
        }
        self.check(code, "nvmlDeviceGetNvLinkState", Some(d))?;
        Ok(Some(state == sys::FEATURE_ENABLED))
    }

    /// The PCI address at the other end of an active link.
    pub fn nvlink_remote_pci(&self, d: Device, link: u32) -> CallResult<PciAddress> {
        let mut info = nvmlPciInfo_t::ZERO;
        // SAFETY: a handle NVML gave and a valid out-pointer; NVML checks the link index.
        let code = unsafe { (self.api.nvlink_remote_pci)(d.handle, link, &mut info) };
        self.check(code, "nvmlDeviceGetNvLinkRemotePciInfo_v2", Some(d))?;
        Ok(PciAddress::of(&info))
    }

    /// What is at the other end of an active link, where the driver can say.
    pub fn nvlink_remote_kind(&self, d: Device, link: u32) -> CallResult<Option<RemoteKind>> {
        let Some(call) = self.api.nvlink_remote_type else { return Ok(None) };
        let mut kind: c_uint = 0;
        // SAFETY: a handle NVML gave and a valid out-pointer; NVML checks the link index.
        let code = unsafe { call(d.handle, link, &mut kind) };
        if code == nvmlReturn_t::NOT_SUPPORTED {
            return Ok(None);
        }
        self.check(code, "nvmlDeviceGetNvLinkRemoteDeviceType", Some(d))?;
        Ok(Some(match kind {
            sys::NVLINK_DEVICE_TYPE_GPU => RemoteKind::Gpu,
            sys::NVLINK_DEVICE_TYPE_SWITCH => RemoteKind::Switch,
            sys::NVLINK_DEVICE_TYPE_IBMNPU => RemoteKind::Cpu,
            _ => RemoteKind::Unknown,
        }))
    }

    /// How far apart two GPUs are on PCIe.
    pub fn common_ancestor(&self, a: Device, b: Device) -> CallResult<PcieLevel> {
        let mut level: c_uint = 0;
        // SAFETY: handles NVML gave and a valid out-pointer.
        let code = unsafe { (self.api.common_ancestor)(a.handle, b.handle, &mut level) };
        self.check(code, "nvmlDeviceGetTopologyCommonAncestor", Some(a))?;
        Ok(PcieLevel::of(level))
    }

    /// The GPU's NUMA node, where the driver says (a newer call; unsupported on some platforms).
    pub fn numa_node(&self, d: Device) -> Option<u32> {
        let call = self.api.numa_node?;
        let mut node: c_uint = 0;
        // SAFETY: a handle NVML gave and a valid out-pointer.
        let code = unsafe { call(d.handle, &mut node) };
        // Linux numbers NUMA nodes below 1024 (MAX_NUMNODES).
        (code == nvmlReturn_t::SUCCESS && node < 1024).then_some(node)
    }

    /// Total device memory in bytes, where the driver says.
    pub fn memory_bytes(&self, d: Device) -> Option<u64> {
        let call = self.api.memory_info?;
        let mut memory = nvmlMemory_t::default();
        // SAFETY: a handle NVML gave and a valid out-pointer.
        let code = unsafe { call(d.handle, &mut memory) };
        (code == nvmlReturn_t::SUCCESS).then_some(memory.total)
    }

    /// The GPU's maximum PCIe (generation 1..=7, width 1..=32), where the driver says.
    pub fn max_pcie(&self, d: Device) -> Option<(u32, u32)> {
        let (gen_call, width_call) = (self.api.max_pcie_generation?, self.api.max_pcie_width?);
        let (mut generation, mut width): (c_uint, c_uint) = (0, 0);
        // SAFETY: a handle NVML gave and valid out-pointers.
        let codes = unsafe { [gen_call(d.handle, &mut generation), width_call(d.handle, &mut width)] };
        let ok = codes.iter().all(|&c| c == nvmlReturn_t::SUCCESS);
        (ok && (1..=7).contains(&generation) && (1..=32).contains(&width)).then_some((generation, width))
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: gives back the reference `open`'s nvmlInit_v2 took. Its code is of no use.
        let _ = unsafe { (self.api.shutdown)() };
    }
}

/// NVML's words for `code`, and the code.
fn describe(api: &Api, code: nvmlReturn_t) -> String {
    // SAFETY: nvmlErrorString takes any code and returns NULL or a static C string.
    let text = unsafe { (api.error_string)(code) };
    let words = if text.is_null() {
        "no description".to_string()
    } else {
        // SAFETY: a non-NULL result is a static NUL-terminated string of NVML's.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    };
    format!("{words} (NVML error {})", code.0)
}

/// A buffer NVML wrote as text: up to the first NUL (the whole buffer if there is none).
fn text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A PCI function's address, as NVML's numeric fields give it (its strings are for people).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

impl PciAddress {
    fn of(info: &nvmlPciInfo_t) -> PciAddress {
        PciAddress { domain: info.domain, bus: info.bus, device: info.device }
    }

    /// `0000:07:00.0`, the form `lspci -D` and CUDA print.
    pub fn bus_id(&self) -> String {
        format!("{:04x}:{:02x}:{:02x}.0", self.domain, self.bus, self.device)
    }
}

/// What NVML says is at the far end of an NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteKind {
    Gpu,
    Switch,
    /// An NVLink to a CPU (IBM POWER's NPU).
    Cpu,
    Unknown,
}

/// `nvmlGpuTopologyLevel_t`: the nearest PCIe ancestor two GPUs share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PcieLevel {
    /// The same board (e.g. both halves of a K80).
    Internal,
    /// One PCIe switch.
    Single,
    /// Several PCIe switches, no host bridge.
    Multiple,
    /// The same host bridge.
    HostBridge,
    /// The same NUMA node.
    Node,
    /// Across the CPUs' interconnect (also any level this crate does not know).
    System,
}

impl PcieLevel {
    fn of(level: c_uint) -> PcieLevel {
        match level {
            sys::TOPOLOGY_INTERNAL => PcieLevel::Internal,
            sys::TOPOLOGY_SINGLE => PcieLevel::Single,
            sys::TOPOLOGY_MULTIPLE => PcieLevel::Multiple,
            sys::TOPOLOGY_HOSTBRIDGE => PcieLevel::HostBridge,
            sys::TOPOLOGY_NODE => PcieLevel::Node,
            // NVML_TOPOLOGY_SYSTEM (50), and any level a newer NVML may add: the farthest.
            _ => PcieLevel::System,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_stops_at_the_nul_or_the_buffer_end() {
        assert_eq!(text(b"A100\0junk"), "A100");
        assert_eq!(text(b"full"), "full");
        assert_eq!(PcieLevel::of(30), PcieLevel::HostBridge);
        assert_eq!(PcieLevel::of(77), PcieLevel::System);
        assert_eq!(PciAddress { domain: 0, bus: 0xb7, device: 0 }.bus_id(), "0000:b7:00.0");
    }
}

//! What NVML says about one GPU: name, UUID, PCI, compute capability, memory, NUMA node,
//! PCIe link, and the PCIe path between two GPUs.

use std::ffi::{c_char, c_int, c_uint};

use super::{edge, pci_info, write_str, Out};
use crate::state;
use crate::sys::{nvmlDevice_t, nvmlMemory_t, nvmlPciInfo_t, nvmlReturn_t};

/// The sub-system id every stand-in GPU reports (an SXM board's).
const SUB_SYSTEM_ID: u32 = 0x1463_10DE;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> nvmlReturn_t {
    edge(|| {
        state::device(device)?;
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { write_str(name, length, &state::machine()?.gpu_name) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t {
    edge(|| {
        let (_, gpu) = state::device(device)?;
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { write_str(uuid, length, &gpu.uuid) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    edge(|| {
        let (_, gpu) = state::device(device)?;
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pci) }?;
        out.set(pci_info(gpu.pci, state::machine()?.pci_device_id, SUB_SYSTEM_ID));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    edge(|| {
        state::device(device)?;
        // SAFETY: the caller's out-pointers.
        let (major, minor) = unsafe { (Out::new(major)?, Out::new(minor)?) };
        let (ma, mi) = state::machine()?.compute_capability;
        major.set(ma);
        minor.set(mi);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t {
    edge(|| {
        state::device(device)?;
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(memory) }?;
        let total = state::machine()?.memory_bytes;
        // What a GPU with no process on it reports: the driver's reservation is used.
        let used = total.min(512 << 20);
        out.set(nvmlMemory_t { total, free: total - used, used });
        Ok(())
    })
}

/// `NVML_ERROR_NOT_SUPPORTED` where the machine file gives no NUMA nodes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: nvmlDevice_t, node: *mut c_uint) -> nvmlReturn_t {
    edge(|| {
        let (_, gpu) = state::device(device)?;
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(node) }?;
        out.set(gpu.numa_node.ok_or(nvmlReturn_t::NOT_SUPPORTED)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(device: nvmlDevice_t, gen: *mut c_uint) -> nvmlReturn_t {
    edge(|| {
        state::device(device)?;
        // SAFETY: the caller's out-pointer.
        unsafe { Out::new(gen) }?.set(state::machine()?.pcie.0);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(device: nvmlDevice_t, width: *mut c_uint) -> nvmlReturn_t {
    edge(|| {
        state::device(device)?;
        // SAFETY: the caller's out-pointer.
        unsafe { Out::new(width) }?.set(state::machine()?.pcie.1);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    path_info: *mut c_uint,
) -> nvmlReturn_t {
    edge(|| {
        let (a, _) = state::device(device1)?;
        let (b, _) = state::device(device2)?;
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(path_info) }?;
        out.set(state::machine()?.common_ancestor(a, b));
        Ok(())
    })
}

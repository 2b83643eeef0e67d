//! A GPU's NVLinks: whether each is up and what is at its other end. A link index beyond the
//! GPU's own links is `NVML_ERROR_INVALID_ARGUMENT`; the remote end of a link that is down is
//! `NVML_ERROR_NOT_SUPPORTED` (the stand-in's choice: NVML documents no answer for it).

use std::ffi::c_uint;

use super::{edge, pci_info, Out};
use crate::machine::{Link, Remote};
use crate::state;
use crate::sys::{
    nvmlDevice_t, nvmlPciInfo_t, nvmlReturn_t, NvmlResult, FEATURE_DISABLED, FEATURE_ENABLED, NVLINK_DEVICE_TYPE_GPU,
    NVLINK_DEVICE_TYPE_SWITCH,
};

/// Link `link` of the GPU `device` names.
fn link_of(device: nvmlDevice_t, link: c_uint) -> NvmlResult<Link> {
    let (_, gpu) = state::device(device)?;
    gpu.links.get(link as usize).copied().ok_or(nvmlReturn_t::INVALID_ARGUMENT)
}

/// What an active link reaches.
fn remote_of(device: nvmlDevice_t, link: c_uint) -> NvmlResult<Remote> {
    let l = link_of(device, link)?;
    l.remote.filter(|_| l.active).ok_or(nvmlReturn_t::NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut c_uint,
) -> nvmlReturn_t {
    edge(|| {
        let l = link_of(device, link)?;
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(is_active) }?;
        out.set(if l.active { FEATURE_ENABLED } else { FEATURE_DISABLED });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    edge(|| {
        link_of(device, link)?;
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pci) }?;
        let m = state::machine()?;
        // pciSubSystemId is "not filled" by NVML for a remote end: zero here.
        let info = match remote_of(device, link)? {
            Remote::Gpu(g) => pci_info(m.gpus[g].pci, m.pci_device_id, 0),
            Remote::Switch(s) => pci_info(m.switches[s].pci, m.switches[s].pci_device_id, 0),
        };
        out.set(info);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    device_type: *mut c_uint,
) -> nvmlReturn_t {
    edge(|| {
        link_of(device, link)?;
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(device_type) }?;
        out.set(match remote_of(device, link)? {
            Remote::Gpu(_) => NVLINK_DEVICE_TYPE_GPU,
            Remote::Switch(_) => NVLINK_DEVICE_TYPE_SWITCH,
        });
        Ok(())
    })
}

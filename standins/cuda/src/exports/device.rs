//! `cuInit`, versions, devices and error strings.

use std::ffi::{c_char, c_int, c_uint, CStr};

use super::{edge, write_str, Out};
use crate::sys::{CUdevice, CUresult, CUuuid};
use crate::{config, device, error};

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    edge(|| config::init(flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        unsafe { Out::new(version) }?.set(config::driver_version());
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(count) }?;
        out.set(device::count()?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(dev) }?;
        out.set(device::get(ordinal)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's buffer of `len` bytes.
    edge(|| unsafe { write_str(name, len, &device::name(dev)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_uint, dev: CUdevice) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(pi) }?;
        out.set(device::attribute(attrib, dev)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's buffer of `len` bytes.
    edge(|| unsafe { write_str(bus_id, len, &device::pci_bus_id(dev)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, bus_id: *const c_char) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(dev) }?;
        if bus_id.is_null() {
            return Err(CUresult::INVALID_VALUE);
        }
        // SAFETY: a non-NULL C string from the caller.
        let wanted = unsafe { CStr::from_ptr(bus_id) }.to_string_lossy().to_ascii_lowercase();
        let found = (0..device::count()?).find(|&d| {
            device::pci_bus_id(d).is_ok_and(|id| id == wanted || id.strip_prefix("0000:") == Some(wanted.as_str()))
        });
        out.set(found.ok_or(CUresult::INVALID_DEVICE)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(bytes) }?;
        device::check(dev)?;
        out.set(device::TOTAL_MEM);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(uuid) }?;
        out.set(device::uuid(dev)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(can) }?;
        out.set(c_int::from(device::can_access_peer(dev, peer)?));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: c_uint, out: *mut *const c_char) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(out) }?;
        let name = error::name(error);
        out.set(name.map_or(std::ptr::null(), CStr::as_ptr));
        name.map(drop).ok_or(CUresult::INVALID_VALUE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: c_uint, out: *mut *const c_char) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(out) }?;
        let text = error::description(error);
        out.set(text.map_or(std::ptr::null(), CStr::as_ptr));
        text.map(drop).ok_or(CUresult::INVALID_VALUE)
    })
}

//! NVML, the driver's management library, loaded at run time: `sys` (its C types and entry
//! points, found with `libloading`), then `checked` (each call made safely, its code turned
//! into an error). Detection sees only the safe surface re-exported here.

mod checked;
mod sys;

pub use checked::{CallError, Device, Nvml, PciAddress, PcieLevel, RemoteKind};
pub use sys::NVLINK_MAX_LINKS;

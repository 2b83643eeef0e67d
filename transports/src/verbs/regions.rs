//! Registrations of host memory for one-sided writes, cached per page range (registering pins
//! and maps memory in the NIC, far too slow per message).
//!
//! A cache of ordinary registrations would be wrong: a buffer freed and a new one mapped at the
//! same address would still name the old, pinned pages, and the peer's writes would land where
//! nobody looks. So host memory is offered only where the port supports **on-demand paging**
//! (`IBV_ACCESS_ON_DEMAND`: the NIC follows the process's page tables, as ConnectX-5 and later
//! do for RC writes), probed once per port; without it every message goes through the ring.
//!
//! Device memory is registered through **dma-buf** (`ibv_reg_dmabuf_mr` on the descriptor the
//! GPU driver exports), a whole allocation at a time, as NCCL registers user buffers: the
//! registration holds the memory, so a buffer freed and another allocated at the same address
//! must not reuse it; the driver's buffer id, checked on every lookup, tells them apart (as the
//! CUDA IPC registrations do).

use std::sync::{Arc, Mutex};

use std::os::fd::AsFd;

use super::device::{MemoryRegion, ProtectionDomain};
use super::stream::HostBuffer;
use super::sys::*;
use crate::error::Result;
use crate::ipc::DeviceAccess;
use crate::registration::Allocation;

/// Registrations kept at most; the least recently used goes first.
const CAPACITY: usize = 64;
const PAGE: usize = 4096;
const WRITE: i32 = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_ON_DEMAND;
/// A source is only read: registered without write access, so read-only memory works too.
const READ: i32 = ACCESS_ON_DEMAND;

/// What a registration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// A source of this side's one-sided writes.
    Read,
    /// A destination the peer writes.
    Write,
}

impl Access {
    fn flags(self) -> i32 {
        match self {
            Access::Read => READ,
            Access::Write => WRITE,
        }
    }

    /// For a dma-buf (pinned by its exporter: no on-demand paging).
    fn device_flags(self) -> i32 {
        match self {
            Access::Read => 0,
            Access::Write => ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
        }
    }
}

/// Whether the port registers on-demand regions, or why not.
pub(crate) fn probe_odp(pd: &Arc<ProtectionDomain>) -> std::result::Result<(), String> {
    let buf = HostBuffer::new(PAGE).map_err(|e| e.to_string())?;
    // SAFETY: the buffer outlives the region, dropped at the end of this function first.
    let mr = unsafe { MemoryRegion::register(pd.clone(), buf.addr(), PAGE, WRITE) };
    mr.map(drop).map_err(|e| format!("no on-demand paging ({e})"))
}

struct Entry {
    mr: Arc<MemoryRegion>,
    access: Access,
    used: u64,
}

struct DeviceEntry {
    allocation: Allocation,
    mr: Arc<MemoryRegion>,
    access: Access,
    used: u64,
}

/// The cache, shared by the connections of one port.
#[derive(Default)]
pub(crate) struct Regions {
    entries: Mutex<(Vec<Entry>, u64)>,
    device: Mutex<(Vec<DeviceEntry>, u64)>,
}

impl Regions {
    /// A registration covering `[addr, addr + len)`: a cached one, or a new one of the whole
    /// pages around it.
    pub(crate) fn cover(
        &self,
        pd: &Arc<ProtectionDomain>,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<Arc<MemoryRegion>> {
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (entries, clock) = &mut *guard;
        *clock += 1;
        let end = addr.saturating_add(len);
        let covers = |e: &Entry| e.access == access && e.mr.addr <= addr && end <= e.mr.addr + e.mr.len;
        if let Some(e) = entries.iter_mut().find(|e| covers(e)) {
            e.used = *clock;
            return Ok(e.mr.clone());
        }
        let base = addr / PAGE * PAGE;
        let span = end.next_multiple_of(PAGE) - base;
        // SAFETY: an on-demand region pins nothing: the NIC resolves each page when it touches
        // it, so a range unmapped later is an error completion, never a stray write; the
        // caller's own contract covers the bytes it reads or writes through it.
        let mr = Arc::new(unsafe { MemoryRegion::register(pd.clone(), base, span, access.flags())? });
        if entries.len() >= CAPACITY {
            if let Some(i) = entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) {
                // In-flight writes keep their own reference; the region goes when they are done.
                entries.swap_remove(i);
            }
        }
        entries.push(Entry { mr: mr.clone(), access, used: *clock });
        Ok(mr)
    }

    /// How many host memory registrations are cached.
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().map_or(0, |g| g.0.len())
    }

    /// A registration of the device allocation `[addr, addr + len)` lies in, through dma-buf:
    /// a cached one of the same allocation (same buffer id), or a new one of its whole pages;
    /// `None` where the memory is not `device`'s or the driver exports no dma-buf for it.
    pub(crate) fn cover_device(
        &self,
        pd: &Arc<ProtectionDomain>,
        device: &dyn DeviceAccess,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<Option<Arc<MemoryRegion>>> {
        let Some(a) = device.allocation(addr as u64)? else { return Ok(None) };
        let end = (addr as u64).saturating_add(len as u64);
        if (addr as u64) < a.base || end > a.base.saturating_add(a.len) {
            return Ok(None);
        }
        let mut guard = self.device.lock().unwrap_or_else(|p| p.into_inner());
        let (entries, clock) = &mut *guard;
        *clock += 1;
        // Registrations of memory freed since (another allocation overlaps them) go; writes in
        // flight keep their own reference.
        entries.retain(|e| e.allocation == a || !e.allocation.overlaps(a.base, a.len));
        if let Some(e) = entries.iter_mut().find(|e| e.allocation == a && e.access == access) {
            e.used = *clock;
            return Ok(Some(e.mr.clone()));
        }
        let page = PAGE as u64;
        let first = a.base / page * page;
        let span = a.base.saturating_add(a.len).next_multiple_of(page) - first;
        let Some(fd) = device.dmabuf(first, span)? else { return Ok(None) };
        let span = usize::try_from(span).map_err(|_| crate::Error::Unsupported(format!("{span} bytes")))?;
        let mr = Arc::new(MemoryRegion::register_dmabuf(pd.clone(), fd.as_fd(), first, span, access.device_flags())?);
        if entries.len() >= CAPACITY {
            if let Some(i) = entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) {
                entries.swap_remove(i);
            }
        }
        entries.push(DeviceEntry { allocation: a, mr: mr.clone(), access, used: *clock });
        Ok(Some(mr))
    }

    /// How many device memory registrations are cached.
    pub(crate) fn device_len(&self) -> usize {
        self.device.lock().map_or(0, |g| g.0.len())
    }
}

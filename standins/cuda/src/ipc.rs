//! Legacy CUDA IPC: memory and event handles are the real 64-byte structs holding a magic, the
//! exporter's pid, the memfd's fd number and inode, and sizes. The importer maps the memfd
//! through `/proc/<pid>/fd/<fd>` (checking the inode, so a recycled fd is not mistaken for it).
//!
//! Rules: only the base of a `cuMemAlloc_v2` allocation has a handle (pool memory has none);
//! opening a memory handle in the exporting process is `CUDA_ERROR_INVALID_CONTEXT`; a second
//! open of the same handle in the same context is `CUDA_ERROR_ALREADY_MAPPED`; only
//! `CU_EVENT_INTERPROCESS` events have handles.

use std::sync::Mutex;

use crate::context;
use crate::event;
use crate::handle::lock;
use crate::mapping::{page, SharedFile};
use crate::memory::{self, Kind};
use crate::sys::{CUipcHandle, CUresult, CuResult, EVENT_INTERPROCESS, IPC_MEM_LAZY_ENABLE_PEER_ACCESS};

const MEM_MAGIC: &[u8; 8] = b"tcSTmem1";
const EVENT_MAGIC: &[u8; 8] = b"tcSTevt1";

/// What a handle carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wire {
    pid: u32,
    fd: i32,
    ino: u64,
    file_len: u64,
    pad: u64,
    size: u64,
}

impl Wire {
    fn encode(&self, magic: &[u8; 8]) -> CUipcHandle {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(magic);
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.ino.to_le_bytes());
        b[24..32].copy_from_slice(&self.file_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.pad.to_le_bytes());
        b[40..48].copy_from_slice(&self.size.to_le_bytes());
        CUipcHandle { reserved: b }
    }

    fn decode(h: &CUipcHandle, magic: &[u8; 8]) -> CuResult<Self> {
        let b = &h.reserved;
        if &b[0..8] != magic {
            return Err(CUresult::INVALID_VALUE);
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let w = Wire {
            pid: u32::from_le_bytes(b[8..12].try_into().unwrap_or_default()),
            fd: i32::from_le_bytes(b[12..16].try_into().unwrap_or_default()),
            ino: u64_at(16),
            file_len: u64_at(24),
            pad: u64_at(32),
            size: u64_at(40),
        };
        if w.pad.checked_add(w.size).map_or(true, |end| end > w.file_len) {
            return Err(CUresult::INVALID_VALUE);
        }
        Ok(w)
    }

    fn open(&self) -> CuResult<SharedFile> {
        SharedFile::open_remote(self.pid, self.fd, self.ino, self.file_len as usize).map_err(|_| CUresult::MAP_FAILED)
    }
}

/// One opened memory handle: which context opened whose memfd, and where it is mapped.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Opened {
    ctx: usize,
    pid: u32,
    ino: u64,
    base: u64,
}

static OPENED: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

/// `cuIpcGetMemHandle`.
pub fn get_mem_handle(ptr: u64) -> CuResult<CUipcHandle> {
    context::current()?.core.resource_call("cuIpcGetMemHandle", false);
    let a = memory::find(ptr).filter(|a| a.base == ptr && a.kind == Kind::Device).ok_or(CUresult::INVALID_VALUE)?;
    let d = a.device_backing().ok_or(CUresult::INVALID_VALUE)?;
    Ok(Wire {
        pid: std::process::id(),
        fd: d.file.raw_fd(),
        ino: d.file.ino,
        file_len: d.file.len as u64,
        pad: d.pad as u64,
        size: a.size as u64,
    }
    .encode(MEM_MAGIC))
}

/// `cuIpcOpenMemHandle_v2`: maps the exporter's memory in the current context.
pub fn open_mem_handle(handle: &CUipcHandle, flags: u32) -> CuResult<u64> {
    let ctx = context::current()?;
    ctx.core.resource_call("cuIpcOpenMemHandle", false);
    if flags & !IPC_MEM_LAZY_ENABLE_PEER_ACCESS != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let w = Wire::decode(handle, MEM_MAGIC)?;
    if w.pid == std::process::id() {
        return Err(CUresult::INVALID_CONTEXT);
    }
    let mut opened = lock(&OPENED);
    if opened.iter().any(|o| (o.ctx, o.pid, o.ino) == (ctx.handle(), w.pid, w.ino)) {
        return Err(CUresult::ALREADY_MAPPED);
    }
    let (base, backing) = memory::map_device(w.open()?, w.pad as usize)?;
    let base = memory::insert_ipc(base, w.size as usize, backing, &ctx);
    opened.push(Opened { ctx: ctx.handle(), pid: w.pid, ino: w.ino, base });
    Ok(base)
}

/// `cuIpcCloseMemHandle`: `ptr` is what `cuIpcOpenMemHandle_v2` returned.
pub fn close_mem_handle(ptr: u64) -> CuResult<()> {
    context::current()?.core.resource_call("cuIpcCloseMemHandle", false);
    let a = memory::find(ptr).filter(|a| a.base == ptr && a.kind == Kind::Ipc).ok_or(CUresult::INVALID_VALUE)?;
    if let Ok(owner) = context::lookup(a.ctx) {
        owner.drain();
    }
    memory::remove_ipc(ptr)?;
    lock(&OPENED).retain(|o| o.base != ptr);
    Ok(())
}

/// Forgets the handles a destroyed context opened (its mappings went with its memory).
pub fn release_context(ctx: usize) {
    lock(&OPENED).retain(|o| o.ctx != ctx);
}

/// `cuIpcGetEventHandle`: only for `CU_EVENT_INTERPROCESS` events.
pub fn get_event_handle(event: usize) -> CuResult<CUipcHandle> {
    let ev = event::lookup(event)?;
    ev.core.check()?;
    let file = ev.counters.file().filter(|_| ev.flags & EVENT_INTERPROCESS != 0).ok_or(CUresult::INVALID_VALUE)?;
    Ok(Wire { pid: std::process::id(), fd: file.raw_fd(), ino: file.ino, file_len: file.len as u64, pad: 0, size: 0 }
        .encode(EVENT_MAGIC))
}

/// `cuIpcOpenEventHandle`: an event in the current context sharing the exporter's counters.
pub fn open_event_handle(handle: &CUipcHandle) -> CuResult<usize> {
    context::current()?;
    let w = Wire::decode(handle, EVENT_MAGIC)?;
    if w.file_len != page() as u64 {
        return Err(CUresult::INVALID_VALUE);
    }
    event::open_shared(w.open()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_reject_garbage() {
        let w = Wire { pid: 42, fd: 7, ino: 99, file_len: 8192, pad: 256, size: 100 };
        let h = w.encode(MEM_MAGIC);
        assert_eq!(Wire::decode(&h, MEM_MAGIC), Ok(w));
        assert_eq!(Wire::decode(&h, EVENT_MAGIC), Err(CUresult::INVALID_VALUE));
        let bad = Wire { size: 9000, ..w }.encode(MEM_MAGIC);
        assert_eq!(Wire::decode(&bad, MEM_MAGIC), Err(CUresult::INVALID_VALUE));
    }
}

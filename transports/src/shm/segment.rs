//! A shared-memory segment: an anonymous memory file (`memfd_create`) mapped by two processes.
//!
//! memfd rather than `/dev/shm`: it is not bounded by the size of a `/dev/shm` mount (Docker's
//! 64 MiB default turns into SIGBUS with POSIX shm), and nothing is left behind when a process
//! dies. The peer opens it through `/proc/<pid>/fd/<fd>` while the creator holds it open. The
//! memory is reserved with `posix_fallocate` up front, so a lack of memory is an error at set-up
//! rather than a SIGBUS on first touch, and sealed against resizing, so the peer cannot cause
//! one later by truncating the file.

use std::ffi::CStr;
use std::fs::OpenOptions;
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

use crate::error::{Error, Result};

/// The seals every segment carries: its size is fixed once created, so neither process can
/// shrink the file under the other's mapping (a SIGBUS) or grow it.
const FIXED_SIZE: SealFlag = SealFlag::F_SEAL_SHRINK.union(SealFlag::F_SEAL_GROW);

/// A mapping shared with another process. Unmapped on drop.
pub(crate) struct Segment {
    base: NonNull<u8>,
    len: usize,
    /// The creator keeps the file open until the peer has mapped it.
    file: Option<OwnedFd>,
}

// SAFETY: the mapping is plain memory owned by this value; all concurrent access to it goes
// through the atomics and the single-producer/single-consumer discipline of `ring`.
unsafe impl Send for Segment {}
// SAFETY: as above; `Segment` itself hands out only raw pointers.
unsafe impl Sync for Segment {}

fn sys(context: &str, e: nix::errno::Errno) -> Error {
    Error::io(context, std::io::Error::from(e))
}

impl Segment {
    /// Creates and maps a zeroed segment of `len` bytes.
    pub(crate) fn create(len: usize) -> Result<Segment> {
        let size = NonZeroUsize::new(len).ok_or_else(|| Error::Unsupported("empty shared segment".into()))?;
        let name: &CStr = c"topoccl-shm";
        let fd = memfd_create(name, MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING)
            .map_err(|e| sys("memfd_create", e))?;
        let off = libc_off(len)?;
        nix::fcntl::posix_fallocate(fd.as_raw_fd(), 0, off)
            .map_err(|e| sys(&format!("reserving {len} bytes of shared memory"), e))?;
        fcntl(fd.as_raw_fd(), FcntlArg::F_ADD_SEALS(FIXED_SIZE | SealFlag::F_SEAL_SEAL))
            .map_err(|e| sys("sealing the shared memory's size", e))?;
        let base = map(&fd, size)?;
        Ok(Segment { base, len, file: Some(fd) })
    }

    /// Maps the segment another process created, named by its pid and descriptor.
    pub(crate) fn open(pid: u32, fd: i32, len: usize) -> Result<Segment> {
        let size = NonZeroUsize::new(len).ok_or_else(|| Error::Unsupported("empty shared segment".into()))?;
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format!("opening the peer's shared memory {path}"), e))?;
        let meta = file.metadata().map_err(|e| Error::io(format!("inspecting {path}"), e))?;
        if meta.len() < len as u64 {
            return Err(Error::Protocol(format!("{path} has {} bytes, expected {len}", meta.len())));
        }
        // A file that could shrink after we map it would turn our reads into SIGBUS.
        let seals = fcntl(file.as_raw_fd(), FcntlArg::F_GET_SEALS)
            .map_err(|e| sys(&format!("reading the seals of {path}"), e))?;
        if !SealFlag::from_bits_truncate(seals).contains(FIXED_SIZE) {
            return Err(Error::Protocol(format!("{path} is not sealed against resizing")));
        }
        let base = map(&file, size)?;
        Ok(Segment { base, len, file: None })
    }

    /// The creator's descriptor, to be named to the peer.
    pub(crate) fn raw_fd(&self) -> Option<i32> {
        self.file.as_ref().map(|f| f.as_raw_fd())
    }

    /// Closes the file once the peer has mapped it; the mappings stay.
    pub(crate) fn release_file(&mut self) {
        self.file = None;
    }

    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

fn libc_off(len: usize) -> Result<i64> {
    i64::try_from(len).map_err(|_| Error::Unsupported(format!("segment of {len} bytes")))
}

fn map<F: std::os::fd::AsFd>(file: &F, size: NonZeroUsize) -> Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping of a file we hold open; no existing Rust object is
    // aliased, and the pointer is only used through `Segment`, which unmaps it on drop.
    let p = unsafe { mmap(None, size, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, file, 0) }
        .map_err(|e| sys("mapping shared memory", e))?;
    Ok(p.cast())
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping made in `map`, and every ring that
        // points into it holds an `Arc<Segment>`, so nothing uses it after this.
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_sealed_and_unsealed_files_are_refused() {
        let mine = Segment::create(8192).unwrap();
        let fd = mine.raw_fd().unwrap();
        let theirs = Segment::open(std::process::id(), fd, 8192).unwrap();
        assert_eq!(theirs.len(), 8192);
        // The seals hold: the file cannot shrink under a mapping.
        assert!(nix::unistd::ftruncate(mine.file.as_ref().unwrap(), 0).is_err());

        // A peer's file that could shrink is refused before it is mapped.
        let loose = memfd_create(c"loose", MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&loose, 8192).unwrap();
        let err = Segment::open(std::process::id(), loose.as_raw_fd(), 8192).err().expect("refused");
        assert!(err.to_string().contains("not sealed"), "{err}");
    }
}

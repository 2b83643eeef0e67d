//! The operating-system side of memory: memfds (the backing of device memory and of
//! interprocess events, shareable through `/proc/<pid>/fd/<fd>`) and the mappings over them.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::ptr::NonNull;

/// The page size.
pub fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

pub fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

/// A memfd: the file behind one device allocation or one interprocess event.
pub struct SharedFile {
    pub fd: OwnedFd,
    pub len: usize,
    /// The inode: what an importer compares to make sure `/proc/<pid>/fd/<fd>` is still it.
    pub ino: u64,
}

impl SharedFile {
    /// A new zero-filled memfd of `len` bytes.
    pub fn create(name: &str, len: usize) -> io::Result<Self> {
        let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `cname` is a valid C string; the returned fd is checked before use.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = File::from(fd);
        file.set_len(len as u64)?;
        let ino = file.metadata()?.ino();
        Ok(SharedFile { fd: file.into(), len, ino })
    }

    /// Another process's memfd, opened through procfs; it must still have inode `ino` and
    /// length `len`.
    pub fn open_remote(pid: u32, fd: i32, ino: u64, len: usize) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{pid}/fd/{fd}"))?;
        let meta = file.metadata()?;
        if meta.ino() != ino || meta.len() != len as u64 {
            return Err(io::Error::new(io::ErrorKind::NotFound, "the exported memory is gone"));
        }
        Ok(SharedFile { fd: file.into(), len, ino })
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// One mapping, unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory; who may touch it is the owners' business.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `mmap` with the given arguments at an address the kernel picks.
    fn map(len: usize, prot: i32, flags: i32, fd: i32) -> io::Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address overlaps nothing of ours.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast()).map(|ptr| Mapping { ptr, len }).ok_or_else(|| io::Error::from(io::ErrorKind::Other))
    }

    /// The whole of `file`, shared, with protection `prot` (`PROT_NONE` for the address a
    /// device pointer names, so that host code dereferencing it faults as on a GPU).
    pub fn file(file: &SharedFile, prot: i32) -> io::Result<Self> {
        Self::map(file.len, prot, libc::MAP_SHARED, file.raw_fd())
    }

    /// The whole of `file` read-write, followed by one inaccessible guard page: the alias
    /// through which the stand-in's workers and kernels reach device memory.
    pub fn file_with_guard(file: &SharedFile) -> io::Result<Self> {
        let reserve = Self::reserve(file.len + page())?;
        // SAFETY: MAP_FIXED over the start of a reservation this function owns.
        let p = unsafe {
            libc::mmap(
                reserve.ptr().cast(),
                file.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(reserve)
    }

    /// `len` bytes of private read-write memory followed by a guard page (pinned host memory).
    pub fn anonymous_with_guard(len: usize) -> io::Result<Self> {
        let reserve = Self::reserve(len + page())?;
        // SAFETY: changes the protection of the first `len` bytes of our own reservation.
        let r = unsafe { libc::mprotect(reserve.ptr().cast(), len, libc::PROT_READ | libc::PROT_WRITE) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(reserve)
    }

    /// Inaccessible address space of `len` bytes.
    fn reserve(len: usize) -> io::Result<Self> {
        Self::map(len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range this value mapped; nothing uses it any more (every
        // user holds the value that owns this mapping).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_sees_the_file_and_ends_in_a_guard() {
        let f = SharedFile::create("t", page()).unwrap();
        let a = Mapping::file_with_guard(&f).unwrap();
        let b = Mapping::file_with_guard(&f).unwrap();
        assert_eq!(a.len(), 2 * page());
        // SAFETY: both are read-write over the file's one page.
        unsafe {
            *a.ptr().add(5) = 42;
            assert_eq!(*b.ptr().add(5), 42);
        }
        assert_eq!(round_up(1, 256), Some(256));
        assert_eq!(round_up(512, 256), Some(512));
        assert_eq!(round_up(usize::MAX, 256), None);
    }
}

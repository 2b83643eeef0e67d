//! Where bytes live: a [`Region`] is a range of memory named by address, with the memory space
//! it lies in. It is plain data, not a borrow (a C caller's buffer, a CUDA device pointer, a
//! slot of a peer's shared window): whoever hands one to a connection or to the executor's
//! local operations promises it stays valid for as long as they use it, and only functions
//! that are `unsafe` turn one back into bytes.

/// The memory a region lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemSpace {
    /// This process's ordinary memory.
    Host,
    /// Memory of the CUDA device with this ordinal (the GPU data path; nothing in this crate
    /// reaches it yet).
    Device(u32),
}

impl std::fmt::Display for MemSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemSpace::Host => f.write_str("host memory"),
            MemSpace::Device(d) => write!(f, "memory of CUDA device {d}"),
        }
    }
}

/// `len` bytes at `addr` in `space`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub space: MemSpace,
    pub addr: usize,
    pub len: usize,
}

impl Region {
    pub const EMPTY: Region = Region { space: MemSpace::Host, addr: 0, len: 0 };

    #[inline]
    pub fn new(space: MemSpace, addr: usize, len: usize) -> Region {
        Region { space, addr, len }
    }

    /// Host memory at `addr`.
    #[inline]
    pub fn host(addr: usize, len: usize) -> Region {
        Region { space: MemSpace::Host, addr, len }
    }

    /// The bytes of `s`, as a region (its lifetime is the caller's to respect).
    #[inline]
    pub fn of(s: &[u8]) -> Region {
        Region::host(s.as_ptr() as usize, s.len())
    }

    /// As [`Region::of`], for memory that may be written through the region.
    #[inline]
    pub fn of_mut(s: &mut [u8]) -> Region {
        Region::host(s.as_mut_ptr() as usize, s.len())
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the last byte (`None` when that overflows the address space).
    #[inline]
    pub fn end(&self) -> Option<usize> {
        self.addr.checked_add(self.len)
    }

    /// Bytes `[at, at + len)` of this region, if they lie inside it.
    #[inline]
    pub fn sub(&self, at: usize, len: usize) -> Option<Region> {
        let end = at.checked_add(len)?;
        (end <= self.len).then(|| Region { space: self.space, addr: self.addr + at, len })
    }

    /// Whether the two regions share a byte (empty regions share none).
    #[inline]
    pub fn overlaps(&self, other: &Region) -> bool {
        self.space == other.space
            && self.len > 0
            && other.len > 0
            && self.addr < other.addr.saturating_add(other.len)
            && other.addr < self.addr.saturating_add(self.len)
    }

    /// The bytes, to read.
    ///
    /// # Safety
    /// The region must be host memory, valid for reads of `len` bytes for `'a`, and nothing
    /// may write it meanwhile.
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        debug_assert_eq!(self.space, MemSpace::Host);
        if self.len == 0 {
            return &[];
        }
        // SAFETY: non-empty host memory valid for `len` bytes and not written meanwhile, by this
        // fn's contract.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// The bytes, to write.
    ///
    /// # Safety
    /// As for [`Region::bytes`], and nothing else may read or write the bytes meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        debug_assert_eq!(self.space, MemSpace::Host);
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and exclusive by this fn's contract.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_regions_and_overlap() {
        let r = Region::host(100, 10);
        assert_eq!(r.sub(4, 6), Some(Region::host(104, 6)));
        assert_eq!(r.sub(4, 7), None);
        assert_eq!(r.sub(usize::MAX, 2), None);
        assert!(r.overlaps(&Region::host(109, 1)));
        assert!(!r.overlaps(&Region::host(110, 5)));
        assert!(!r.overlaps(&Region::host(105, 0)));
        assert!(!r.overlaps(&Region::new(MemSpace::Device(0), 100, 10)));
        assert_eq!(Region::host(usize::MAX, 2).end(), None);
    }
}

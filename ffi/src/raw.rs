//! Raw C pointers into Rust references: every `unsafe` conversion of the C ABI is here, each
//! checked for NULL first, so the entry points see slices and `Result`s only.

use std::ffi::c_void;

use crate::error::{invalid, Result};

/// Where a caller's buffer is, kept as plain numbers while a group waits (a pointer is not
/// `Send`; the caller keeps the memory valid until `ncclGroupEnd`, as NCCL requires).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub addr: usize,
    pub len: usize,
}

impl Region {
    pub fn new(ptr: *const c_void, len: usize, what: &str) -> Result<Region> {
        if ptr.is_null() && len > 0 {
            return Err(invalid(format!("{what} is NULL")));
        }
        let addr = ptr as usize;
        if addr.checked_add(len).is_none() {
            return Err(invalid(format!("{what} of {len} bytes runs past the end of the address space")));
        }
        Ok(Region { addr, len })
    }

    pub fn empty() -> Region {
        Region { addr: 0, len: 0 }
    }

    pub fn overlaps(&self, other: &Region) -> bool {
        self.len > 0 && other.len > 0 && self.addr < other.addr + other.len && other.addr < self.addr + self.len
    }

    /// The bytes, to read.
    ///
    /// # Safety
    /// The region must be readable memory of the caller that nothing writes while the
    /// returned slice lives (NCCL's contract for a send buffer during its call).
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: non-NULL (checked in `new`) and valid for `len` bytes by this fn's contract.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// The bytes, to write.
    ///
    /// # Safety
    /// The region must be writable memory of the caller that nothing else touches while the
    /// returned slice lives (NCCL's contract for a receive buffer during its call).
    pub unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and exclusive by this fn's contract.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

/// Stores `value` in a caller's out-parameter.
pub fn put<T>(out: *mut T, value: T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and the API's contract makes an out-parameter point at a writable `T`.
    unsafe { out.write(value) };
    Ok(())
}

/// A reference to a caller's struct (NULL allowed where the API allows it).
pub fn get<'a, T>(ptr: *const T) -> Option<&'a T> {
    // SAFETY: a non-NULL pointer the API passes in points at a valid `T` for the call.
    unsafe { ptr.as_ref() }
}

/// Reads `n` ints from a caller's array.
pub fn ints(ptr: *const i32, n: usize, what: &str) -> Result<Vec<i32>> {
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and the API's contract makes it an array of at least `n` ints.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec())
}

/// Reads `n` bytes at `addr` (a PreMulSum scalar read at call time).
pub fn read_bytes(addr: usize, n: usize) -> Result<Vec<u8>> {
    if addr == 0 {
        return Err(invalid("the PreMulSum scalar's address is NULL"));
    }
    // SAFETY: the address was given for `ncclScalarDevice` residence, which by NCCL's contract
    // stays valid, holding one element, for as long as the operator is used.
    Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, n) }.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_check_null_and_overlap() {
        assert!(Region::new(std::ptr::null(), 4, "buf").is_err());
        assert!(Region::new(std::ptr::null(), 0, "buf").is_ok());
        let a = Region { addr: 100, len: 10 };
        assert!(a.overlaps(&Region { addr: 109, len: 1 }));
        assert!(!a.overlaps(&Region { addr: 110, len: 5 }));
        assert!(!a.overlaps(&Region { addr: 105, len: 0 }));
        assert!(Region::new(usize::MAX as *const c_void, 2, "buf").is_err());
    }
}

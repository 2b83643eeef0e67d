//! Raw C pointers into Rust references: every `unsafe` conversion of the C ABI is here, each
//! checked for NULL first, so the entry points see slices and `Result`s only.

use crate::error::{invalid, Result};

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

/// A mutable reference to a caller's struct (NULL allowed where the API allows it).
pub fn get_mut<'a, T>(ptr: *mut T) -> Option<&'a mut T> {
    // SAFETY: a non-NULL pointer the API passes in points at a valid, writable `T` that the
    // caller does not touch during the call.
    unsafe { ptr.as_mut() }
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

//! A caller's raw C pointers into Rust values. Every conversion of a pointer the C ABI is
//! handed goes through these `unsafe fn`s, each checking NULL first: the entry point's `unsafe`
//! block says which argument the API's contract vouches for, and these say what they need of
//! it. Nothing returned outlives the call it was made in.

use std::ffi::{c_char, CStr};

use crate::error::{invalid, Result};

/// Stores `value` in a caller's out-parameter.
///
/// # Safety
/// `out` is NULL or points at a `T` the caller lets this call write.
pub unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, so writable (this fn's contract).
    unsafe { out.write(value) };
    Ok(())
}

/// A reference to a caller's struct (NULL allowed where the API allows it).
///
/// # Safety
/// `ptr` is NULL or points at a valid `T` that nobody writes while the reference is used,
/// which must end before the entry point returns.
pub unsafe fn get<'a, T>(ptr: *const T) -> Option<&'a T> {
    // SAFETY: NULL or valid for `'a` (this fn's contract).
    unsafe { ptr.as_ref() }
}

/// A mutable reference to a caller's struct (NULL allowed where the API allows it).
///
/// # Safety
/// As for [`get`], and the caller does not touch the `T` while the reference is used.
pub unsafe fn get_mut<'a, T>(ptr: *mut T) -> Option<&'a mut T> {
    // SAFETY: NULL or valid and not aliased for `'a` (this fn's contract).
    unsafe { ptr.as_mut() }
}

/// Copies `n` elements of a caller's array.
///
/// # Safety
/// `ptr` is NULL or points at `n` valid `T`s.
pub unsafe fn array<T: Copy>(ptr: *const T, n: usize, what: &str) -> Result<Vec<T>> {
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, so an array of at least `n` elements (this fn's contract).
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec())
}

/// Copies `n` bytes at `addr` (a PreMulSum scalar read at call time).
///
/// # Safety
/// `addr` is 0 or the address of `n` readable bytes.
pub unsafe fn read_bytes(addr: usize, n: usize) -> Result<Vec<u8>> {
    if addr == 0 {
        return Err(invalid("the PreMulSum scalar's address is NULL"));
    }
    // SAFETY: non-zero, so `n` readable bytes (this fn's contract).
    Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, n) }.to_vec())
}

/// A caller's C string, copied (bytes that are not UTF-8 replaced); `None` for NULL.
///
/// # Safety
/// `ptr` is NULL or points at a NUL-terminated string.
pub unsafe fn string(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL, so NUL-terminated (this fn's contract).
    Some(unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned())
}

/// Copies `bytes` into a caller's buffer.
///
/// # Safety
/// `out` is NULL or points at `bytes.len()` writable bytes that do not overlap `bytes`.
pub unsafe fn write_bytes(out: *mut u8, bytes: &[u8], what: &str) -> Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    if out.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, so `bytes.len()` writable bytes apart from `bytes` (this fn's contract).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, bytes.len()) };
    Ok(())
}

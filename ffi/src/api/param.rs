#![allow(non_camel_case_types)]

//! NCCL 2.30's parameter API: the settings this library reads, by name, with their current
//! values (the environment's, else "" for unset). A handle is a parameter's index + 1. Values
//! are read when asked, so they follow the environment as NCCL's follow their sources.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::OnceLock;

use super::{export, guard};
use crate::abi::*;
use crate::error::{invalid, Result};
use crate::log::{self, Subsys};
use crate::raw;

/// Every setting the library reads (`TOPOCCL_SECRET` is left out: it is a credential).
const KEYS: [&str; 23] = [
    "NCCL_ALGO",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_P2P_DISABLE",
    "NCCL_PROTO",
    "NCCL_SHM_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "TOPOCCL_ALGO",
    "TOPOCCL_CACHE_DIR",
    "TOPOCCL_CACHE_MAX_BYTES",
    "TOPOCCL_IPC_BYTES",
    "TOPOCCL_MAX_BACKLOG",
    "TOPOCCL_NSOCKS",
    "TOPOCCL_ROOT",
    "TOPOCCL_SHM_BYTES",
    "TOPOCCL_SHM_DIRECT",
    "TOPOCCL_SLICE_BYTES",
    "TOPOCCL_SOCKET_IFNAME",
    "TOPOCCL_TIMEOUT",
    "TOPOCCL_TOPOLOGY",
    "TOPOCCL_TRANSPORT",
    "TOPOCCL_TUNE",
];

/// `ncclParamHandle_t`.
pub type ncclParamHandle_t = *mut c_void;

thread_local! {
    /// The strings handed out on this thread, valid until its next call that returns one (as
    /// NCCL documents for `ncclParamGetParameter`).
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn key_of(h: ncclParamHandle_t) -> Result<&'static str> {
    (h as usize)
        .checked_sub(1)
        .and_then(|i| KEYS.get(i))
        .copied()
        .ok_or_else(|| invalid(format!("{h:p} is not a parameter handle")))
}

fn value(key: &str) -> String {
    topoccl::env::var(key).unwrap_or_default()
}

/// `value` as a C string kept for the caller until its next such call on this thread.
fn hand_out(value: String) -> *const c_char {
    let c = CString::new(value.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| {
        *l.borrow_mut() = c;
        l.borrow().as_ptr()
    })
}

fn c_key(key: *const c_char) -> Result<String> {
    // SAFETY: `key` is NULL or NUL-terminated (the API's contract).
    unsafe { raw::string(key) }.ok_or_else(|| invalid("key is NULL"))
}

fn bind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t {
    guard("ncclParamBind", || {
        let key = c_key(key)?;
        let i = KEYS.iter().position(|k| *k == key).ok_or_else(|| invalid(format!("no parameter `{key}`")))?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, (i + 1) as ncclParamHandle_t, "out") }?;
        Ok(NCCL_SUCCESS)
    })
}

/// Reads the handle's value as an integer of type `T`.
fn integer<T: TryFrom<i128>>(name: &str, h: ncclParamHandle_t, out: *mut T) -> ncclResult_t {
    guard(name, || {
        let key = key_of(h)?;
        let v = value(key);
        let parsed: i128 = v.trim().parse().map_err(|_| invalid(format!("{key} = `{v}` is not an integer")))?;
        let t =
            T::try_from(parsed).map_err(|_| invalid(format!("{key} = {parsed} does not fit the type asked for")))?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, t, "out") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn get_i8(h: ncclParamHandle_t, out: *mut i8) -> ncclResult_t {
    integer("ncclParamGetI8", h, out)
}
fn get_i16(h: ncclParamHandle_t, out: *mut i16) -> ncclResult_t {
    integer("ncclParamGetI16", h, out)
}
fn get_i32(h: ncclParamHandle_t, out: *mut i32) -> ncclResult_t {
    integer("ncclParamGetI32", h, out)
}
fn get_i64(h: ncclParamHandle_t, out: *mut i64) -> ncclResult_t {
    integer("ncclParamGetI64", h, out)
}
fn get_u8(h: ncclParamHandle_t, out: *mut u8) -> ncclResult_t {
    integer("ncclParamGetU8", h, out)
}
fn get_u16(h: ncclParamHandle_t, out: *mut u16) -> ncclResult_t {
    integer("ncclParamGetU16", h, out)
}
fn get_u32(h: ncclParamHandle_t, out: *mut u32) -> ncclResult_t {
    integer("ncclParamGetU32", h, out)
}
fn get_u64(h: ncclParamHandle_t, out: *mut u64) -> ncclResult_t {
    integer("ncclParamGetU64", h, out)
}

fn get_str(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t {
    guard("ncclParamGetStr", || {
        let key = key_of(h)?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, hand_out(value(key)), "out") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn get_raw(h: ncclParamHandle_t, out: *mut c_void, max_len: c_int, len: *mut c_int) -> ncclResult_t {
    guard("ncclParamGet", || {
        let key = key_of(h)?;
        let v = value(key);
        let max = usize::try_from(max_len).map_err(|_| invalid(format!("maxLen {max_len}")))?;
        let n = v.len().min(max);
        // SAFETY: `out` is NULL or a buffer of `maxLen` bytes (the API's contract); `n` <= it.
        unsafe { raw::write_bytes(out.cast::<u8>(), &v.as_bytes()[..n], "out") }?;
        // SAFETY: `len` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(len, n as c_int, "len") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn get_parameter(key: *const c_char, out: *mut *const c_char, len: *mut c_int) -> ncclResult_t {
    guard("ncclParamGetParameter", || {
        let key = c_key(key)?;
        if !KEYS.contains(&key.as_str()) {
            return Err(invalid(format!("no parameter `{key}`")));
        }
        let v = value(&key);
        let n = v.len() as c_int;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, hand_out(v), "value") }?;
        // SAFETY: `len` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(len, n, "valueLen") }?;
        Ok(NCCL_SUCCESS)
    })
}

/// The key table as C strings (made once; lives as long as the library).
fn key_table() -> &'static [usize] {
    static TABLE: OnceLock<(Vec<CString>, Vec<usize>)> = OnceLock::new();
    let (_, ptrs) = TABLE.get_or_init(|| {
        let strings: Vec<CString> = KEYS.iter().map(|k| CString::new(*k).unwrap_or_default()).collect();
        let ptrs = strings.iter().map(|s| s.as_ptr() as usize).collect();
        (strings, ptrs)
    });
    ptrs
}

fn all_keys(table: *mut *const *const c_char, len: *mut c_int) -> ncclResult_t {
    guard("ncclParamGetAllParameterKeys", || {
        let t = key_table();
        // SAFETY: `table` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(table, t.as_ptr() as *const *const c_char, "table") }?;
        // SAFETY: `len` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(len, t.len() as c_int, "tableLen") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn dump_all() {
    for key in KEYS {
        log::info(Subsys::Env, None, format_args!("{key} = {}", value(key)));
    }
}

fn reset_debug_init() {
    log::reset();
}

export! {
    /// A handle to the parameter `key`.
    ncclParamBind / pncclParamBind (out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t = bind
}
export! {
    /// The value as an int8.
    ncclParamGetI8 / pncclParamGetI8 (h: ncclParamHandle_t, out: *mut i8) -> ncclResult_t = get_i8
}
export! {
    /// The value as an int16.
    ncclParamGetI16 / pncclParamGetI16 (h: ncclParamHandle_t, out: *mut i16) -> ncclResult_t = get_i16
}
export! {
    /// The value as an int32.
    ncclParamGetI32 / pncclParamGetI32 (h: ncclParamHandle_t, out: *mut i32) -> ncclResult_t = get_i32
}
export! {
    /// The value as an int64.
    ncclParamGetI64 / pncclParamGetI64 (h: ncclParamHandle_t, out: *mut i64) -> ncclResult_t = get_i64
}
export! {
    /// The value as a uint8.
    ncclParamGetU8 / pncclParamGetU8 (h: ncclParamHandle_t, out: *mut u8) -> ncclResult_t = get_u8
}
export! {
    /// The value as a uint16.
    ncclParamGetU16 / pncclParamGetU16 (h: ncclParamHandle_t, out: *mut u16) -> ncclResult_t = get_u16
}
export! {
    /// The value as a uint32.
    ncclParamGetU32 / pncclParamGetU32 (h: ncclParamHandle_t, out: *mut u32) -> ncclResult_t = get_u32
}
export! {
    /// The value as a uint64.
    ncclParamGetU64 / pncclParamGetU64 (h: ncclParamHandle_t, out: *mut u64) -> ncclResult_t = get_u64
}
export! {
    /// The value as a string (valid until this thread's next such call).
    ncclParamGetStr / pncclParamGetStr (h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t = get_str
}
export! {
    /// The value's bytes, at most `maxLen`.
    ncclParamGet / pncclParamGet (h: ncclParamHandle_t, out: *mut c_void, max_len: c_int, len: *mut c_int) -> ncclResult_t = get_raw
}
export! {
    /// The value of `key` as a string.
    ncclParamGetParameter / pncclParamGetParameter (key: *const c_char, value: *mut *const c_char, value_len: *mut c_int) -> ncclResult_t = get_parameter
}
export! {
    /// Every parameter's name.
    ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys (table: *mut *const *const c_char, table_len: *mut c_int) -> ncclResult_t = all_keys
}
export! {
    /// Logs every parameter (NCCL_DEBUG=INFO, subsystem ENV).
    ncclParamDumpAll / pncclParamDumpAll () -> () = dump_all
}
export! {
    /// Reads NCCL_DEBUG and NCCL_DEBUG_SUBSYS again.
    ncclResetDebugInit / pncclResetDebugInit () -> () = reset_debug_init
}

/// NCCL's internal name for `ncclResetDebugInit`, exported by its library (no `pnccl` twin).
#[no_mangle]
pub extern "C" fn ncclResetDebugInitInternal() {
    log::reset();
}

//! Stream memory operations: `cuStreamWaitValue32_v2` (the stream's worker polls the word with
//! short sleeps when it reaches the item; other streams go on) and `cuStreamWriteValue32_v2`.
//! The word may be device memory (own, peer or IPC) or host-mapped pinned memory.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::context;
use crate::memory::{self, Region};
use crate::stream::{self, Stream};
use crate::sys::{CUresult, CuResult, WAIT_VALUE_AND, WAIT_VALUE_EQ, WAIT_VALUE_FLUSH, WAIT_VALUE_GEQ};
use crate::sys::{WAIT_VALUE_NOR, WRITE_VALUE_NO_MEMORY_BARRIER};

/// Whether `word` satisfies the wait `op` against `value`.
pub fn satisfied(op: u32, word: u32, value: u32) -> bool {
    match op {
        WAIT_VALUE_GEQ => (word.wrapping_sub(value) as i32) >= 0,
        WAIT_VALUE_EQ => word == value,
        WAIT_VALUE_AND => word & value != 0,
        WAIT_VALUE_NOR => !(word | value) != 0,
        _ => false,
    }
}

/// The stream and the 4-byte aligned word at `addr`, which the stream's context may touch.
fn target(stream: usize, addr: u64, write: bool) -> CuResult<(Arc<Stream>, Region)> {
    context::current()?;
    let s = stream::resolve(stream)?;
    if addr % 4 != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let r = memory::device_region(addr, 4, &s.core, write)?;
    Ok((s, r))
}

/// The word as an atomic, while `r` keeps it mapped.
fn atomic(r: &Region) -> &AtomicU32 {
    // SAFETY: `r` is 4 aligned bytes (device allocations and the alias are 256-aligned and
    // `addr % 4 == 0`; host memory keeps the caller's alignment) that stay mapped while `r`
    // lives; other processes touch the word only atomically too.
    unsafe { &*r.ptr().cast::<AtomicU32>() }
}

/// `cuStreamWaitValue32_v2`.
pub fn wait_value(stream: usize, addr: u64, value: u32, flags: u32) -> CuResult<()> {
    let op = flags & !WAIT_VALUE_FLUSH;
    if op > WAIT_VALUE_NOR {
        return Err(CUresult::INVALID_VALUE);
    }
    let (s, r) = target(stream, addr, false)?;
    let core = s.core.clone();
    s.submit_always(
        Vec::new(),
        Arc::new(move || {
            while !satisfied(op, atomic(&r).load(Ordering::Acquire), value) {
                if core.is_closing() || core.sticky().is_err() || !r.alloc.is_live() {
                    break;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            Ok(())
        }),
    )?;
    Ok(())
}

/// `cuStreamWriteValue32_v2`.
pub fn write_value(stream: usize, addr: u64, value: u32, flags: u32) -> CuResult<()> {
    if flags & !WRITE_VALUE_NO_MEMORY_BARRIER != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let (s, r) = target(stream, addr, true)?;
    s.submit_always(
        Vec::new(),
        Arc::new(move || {
            r.check_live()?;
            atomic(&r).store(value, Ordering::Release);
            crate::sync::notify();
            Ok(())
        }),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons() {
        assert!(satisfied(WAIT_VALUE_GEQ, 5, 5));
        assert!(satisfied(WAIT_VALUE_GEQ, 6, 5));
        assert!(!satisfied(WAIT_VALUE_GEQ, 4, 5));
        // Wrapping: 1 is "after" u32::MAX.
        assert!(satisfied(WAIT_VALUE_GEQ, 1, u32::MAX));
        assert!(!satisfied(WAIT_VALUE_GEQ, u32::MAX, 1));
        assert!(satisfied(WAIT_VALUE_EQ, 7, 7) && !satisfied(WAIT_VALUE_EQ, 7, 8));
        assert!(satisfied(WAIT_VALUE_AND, 0b110, 0b010) && !satisfied(WAIT_VALUE_AND, 0b100, 0b010));
        assert!(satisfied(WAIT_VALUE_NOR, 0, 0) && !satisfied(WAIT_VALUE_NOR, u32::MAX, 0));
        assert!(!satisfied(WAIT_VALUE_NOR, 0xffff_0000, 0x0000_ffff));
    }
}

//! Telling the CPU which cache lines are read next. At tens of thousands of ranks the matcher's
//! working set (what each rank holds: n² bits, and every rank's arrival list) is gigabytes, and
//! each destination's few reads are each a miss; asking for a destination's lines while an
//! earlier one is matched overlaps those misses instead of taking them one after another.

/// Starts loading the cache line holding `item` (a hint: it changes nothing and never fails).
#[inline(always)]
pub(super) fn prefetch<T>(item: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` only hints the cache: it never faults and reads or writes nothing
    // the program can see (here the address is even that of a live reference). It is `unsafe`
    // only for its `sse` target feature, which every x86_64 CPU has.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((item as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}

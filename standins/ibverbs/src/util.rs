//! Small shared pieces: poison-tolerant locks, `errno`, the panic fence every exported function
//! runs behind, the public C structures we hand out, the seeded generator and the counters the
//! tests read.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::config::config;

/// Locks a mutex, taking the data over from a thread that panicked while holding it (every
/// structure here stays consistent between statements that can panic).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-locks a `RwLock`, poison-tolerant as [`lock`].
pub fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-locks a `RwLock`, poison-tolerant as [`lock`].
pub fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's own, always valid, errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Runs an exported function's body; a panic (a bug of the stand-in) never unwinds into C: it
/// is reported and the call answers `on_panic`.
pub fn fence<R>(name: &str, on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            eprintln!("topoccl ibverbs stand-in: internal error (panic) in {name}");
            on_panic
        }
    }
}

/// A C structure handed to the caller by pointer (`ibv_qp`, `ibv_cq`, …). It lives inside the
/// stand-in's own `Arc`'d object, so its address is stable and stays valid for as long as any
/// thread of the NIC still holds the object.
pub struct Public<T>(UnsafeCell<T>);

// SAFETY: after the object is published the stand-in never forms references into the C
// structure: it only reads fields it wrote before publication and writes `qp->state` through
// an atomic (`Qp::set_state`); the caller owns every other access, as with rdma-core.
unsafe impl<T> Send for Public<T> {}
// SAFETY: as for `Send`.
unsafe impl<T> Sync for Public<T> {}

impl<T> Public<T> {
    pub fn new(value: T) -> Public<T> {
        Public(UnsafeCell::new(value))
    }

    /// The pointer the caller gets.
    pub fn ptr(&self) -> *mut T {
        self.0.get()
    }
}

/// splitmix64: small, seedable, good enough for delays, drops and permutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max`.
    pub fn upto(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            self.next_u64()
        } else {
            self.next_u64() % (max + 1)
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.upto(i as u64) as usize;
            v.swap(i, j);
        }
    }
}

static RNG: Mutex<Option<Rng>> = Mutex::new(None);

/// The process's generator, seeded from `TOPOCCL_STANDIN_IB_SEED`.
pub fn with_rng<R>(f: impl FnOnce(&mut Rng) -> R) -> R {
    let mut g = lock(&RNG);
    let rng = g.get_or_insert_with(|| Rng::new(config().seed));
    f(rng)
}

/// What the emulated NIC did, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Request packets put on the wire (first transmissions and retransmissions).
    pub transmits: u64,
    /// Retransmissions (after a local ACK timeout, an RNR NAK or a sequence NAK).
    pub retransmits: u64,
    /// Packets (requests or responses) dropped by `TOPOCCL_STANDIN_IB_DROP`.
    pub dropped: u64,
    /// Duplicate requests a responder acknowledged without applying them again.
    pub duplicates: u64,
    /// RNR NAKs sent by responders of this process.
    pub rnr_naks: u64,
}

pub struct Counters {
    pub transmits: AtomicU64,
    pub retransmits: AtomicU64,
    pub dropped: AtomicU64,
    pub duplicates: AtomicU64,
    pub rnr_naks: AtomicU64,
}

pub static COUNTERS: Counters = Counters {
    transmits: AtomicU64::new(0),
    retransmits: AtomicU64::new(0),
    dropped: AtomicU64::new(0),
    duplicates: AtomicU64::new(0),
    rnr_naks: AtomicU64::new(0),
};

/// Adds one to a counter.
pub fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A snapshot of this process's counters.
pub fn stats() -> Stats {
    let c = &COUNTERS;
    Stats {
        transmits: c.transmits.load(Ordering::Relaxed),
        retransmits: c.retransmits.load(Ordering::Relaxed),
        dropped: c.dropped.load(Ordering::Relaxed),
        duplicates: c.duplicates.load(Ordering::Relaxed),
        rnr_naks: c.rnr_naks.load(Ordering::Relaxed),
    }
}

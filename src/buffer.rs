//! Buffers as callers hand them over: where a buffer starts and which memory it lies in. Its
//! length follows from the call (NCCL's contract), so it is computed and checked once, by the
//! library, when the call is validated; the executor then only sees [`Region`]s.
//!
//! A buffer whose memory space is asked of the CUDA driver, [`Buffer::at`], is made beside the
//! driver (`crate::cuda`), which this module does not depend on.

use std::fmt;

pub use topoccl_transports::{MemSpace, Region};

/// The start of a caller's buffer, in its memory space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buffer {
    pub space: MemSpace,
    pub addr: usize,
}

impl Buffer {
    /// No buffer (NCCL passes NULL where a rank has none, such as a non-root's receive buffer
    /// of a reduce).
    pub const NULL: Buffer = Buffer { space: MemSpace::Host, addr: 0 };

    /// Host memory at `ptr` (a Rust slice's: CPU memory by construction).
    pub fn host<T>(ptr: *const T) -> Buffer {
        Buffer { space: MemSpace::Host, addr: ptr as usize }
    }

    pub fn is_null(&self) -> bool {
        self.addr == 0
    }

    /// The first `len` bytes.
    pub fn region(&self, len: usize) -> Region {
        Region::new(self.space, self.addr, len)
    }

    /// The buffer `bytes` further on (`None` past the end of the address space).
    pub fn offset(&self, bytes: usize) -> Option<Buffer> {
        Some(Buffer { space: self.space, addr: self.addr.checked_add(bytes)? })
    }
}

impl fmt::Display for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x} ({})", self.addr, self.space)
    }
}

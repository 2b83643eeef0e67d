//! Byte buffers kept for reuse by a framed stream, in two size classes.
//!
//! Small buffers (frame headers, copied small payloads, small messages) and message buffers are
//! pooled apart. One pool for both churned: a header took a message buffer, the next message
//! grew a header's buffer, and a full pool dropped message buffers, so every large call went
//! through the allocator again (and the pages it freed faulted back in).

/// Small buffers kept.
const SMALL_BUFFERS: usize = 64;
/// What a stream keeps of message buffers: enough for the messages a 64 MiB call has queued
/// at once between two ranks that both send before they receive.
const LARGE_BYTES: usize = 64 << 20;

pub(crate) struct BufferPool {
    /// Buffers up to this capacity are small.
    small_max: usize,
    small: Vec<Vec<u8>>,
    large: Vec<Vec<u8>>,
    /// Capacity of `large` in all.
    large_bytes: usize,
}

impl BufferPool {
    pub(crate) fn new(small_max: usize) -> BufferPool {
        BufferPool { small_max, small: Vec::new(), large: Vec::new(), large_bytes: 0 }
    }

    /// A buffer of exactly `len` bytes, reused when possible. Contents are unspecified.
    pub(crate) fn take(&mut self, len: usize) -> Vec<u8> {
        let pooled = if len <= self.small_max { self.small.pop() } else { self.take_large(len) };
        let mut v = pooled.unwrap_or_default();
        if v.len() < len {
            v.resize(len, 0);
        } else {
            v.truncate(len);
        }
        v
    }

    /// A message buffer of at least `len` bytes' capacity, else the newest one (to be grown).
    fn take_large(&mut self, len: usize) -> Option<Vec<u8>> {
        let i = self.large.iter().rposition(|b| b.capacity() >= len).or(self.large.len().checked_sub(1))?;
        let v = self.large.swap_remove(i);
        self.large_bytes -= v.capacity();
        Some(v)
    }

    /// Keeps `data` for reuse while its class has room.
    pub(crate) fn give(&mut self, data: Vec<u8>) {
        let cap = data.capacity();
        if cap <= self.small_max {
            if self.small.len() < SMALL_BUFFERS {
                self.small.push(data);
            }
        } else if self.large_bytes + cap <= LARGE_BYTES {
            self.large_bytes += cap;
            self.large.push(data);
        }
    }

    /// Message buffers kept, and whether every small one is small.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, bool) {
        (self.large.len(), self.small.iter().all(|b| b.capacity() <= self.small_max))
    }
}

//! Memory registration as a value: what a one-sided backend tells a peer so that the peer can
//! write this rank's buffer itself. An offer ([`Connection::offer`](crate::Connection::offer))
//! names a [`Registration`] and an offset into it, never a raw address: a CUDA IPC handle means
//! something in another process, an address does not (an RDMA key will be the third kind).
//!
//! Registering costs a driver call and, at the peer, a mapping; so registrations are cached per
//! allocation ([`RegistrationCache`]) and reused by every later offer into the same buffer. A
//! cached registration is only as good as the allocation it names: a buffer freed and another
//! allocated at the same address must not reuse it (the peer's mapping still shows the old
//! memory). The driver gives every allocation an id no later one shares (CUDA's
//! `CU_POINTER_ATTRIBUTE_BUFFER_ID`), and the cache checks it on every lookup; a registration
//! found stale is replaced, and the connections that announced it revoke it at their peers.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::error::Result;

/// One allocation of device memory, as the driver describes the range an address lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Its first byte.
    pub base: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The driver's id for it, never shared by a later allocation at the same address.
    pub buffer_id: u64,
}

impl Allocation {
    /// Whether the two allocations share a byte.
    pub fn overlaps(&self, base: u64, len: u64) -> bool {
        self.base < base.saturating_add(len) && base < self.base.saturating_add(self.len)
    }
}

/// How a peer reaches a registered allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationKey {
    /// A legacy CUDA IPC memory handle (`CUipcMemHandle`), opened by the peer's process.
    CudaIpc([u8; crate::ipc::device::IPC_HANDLE_BYTES]),
}

/// A registered allocation: the one value an offer refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Unique within the cache that made it (offers and revocations name it by this).
    pub id: u64,
    /// The allocation registered.
    pub allocation: Allocation,
    pub key: RegistrationKey,
}

/// What a cache has done, for tests and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Registrations made (driver calls).
    pub registered: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Cached registrations found stale (their buffer freed) and dropped.
    pub stale: u64,
}

struct Entry {
    allocation: Allocation,
    /// `None`: the allocation cannot be registered (pool memory has no IPC handle); remembered
    /// so the driver is not asked again for every offer into it.
    registration: Option<Arc<Registration>>,
}

/// Registrations of one rank's buffers, per allocation, checked against the driver's buffer id
/// on every lookup.
pub struct RegistrationCache {
    entries: VecDeque<Entry>,
    capacity: usize,
    next_id: u64,
    counts: CacheCounts,
}

impl RegistrationCache {
    /// A cache of at most `capacity` allocations (the oldest go first).
    pub fn new(capacity: usize) -> RegistrationCache {
        RegistrationCache {
            entries: VecDeque::new(),
            capacity: capacity.max(1),
            next_id: 1,
            counts: CacheCounts::default(),
        }
    }

    pub fn counts(&self) -> CacheCounts {
        self.counts
    }

    /// The registration of `allocation`, made by `register` if the cache has none (or only a
    /// stale one); `None` when the allocation cannot be registered.
    pub fn get_or_register(
        &mut self,
        allocation: Allocation,
        register: impl FnOnce() -> Result<Option<RegistrationKey>>,
    ) -> Result<Option<Arc<Registration>>> {
        if let Some(e) = self.entries.iter().find(|e| e.allocation == allocation) {
            self.counts.hits += 1;
            return Ok(e.registration.clone());
        }
        // Anything cached over these bytes belongs to memory freed since.
        let before = self.entries.len();
        self.entries.retain(|e| !e.allocation.overlaps(allocation.base, allocation.len));
        self.counts.stale += (before - self.entries.len()) as u64;
        let registration = register()?.map(|key| {
            self.counts.registered += 1;
            let id = self.next_id;
            self.next_id += 1;
            Arc::new(Registration { id, allocation, key })
        });
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(Entry { allocation, registration: registration.clone() });
        Ok(registration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(base: u64, len: u64, buffer_id: u64) -> Allocation {
        Allocation { base, len, buffer_id }
    }

    fn key(n: u8) -> RegistrationKey {
        RegistrationKey::CudaIpc([n; 64])
    }

    #[test]
    fn one_registration_per_allocation() {
        let mut c = RegistrationCache::new(8);
        let a = c.get_or_register(alloc(4096, 1 << 20, 7), || Ok(Some(key(1)))).unwrap().unwrap();
        for _ in 0..5 {
            let b = c.get_or_register(alloc(4096, 1 << 20, 7), || panic!("registered twice")).unwrap().unwrap();
            assert_eq!(a, b);
        }
        assert_eq!(c.counts(), CacheCounts { registered: 1, hits: 5, stale: 0 });
    }

    #[test]
    fn a_buffer_freed_and_reallocated_at_the_same_address_is_registered_again() {
        let mut c = RegistrationCache::new(8);
        let old = c.get_or_register(alloc(4096, 1 << 20, 7), || Ok(Some(key(1)))).unwrap().unwrap();
        // Same base and length, another buffer id: the driver's new allocation.
        let new = c.get_or_register(alloc(4096, 1 << 20, 8), || Ok(Some(key(2)))).unwrap().unwrap();
        assert_ne!(old.id, new.id);
        assert_eq!(new.key, key(2));
        // A smaller allocation inside a freed larger one replaces it too.
        let inner = c.get_or_register(alloc(8192, 4096, 9), || Ok(Some(key(3)))).unwrap().unwrap();
        assert_ne!(inner.id, new.id);
        assert_eq!(c.counts(), CacheCounts { registered: 3, hits: 0, stale: 2 });
    }

    #[test]
    fn memory_without_a_handle_is_remembered_as_such() {
        let mut c = RegistrationCache::new(8);
        assert!(c.get_or_register(alloc(4096, 4096, 1), || Ok(None)).unwrap().is_none());
        assert!(c.get_or_register(alloc(4096, 4096, 1), || panic!("asked again")).unwrap().is_none());
        assert_eq!(c.counts().registered, 0);
    }

    #[test]
    fn the_oldest_allocation_goes_when_full() {
        let mut c = RegistrationCache::new(2);
        for (i, base) in [0u64, 1 << 20, 2 << 20].into_iter().enumerate() {
            c.get_or_register(alloc(base, 4096, i as u64), || Ok(Some(key(i as u8)))).unwrap();
        }
        let mut asked = false;
        c.get_or_register(alloc(0, 4096, 0), || {
            asked = true;
            Ok(Some(key(9)))
        })
        .unwrap();
        assert!(asked, "the first allocation was evicted");
    }
}

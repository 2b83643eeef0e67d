//! Opaque handles (`CUcontext`, `CUstream`, `CUevent`, `CUmodule`, `CUfunction`): numbers that
//! look like addresses, never reused in a process, each looked up in its kind's registry, so
//! a stale or foreign handle is an error code rather than undefined behaviour.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

static NEXT: AtomicUsize = AtomicUsize::new(0x5c0_0000);

/// A fresh handle value: never 0, `CU_STREAM_LEGACY` (1) or `CU_STREAM_PER_THREAD` (2).
pub fn fresh() -> usize {
    NEXT.fetch_add(0x40, Ordering::Relaxed)
}

/// Locks `m`, ignoring poisoning: a panic elsewhere is reported through its own call.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The live objects of one kind, by handle.
pub struct Registry<T> {
    map: Mutex<BTreeMap<usize, Arc<T>>>,
}

impl<T> Registry<T> {
    pub const fn new() -> Self {
        Registry { map: Mutex::new(BTreeMap::new()) }
    }

    pub fn insert(&self, handle: usize, value: Arc<T>) {
        lock(&self.map).insert(handle, value);
    }

    pub fn get(&self, handle: usize) -> Option<Arc<T>> {
        lock(&self.map).get(&handle).cloned()
    }

    pub fn remove(&self, handle: usize) -> Option<Arc<T>> {
        lock(&self.map).remove(&handle)
    }

    /// Removes and returns every entry `pred` selects.
    pub fn remove_where(&self, pred: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        let mut map = lock(&self.map);
        let doomed: Vec<usize> = map.iter().filter(|(_, v)| pred(v)).map(|(&k, _)| k).collect();
        doomed.into_iter().filter_map(|k| map.remove(&k)).collect()
    }
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self::new()
    }
}

//! [`Recent`]: the last few results of a costly, pure computation, shared by every thread.
//!
//! The tuner prices one topology at several pipeline depths, and the packings behind a
//! synthesizer's schedules (a second or more on 8–16 ranks) do not depend on the depth: each
//! synthesizer keeps its packings here, keyed by what they do depend on, so that only the first
//! depth pays for the search.

use std::sync::{Arc, Mutex, PoisonError};

/// Up to `kept` results by key, the oldest dropped first.
pub struct Recent<K, V> {
    entries: Mutex<Vec<(K, Arc<V>)>>,
    kept: usize,
}

impl<K: PartialEq, V> Recent<K, V> {
    /// An empty list that keeps `kept` results (at least one).
    pub const fn new(kept: usize) -> Recent<K, V> {
        Recent { entries: Mutex::new(Vec::new()), kept }
    }

    /// The result kept for `key`, else `make()`'s, kept when it succeeds. The lock is not held
    /// while `make` runs: two threads asking for one new key both compute it, and the results
    /// are equal (`make` is pure).
    pub fn get_or_try<E>(&self, key: K, make: impl FnOnce() -> Result<V, E>) -> Result<Arc<V>, E> {
        // A poisoned lock only means another thread panicked while holding it; entries are
        // pushed whole, so the list is still good.
        let entries = || self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, value)) = entries().iter().find(|(k, _)| *k == key) {
            return Ok(Arc::clone(value));
        }
        let value = Arc::new(make()?);
        let mut kept = entries();
        if !kept.iter().any(|(k, _)| *k == key) {
            if kept.len() >= self.kept.max(1) {
                kept.remove(0);
            }
            kept.push((key, Arc::clone(&value)));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_result_is_not_computed_again_and_the_oldest_goes_first() {
        let recent: Recent<u32, u32> = Recent::new(2);
        let calls = std::cell::Cell::new(0);
        let get = |k: u32| {
            *recent
                .get_or_try(k, || {
                    calls.set(calls.get() + 1);
                    Ok::<_, ()>(k * 10)
                })
                .unwrap()
        };
        assert_eq!((get(1), get(1), get(2)), (10, 10, 20));
        assert_eq!(get(3), 30); // drops 1
        assert_eq!((get(2), get(3)), (20, 30));
        assert_eq!(get(1), 10);
        assert_eq!(calls.get(), 4);
    }

    #[test]
    fn a_failure_is_not_kept() {
        let recent: Recent<u32, u32> = Recent::new(4);
        assert_eq!(recent.get_or_try(1, || Err("no")).unwrap_err(), "no");
        assert_eq!(*recent.get_or_try(1, || Ok::<_, &str>(7)).unwrap(), 7);
    }
}

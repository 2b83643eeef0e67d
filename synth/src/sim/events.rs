//! The simulator's pending events.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rustc_hash::FxHashMap;

#[derive(Clone, Copy, PartialEq)]
pub(super) enum EventKind {
    /// The first-ending flow of a route ends (stale if the route's version moved on).
    FlowDone {
        route: u32,
        version: u32,
    },
    Arrive {
        conn: u32,
    },
    Continue {
        channel: u32,
    },
}

/// Pending events, grouped by exact time: a heap of distinct times and a FIFO per time. Lock-step
/// schedules (rings on uniform links) put thousands of events on one timestamp, so this keeps the
/// heap small; within a time, events run in the order they were posted, so runs are
/// deterministic. The bucket events are taken from and the one last posted to are remembered,
/// so a lock-step round looks each time up once.
#[derive(Default)]
pub(super) struct EventQueue {
    /// Times as f64 bits: for non-negative finite times, bit order is numeric order.
    times: BinaryHeap<Reverse<u64>>,
    slot_of: FxHashMap<u64, u32>,
    buckets: Vec<VecDeque<EventKind>>,
    free: Vec<u32>,
    /// (time, bucket) last posted to.
    posted: Option<(u64, u32)>,
    /// (time, bucket) at the head of the heap.
    head: Option<(u64, u32)>,
}

impl EventQueue {
    pub fn push(&mut self, time: f64, kind: EventKind) {
        let key = time.max(0.0).to_bits();
        let slot = match self.posted {
            Some((k, s)) if k == key => s,
            _ => {
                let slot = match self.slot_of.get(&key) {
                    Some(&s) => s,
                    None => {
                        let s = match self.free.pop() {
                            Some(s) => s,
                            None => {
                                self.buckets.push(VecDeque::new());
                                self.buckets.len() as u32 - 1
                            }
                        };
                        self.slot_of.insert(key, s);
                        self.times.push(Reverse(key));
                        s
                    }
                };
                self.posted = Some((key, slot));
                slot
            }
        };
        self.buckets[slot as usize].push_back(kind);
    }

    pub fn pop(&mut self) -> Option<(f64, EventKind)> {
        loop {
            let (key, slot) = match self.head {
                Some(h) => h,
                None => {
                    let Reverse(key) = *self.times.peek()?;
                    let slot = *self.slot_of.get(&key)?;
                    self.head = Some((key, slot));
                    (key, slot)
                }
            };
            if let Some(kind) = self.buckets[slot as usize].pop_front() {
                return Some((f64::from_bits(key), kind));
            }
            // The earliest time is drained: nothing can be posted before it any more.
            self.times.pop();
            self.slot_of.remove(&key);
            self.free.push(slot);
            self.head = None;
            if self.posted.is_some_and(|(k, _)| k == key) {
                self.posted = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pop_by_time_then_in_posting_order() {
        let mut q = EventQueue::default();
        q.push(2.0, EventKind::Continue { channel: 1 });
        q.push(1.0, EventKind::Continue { channel: 2 });
        q.push(2.0, EventKind::Continue { channel: 3 });
        assert_eq!(q.pop().map(|e| e.0), Some(1.0));
        // Posted at the current head's time while it drains.
        q.push(1.0, EventKind::Continue { channel: 4 });
        let order: Vec<(f64, EventKind)> = std::iter::from_fn(|| q.pop()).collect();
        let channels: Vec<u32> = order
            .iter()
            .map(|(_, k)| match k {
                EventKind::Continue { channel } => *channel,
                _ => 0,
            })
            .collect();
        assert_eq!(channels, [4, 1, 3]);
        // A drained time can be used again.
        q.push(5.0, EventKind::Arrive { conn: 9 });
        assert!(q.pop().is_some_and(|(t, k)| t == 5.0 && k == EventKind::Arrive { conn: 9 }));
        assert!(q.pop().is_none());
    }
}

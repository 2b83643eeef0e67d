//! The flows of one route, priced together.
//!
//! Every flow's rate is the smallest share along its route, and the shares depend on the route
//! only, so all flows of a route run at one rate. A route therefore keeps one running total of
//! the bytes each of its flows has been served, and a flow is just the total at which it ends
//! (its *mark*). A rate change is then one update per route, not per flow, and only the route's
//! first-ending flow has an event: schedules with hundreds of flows on one link (tree packings
//! in lanes) cost per route, not per flow.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The active flows of one route.
#[derive(Default)]
pub(super) struct RouteFlows {
    /// Bytes served to each flow of the route since it was first used, as of `last`.
    served: f64,
    /// Bytes per µs each flow gets now.
    rate: f64,
    last: f64,
    /// Bumped at every rate change; events of older versions are stale.
    version: u32,
    /// (mark as f64 bits, flow id): marks are non-negative, so bit order is numeric order.
    ends: BinaryHeap<Reverse<(u64, u32)>>,
}

impl RouteFlows {
    pub fn version(&self) -> u32 {
        self.version
    }

    fn catch_up(&mut self, now: f64) {
        self.served += self.rate * (now - self.last);
        self.last = now;
    }

    /// Adds flow `id` of `bytes` at time `now`; true if it is the route's only flow.
    pub fn add(&mut self, now: f64, id: u32, bytes: f64) -> bool {
        self.catch_up(now);
        self.ends.push(Reverse(((self.served + bytes).to_bits(), id)));
        self.ends.len() == 1
    }

    /// Removes the first-ending flow (whose end event fired); returns it and whether the route
    /// has no flow left.
    pub fn pop(&mut self, now: f64) -> Option<(u32, bool)> {
        self.catch_up(now);
        let Reverse((_, id)) = self.ends.pop()?;
        Some((id, self.ends.is_empty()))
    }

    /// Sets the rate from `now` on; returns the new version and, if a flow is left, the time
    /// until the first one ends.
    pub fn rerate(&mut self, now: f64, rate: f64) -> (u32, Option<f64>) {
        self.catch_up(now);
        self.rate = rate;
        self.version = self.version.wrapping_add(1);
        let next = self.ends.peek().map(|Reverse((mark, _))| (f64::from_bits(*mark) - self.served).max(0.0) / rate);
        (self.version, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_of_a_route_end_in_order_of_their_marks() {
        let mut r = RouteFlows::default();
        assert!(r.add(0.0, 7, 100.0));
        assert_eq!(r.rerate(0.0, 10.0).1, Some(10.0));
        // At t=5 the first flow has 50 left; a second of 20 ends first.
        assert!(!r.add(5.0, 8, 20.0));
        let (_, next) = r.rerate(5.0, 5.0);
        assert_eq!(next, Some(4.0));
        assert_eq!(r.pop(9.0), Some((8, false)));
        // The first flow: 50 − 20 = 30 left, alone at 10 per µs.
        assert_eq!(r.rerate(9.0, 10.0).1, Some(3.0));
        assert_eq!(r.pop(12.0), Some((7, true)));
        assert_eq!(r.pop(12.0), None);
    }
}

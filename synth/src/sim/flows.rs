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

/// No flow: [`RouteFlows::first`] is empty.
const NO_FLOW: u32 = u32::MAX;

/// Flows after the first as (mark as f64 bits, flow id), earliest on top.
type LaterFlows = BinaryHeap<Reverse<(u64, u32)>>;

/// The active flows of one route.
pub(super) struct RouteFlows {
    /// Bytes served to each flow of the route since it was first used, as of `last`.
    served: f64,
    /// Bytes per µs each flow gets now.
    rate: f64,
    last: f64,
    /// The first-ending flow, as (mark, id), kept apart from the rest: most routes carry one
    /// flow at a time, and then the heap's own memory is never touched.
    first_mark: f64,
    first: u32,
    /// Bumped at every rate change; events of older versions are stale.
    version: u32,
    /// The other flows as (mark as f64 bits, flow id): marks are non-negative, so bit order is
    /// numeric order. Boxed: a route is then 48 bytes, and the many that never carry two flows
    /// at once fit more of them in cache.
    rest: Option<Box<LaterFlows>>,
}

impl Default for RouteFlows {
    fn default() -> RouteFlows {
        RouteFlows { served: 0.0, rate: 0.0, last: 0.0, first_mark: 0.0, first: NO_FLOW, version: 0, rest: None }
    }
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
        let mark = self.served + bytes;
        if self.first == NO_FLOW {
            (self.first_mark, self.first) = (mark, id);
            return true;
        }
        let (mut mark, mut id) = (mark, id);
        if (mark, id) < (self.first_mark, self.first) {
            std::mem::swap(&mut mark, &mut self.first_mark);
            std::mem::swap(&mut id, &mut self.first);
        }
        self.rest.get_or_insert_with(Box::default).push(Reverse((mark.to_bits(), id)));
        false
    }

    /// Removes the first-ending flow (whose end event fired); returns it and whether the route
    /// has no flow left.
    pub fn pop(&mut self, now: f64) -> Option<(u32, bool)> {
        self.catch_up(now);
        if self.first == NO_FLOW {
            return None;
        }
        let id = self.first;
        (self.first_mark, self.first) = match self.rest.as_mut().and_then(|rest| rest.pop()) {
            Some(Reverse((mark, next))) => (f64::from_bits(mark), next),
            None => (0.0, NO_FLOW),
        };
        Some((id, self.first == NO_FLOW))
    }

    /// Sets the rate from `now` on; returns the new version and, if a flow is left, the time
    /// until the first one ends.
    pub fn rerate(&mut self, now: f64, rate: f64) -> (u32, Option<f64>) {
        self.catch_up(now);
        self.rate = rate;
        self.version = self.version.wrapping_add(1);
        let next = (self.first != NO_FLOW).then(|| (self.first_mark - self.served).max(0.0) / rate);
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

//! Waiting for asynchronous work: one process-wide "something progressed" signal that stream
//! workers raise after every item, with a short timeout so that what no local thread signals
//! (an interprocess event recorded by another process) is polled.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::handle::lock;

static PROGRESS: Mutex<u64> = Mutex::new(0);
static CHANGED: Condvar = Condvar::new();

/// How long a waiter sleeps before looking again without a signal.
const POLL: Duration = Duration::from_micros(200);

/// Wakes every waiter: some item completed or some counter moved.
pub fn notify() {
    *lock(&PROGRESS) += 1;
    CHANGED.notify_all();
}

/// Blocks until `done()` holds.
pub fn wait_until(mut done: impl FnMut() -> bool) {
    loop {
        if done() {
            return;
        }
        let guard = lock(&PROGRESS);
        // Checked again under the lock: a notify between the two checks is not lost.
        if done() {
            return;
        }
        let _ = CHANGED.wait_timeout(guard, POLL).unwrap_or_else(|e| e.into_inner());
    }
}

/// [`wait_until`], saying once on stderr what waits (`what()`) when it has waited the
/// stand-in's deadlock time: where a real driver would never come back, the stand-in waits too,
/// but a test's log says why.
pub fn wait_until_reporting(mut done: impl FnMut() -> bool, what: impl FnOnce() -> String) {
    let report_after = crate::config::get().map_or(10.0, |c| c.deadlock_report_s);
    let start = std::time::Instant::now();
    let mut what = Some(what);
    wait_until(|| {
        if done() {
            return true;
        }
        if start.elapsed().as_secs_f64() >= report_after {
            if let Some(w) = what.take() {
                eprintln!("stand-in CUDA driver: {} (waited {report_after} s; a real driver deadlocks here)", w());
            }
        }
        false
    });
}

/// A stream's random delays: 0..`max_us` microseconds, from a splitmix64 sequence.
pub struct Delay {
    state: u64,
    max_us: u64,
}

impl Delay {
    pub fn new(seed: u64, max_us: u64) -> Self {
        Delay { state: seed, max_us }
    }

    pub fn next_us(&mut self) -> u64 {
        if self.max_us == 0 {
            return 0;
        }
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % self.max_us
    }

    pub fn sleep(&mut self) {
        let us = self.next_us();
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_below_the_bound_and_vary() {
        let mut d = Delay::new(7, 200);
        let v: Vec<u64> = (0..100).map(|_| d.next_us()).collect();
        assert!(v.iter().all(|&x| x < 200));
        assert!(v.iter().any(|&x| x != v[0]));
        assert_eq!(Delay::new(1, 0).next_us(), 0);
    }
}

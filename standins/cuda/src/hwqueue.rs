//! Hardware work queues. A GPU takes a context's work through a few hardware queues
//! ("connections": `CUDA_DEVICE_MAX_CONNECTIONS`, default 8, at most 32): each stream is given
//! one when it is made, round robin, and a queue runs its items in the order they were
//! submitted, whichever stream they came from. An item that waits at a queue's head — a
//! `cuStreamWaitValue32` whose value is not there yet, an event not yet reached — holds up
//! every later item of every stream on that queue. Events only point back at work submitted
//! earlier, so such a false dependency only delays; a value wait that later work on the same
//! queue would release never ends (NVIDIA's driver API documentation on stream memory
//! operations: such order "should also have that order expressed with CUDA-visible
//! dependencies"). With `CUDA_DEVICE_MAX_CONNECTIONS=1` every stream of a context is on one
//! queue. `TOPOCCL_STANDIN_QUEUES=stream` gives each stream a queue of its own instead.
//!
//! One worker thread per queue runs its items, each after the queue's random delay.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};

use crate::context::CtxCore;
use crate::handle::lock;
use crate::stream::{Item, Progress};
use crate::sync::{self, Delay};
use crate::sys::{CUresult, CuResult};

/// An item and the stream it came from.
struct Entry {
    progress: Arc<Progress>,
    core: Arc<CtxCore>,
    item: Item,
}

#[derive(Default)]
struct Pending {
    items: VecDeque<Entry>,
    closed: bool,
}

pub struct HwQueue {
    pending: Mutex<Pending>,
    ready: Condvar,
}

impl HwQueue {
    /// A queue with its worker running, named `name`.
    pub fn spawn(name: String, delay: Delay) -> Arc<HwQueue> {
        let q = Arc::new(HwQueue { pending: Mutex::new(Pending::default()), ready: Condvar::new() });
        let worker = q.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || worker.run(delay))
            .expect("the stand-in could not start a queue worker thread");
        q
    }

    /// Appends a stream's item; its number on that stream (counted from 1).
    pub(crate) fn push(&self, progress: &Arc<Progress>, core: &Arc<CtxCore>, item: Item) -> CuResult<u64> {
        let mut p = lock(&self.pending);
        if p.closed {
            return Err(CUresult::INVALID_HANDLE);
        }
        p.items.push_back(Entry { progress: progress.clone(), core: core.clone(), item });
        // Numbered under the queue's lock, so a stream's numbers follow the queue's order.
        let seq = progress.count_submitted();
        self.ready.notify_one();
        Ok(seq)
    }

    /// Lets the worker finish what is queued and exit.
    pub fn close(&self) {
        lock(&self.pending).closed = true;
        self.ready.notify_all();
    }

    fn run(&self, mut delay: Delay) {
        loop {
            let Entry { progress, core, item } = {
                let mut p = lock(&self.pending);
                loop {
                    if let Some(e) = p.items.pop_front() {
                        break e;
                    }
                    if p.closed {
                        return;
                    }
                    p = self.ready.wait(p).unwrap_or_else(|e| e.into_inner());
                }
            };
            delay.sleep();
            for dep in &item.deps {
                sync::wait_until(|| dep.met());
            }
            if item.always || core.sticky().is_ok() {
                match catch_unwind(AssertUnwindSafe(item.work)) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => core.fail(e),
                    Err(_) => core.fail(CUresult::LAUNCH_FAILED),
                }
            }
            progress.count_done();
            sync::notify();
        }
    }
}

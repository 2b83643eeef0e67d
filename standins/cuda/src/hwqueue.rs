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
//! One worker thread per queue runs its items, each after the queue's random delay. On a queue
//! that several streams share, a kernel does not hold the queue while it runs: as on a GPU,
//! where kernels of different streams run side by side (up to 128 at once on Hopper), the
//! worker starts it on a thread of its own and goes on to the next item, which, if it is of the
//! same stream, first waits for the kernel to end (stream order). Only an item that waits
//! (a value, an event, its own stream's earlier work) holds the queue.

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
    /// Its number on its stream.
    seq: u64,
}

#[derive(Default)]
struct Pending {
    items: VecDeque<Entry>,
    closed: bool,
}

pub struct HwQueue {
    pending: Mutex<Pending>,
    ready: Condvar,
    /// Whether streams share it (kernels then run beside the queue: module documentation).
    shared: bool,
}

impl HwQueue {
    /// A queue with its worker running, named `name`, shared by several streams or not.
    pub fn spawn(name: String, delay: Delay, shared: bool) -> Arc<HwQueue> {
        let q = Arc::new(HwQueue { pending: Mutex::new(Pending::default()), ready: Condvar::new(), shared });
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
        // Numbered under the queue's lock, so a stream's numbers follow the queue's order.
        let seq = progress.count_submitted();
        p.items.push_back(Entry { progress: progress.clone(), core: core.clone(), item, seq });
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
            let Entry { progress, core, item, seq } = {
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
            // Stream order: a kernel started beside the queue may still run.
            sync::wait_until(|| progress.reached(seq - 1));
            for dep in &item.deps {
                sync::wait_until(|| dep.met());
            }
            if self.shared && item.concurrent {
                let spawned = std::thread::Builder::new()
                    .name("cuda-standin-kernel".into())
                    .spawn(move || finish(&progress, &core, item));
                if spawned.is_err() {
                    // No thread to be had: the kernel fails, as a launch out of resources.
                    eprintln!("cuda stand-in: no thread for a kernel; the context faults");
                }
                continue;
            }
            finish(&progress, &core, item);
        }
    }
}

/// Runs `item` (unless the context faulted and it is data work) and counts it done.
fn finish(progress: &Progress, core: &CtxCore, item: Item) {
    if item.always || core.sticky().is_ok() {
        match catch_unwind(AssertUnwindSafe(|| (item.work)())) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => core.fail(e),
            Err(_) => core.fail(CUresult::LAUNCH_FAILED),
        }
    }
    progress.count_done();
    sync::notify();
}

//! Streams: each feeds a hardware queue (`hwqueue`: its own, or one shared with other streams
//! of the context), whose worker runs the items in order, each first sleeping a random delay,
//! so work really runs after the call that enqueued it returned and a missing wait shows up as
//! wrong data. Each context's legacy default stream (`NULL`,
//! `CU_STREAM_LEGACY`) synchronises implicitly with the context's blocking streams, as CUDA
//! defines it; `CU_STREAM_NON_BLOCKING` streams do not.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::capture::{self, Capture};
use crate::config;
use crate::context::{self, Context, CtxCore};
use crate::event::Counters;
use crate::handle::{fresh, lock, Registry};
use crate::hwqueue::HwQueue;
use crate::sync::{self, Delay};
use crate::sys::{CUresult, CuResult, STREAM_LEGACY, STREAM_NON_BLOCKING, STREAM_PER_THREAD};

/// How far a stream got: items submitted and items finished, both counted from 1.
#[derive(Default)]
pub struct Progress {
    submitted: AtomicU64,
    done: AtomicU64,
}

impl Progress {
    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::Acquire)
    }

    pub fn reached(&self, seq: u64) -> bool {
        self.done.load(Ordering::Acquire) >= seq
    }

    /// One more item submitted: its number.
    pub(crate) fn count_submitted(&self) -> u64 {
        self.submitted.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// One more item run.
    pub(crate) fn count_done(&self) {
        self.done.fetch_add(1, Ordering::AcqRel);
    }
}

/// What an item waits for before it runs.
pub enum Dep {
    /// Another stream's item `seq` (implicit legacy-stream synchronisation).
    Stream(Arc<Progress>, u64),
    /// An event's record number `gen` (`cuStreamWaitEvent`).
    Event(Arc<Counters>, u64),
}

impl Dep {
    pub(crate) fn met(&self) -> bool {
        match self {
            Dep::Stream(p, seq) => p.reached(*seq),
            Dep::Event(c, generation) => c.completed() >= *generation,
        }
    }
}

/// An item's work: runs on the stream's worker; an `Err` becomes the context's sticky error.
pub type Work = Arc<dyn Fn() -> CuResult<()> + Send + Sync>;

pub(crate) struct Item {
    pub deps: Vec<Dep>,
    pub work: Work,
    /// Bookkeeping (event records, value writes) runs even after the context faulted, so that
    /// nothing waiting on it hangs; data work is skipped, as a dead GPU context runs nothing.
    pub always: bool,
    /// A kernel: on a shared queue it runs beside the queue (`hwqueue`).
    pub concurrent: bool,
}

pub struct Stream {
    /// 0 for a legacy default stream.
    pub handle: usize,
    pub flags: u32,
    pub legacy: bool,
    pub core: Arc<CtxCore>,
    ctx: Weak<Context>,
    /// The hardware queue its items go to.
    hw: Arc<HwQueue>,
    /// Whether that queue is this stream's alone (closed with it).
    own_queue: bool,
    closed: AtomicBool,
    pub progress: Arc<Progress>,
    /// The capture its work goes into instead of its queue, while one is under way.
    capture: Mutex<Option<Arc<Capture>>>,
}

static STREAMS: Registry<Stream> = Registry::new();

impl Stream {
    /// A stream feeding `hw` (a shared queue of its context), or a queue of its own.
    pub fn spawn(
        core: Arc<CtxCore>,
        ctx: Weak<Context>,
        flags: u32,
        legacy: bool,
        hw: Option<Arc<HwQueue>>,
    ) -> Arc<Stream> {
        let handle = if legacy { 0 } else { fresh() };
        let own_queue = hw.is_none();
        let hw = hw.unwrap_or_else(|| {
            let (seed, max_us) = config::get().map_or((1, 0), |c| (c.seed, c.delay_us));
            let delay = Delay::new(seed ^ (core.handle as u64).rotate_left(17) ^ handle as u64, max_us);
            HwQueue::spawn(format!("cuda-standin-{:x}", handle.max(core.handle)), delay, false)
        });
        Arc::new(Stream {
            handle,
            flags,
            legacy,
            core,
            ctx,
            hw,
            own_queue,
            closed: AtomicBool::new(false),
            progress: Arc::default(),
            capture: Mutex::new(None),
        })
    }

    /// Enqueues data work (copies, memsets, kernels): the item number.
    pub fn submit(&self, deps: Vec<Dep>, work: Work) -> CuResult<u64> {
        self.enqueue(deps, work, false, false)
    }

    /// Enqueues a kernel (data work that may run beside a shared queue).
    pub fn submit_kernel(&self, deps: Vec<Dep>, work: Work) -> CuResult<u64> {
        self.enqueue(deps, work, false, true)
    }

    /// Enqueues bookkeeping that must run even on a faulted context.
    pub fn submit_always(&self, deps: Vec<Dep>, work: Work) -> CuResult<u64> {
        self.enqueue(deps, work, true, false)
    }

    /// Enqueues one node of a launched graph (`capture::launch`).
    pub(crate) fn submit_node(&self, deps: Vec<Dep>, work: Work, always: bool, concurrent: bool) -> CuResult<u64> {
        self.enqueue(deps, work, always, concurrent)
    }

    /// The capture under way on this stream, if any.
    pub fn capture(&self) -> Option<Arc<Capture>> {
        lock(&self.capture).clone()
    }

    pub(crate) fn set_capture(&self, c: Option<Arc<Capture>>) {
        *lock(&self.capture) = c;
    }

    /// Refuses what a capturing stream cannot do (`why`), invalidating its capture.
    pub fn refuse_in_capture(&self, why: CUresult) -> CuResult<()> {
        match self.capture() {
            Some(c) => Err(c.invalidate(why)),
            None if self.legacy => capture::legacy_use(&self.core),
            None => Ok(()),
        }
    }

    /// Queues work, or records it into the stream's capture (the item number then is 0: a
    /// captured operation has no place on the queue).
    fn enqueue(&self, mut deps: Vec<Dep>, work: Work, always: bool, concurrent: bool) -> CuResult<u64> {
        if let Some(c) = self.capture() {
            c.record(self.handle, work, always, concurrent)?;
            return Ok(0);
        }
        if self.legacy {
            // Work on the legacy stream would depend on a capturing blocking stream.
            capture::legacy_use(&self.core)?;
        }
        // Implicit synchronisation with the legacy default stream.
        if let Some(ctx) = self.ctx.upgrade() {
            if self.legacy {
                for s in ctx.streams().iter().filter(|s| s.flags & STREAM_NON_BLOCKING == 0) {
                    deps.push(Dep::Stream(s.progress.clone(), s.progress.submitted()));
                }
            } else if self.flags & STREAM_NON_BLOCKING == 0 {
                deps.push(Dep::Stream(ctx.legacy.progress.clone(), ctx.legacy.progress.submitted()));
            }
        }
        deps.retain(|d| !d.met());
        if self.closed.load(Ordering::Acquire) {
            return Err(CUresult::INVALID_HANDLE);
        }
        self.hw.push(&self.progress, &self.core, Item { deps, work, always, concurrent })
    }

    /// Blocks until item `seq` has run.
    pub fn wait_for(&self, seq: u64) {
        sync::wait_until(|| self.progress.reached(seq));
    }

    /// Blocks until everything submitted so far has run.
    pub fn wait_idle(&self) {
        self.wait_for(self.progress.submitted());
    }

    /// `cuStreamSynchronize`.
    pub fn synchronize(&self) -> CuResult<()> {
        self.refuse_in_capture(CUresult::STREAM_CAPTURE_UNSUPPORTED)?;
        self.wait_idle();
        self.core.check()
    }

    /// `cuStreamQuery`.
    pub fn query(&self) -> CuResult<()> {
        self.refuse_in_capture(CUresult::STREAM_CAPTURE_UNSUPPORTED)?;
        self.core.check()?;
        if self.progress.reached(self.progress.submitted()) {
            Ok(())
        } else {
            Err(CUresult::NOT_READY)
        }
    }

    /// Takes no more work; what is queued still runs (and a queue of its own then ends).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if self.own_queue {
            self.hw.close();
        }
    }

    /// The owning context, while it lives.
    pub fn context(&self) -> CuResult<Arc<Context>> {
        self.ctx.upgrade().ok_or(CUresult::INVALID_CONTEXT)
    }
}

/// The stream a handle names, without error checks on its context: `NULL` and
/// `CU_STREAM_LEGACY` name the current context's legacy stream.
pub fn lookup(handle: usize) -> CuResult<Arc<Stream>> {
    match handle {
        0 | STREAM_LEGACY => Ok(context::current_unchecked()?.ok_or(CUresult::INVALID_CONTEXT)?.legacy.clone()),
        STREAM_PER_THREAD => {
            let ctx = context::current_unchecked()?.ok_or(CUresult::INVALID_CONTEXT)?;
            Ok(ctx.per_thread_stream())
        }
        h => {
            config::get()?;
            STREAMS.get(h).ok_or(CUresult::INVALID_HANDLE)
        }
    }
}

/// The stream a handle names, for work: its context must be alive and without sticky error.
pub fn resolve(handle: usize) -> CuResult<Arc<Stream>> {
    let s = lookup(handle)?;
    s.core.check()?;
    Ok(s)
}

/// `cuStreamCreate`.
pub fn create(flags: u32) -> CuResult<usize> {
    let ctx = context::current()?;
    if flags & !STREAM_NON_BLOCKING != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    ctx.core.resource_call("cuStreamCreate", true);
    let s = Stream::spawn(ctx.core.clone(), Arc::downgrade(&ctx), flags, false, ctx.queue_for_stream());
    ctx.add_stream(&s);
    STREAMS.insert(s.handle, s.clone());
    Ok(s.handle)
}

/// `cuStreamDestroy_v2`: returns at once; queued work still runs, then the worker exits.
pub fn destroy(handle: usize) -> CuResult<()> {
    config::get()?;
    if handle == 0 || handle == STREAM_LEGACY || handle == STREAM_PER_THREAD {
        return Err(CUresult::INVALID_HANDLE);
    }
    let s = STREAMS.remove(handle).ok_or(CUresult::INVALID_HANDLE)?;
    s.close();
    Ok(())
}

/// Forgets the streams of a destroyed context.
pub fn forget_context(ctx: usize) {
    STREAMS.remove_where(|s| s.core.handle == ctx);
}

/// `cuStreamWaitEvent`: later items of `stream` wait for the event's latest record.
pub fn wait_event(stream: usize, counters: &Arc<Counters>) -> CuResult<()> {
    let s = resolve(stream)?;
    let generation = counters.recorded();
    s.submit_always(vec![Dep::Event(counters.clone(), generation)], Arc::new(|| Ok(())))?;
    Ok(())
}

//! Contexts: one primary context per device (reference counted) and created ones; the current
//! context is per thread (a stack, as the driver's), so a thread that never bound one gets
//! `CUDA_ERROR_INVALID_CONTEXT`. A context carries its sticky error: once a kernel faulted,
//! every call using the context returns that error.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::config;
use crate::device;
use crate::handle::{fresh, lock, Registry};
use crate::hwqueue::HwQueue;
use crate::stream::Stream;
use crate::sync::{self, Delay};
use crate::sys::{CUresult, CuResult};
use crate::{ipc, memory, module, stream};

/// `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
const CONTEXT_IS_DESTROYED: CUresult = CUresult(709);

/// What streams, memory and events need of their context, without keeping it alive.
pub struct CtxCore {
    pub handle: usize,
    pub device: i32,
    sticky: AtomicU32,
    destroyed: AtomicBool,
    /// Set while the context is torn down: stream waits on memory give up.
    closing: AtomicBool,
    /// (context, device) pairs this context enabled peer access to.
    peers: Mutex<Vec<(usize, i32)>>,
    /// Held (shared) by a copy into pageable host memory while it waits for its stream, and
    /// taken (exclusive) by resource calls ([`CtxCore::resource_call`]): on an H200 (driver
    /// 580) `cuStreamCreate` and `cuEventCreate` waited for as long as another thread of the
    /// context sat in `cuMemcpyDtoHAsync` to pageable memory. Copies do not exclude each other.
    pub blocking: RwLock<()>,
}

impl CtxCore {
    /// `Err` with the sticky error, or `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
    pub fn check(&self) -> CuResult<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Err(CONTEXT_IS_DESTROYED);
        }
        self.sticky()
    }

    /// `Err` with the sticky error, if the context has one.
    pub fn sticky(&self) -> CuResult<()> {
        match self.sticky.load(Ordering::Acquire) {
            0 => Ok(()),
            e => Err(CUresult(e)),
        }
    }

    /// Makes `e` the context's sticky error (the first one stays).
    pub fn fail(&self, e: CUresult) {
        let _ = self.sticky.compare_exchange(0, e.0, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A resource call (`call`) waits, as on a real driver, while a copy into pageable memory of
    /// this context waits for its stream: `observed` calls (stream and event creation, seen so
    /// on an H200) always, the others under `TOPOCCL_STANDIN_LOCKS=all`. Said on stderr once
    /// it has waited the deadlock time.
    pub fn resource_call(&self, call: &str, observed: bool) {
        if !observed && !config::get().is_ok_and(|c| c.lock_all) {
            return;
        }
        if let Ok(guard) = self.blocking.try_write() {
            drop(guard);
            return;
        }
        sync::wait_until_reporting(
            || self.blocking.try_write().is_ok(),
            || {
                format!("{call} waits for the context lock that a copy into pageable memory holds while it waits for its stream")
            },
        );
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Whether kernels and copies of this context may touch memory of `device`: its own
    /// device (any context of it: see the README), or a peer it enabled.
    pub fn may_touch(&self, device: i32) -> bool {
        device == self.device || lock(&self.peers).iter().any(|&(_, d)| d == device)
    }
}

/// A context: its core, its legacy default stream and its other streams.
pub struct Context {
    pub core: Arc<CtxCore>,
    pub primary: bool,
    pub legacy: Arc<Stream>,
    streams: Mutex<Vec<Weak<Stream>>>,
    /// The hardware queues its streams share (`TOPOCCL_STANDIN_QUEUES=connections`; empty when
    /// each stream has its own), and the next one a new stream gets.
    queues: Vec<Arc<HwQueue>>,
    next_queue: AtomicUsize,
    /// Each thread's default stream (`CU_STREAM_PER_THREAD`), made at its first use.
    per_thread: Mutex<Vec<(std::thread::ThreadId, Arc<Stream>)>>,
    this: Weak<Context>,
}

impl Context {
    pub fn handle(&self) -> usize {
        self.core.handle
    }

    pub fn device(&self) -> i32 {
        self.core.device
    }

    pub fn add_stream(&self, s: &Arc<Stream>) {
        let mut streams = lock(&self.streams);
        streams.retain(|w| w.strong_count() > 0);
        streams.push(Arc::downgrade(s));
    }

    /// The queue a new stream feeds: the next shared one, round robin (`None`: its own).
    pub fn queue_for_stream(&self) -> Option<Arc<HwQueue>> {
        if self.queues.is_empty() {
            return None;
        }
        let i = self.next_queue.fetch_add(1, Ordering::Relaxed) % self.queues.len();
        Some(self.queues[i].clone())
    }

    /// The calling thread's default stream (`CU_STREAM_PER_THREAD`): a blocking stream of its
    /// own (it synchronises with the legacy stream, as any blocking stream), made at first use.
    pub fn per_thread_stream(&self) -> Arc<Stream> {
        let me = std::thread::current().id();
        let mut all = lock(&self.per_thread);
        if let Some((_, s)) = all.iter().find(|(t, _)| *t == me) {
            return s.clone();
        }
        let s = Stream::spawn(self.core.clone(), self.this.clone(), 0, false, self.queue_for_stream());
        self.add_stream(&s);
        all.push((me, s.clone()));
        s
    }

    /// The context's live streams other than the legacy one.
    pub fn streams(&self) -> Vec<Arc<Stream>> {
        lock(&self.streams).iter().filter_map(Weak::upgrade).collect()
    }

    /// Waits for everything submitted so far on every stream of the context.
    pub fn drain(&self) {
        self.drain_for("synchronising the context (a free, cuCtxSynchronize, a context's end)");
    }

    /// [`Context::drain`], saying on stderr what waits (`why`) once it has waited the
    /// deadlock time.
    pub fn drain_for(&self, why: &str) {
        for s in std::iter::once(self.legacy.clone()).chain(self.streams()) {
            let seq = s.progress.submitted();
            sync::wait_until_reporting(
                || s.progress.reached(seq),
                || format!("{why}, but a stream of the context does not finish"),
            );
        }
    }

    /// `cuCtxSynchronize`.
    pub fn synchronize(&self) -> CuResult<()> {
        crate::capture::context_sync(&self.core)?;
        self.drain();
        self.core.check()
    }
}

static CONTEXTS: Registry<Context> = Registry::new();

thread_local! {
    static STACK: RefCell<Vec<Arc<Context>>> = const { RefCell::new(Vec::new()) };
}

struct Primary {
    ctx: Option<Arc<Context>>,
    refs: u32,
}

static PRIMARY: Mutex<Vec<Primary>> = Mutex::new(Vec::new());

fn new_context(device: i32, primary: bool) -> Arc<Context> {
    let core = Arc::new(CtxCore {
        handle: fresh(),
        device,
        sticky: AtomicU32::new(0),
        destroyed: AtomicBool::new(false),
        closing: AtomicBool::new(false),
        peers: Mutex::new(Vec::new()),
        blocking: RwLock::new(()),
    });
    let (seed, max_us) = config::get().map_or((1, 0), |c| (c.seed, c.delay_us));
    let queues: Vec<Arc<HwQueue>> = (0..config::get().ok().and_then(|c| c.queues).unwrap_or(0))
        .map(|i| {
            let delay = Delay::new(seed ^ (core.handle as u64).rotate_left(17) ^ u64::from(i).rotate_left(40), max_us);
            HwQueue::spawn(format!("cuda-standin-q{i}-{:x}", core.handle), delay, true)
        })
        .collect();
    // The legacy stream takes the first shared queue.
    let ctx = Arc::new_cyclic(|weak| Context {
        legacy: Stream::spawn(core.clone(), weak.clone(), 0, true, queues.first().cloned()),
        core: core.clone(),
        primary,
        streams: Mutex::new(Vec::new()),
        next_queue: AtomicUsize::new(1),
        queues,
        per_thread: Mutex::new(Vec::new()),
        this: weak.clone(),
    });
    CONTEXTS.insert(core.handle, ctx.clone());
    ctx
}

/// Waits for the context's work, then frees everything it owns and marks it destroyed.
fn tear_down(ctx: &Context) {
    ctx.core.closing.store(true, Ordering::Release);
    ctx.drain();
    ctx.core.destroyed.store(true, Ordering::Release);
    CONTEXTS.remove(ctx.handle());
    ctx.legacy.close();
    for s in ctx.streams() {
        s.close();
    }
    for q in &ctx.queues {
        q.close();
    }
    stream::forget_context(ctx.handle());
    memory::release_context(ctx.handle());
    ipc::release_context(ctx.handle());
    module::release_context(ctx.handle());
}

/// The context with this handle; `CUDA_ERROR_INVALID_CONTEXT` for an unknown one.
pub fn lookup(handle: usize) -> CuResult<Arc<Context>> {
    config::get()?;
    CONTEXTS.get(handle).ok_or(CUresult::INVALID_CONTEXT)
}

/// The calling thread's current context, if any (no error checks beyond `cuInit`).
pub fn current_unchecked() -> CuResult<Option<Arc<Context>>> {
    config::get()?;
    Ok(STACK.with(|s| s.borrow().last().cloned()))
}

/// The calling thread's current context, checked: `CUDA_ERROR_INVALID_CONTEXT` when there is
/// none, its sticky error when it has one.
pub fn current() -> CuResult<Arc<Context>> {
    let ctx = current_unchecked()?.ok_or(CUresult::INVALID_CONTEXT)?;
    ctx.core.check()?;
    Ok(ctx)
}

/// `cuCtxGetCurrent`: the handle, or 0.
pub fn get_current() -> CuResult<usize> {
    Ok(current_unchecked()?.map_or(0, |c| c.handle()))
}

/// `cuCtxSetCurrent`: replaces the top of the stack (0 pops it).
pub fn set_current(handle: usize) -> CuResult<()> {
    config::get()?;
    let ctx = if handle == 0 { None } else { Some(lookup(handle)?) };
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        s.extend(ctx);
    });
    Ok(())
}

/// `cuCtxPushCurrent_v2`.
pub fn push(handle: usize) -> CuResult<()> {
    let ctx = lookup(handle)?;
    STACK.with(|s| s.borrow_mut().push(ctx));
    Ok(())
}

/// `cuCtxPopCurrent_v2`: the popped handle.
pub fn pop() -> CuResult<usize> {
    config::get()?;
    STACK.with(|s| s.borrow_mut().pop()).map(|c| c.handle()).ok_or(CUresult::INVALID_CONTEXT)
}

/// `cuCtxCreate_v2`: a new (non-primary) context, pushed on the calling thread's stack.
pub fn create(flags: u32, device: i32) -> CuResult<usize> {
    device::check(device)?;
    if flags & !0xff != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let ctx = new_context(device, false);
    let handle = ctx.handle();
    STACK.with(|s| s.borrow_mut().push(ctx));
    Ok(handle)
}

/// `cuCtxDestroy_v2`: waits for the context's work and frees what it owns; it leaves the
/// calling thread's stack (other threads that still have it current get
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED`). A primary context cannot be destroyed.
pub fn destroy(handle: usize) -> CuResult<()> {
    let ctx = lookup(handle)?;
    if ctx.primary {
        return Err(CUresult::INVALID_CONTEXT);
    }
    tear_down(&ctx);
    STACK.with(|s| s.borrow_mut().retain(|c| c.handle() != handle));
    Ok(())
}

/// `cuDevicePrimaryCtxRetain`.
pub fn primary_retain(device: i32) -> CuResult<usize> {
    let devices = device::check(device)?;
    let mut slots = lock(&PRIMARY);
    slots.resize_with(devices as usize, || Primary { ctx: None, refs: 0 });
    let slot = &mut slots[device as usize];
    let ctx = slot.ctx.get_or_insert_with(|| new_context(device, true));
    slot.refs += 1;
    Ok(ctx.handle())
}

/// `cuDevicePrimaryCtxRelease_v2`: the last release destroys the primary context (a later
/// retain makes a fresh one).
pub fn primary_release(device: i32) -> CuResult<()> {
    device::check(device)?;
    let doomed = {
        let mut slots = lock(&PRIMARY);
        let slot = slots.get_mut(device as usize).filter(|s| s.refs > 0).ok_or(CUresult::INVALID_CONTEXT)?;
        slot.refs -= 1;
        if slot.refs == 0 {
            slot.ctx.take()
        } else {
            None
        }
    };
    if let Some(ctx) = doomed {
        tear_down(&ctx);
    }
    Ok(())
}

/// `cuDevicePrimaryCtxGetState`: (flags, active).
pub fn primary_state(device: i32) -> CuResult<(u32, bool)> {
    device::check(device)?;
    let slots = lock(&PRIMARY);
    Ok((0, slots.get(device as usize).is_some_and(|s| s.refs > 0)))
}

/// `cuCtxEnablePeerAccess`: the current context may then touch memory of `peer`'s device.
pub fn enable_peer(peer: usize, flags: u32) -> CuResult<()> {
    let ctx = current()?;
    if flags != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let peer = lookup(peer)?;
    ctx.core.resource_call("cuCtxEnablePeerAccess", false);
    if peer.device() == ctx.device() {
        return Err(CUresult::INVALID_DEVICE);
    }
    let mut peers = lock(&ctx.core.peers);
    if peers.iter().any(|&(h, _)| h == peer.handle()) {
        return Err(CUresult::PEER_ACCESS_ALREADY_ENABLED);
    }
    peers.push((peer.handle(), peer.device()));
    Ok(())
}

/// `cuCtxDisablePeerAccess`.
pub fn disable_peer(peer: usize) -> CuResult<()> {
    let ctx = current()?;
    let mut peers = lock(&ctx.core.peers);
    let before = peers.len();
    peers.retain(|&(h, _)| h != peer);
    if peers.len() == before {
        return Err(CUresult::PEER_ACCESS_NOT_ENABLED);
    }
    Ok(())
}

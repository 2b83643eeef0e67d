//! Stream capture and graphs: between `cuStreamBeginCapture_v2` and `cuStreamEndCapture`, the
//! work a capturing stream is given is recorded as a graph's nodes instead of run; the graph
//! is instantiated (`cuGraphInstantiateWithFlags`) and launched (`cuGraphLaunch`) as often as
//! the caller likes, each launch running every node again, with the arguments, addresses and
//! values it had when captured (a kernel's arguments are copied at capture, as a kernel
//! node's).
//!
//! Other streams join a capture through events: an event recorded on a capturing stream
//! names the nodes captured so far on it, and a stream that waits for it captures from then
//! on into the same graph, after those nodes (a fork); the capture may end only once every
//! such stream's work is joined back into the stream that began it (an event recorded on the
//! forked stream, waited for by the origin), else `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`.
//!
//! What a real driver refuses while a stream captures, the stand-in refuses with the same
//! code, and like the driver it invalidates the capture, so that `cuStreamEndCapture` returns
//! `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and no graph:
//!
//! - synchronising or querying a capturing stream, or the context (`cuCtxSynchronize`):
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`;
//! - the legacy default stream while a blocking stream of its context captures (work on it,
//!   its synchronisation, a synchronous copy): `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`;
//! - querying or synchronising an event last recorded in a capture:
//!   `CUDA_ERROR_CAPTURED_EVENT`;
//! - a stream waiting for an event recorded outside the capture (capture isolation) without
//!   `CU_EVENT_WAIT_EXTERNAL`: `CUDA_ERROR_STREAM_CAPTURE_ISOLATION` (the code is inferred from
//!   the header's text, not seen on a GPU); for an event of another capture,
//!   `CUDA_ERROR_STREAM_CAPTURE_MERGE`;
//! - "potentially unsafe" calls (allocating, freeing, registering memory) from a thread whose
//!   capture-interaction mode forbids them (`cuThreadExchangeStreamCaptureMode`): in
//!   `GLOBAL` mode while any global capture of the process is under way, in `THREAD_LOCAL`
//!   while this thread has one, never in `RELAXED`: `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
//!
//! Captured copies may use pageable memory: the node reads or writes it when each launch runs
//! it (as on a GPU: pytorch#166765), so the caller must keep it valid. Graph-owned memory
//! (`cuMemAllocAsync` / `cuMemFreeAsync` in a capture) is not modelled: `CUDA_ERROR_NOT_SUPPORTED`.
//!
//! A launch runs the graph's nodes in the order they were captured (an order its dependencies
//! allow) on the launch stream, kernels beside a shared hardware queue as any kernel; two
//! launches of one executable graph run one after the other, even on different streams.
//! Branches of a forked capture therefore run one after another rather than side by side: a
//! graph whose branches wait for each other would hang here where a GPU might not.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::ThreadId;

use crate::context::{self, CtxCore};
use crate::handle::{fresh, lock, Registry};
use crate::stream::{self, Dep, Progress, Stream, Work};
use crate::sys::{CUresult, CuResult};

/// `CUstreamCaptureMode`.
pub const MODE_GLOBAL: u32 = 0;
pub const MODE_THREAD_LOCAL: u32 = 1;
pub const MODE_RELAXED: u32 = 2;

/// `CUstreamCaptureStatus`.
pub const STATUS_NONE: u32 = 0;
pub const STATUS_ACTIVE: u32 = 1;
pub const STATUS_INVALIDATED: u32 = 2;

/// `cuGraphInstantiateWithFlags`' flags: auto-free on launch, upload, device launch, node
/// priority (all accepted; none changes what the stand-in does).
const INSTANTIATE_FLAGS: u64 = 1 | 2 | 4 | 8;

/// One captured operation.
#[derive(Clone)]
pub struct Node {
    pub work: Work,
    /// Bookkeeping that runs even on a faulted context (a value write, a wait).
    pub always: bool,
    /// A kernel (runs beside a shared hardware queue).
    pub concurrent: bool,
    /// Earlier nodes it follows.
    pub deps: Vec<usize>,
}

#[derive(Default)]
struct State {
    nodes: Vec<Node>,
    /// Per stream in the capture (its handle): the nodes its next node follows, and the stream.
    tails: BTreeMap<usize, (Vec<usize>, Weak<Stream>)>,
    /// Why the capture was invalidated, if it was.
    invalid: Option<CUresult>,
}

/// A capture under way.
pub struct Capture {
    pub id: u64,
    /// The stream that began it.
    origin: usize,
    pub mode: u32,
    thread: ThreadId,
    pub core: Arc<CtxCore>,
    state: Mutex<State>,
}

/// Captures under way in the process (for the unsafe-call rule).
static ACTIVE: Mutex<Vec<Weak<Capture>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's capture-interaction mode.
    static THREAD_MODE: Cell<u32> = const { Cell::new(MODE_GLOBAL) };
}

impl Capture {
    /// Records an operation of stream `handle`: after that stream's tail, as its new tail.
    pub(crate) fn record(&self, handle: usize, work: Work, always: bool, concurrent: bool) -> CuResult<()> {
        let mut st = lock(&self.state);
        if st.invalid.is_some() {
            return Err(CUresult::STREAM_CAPTURE_INVALIDATED);
        }
        let index = st.nodes.len();
        let deps = st.tails.get(&handle).map(|t| t.0.clone()).unwrap_or_default();
        st.nodes.push(Node { work, always, concurrent, deps });
        if let Some(t) = st.tails.get_mut(&handle) {
            t.0 = vec![index];
        }
        Ok(())
    }

    /// Invalidates the capture with `why` (the first reason stays); returns `why`.
    pub fn invalidate(&self, why: CUresult) -> CUresult {
        lock(&self.state).invalid.get_or_insert(why);
        why
    }

    pub fn is_invalid(&self) -> bool {
        lock(&self.state).invalid.is_some()
    }

    /// The nodes stream `handle`'s next operation would follow (what an event records).
    pub fn tail(&self, handle: usize) -> Vec<usize> {
        lock(&self.state).tails.get(&handle).map(|t| t.0.clone()).unwrap_or_default()
    }

    /// Stream `s` waits for `nodes` of this capture: it joins it (a fork), or, already in it,
    /// follows them too (a join).
    pub(crate) fn follow(self: &Arc<Capture>, s: &Arc<Stream>, nodes: &[usize]) -> CuResult<()> {
        let mut st = lock(&self.state);
        if st.invalid.is_some() {
            return Err(CUresult::STREAM_CAPTURE_INVALIDATED);
        }
        let t = st.tails.entry(s.handle).or_insert_with(|| (Vec::new(), Arc::downgrade(s)));
        for &n in nodes {
            if !t.0.contains(&n) {
                t.0.push(n);
            }
        }
        drop(st);
        s.set_capture(Some(self.clone()));
        Ok(())
    }

    /// Every node `from` follows, directly or not, and `from` itself.
    fn ancestors(nodes: &[Node], from: &[usize]) -> Vec<bool> {
        let mut seen = vec![false; nodes.len()];
        let mut todo: Vec<usize> = from.to_vec();
        while let Some(n) = todo.pop() {
            if n < seen.len() && !seen[n] {
                seen[n] = true;
                todo.extend_from_slice(&nodes[n].deps);
            }
        }
        seen
    }

    /// Ends the capture: every stream leaves it; the graph's nodes, or why there is none.
    fn end(&self) -> CuResult<Vec<Node>> {
        let (tails, nodes, invalid) = {
            let mut st = lock(&self.state);
            (std::mem::take(&mut st.tails), std::mem::take(&mut st.nodes), st.invalid)
        };
        for (_, w) in tails.into_values() {
            if let Some(s) = w.upgrade() {
                s.set_capture(None);
            }
        }
        lock(&ACTIVE).retain(|w| w.upgrade().is_some_and(|c| c.id != self.id));
        match invalid {
            Some(_) => Err(CUresult::STREAM_CAPTURE_INVALIDATED),
            None => Ok(nodes),
        }
    }
}

/// The capture-interaction mode of this thread.
fn thread_mode() -> u32 {
    THREAD_MODE.with(Cell::get)
}

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's mode to `*mode`, returning the old.
pub fn exchange_mode(mode: u32) -> CuResult<u32> {
    if mode > MODE_RELAXED {
        return Err(CUresult::INVALID_VALUE);
    }
    Ok(THREAD_MODE.with(|m| m.replace(mode)))
}

/// A "potentially unsafe" call (memory allocation, freeing, registration): refused, and the
/// captures it would break invalidated, where this thread's mode forbids it (module docs).
pub fn unsafe_call() -> CuResult<()> {
    if thread_mode() == MODE_RELAXED {
        return Ok(());
    }
    let me = std::thread::current().id();
    let active: Vec<Arc<Capture>> = lock(&ACTIVE).iter().filter_map(Weak::upgrade).collect();
    let mut refused = false;
    for c in active.iter().filter(|c| !c.is_invalid()) {
        let breaks = match c.mode {
            MODE_GLOBAL => true,
            MODE_THREAD_LOCAL => c.thread == me,
            _ => false,
        };
        if breaks {
            c.invalidate(CUresult::STREAM_CAPTURE_UNSUPPORTED);
            refused = true;
        }
    }
    if refused {
        Err(CUresult::STREAM_CAPTURE_UNSUPPORTED)
    } else {
        Ok(())
    }
}

/// The captures under way on blocking streams of context `core` (what the legacy stream
/// would implicitly depend on).
pub fn blocking_captures(core: &CtxCore) -> Vec<Arc<Capture>> {
    let Ok(ctx) = context::lookup(core.handle) else { return Vec::new() };
    let mut v: Vec<Arc<Capture>> = Vec::new();
    for s in ctx.streams() {
        if s.flags & crate::sys::STREAM_NON_BLOCKING == 0 {
            if let Some(c) = s.capture() {
                if !v.iter().any(|x| x.id == c.id) {
                    v.push(c);
                }
            }
        }
    }
    v
}

/// `Err(why)` if `caps` is not empty, each of them invalidated.
fn refuse(caps: &[Arc<Capture>], why: CUresult) -> CuResult<()> {
    for c in caps {
        c.invalidate(why);
    }
    if caps.is_empty() {
        Ok(())
    } else {
        Err(why)
    }
}

/// The legacy stream of `core` is used: refused, invalidating them, while blocking streams
/// capture.
pub fn legacy_use(core: &CtxCore) -> CuResult<()> {
    refuse(&blocking_captures(core), CUresult::STREAM_CAPTURE_IMPLICIT)
}

/// Context `core` is synchronised (`cuCtxSynchronize`): refused, invalidating them, while any
/// of its captures is under way.
pub fn context_sync(core: &CtxCore) -> CuResult<()> {
    let caps: Vec<Arc<Capture>> =
        lock(&ACTIVE).iter().filter_map(Weak::upgrade).filter(|c| c.core.handle == core.handle).collect();
    refuse(&caps, CUresult::STREAM_CAPTURE_UNSUPPORTED)
}

/// `cuStreamBeginCapture_v2`.
pub fn begin(stream: usize, mode: u32) -> CuResult<()> {
    if mode > MODE_RELAXED {
        return Err(CUresult::INVALID_VALUE);
    }
    let s = stream::resolve(stream)?;
    if s.legacy {
        // The legacy stream cannot capture.
        return Err(CUresult::STREAM_CAPTURE_UNSUPPORTED);
    }
    if s.capture().is_some() {
        return Err(CUresult::ILLEGAL_STATE);
    }
    let c = Arc::new(Capture {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        origin: s.handle,
        mode,
        thread: std::thread::current().id(),
        core: s.core.clone(),
        state: Mutex::default(),
    });
    lock(&c.state).tails.insert(s.handle, (Vec::new(), Arc::downgrade(&s)));
    lock(&ACTIVE).push(Arc::downgrade(&c));
    s.set_capture(Some(c));
    Ok(())
}

/// `cuStreamIsCapturing`: the legacy stream while a blocking stream captures is
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (the capture goes on).
pub fn status(stream: usize) -> CuResult<u32> {
    let s = stream::lookup(stream)?;
    if s.legacy {
        return if blocking_captures(&s.core).is_empty() {
            Ok(STATUS_NONE)
        } else {
            Err(CUresult::STREAM_CAPTURE_IMPLICIT)
        };
    }
    Ok(match s.capture() {
        None => STATUS_NONE,
        Some(c) if c.is_invalid() => STATUS_INVALIDATED,
        Some(_) => STATUS_ACTIVE,
    })
}

/// `cuStreamGetCaptureInfo`: the status and, while capturing, the capture's id.
pub fn info(stream: usize) -> CuResult<(u32, u64)> {
    let st = status(stream)?;
    let id = stream::lookup(stream)?.capture().map_or(0, |c| c.id);
    Ok((st, id))
}

/// A captured graph (`CUgraph`).
pub struct Graph {
    nodes: Arc<[Node]>,
    ctx: usize,
}

/// An executable graph (`CUgraphExec`): launches run one after another.
pub struct Exec {
    nodes: Arc<[Node]>,
    ctx: usize,
    last: Mutex<Option<(Arc<Progress>, u64)>>,
}

static GRAPHS: Registry<Graph> = Registry::new();
static EXECS: Registry<Exec> = Registry::new();

/// `cuStreamEndCapture`: the graph's handle.
pub fn end(stream: usize) -> CuResult<usize> {
    let s = stream::resolve(stream)?;
    let c = s.capture().ok_or(CUresult::ILLEGAL_STATE)?;
    if c.origin != s.handle {
        return Err(CUresult::STREAM_CAPTURE_UNMATCHED);
    }
    if c.mode != MODE_RELAXED && c.thread != std::thread::current().id() {
        return Err(CUresult::STREAM_CAPTURE_WRONG_THREAD);
    }
    // Every stream forked into the capture must be joined back into the origin.
    {
        let st = lock(&c.state);
        let origin_tail = st.tails.get(&c.origin).map(|t| t.0.clone()).unwrap_or_default();
        let joined = Capture::ancestors(&st.nodes, &origin_tail);
        let unjoined = st.tails.iter().any(|(&h, t)| h != c.origin && t.0.iter().any(|&n| !joined[n]));
        drop(st);
        if unjoined {
            c.invalidate(CUresult::STREAM_CAPTURE_UNJOINED);
            let _ = c.end();
            return Err(CUresult::STREAM_CAPTURE_UNJOINED);
        }
    }
    let nodes = c.end()?;
    let handle = fresh();
    GRAPHS.insert(handle, Arc::new(Graph { nodes: nodes.into(), ctx: c.core.handle }));
    Ok(handle)
}

/// `cuGraphDestroy`.
pub fn destroy_graph(graph: usize) -> CuResult<()> {
    crate::config::get()?;
    GRAPHS.remove(graph).map(drop).ok_or(CUresult::INVALID_VALUE)
}

/// How many nodes a graph has (`cuGraphGetNodes` with no array).
pub fn node_count(graph: usize) -> CuResult<usize> {
    crate::config::get()?;
    GRAPHS.get(graph).map(|g| g.nodes.len()).ok_or(CUresult::INVALID_VALUE)
}

/// `cuGraphInstantiateWithFlags`.
pub fn instantiate(graph: usize, flags: u64) -> CuResult<usize> {
    context::current()?;
    if flags & !INSTANTIATE_FLAGS != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let g = GRAPHS.get(graph).ok_or(CUresult::INVALID_VALUE)?;
    let handle = fresh();
    EXECS.insert(handle, Arc::new(Exec { nodes: g.nodes.clone(), ctx: g.ctx, last: Mutex::new(None) }));
    Ok(handle)
}

/// `cuGraphExecDestroy`: launches already queued still run.
pub fn destroy_exec(exec: usize) -> CuResult<()> {
    crate::config::get()?;
    EXECS.remove(exec).map(drop).ok_or(CUresult::INVALID_VALUE)
}

/// `cuGraphLaunch`: every node on `stream`, in capture order, after the exec's previous
/// launch. Launching into a capturing stream (a child graph) is not supported here.
pub fn launch(exec: usize, stream: usize) -> CuResult<()> {
    let e = EXECS.get(exec).ok_or(CUresult::INVALID_VALUE)?;
    let s = stream::resolve(stream)?;
    if s.capture().is_some() {
        return Err(CUresult::NOT_SUPPORTED);
    }
    if s.core.handle != e.ctx {
        return Err(CUresult::INVALID_VALUE);
    }
    let mut last = lock(&e.last);
    let mut after: Vec<Dep> = last.iter().map(|(p, seq)| Dep::Stream(p.clone(), *seq)).collect();
    let mut seq = None;
    for n in e.nodes.iter() {
        seq = Some(s.submit_node(std::mem::take(&mut after), n.work.clone(), n.always, n.concurrent)?);
    }
    if seq.is_none() {
        // An empty graph still orders: one item to stand for it.
        seq = Some(s.submit_node(after, Arc::new(|| Ok(())), true, false)?);
    }
    *last = seq.map(|q| (s.progress.clone(), q));
    Ok(())
}

//! Events as generation counters: a record takes the next number at call time and the stream
//! stores it as completed when it reaches the record; a wait (`cuStreamWaitEvent`) waits for
//! the number the event had when the wait was called, so it sees the record made most
//! recently before it (an event never recorded is complete). Interprocess events keep their
//! counters in a memfd page, which the importer maps through procfs: both processes then
//! record and wait on the same numbers.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::capture::Capture;
use crate::context::{self, CtxCore};
use crate::handle::{fresh, lock, Registry};
use crate::mapping::{page, Mapping, SharedFile};
use crate::stream;
use crate::sync;
use crate::sys::{CUresult, CuResult, EVENT_BLOCKING_SYNC, EVENT_DISABLE_TIMING, EVENT_INTERPROCESS};

#[repr(C)]
#[derive(Default)]
struct Raw {
    recorded: AtomicU64,
    completed: AtomicU64,
    /// When the latest completed record ran (ns since the process's clock origin).
    completed_ns: AtomicU64,
}

enum Backing {
    Local(Box<Raw>),
    Shared { file: SharedFile, map: Mapping },
}

/// An event's counters, local or in shared memory.
pub struct Counters {
    backing: Backing,
}

fn now_ns() -> u64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Counters {
    fn local() -> Arc<Self> {
        Arc::new(Counters { backing: Backing::Local(Box::default()) })
    }

    fn shared(file: SharedFile) -> io::Result<Arc<Self>> {
        let map = Mapping::file(&file, libc::PROT_READ | libc::PROT_WRITE)?;
        Ok(Arc::new(Counters { backing: Backing::Shared { file, map } }))
    }

    fn raw(&self) -> &Raw {
        match &self.backing {
            Backing::Local(raw) => raw,
            // SAFETY: the mapping is a page (larger than `Raw`), page-aligned, lives as long as
            // `self`, and is only ever accessed through these atomics.
            Backing::Shared { map, .. } => unsafe { &*map.ptr().cast::<Raw>() },
        }
    }

    /// The memfd of an interprocess event.
    pub fn file(&self) -> Option<&SharedFile> {
        match &self.backing {
            Backing::Shared { file, .. } => Some(file),
            Backing::Local(_) => None,
        }
    }

    pub fn recorded(&self) -> u64 {
        self.raw().recorded.load(Ordering::Acquire)
    }

    pub fn completed(&self) -> u64 {
        self.raw().completed.load(Ordering::Acquire)
    }

    /// Takes the next record number.
    fn record(&self) -> u64 {
        self.raw().recorded.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Marks record `generation` as reached (records may complete out of order across streams).
    fn complete(&self, generation: u64) {
        let raw = self.raw();
        raw.completed_ns.store(now_ns(), Ordering::Release);
        raw.completed.fetch_max(generation, Ordering::AcqRel);
        sync::notify();
    }
}

pub struct Event {
    pub handle: usize,
    pub flags: u32,
    pub core: Arc<CtxCore>,
    pub counters: Arc<Counters>,
    /// Its last record, if that was in a capture: the capture and the nodes it names.
    captured: Mutex<Option<(Weak<Capture>, Vec<usize>)>>,
}

impl Event {
    /// The capture (still under way) and nodes of its last record, if it was captured.
    fn captured(&self) -> Option<(Option<Arc<Capture>>, Vec<usize>)> {
        lock(&self.captured).as_ref().map(|(c, n)| (c.upgrade(), n.clone()))
    }

    /// `CUDA_ERROR_CAPTURED_EVENT` if its last record was in a capture.
    fn not_captured(&self) -> CuResult<()> {
        match self.captured() {
            Some(_) => Err(CUresult::CAPTURED_EVENT),
            None => Ok(()),
        }
    }
}

static EVENTS: Registry<Event> = Registry::new();

fn register(core: Arc<CtxCore>, flags: u32, counters: Arc<Counters>) -> usize {
    let handle = fresh();
    EVENTS.insert(handle, Arc::new(Event { handle, flags, core, counters, captured: Mutex::new(None) }));
    handle
}

/// `cuEventCreate`.
pub fn create(flags: u32) -> CuResult<usize> {
    let ctx = context::current()?;
    // Waits while a copy to pageable memory waits for its stream (`CtxCore::blocking`).
    ctx.core.resource_call("cuEventCreate", true);
    if flags & !(EVENT_BLOCKING_SYNC | EVENT_DISABLE_TIMING | EVENT_INTERPROCESS) != 0 {
        return Err(CUresult::INVALID_VALUE);
    }
    let counters = if flags & EVENT_INTERPROCESS != 0 {
        if flags & EVENT_DISABLE_TIMING == 0 {
            return Err(CUresult::INVALID_VALUE);
        }
        let file = SharedFile::create("topoccl-standin-event", page()).map_err(|_| CUresult::OUT_OF_MEMORY)?;
        Counters::shared(file).map_err(|_| CUresult::OUT_OF_MEMORY)?
    } else {
        Counters::local()
    };
    Ok(register(ctx.core.clone(), flags, counters))
}

/// An interprocess event opened from another process's handle, in the current context.
pub fn open_shared(file: SharedFile) -> CuResult<usize> {
    let ctx = context::current()?;
    let counters = Counters::shared(file).map_err(|_| CUresult::MAP_FAILED)?;
    Ok(register(ctx.core.clone(), EVENT_DISABLE_TIMING | EVENT_INTERPROCESS, counters))
}

pub fn lookup(handle: usize) -> CuResult<Arc<Event>> {
    crate::config::get()?;
    EVENTS.get(handle).ok_or(CUresult::INVALID_HANDLE)
}

/// `cuEventRecord`: the event and the stream must belong to the same context.
pub fn record(event: usize, stream: usize) -> CuResult<()> {
    let ev = lookup(event)?;
    let s = stream::resolve(stream)?;
    if !Arc::ptr_eq(&ev.core, &s.core) {
        return Err(CUresult::INVALID_HANDLE);
    }
    if let Some(c) = s.capture() {
        // A record in a capture names the nodes captured so far on the stream.
        let tail = c.tail(s.handle);
        *lock(&ev.captured) = Some((Arc::downgrade(&c), tail));
        return Ok(());
    }
    *lock(&ev.captured) = None;
    let generation = ev.counters.record();
    let counters = ev.counters.clone();
    s.submit_always(
        Vec::new(),
        Arc::new(move || {
            counters.complete(generation);
            Ok(())
        }),
    )?;
    Ok(())
}

/// `cuEventQuery`.
pub fn query(event: usize) -> CuResult<()> {
    let ev = lookup(event)?;
    ev.not_captured()?;
    ev.core.check()?;
    if ev.counters.completed() >= ev.counters.recorded() {
        Ok(())
    } else {
        Err(CUresult::NOT_READY)
    }
}

/// `cuEventSynchronize`.
pub fn synchronize(event: usize) -> CuResult<()> {
    let ev = lookup(event)?;
    ev.not_captured()?;
    let generation = ev.counters.recorded();
    sync::wait_until(|| ev.counters.completed() >= generation);
    ev.core.check()
}

/// `CU_EVENT_WAIT_EXTERNAL`.
const EVENT_WAIT_EXTERNAL: u32 = 1;

/// `cuStreamWaitEvent`: in a capture, a wait for an event recorded outside it needs
/// `CU_EVENT_WAIT_EXTERNAL` (an event-wait node), else `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`.
pub fn wait(stream: usize, event: usize, flags: u32) -> CuResult<()> {
    let ev = lookup(event)?;
    if flags > EVENT_WAIT_EXTERNAL {
        return Err(CUresult::INVALID_VALUE);
    }
    let s = stream::resolve(stream)?;
    if flags == EVENT_WAIT_EXTERNAL {
        // An event-wait node: each launch waits for the event's latest record at that time.
        let c = s.capture().ok_or(CUresult::INVALID_VALUE)?;
        let counters = ev.counters.clone();
        let work: stream::Work = Arc::new(move || {
            let generation = counters.recorded();
            sync::wait_until(|| counters.completed() >= generation);
            Ok(())
        });
        return c.record(s.handle, work, true, false);
    }
    match (s.capture(), ev.captured()) {
        (None, None) => stream::wait_event(stream, &ev.counters),
        // A wait for a capture's event joins the stream into it (a fork), or, in it already,
        // orders it after the event's nodes (a join).
        (mine, Some((Some(theirs), nodes))) => match mine {
            Some(m) if m.id != theirs.id => Err(m.invalidate(CUresult::STREAM_CAPTURE_MERGE)),
            _ => theirs.follow(&s, &nodes),
        },
        // The event's capture has ended: it no longer names work that will run.
        (Some(m), Some((None, _))) => Err(m.invalidate(CUresult::STREAM_CAPTURE_ISOLATION)),
        (None, Some((None, _))) => Err(CUresult::STREAM_CAPTURE_INVALIDATED),
        // A capturing stream may not depend on work outside its capture.
        (Some(m), None) => Err(m.invalidate(CUresult::STREAM_CAPTURE_ISOLATION)),
    }
}

/// `cuEventDestroy_v2`: pending records still complete.
pub fn destroy(event: usize) -> CuResult<()> {
    crate::config::get()?;
    EVENTS.remove(event).map(|_| ()).ok_or(CUresult::INVALID_HANDLE)
}

/// `cuEventElapsedTime`: milliseconds between two completed records of timing events.
pub fn elapsed_ms(start: usize, end: usize) -> CuResult<f32> {
    let (s, e) = (lookup(start)?, lookup(end)?);
    if (s.flags | e.flags) & EVENT_DISABLE_TIMING != 0 {
        return Err(CUresult::INVALID_HANDLE);
    }
    if s.counters.recorded() == 0 || e.counters.recorded() == 0 {
        return Err(CUresult::INVALID_HANDLE);
    }
    for c in [&s.counters, &e.counters] {
        if c.completed() < c.recorded() {
            return Err(CUresult::NOT_READY);
        }
    }
    let ns = |c: &Counters| c.raw().completed_ns.load(Ordering::Acquire) as f64;
    Ok(((ns(&e.counters) - ns(&s.counters)) / 1e6) as f32)
}

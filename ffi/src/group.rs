//! `ncclGroupStart` / `ncclGroupEnd`: calls made in between (per thread, nestable) wait, and
//! run together when the outermost group ends — the only way one thread can drive several
//! communicators (one per device, as `ncclCommInitAll` users do) or exchange in both
//! directions without deadlock.
//!
//! At the end, the work is split by communicator. Inits and splits come first, each
//! communicator's on a thread of its own (their rendezvous blocks until every rank arrives).
//! Then each communicator's sends and receives, as one batch, and its collectives in call order
//! are queued on it ([`topoccl::Communicator::submit`]) — several communicators' side by side,
//! a thread each, since a device-resident call on one may wait, as it is queued, for another's
//! to be queued (ranks on one device) — so every communicator's progress thread runs its share
//! at once, and the group's end waits for all of them. Any order that is
//! the same on every rank is correct, because NCCL's group semantics is that the calls run
//! concurrently.

use std::cell::RefCell;
use std::sync::Arc;

use topoccl::{Communicator, Config, UniqueId};

use crate::call::{self, CollectiveArgs, TransferArgs};
use crate::error::{usage, Error, Result};
use crate::handle::Handle;

/// A group's queued calls: each communicator's works, in the order they run.
pub type Queued = Vec<(Arc<Handle>, Vec<topoccl::Work>)>;

/// Work deferred to the group's end.
pub enum Deferred {
    Init {
        handle: Arc<Handle>,
        id: UniqueId,
        rank: u32,
        nranks: u32,
        config: Box<Config>,
    },
    /// `child` is `None` for `NCCL_SPLIT_NOCOLOR`.
    Split {
        parent: Arc<Handle>,
        child: Option<Arc<Handle>>,
        color: Option<u32>,
        key: i32,
    },
    Collective {
        handle: Arc<Handle>,
        call: CollectiveArgs,
    },
    Transfer {
        handle: Arc<Handle>,
        transfer: TransferArgs,
    },
}

impl Deferred {
    /// The communicator whose thread runs this.
    fn lane(&self) -> usize {
        match self {
            Deferred::Init { handle, .. } | Deferred::Collective { handle, .. } | Deferred::Transfer { handle, .. } => {
                Arc::as_ptr(handle) as usize
            }
            Deferred::Split { parent, .. } => Arc::as_ptr(parent) as usize,
        }
    }

    /// Settles handles still waiting on this work (the group failed before it ran).
    fn cancel(self, why: &str) {
        match self {
            Deferred::Init { handle, .. } | Deferred::Split { child: Some(handle), .. } => {
                handle.finish_start(Err(usage(format!("not created: {why}"))))
            }
            _ => {}
        }
    }
}

#[derive(Default)]
struct GroupState {
    depth: usize,
    work: Vec<Deferred>,
    /// The first call of the group that failed when it was made.
    failed: Option<String>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// Whether calls on this thread are being grouped.
pub fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Queues work for the group's end.
pub fn push(work: Deferred) {
    GROUP.with(|g| g.borrow_mut().work.push(work));
}

/// Remembers that a call of the open group failed: the group's end reports it and runs nothing.
pub fn poison(why: &str) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.failed.is_none() {
            g.failed = Some(why.to_string());
        }
    });
}

/// Ends a group level; the outermost runs everything queued.
pub fn end() -> Result<()> {
    let (work, failed) = take_level()?;
    if let Some(why) = failed {
        let msg = format!("a call in the group failed, so nothing in it ran ({why})");
        work.into_iter().for_each(|w| w.cancel(&msg));
        return Err(usage(msg));
    }
    run(work)
}

/// Ends a group level as [`end`] does, but returns once the outermost level's calls are queued
/// (inits and splits in it have run): their works, by communicator, to wait for.
pub fn end_async() -> Result<Queued> {
    let (work, failed) = take_level()?;
    if let Some(why) = failed {
        let msg = format!("a call in the group failed, so nothing in it ran ({why})");
        work.into_iter().for_each(|w| w.cancel(&msg));
        return Err(usage(msg));
    }
    let (pending, first_error) = submit(work);
    match first_error {
        None => Ok(pending),
        Some(e) => {
            // Whatever was queued runs on; its failure is what the caller sees.
            for (handle, works) in pending {
                for w in works {
                    let _ = call::finish(&handle, &w);
                }
            }
            Err(e)
        }
    }
}

/// Ends a group level without running anything (`ncclGroupSimulateEnd`): the simulated time,
/// in microseconds, of the collectives queued in it, one after another as a communicator
/// runs them (point-to-point transfers add nothing to the estimate). Inits and splits in it
/// are not made.
pub fn simulate_end() -> Result<f64> {
    let (work, failed) = take_level()?;
    if let Some(why) = failed {
        work.into_iter().for_each(|w| w.cancel(&why));
        return Err(usage(format!("a call in the group failed ({why})")));
    }
    let mut total = 0.0;
    for w in work {
        match w {
            Deferred::Collective { handle, call } => total += handle.with_comm(|c| Ok(c.estimate_us(&call.call)?))?,
            other => other.cancel("the group was only simulated (ncclGroupSimulateEnd)"),
        }
    }
    Ok(total)
}

/// Leaves one group level: the outermost level's work and the first failure in it.
fn take_level() -> Result<(Vec<Deferred>, Option<String>)> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(usage("ncclGroupEnd without a matching ncclGroupStart"));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok((Vec::new(), None));
        }
        Ok((std::mem::take(&mut g.work), g.failed.take()))
    })
}

fn run(work: Vec<Deferred>) -> Result<()> {
    let (pending, mut first_error) = submit(work);
    for (handle, works) in pending {
        for w in works {
            if let Err(e) = call::finish(&handle, &w) {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Runs a group's inits and splits, then queues every communicator's calls: the queued works
/// by communicator, and the first error met.
fn submit(work: Vec<Deferred>) -> (Queued, Option<Error>) {
    let mut lanes: Vec<(usize, Vec<Deferred>)> = Vec::new();
    for w in work {
        let lane = w.lane();
        match lanes.iter_mut().find(|(l, _)| *l == lane) {
            Some((_, list)) => list.push(w),
            None => lanes.push((lane, vec![w])),
        }
    }
    let mut first_error: Option<Error> = None;
    let mut note = |r: Result<()>| {
        if let Err(e) = r {
            first_error.get_or_insert(e);
        }
    };
    // Inits and splits, concurrently across communicators.
    let (starts, calls): (Vec<Vec<Deferred>>, Vec<Vec<Deferred>>) = lanes
        .into_iter()
        .map(|(_, w)| w.into_iter().partition(|w| matches!(w, Deferred::Init { .. } | Deferred::Split { .. })))
        .unzip();
    let starts: Vec<Vec<Deferred>> = starts.into_iter().filter(|s| !s.is_empty()).collect();
    if starts.len() == 1 {
        starts.into_iter().for_each(|s| note(run_starts(s)));
    } else if !starts.is_empty() {
        let results: Vec<Result<()>> = std::thread::scope(|sc| {
            let running: Vec<_> = starts.into_iter().map(|s| sc.spawn(move || run_starts(s))).collect();
            running
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|_| Err(Error::Panic("a group's thread panicked".into()))))
                .collect()
        });
        results.into_iter().for_each(&mut note);
    }
    // Every communicator's calls queued. Several communicators' calls go in side by side, a
    // thread each, with the caller's CUDA context current: a device-resident call between
    // ranks on one device queues a wait only once its peer has queued the write releasing it
    // (topoccl's `exec::resident`), and the peer's calls are this same group's.
    let lanes: Vec<Vec<Deferred>> = calls.into_iter().filter(|c| !c.is_empty()).collect();
    let results: Vec<Result<(Arc<Handle>, Vec<topoccl::Work>)>> = if lanes.len() <= 1 {
        lanes.into_iter().map(submit_lane).collect()
    } else {
        let current = topoccl::cuda::Context::current().ok().flatten().map(|c| c as usize);
        std::thread::scope(|sc| {
            let running: Vec<_> = lanes
                .into_iter()
                .map(|lane| {
                    sc.spawn(move || {
                        // SAFETY: the context current on the group's thread, which stays alive
                        // while that thread waits here for this one.
                        let ctx = current.and_then(|raw| unsafe { topoccl::cuda::Context::borrowed(raw as _) }.ok());
                        let _entered = ctx.as_ref().and_then(|c| c.enter().ok());
                        submit_lane(lane)
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|_| Err(Error::Panic("a group's thread panicked".into()))))
                .collect()
        })
    };
    let mut pending = Vec::new();
    for r in results {
        match r {
            Ok(p) => pending.push(p),
            Err(e) => note(Err(e)),
        }
    }
    (pending, first_error)
}

/// One communicator's inits and splits, in call order.
fn run_starts(work: Vec<Deferred>) -> Result<()> {
    let mut first_error: Option<Error> = None;
    for w in work {
        let r = match w {
            Deferred::Init { handle, id, rank, nranks, config } => {
                match Communicator::init_with(&id, rank, nranks, *config).map_err(Error::from) {
                    Ok(comm) => {
                        handle.finish_start(Ok(comm));
                        Ok(())
                    }
                    Err(e) => {
                        handle.finish_start(Err(e.clone()));
                        Err(e)
                    }
                }
            }
            Deferred::Split { parent, child, color, key } => split(&parent, child, color, key),
            _ => Ok(()),
        };
        if let Err(e) = r {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Queues one communicator's sends and receives (one batch) and its collectives (in call
/// order); the handle and the queued works.
fn submit_lane(work: Vec<Deferred>) -> Result<(Arc<Handle>, Vec<topoccl::Work>)> {
    let mut transfers: Vec<TransferArgs> = Vec::new();
    let mut collectives = Vec::new();
    let mut handle: Option<Arc<Handle>> = None;
    for w in work {
        match w {
            Deferred::Transfer { handle: h, transfer } => {
                transfers.push(transfer);
                handle = Some(h);
            }
            Deferred::Collective { handle: h, call } => {
                collectives.push(call);
                handle = Some(h);
            }
            Deferred::Init { .. } | Deferred::Split { .. } => {}
        }
    }
    let handle = handle.ok_or_else(|| Error::Panic("a group lane without a communicator".into()))?;
    let works = call::submit_all(&handle, &transfers, &collectives)?;
    Ok((handle, works))
}

/// Runs a split on `parent`; the new communicator settles `child`.
pub fn split(parent: &Handle, child: Option<Arc<Handle>>, color: Option<u32>, key: i32) -> Result<()> {
    let made = parent.with_comm(|c| c.split(color, key).map_err(Error::from));
    match (made, child) {
        (Ok(Some(comm)), Some(h)) => {
            h.finish_start(Ok(comm));
            Ok(())
        }
        (Ok(_), None) => Ok(()),
        (Ok(None), Some(h)) => {
            let e = usage("the split gave this rank no communicator");
            h.finish_start(Err(e.clone()));
            Err(e)
        }
        (Err(e), child) => {
            if let Some(h) = child {
                h.finish_start(Err(Error::with_code(e.code(), format!("the split failed: {e}"))));
            }
            Err(e)
        }
    }
}

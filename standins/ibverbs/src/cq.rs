//! Completion queues. A CQ holds exactly the `cqe` completions it was created with; one more is
//! an overflow, which is fatal as on hardware: the CQ is in error from then on (`poll_cq`
//! answers a negative value), every QP using it goes to the error state, and a line on
//! standard error says so.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::device::{Ctx, MAX_CQE};
use crate::registry::{self, reg_mut};
use crate::sys::*;
use crate::util::{lock, Public};
use crate::{engine, qp::Qp};

/// One completion and the work-queue slot its polling frees.
pub struct Entry {
    pub wc: ibv_wc,
    pub qp: Weak<Qp>,
    /// Send queue (else receive queue).
    pub send: bool,
    /// The work request's sequence number in its queue: polling frees the slots of it and of
    /// every earlier request of that queue.
    pub seq: u64,
}

struct CqInner {
    entries: VecDeque<Entry>,
    broken: bool,
}

pub struct Cq {
    public: Public<ibv_cq>,
    pub ctx: Arc<Ctx>,
    pub id: u32,
    pub cap: usize,
    /// QPs using it.
    pub users: AtomicUsize,
    inner: Mutex<CqInner>,
}

impl Cq {
    pub fn ptr(&self) -> *mut ibv_cq {
        self.public.ptr()
    }

    /// Adds a completion; on overflow the CQ breaks (and its QPs are sent to the error state by
    /// the engine thread, which holds no other lock then).
    pub fn push(self: &Arc<Self>, e: Entry) {
        let mut g = lock(&self.inner);
        if g.broken {
            return;
        }
        if g.entries.len() >= self.cap {
            g.broken = true;
            g.entries.clear();
            drop(g);
            eprintln!(
                "topoccl ibverbs stand-in: CQ overrun: completion queue {} (cqe {}) is full and a completion \
                 arrived; the CQ is in error and its QPs go to the error state",
                self.id, self.cap
            );
            engine::defer(engine::Task::CqBroken(self.clone()));
            return;
        }
        g.entries.push_back(e);
    }

    /// Takes up to `max` completions; `None` once the CQ is in error.
    pub fn take(&self, max: usize) -> Option<Vec<Entry>> {
        let mut g = lock(&self.inner);
        if g.broken {
            return None;
        }
        let n = max.min(g.entries.len());
        Some(g.entries.drain(..n).collect())
    }

    pub fn is_broken(&self) -> bool {
        lock(&self.inner).broken
    }

    /// Drops the completions of a QP being reset or destroyed (as rdma-core's providers clean
    /// the CQ then).
    pub fn purge(&self, qp: &Qp) {
        lock(&self.inner).entries.retain(|e| !std::ptr::eq(e.qp.as_ptr(), qp));
    }
}

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

pub fn create_cq(
    ctx_ptr: *const ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut ibv_cq, c_int> {
    let ctx = registry::ctx(ctx_ptr).ok_or(libc::EINVAL)?;
    // Completion channels are not emulated: no `ibv_create_comp_channel` hands one out.
    if !(1..=MAX_CQE).contains(&cqe) || !channel.is_null() || comp_vector != 0 {
        return Err(libc::EINVAL);
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let public = ibv_cq {
        context: ctx.ptr(),
        channel,
        cq_context,
        handle: id,
        cqe,
        mutex: [0; 5],
        cond: [0; 6],
        comp_events_completed: 0,
        async_events_completed: 0,
    };
    ctx.children.fetch_add(1, Ordering::Relaxed);
    let cq = Arc::new(Cq {
        public: Public::new(public),
        ctx,
        id,
        cap: cqe as usize,
        users: AtomicUsize::new(0),
        inner: Mutex::new(CqInner { entries: VecDeque::new(), broken: false }),
    });
    let p = cq.ptr();
    reg_mut().cqs.insert(registry::key(p), cq);
    Ok(p)
}

pub fn destroy_cq(p: *const ibv_cq) -> c_int {
    let mut reg = reg_mut();
    let Some(cq) = reg.cqs.get(&registry::key(p)) else { return libc::EINVAL };
    if cq.users.load(Ordering::Relaxed) > 0 {
        return libc::EBUSY;
    }
    if let Some(cq) = reg.cqs.remove(&registry::key(p)) {
        cq.ctx.children.fetch_sub(1, Ordering::Relaxed);
    }
    0
}

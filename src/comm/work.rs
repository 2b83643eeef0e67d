//! Asynchronous calls: a communicator's work queue, its progress thread, and [`Work`], the
//! handle every queued call returns.
//!
//! Calls are checked and planned on the caller's thread, in call order, and queued; one
//! executor runs them strictly in that order. Who runs them:
//!
//! - The communicator's **progress thread** (NCCL's proxy thread, Gloo's work queue) runs
//!   whatever is queued while no caller waits, so a call that returned a [`Work`] completes
//!   without the caller's help (the shape `ncclAllReduce(..., stream)` and PyTorch's work
//!   objects need).
//! - A caller that **waits** runs queued work itself when nothing is running (MPI-style
//!   progress by the waiting thread): a blocking call is submit-then-wait, and on an idle
//!   communicator it runs on the caller's thread with no hand-over to another thread. A
//!   hand-over costs a futex wake and a context switch per call, more than a small
//!   shared-memory all-reduce takes, and the waiting thread would only sleep meanwhile (the
//!   README has the figures).
//!
//! Either way one runner at a time holds the executor, so calls never overlap or reorder.
//!
//! Failure: a call that fails in the executor (a peer gone, a timeout, a mismatch) breaks the
//! communicator: its connections close, so peers fail promptly too, and queued and later calls
//! fail with [`Error::Broken`]. [`AbortHandle::abort`](super::AbortHandle) fails the running
//! call within milliseconds and every queued one at once. Waiting has no deadline of its own
//! but never hangs: the executor's `TOPOCCL_TIMEOUT` and abort end every running call.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::agree::Refine;
use crate::error::{Error, Result};
use crate::exec::job::Job;
use crate::exec::Executor;

/// A job as the communicator queues it: what the executor runs, and the communicator's part
/// around it (a collective's place in switching sizes to the tuner's background decisions,
/// [`super::agree`]).
pub(crate) struct Task {
    pub job: Job,
    pub refine: Option<Box<Refine>>,
}

impl From<Job> for Task {
    fn from(job: Job) -> Task {
        Task { job, refine: None }
    }
}

/// A job and where its result goes.
struct Queued {
    task: Task,
    state: Arc<WorkState>,
}

/// How a piece of work ended, once it has.
#[derive(Default)]
struct WorkState {
    done: AtomicBool,
    result: Mutex<Option<Result<()>>>,
}

impl WorkState {
    fn finish(&self, r: Result<()>) {
        *lock(&self.result) = Some(r);
        self.done.store(true, Ordering::SeqCst);
    }

    fn outcome(&self) -> Option<Result<()>> {
        if !self.done.load(Ordering::Acquire) {
            return None;
        }
        Some(match &*lock(&self.result) {
            Some(Ok(())) | None => Ok(()),
            Some(Err(e)) => Err(e.duplicate()),
        })
    }
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Queued>,
    /// The communicator is going away: the progress thread ends once the queue is empty.
    closing: bool,
    /// Why the communicator cannot run anything any more.
    broken: Option<Error>,
    /// That error, when the job it ended was one nobody waits for (an agreement of the tuner's,
    /// `super::agree`): the next call fails with it whole (naming the rank at fault), as the
    /// failed call itself would have.
    unseen: Option<Error>,
    /// Whether the progress thread sleeps on `work_ready`.
    progress_asleep: bool,
}

/// What callers and the progress thread share.
///
/// One thread at a time runs jobs: the one that set `running`. The hot path — a blocking call
/// on an idle communicator — claims `running` with one compare-and-swap and lets it go with one
/// store, touching the queue's lock only when someone needs telling: `attention` counts the
/// queued jobs and the threads asleep on `progressed`. A party that starts to wait raises
/// `attention` and then looks at what it waits for; a runner changes what it looks at and then
/// reads `attention`. Both sides use sequentially consistent operations, so at least one sees
/// the other (Dekker): no wake-up is lost.
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    running: AtomicBool,
    attention: AtomicU32,
    /// Signalled when work is queued for the progress thread, or it should end.
    work_ready: Condvar,
    /// Signalled when a job finishes or the executor is free again.
    progressed: Condvar,
    /// Used only by the thread that holds `running` (see [`Shared::executor`]).
    exec: UnsafeCell<Executor>,
    pub abort: Arc<AtomicBool>,
    /// Set once `Queue::broken` is, for a check without the queue's lock.
    is_broken: AtomicBool,
}

// SAFETY: every field but `exec` is Sync by itself; `exec` is only touched through
// `Shared::executor`, by the one thread that holds `running` (a compare-and-swap hands it out to
// one thread at a time), so the executor is never used from two threads at once. `Executor` is
// Send, which is what moving its use between threads needs.
unsafe impl Sync for Shared {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent (every critical section
    // is a few assignments), so a poisoned lock is used as it is.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(crate) fn new(exec: Executor) -> Arc<Shared> {
        let abort = exec.abort.clone();
        Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            running: AtomicBool::new(false),
            attention: AtomicU32::new(0),
            work_ready: Condvar::new(),
            progressed: Condvar::new(),
            exec: UnsafeCell::new(exec),
            abort,
            is_broken: AtomicBool::new(false),
        })
    }

    /// Claims the executor's turn if nobody holds it.
    fn claim(&self) -> bool {
        self.running.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// Sleeps on `progressed` until woken (or `timeout` passes), unless `ready` already holds
    /// once this thread is counted as waiting.
    fn sleep<'q>(
        &self,
        q: MutexGuard<'q, Queue>,
        timeout: Option<Duration>,
        ready: impl Fn() -> bool,
    ) -> MutexGuard<'q, Queue> {
        self.attention.fetch_add(1, Ordering::SeqCst);
        let q = if ready() {
            q
        } else {
            match timeout {
                None => self.progressed.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(t) => self.progressed.wait_timeout(q, t).unwrap_or_else(|p| p.into_inner()).0,
            }
        };
        self.attention.fetch_sub(1, Ordering::SeqCst);
        q
    }

    /// Wakes whoever waits for progress, and the progress thread when there is work it could
    /// take.
    fn wake(&self, q: &Queue) {
        if q.progress_asleep && (!q.jobs.is_empty() || q.closing) && !self.running.load(Ordering::SeqCst) {
            self.work_ready.notify_one();
        }
        self.progressed.notify_all();
    }

    /// Why nothing can run, if so.
    pub(crate) fn unusable(&self) -> Option<Error> {
        if self.is_broken.load(Ordering::Acquire) {
            let mut q = lock(&self.queue);
            if let Some(e) = q.unseen.take() {
                return Some(e);
            }
            if let Some(why) = &q.broken {
                return Some(Error::Broken(why.to_string()));
            }
        }
        self.abort.load(Ordering::Relaxed).then_some(Error::Aborted)
    }

    /// Runs `f` on the executor with nothing running (waits for the running job to end).
    pub(crate) fn with_executor<R>(&self, f: impl FnOnce(&mut Executor) -> R) -> R {
        let mut q = lock(&self.queue);
        while !self.claim() {
            q = self.sleep(q, None, || !self.running.load(Ordering::SeqCst));
        }
        drop(q);
        // SAFETY: this thread holds `running` (claimed above) until `release` below.
        let r = f(unsafe { self.executor() });
        self.release();
        r
    }

    /// Queues `job` for the progress thread; its handle.
    pub(crate) fn submit(self: &Arc<Shared>, task: Task) -> Work {
        let state = Arc::new(WorkState::default());
        let mut q = lock(&self.queue);
        q.jobs.push_back(Queued { task, state: state.clone() });
        self.attention.fetch_add(1, Ordering::SeqCst);
        if !self.running.load(Ordering::SeqCst) {
            self.wake(&q);
        }
        Work { state, shared: self.clone() }
    }

    /// Runs a blocking call's `job`, admitted in call order while the caller holds `order`
    /// (the lock that orders its calls, let go here): on this thread when nothing is queued or
    /// running, the job never moved, else queued behind the others and waited for.
    pub(crate) fn run_blocking<G>(self: &Arc<Shared>, order: G, mut task: Task) -> Result<()> {
        if self.claim_idle() {
            drop(order);
            let r = self.run_job(&mut task);
            self.release();
            return r;
        }
        let work = self.submit(task);
        drop(order);
        work.wait()
    }

    /// Gives the executor's turn up: the progress thread takes what is queued, waiters look
    /// again (the queue's lock only when someone needs telling).
    fn release(&self) {
        self.running.store(false, Ordering::SeqCst);
        if self.attention.load(Ordering::SeqCst) > 0 {
            self.wake(&lock(&self.queue));
        }
    }

    /// Claims the executor for a blocking call admitted under the lock that orders calls, if
    /// nothing is queued or running.
    fn claim_idle(&self) -> bool {
        // Nothing queued (submissions hold the caller's lock, so none can be added meanwhile)
        // and nobody running: this call is next.
        if self.attention.load(Ordering::SeqCst) == 0 && self.claim() {
            if self.attention.load(Ordering::SeqCst) == 0 {
                return true;
            }
            // Someone started waiting meanwhile: take the common path.
            self.release();
        }
        false
    }

    /// The executor.
    ///
    /// # Safety
    /// The calling thread must hold `running` (have claimed it and not released it), and use
    /// the reference only until it releases it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn executor(&self) -> &mut Executor {
        // SAFETY: `running` is held by one thread at a time, and only that thread calls this
        // (this fn's contract), so no other reference to the executor exists meanwhile.
        unsafe { &mut *self.exec.get() }
    }

    /// Runs `job` with `running` already set (without releasing it).
    fn run_job(&self, task: &mut Task) -> Result<()> {
        debug_assert!(self.running.load(Ordering::Relaxed), "a job run without the executor's turn");
        // SAFETY: every caller holds `running` (claimed by `claim_idle` or `take`) and
        // releases it only after this returns.
        let exec = unsafe { self.executor() };
        if let Some(e) = self.unusable() {
            task.job.release();
            return Err(e);
        }
        if let (Job::Collective(c), Some(refine)) = (&mut task.job, task.refine.as_deref_mut()) {
            if !super::agree::before_run(refine, c, exec.rank) {
                return Ok(());
            }
        }
        if let Some(b) = &exec.board {
            b.begin(match &task.job {
                Job::Collective(c) => Some(&c.header),
                Job::Transfers(_) => None,
            });
        }
        // SAFETY: the job's regions are the submitter's buffers, valid until the job completes:
        // the promise every submission path makes (the safe APIs wait before their borrows end;
        // the raw ones are `unsafe fn`s that pass the promise to their callers).
        let r = unsafe { exec.run(&task.job) };
        if let (Ok(()), Some(refine)) = (&r, task.refine.as_deref()) {
            super::agree::after_run(refine);
        }
        let e = match r {
            Err(e) if !matches!(e, Error::InvalidArgument(_)) => e,
            r => {
                if let Some(b) = &exec.board {
                    b.end(None);
                }
                return r;
            }
        };
        // The ranks are out of step. Find out why (asking the peers, before they see this
        // rank's connections close), then close them so the peers learn at once, and refuse
        // what follows.
        let e = match &exec.board {
            Some(b) => {
                b.end(Some(&e));
                crate::diag::explain(b, e)
            }
            None => e,
        };
        exec.close_links();
        let mut q = lock(&self.queue);
        if q.broken.is_none() {
            q.broken = Some(e.duplicate());
            if super::agree::unwaited(task) {
                q.unseen = Some(e.duplicate());
            }
        }
        drop(q);
        self.is_broken.store(true, Ordering::Release);
        Err(e)
    }

    /// Runs a queued job with `running` already set; records its result and releases the
    /// executor.
    fn execute(&self, mut item: Queued) {
        let result = self.run_job(&mut item.task);
        item.state.finish(result);
        self.release();
    }

    /// Takes the next queued job, claiming the executor's turn; none if the queue is empty or
    /// someone runs.
    fn take(&self, q: &mut Queue) -> Option<Queued> {
        if q.jobs.is_empty() || !self.claim() {
            return None;
        }
        let item = q.jobs.pop_front();
        self.attention.fetch_sub(1, Ordering::SeqCst);
        item
    }

    /// The progress thread: runs queued work until the communicator closes.
    pub(crate) fn progress_loop(&self) {
        loop {
            let mut q = lock(&self.queue);
            let item = loop {
                if let Some(item) = self.take(&mut q) {
                    break Some(item);
                }
                if q.closing && q.jobs.is_empty() && !self.running.load(Ordering::SeqCst) {
                    break None;
                }
                q.progress_asleep = true;
                q = self.work_ready.wait(q).unwrap_or_else(|p| p.into_inner());
                q.progress_asleep = false;
            };
            drop(q);
            match item {
                Some(item) => self.execute(item),
                None => return,
            }
        }
    }

    /// Asks the progress thread to end once the queue is empty and nothing runs. From now on
    /// every runner takes the slow path when it lets go (`attention` stays raised), so the
    /// progress thread learns when a job another thread was running ends.
    pub(crate) fn close(&self) {
        let mut q = lock(&self.queue);
        if !q.closing {
            q.closing = true;
            self.attention.fetch_add(1, Ordering::SeqCst);
        }
        drop(q);
        self.work_ready.notify_all();
    }

    /// Whether anything is queued or running.
    pub(crate) fn busy(&self) -> bool {
        let q = lock(&self.queue);
        self.running.load(Ordering::SeqCst) || !q.jobs.is_empty()
    }

    /// Waits until nothing is queued or running, running queued work meanwhile when nobody
    /// else does.
    pub(crate) fn flush(&self) {
        loop {
            let mut q = lock(&self.queue);
            if let Some(item) = self.take(&mut q) {
                drop(q);
                self.execute(item);
                continue;
            }
            if q.jobs.is_empty() && !self.running.load(Ordering::SeqCst) {
                return;
            }
            drop(self.sleep(q, None, || !self.running.load(Ordering::SeqCst)));
        }
    }

    /// The error that broke the communicator, if one did.
    pub(crate) fn broken(&self) -> Option<String> {
        lock(&self.queue).broken.as_ref().map(Error::to_string)
    }

    /// The error that broke the communicator, if one did.
    pub(crate) fn failure(&self) -> Option<Error> {
        if !self.is_broken.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.queue).broken.as_ref().map(Error::duplicate)
    }

    /// Fails every queued job with `why` (an abort), without running it.
    pub(crate) fn drain(&self, why: impl Fn() -> Error) {
        let mut q = lock(&self.queue);
        let jobs: Vec<Queued> = q.jobs.drain(..).collect();
        self.attention.fetch_sub(jobs.len() as u32, Ordering::SeqCst);
        for item in jobs {
            item.task.job.release();
            item.state.finish(Err(why()));
        }
        self.wake(&q);
    }
}

/// A queued call: wait for it, test it, or read its error. Dropping it does not cancel the
/// call (it still runs, in order).
pub struct Work {
    state: Arc<WorkState>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work").field("done", &self.state.done.load(Ordering::Relaxed)).finish_non_exhaustive()
    }
}

impl Work {
    /// A handle of a call that is already done (an empty call).
    pub(crate) fn done(shared: &Arc<Shared>) -> Work {
        let state = WorkState::default();
        state.finish(Ok(()));
        Work { state: Arc::new(state), shared: shared.clone() }
    }

    /// Whether the call has completed: `Ok(false)` while it is queued or running, `Ok(true)`
    /// once it succeeded, its error once it failed.
    pub fn test(&self) -> Result<bool> {
        match self.state.outcome() {
            None => Ok(false),
            Some(r) => r.map(|()| true),
        }
    }

    /// The call's error, if it has failed (`None` while it runs or once it succeeded).
    pub fn error(&self) -> Option<Error> {
        self.state.outcome().and_then(Result::err)
    }

    /// Waits until the call completes (running queued work on this thread meanwhile when no
    /// one else does); its result.
    pub fn wait(&self) -> Result<()> {
        self.wait_until(None).unwrap_or(Ok(()))
    }

    /// As [`Work::wait`], for at most `timeout`: `None` if the call is still queued or running
    /// then (it goes on; wait again, or abort the communicator).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<()>> {
        self.wait_until(Some(Instant::now() + timeout))
    }

    fn wait_until(&self, deadline: Option<Instant>) -> Option<Result<()>> {
        let shared = &self.shared;
        loop {
            if let Some(r) = self.state.outcome() {
                return Some(r);
            }
            let mut q = lock(&shared.queue);
            if self.state.done.load(Ordering::SeqCst) {
                continue;
            }
            // Help: run the oldest queued job while nobody else runs one (it is ours, or one
            // that must run before ours).
            if deadline.is_none() {
                if let Some(item) = shared.take(&mut q) {
                    drop(q);
                    shared.execute(item);
                    continue;
                }
            }
            let done = || self.state.done.load(Ordering::SeqCst);
            match deadline {
                // Woken when a job finishes: ours, or one before it, which frees the executor
                // for this thread to help.
                None => drop(shared.sleep(q, None, || done() || !shared.running.load(Ordering::SeqCst))),
                // Without helping (a job run here could outlast the deadline): ours only.
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    drop(shared.sleep(q, Some(left), done));
                }
            }
        }
    }
}

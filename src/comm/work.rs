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
//!   communicator it runs on the caller's thread with no hand-over to another thread. On a
//!   2-core machine a hand-over costs a futex wake and a context switch per call, several
//!   microseconds against a 2-rank shared-memory all-reduce of about one microsecond, and the
//!   waiting thread would only sleep meanwhile.
//!
//! Either way one runner at a time holds the executor, so calls never overlap or reorder.
//!
//! Failure: a call that fails in the executor (a peer gone, a timeout, a mismatch) breaks the
//! communicator: its connections close, so peers fail promptly too, and queued and later calls
//! fail with [`Error::Broken`]. [`AbortHandle::abort`](super::AbortHandle) fails the running
//! call within milliseconds and every queued one at once. Waiting has no deadline of its own
//! but never hangs: the executor's `TOPOCCL_TIMEOUT` and abort end every running call.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::exec::job::{CollectiveJob, TransferJob};
use crate::exec::Executor;

/// What the executor runs.
pub(crate) enum Job {
    Collective(CollectiveJob),
    Transfers(TransferJob),
}

/// A job and where its result goes.
struct Queued {
    job: Job,
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
        self.done.store(true, Ordering::Release);
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
    /// Some thread holds the executor and runs a job.
    running: bool,
    /// The communicator is going away: the progress thread ends once the queue is empty.
    closing: bool,
    /// Why the communicator cannot run anything any more.
    broken: Option<String>,
    /// Threads asleep on `progressed`, and whether the progress thread sleeps on
    /// `work_ready`: a condition variable's notify is a system call even when nobody waits,
    /// so the hot path (a blocking call on an idle communicator) notifies only sleepers.
    waiters: u32,
    progress_asleep: bool,
}

/// What callers and the progress thread share.
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when work is queued for the progress thread, or it should end.
    work_ready: Condvar,
    /// Signalled when a job finishes or the executor is free again.
    progressed: Condvar,
    /// Held by whoever runs a job (uncontended: only the holder of `running` takes it).
    exec: Mutex<Executor>,
    pub abort: Arc<AtomicBool>,
    /// Set once `Queue::broken` is, for a check without the queue's lock.
    is_broken: AtomicBool,
}

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
            work_ready: Condvar::new(),
            progressed: Condvar::new(),
            exec: Mutex::new(exec),
            abort,
            is_broken: AtomicBool::new(false),
        })
    }

    /// Sleeps on `progressed` (counted, so that wakers know someone sleeps).
    fn sleep<'q>(&self, mut q: MutexGuard<'q, Queue>, timeout: Option<Duration>) -> MutexGuard<'q, Queue> {
        q.waiters += 1;
        let mut q = match timeout {
            None => self.progressed.wait(q).unwrap_or_else(|p| p.into_inner()),
            Some(t) => self.progressed.wait_timeout(q, t).unwrap_or_else(|p| p.into_inner()).0,
        };
        q.waiters -= 1;
        q
    }

    /// Wakes whoever waits for progress, and the progress thread when it has work.
    fn wake(&self, q: &Queue) {
        if q.progress_asleep && (!q.jobs.is_empty() || q.closing) && !q.running {
            self.work_ready.notify_one();
        }
        if q.waiters > 0 {
            self.progressed.notify_all();
        }
    }

    /// Why nothing can run, if so.
    pub(crate) fn unusable(&self) -> Option<Error> {
        if self.is_broken.load(Ordering::Acquire) {
            if let Some(why) = &lock(&self.queue).broken {
                return Some(Error::Broken(why.clone()));
            }
        }
        self.abort.load(Ordering::Relaxed).then_some(Error::Aborted)
    }

    /// Runs `f` on the executor with nothing running (waits for the running job to end).
    pub(crate) fn with_executor<R>(&self, f: impl FnOnce(&mut Executor) -> R) -> R {
        let mut q = lock(&self.queue);
        while q.running {
            q = self.sleep(q, None);
        }
        q.running = true;
        drop(q);
        let r = f(&mut lock(&self.exec));
        self.release();
        r
    }

    /// Queues `job` for the progress thread; its handle.
    fn submit(self: &Arc<Shared>, job: Job) -> Work {
        let state = Arc::new(WorkState::default());
        let mut q = lock(&self.queue);
        q.jobs.push_back(Queued { job, state: state.clone() });
        self.wake(&q);
        Work { state, shared: self.clone() }
    }

    /// Admits `job` in call order (the caller holds the lock that orders its calls): queued,
    /// or, for a blocking call on an idle communicator, claimed for the caller to run on its
    /// own thread once it has let go of that lock ([`Admitted::finish`]).
    pub(crate) fn admit(self: &Arc<Shared>, job: Job, blocking: bool) -> Admitted {
        let mut q = lock(&self.queue);
        if blocking && q.jobs.is_empty() && !q.running {
            q.running = true;
            return Admitted::Run(job);
        }
        drop(q);
        Admitted::Queued(self.submit(job))
    }

    /// Gives the executor up after a job: the progress thread takes what is queued, waiters
    /// look again.
    fn release(&self) {
        let mut q = lock(&self.queue);
        q.running = false;
        self.wake(&q);
    }

    /// Runs `job` with `running` already set (without releasing it).
    fn run_job(&self, job: &Job) -> Result<()> {
        let mut exec = lock(&self.exec);
        if let Some(e) = self.unusable() {
            return Err(e);
        }
        // SAFETY: the job's regions are the submitter's buffers, valid until the job completes:
        // the promise every submission path makes (the safe APIs wait before their borrows end;
        // the raw ones are `unsafe fn`s that pass the promise to their callers).
        let r = unsafe {
            match job {
                Job::Collective(c) => exec.run_collective(c),
                Job::Transfers(t) => exec.run_transfers(t),
            }
        };
        if let Err(e) = &r {
            if !matches!(e, Error::InvalidArgument(_)) {
                // The ranks are out of step: close the connections so the peers learn at once,
                // and refuse what follows.
                exec.close_links();
                lock(&self.queue).broken.get_or_insert_with(|| e.to_string());
                self.is_broken.store(true, Ordering::Release);
            }
        }
        r
    }

    /// Runs a queued job with `running` already set; records its result and releases the
    /// executor.
    fn execute(&self, item: Queued) {
        let result = self.run_job(&item.job);
        item.state.finish(result);
        self.release();
    }

    /// Takes the next job if nothing runs: the caller must `execute` it.
    fn take(&self, q: &mut Queue) -> Option<Queued> {
        if q.running {
            return None;
        }
        let item = q.jobs.pop_front()?;
        q.running = true;
        Some(item)
    }

    /// The progress thread: runs queued work until the communicator closes.
    pub(crate) fn progress_loop(&self) {
        loop {
            let mut q = lock(&self.queue);
            let item = loop {
                if let Some(item) = self.take(&mut q) {
                    break Some(item);
                }
                if q.closing && q.jobs.is_empty() && !q.running {
                    break None;
                }
                q.progress_asleep = true;
                q = self.work_ready.wait(q).unwrap_or_else(|p| p.into_inner());
                q.progress_asleep = false;
            };
            drop(q);
            match item {
                Some(item) => {
                    self.execute(item);
                }
                None => return,
            }
        }
    }

    /// Asks the progress thread to end once the queue is empty.
    pub(crate) fn close(&self) {
        let mut q = lock(&self.queue);
        q.closing = true;
        drop(q);
        self.work_ready.notify_all();
    }

    /// Whether anything is queued or running.
    pub(crate) fn busy(&self) -> bool {
        let q = lock(&self.queue);
        q.running || !q.jobs.is_empty()
    }

    /// Waits until nothing is queued or running.
    pub(crate) fn flush(&self) {
        let mut q = lock(&self.queue);
        while q.running || !q.jobs.is_empty() {
            q = self.sleep(q, None);
        }
    }

    /// The error that broke the communicator, if one did.
    pub(crate) fn broken(&self) -> Option<String> {
        lock(&self.queue).broken.clone()
    }

    /// Fails every queued job with `why` (an abort), without running it.
    pub(crate) fn drain(&self, why: impl Fn() -> Error) {
        let jobs: Vec<Queued> = lock(&self.queue).jobs.drain(..).collect();
        for item in jobs {
            item.state.finish(Err(why()));
        }
        self.wake(&lock(&self.queue));
    }
}

/// A call admitted to the queue, or to be run by the caller.
pub(crate) enum Admitted {
    /// The caller holds the executor's turn and runs the job itself.
    Run(Job),
    Queued(Work),
}

impl Admitted {
    /// Runs or waits for the call; its result.
    pub(crate) fn finish(self, shared: &Shared) -> Result<()> {
        match self {
            Admitted::Run(job) => {
                let r = shared.run_job(&job);
                shared.release();
                r
            }
            Admitted::Queued(work) => work.wait(),
        }
    }

    /// The handle of a queued call (a claimed one runs now and comes back done).
    pub(crate) fn into_work(self, shared: &Arc<Shared>) -> Work {
        match self {
            Admitted::Queued(work) => work,
            Admitted::Run(job) => {
                let state = Arc::new(WorkState::default());
                state.finish(shared.run_job(&job));
                shared.release();
                Work { state, shared: shared.clone() }
            }
        }
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
            if self.state.done.load(Ordering::Acquire) {
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
            match deadline {
                None => drop(shared.sleep(q, None)),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    drop(shared.sleep(q, Some(left)));
                }
            }
        }
    }
}

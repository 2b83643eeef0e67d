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

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
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
    /// An agreement that runs just before this job, by whoever runs it: queued with the call
    /// it precedes, it costs no hand-over of its own to the progress thread.
    pub agreement: Option<Box<Task>>,
}

impl From<Job> for Task {
    fn from(job: Job) -> Task {
        Task { job, refine: None, agreement: None }
    }
}

/// A job and where its result goes.
struct Queued {
    task: Task,
    state: Arc<WorkState>,
}

/// What runs once a piece of work has ended (see [`Work::on_complete`]).
pub type Completion = Box<dyn FnOnce(&Result<()>) + Send>;

/// How a piece of work ended, once it has, and who wants to know.
#[derive(Default)]
struct WorkState {
    done: AtomicBool,
    result: Mutex<Outcome>,
}

#[derive(Default)]
struct Outcome {
    result: Option<Result<()>>,
    /// Registered while the work ran; taken by whoever finishes it.
    completions: Vec<Completion>,
}

/// Completions to run, with the result they are told: run by [`Finished::notify`] after the
/// finisher has let go of the executor and the queue (a completion may make calls and wait).
#[must_use = "completions must be run (Finished::notify)"]
struct Finished(Vec<Completion>, Result<()>);

impl Finished {
    fn notify(self) {
        let Finished(completions, result) = self;
        for c in completions {
            c(&result);
        }
    }
}

impl WorkState {
    fn finish(&self, r: Result<()>) -> Finished {
        let mut o = lock(&self.result);
        let completions = std::mem::take(&mut o.completions);
        let told = if completions.is_empty() { Ok(()) } else { r.clone() };
        o.result = Some(r);
        self.done.store(true, Ordering::SeqCst);
        Finished(completions, told)
    }

    fn outcome(&self) -> Option<Result<()>> {
        if !self.done.load(Ordering::Acquire) {
            return None;
        }
        Some(match &lock(&self.result).result {
            Some(Ok(())) | None => Ok(()),
            Some(Err(e)) => Err(e.clone()),
        })
    }

    /// Runs `c` when the work ends (at once, on this thread, if it has).
    fn on_complete(&self, c: Completion) {
        let mut o = lock(&self.result);
        match &o.result {
            None => o.completions.push(c),
            Some(r) => {
                let r = r.clone();
                drop(o);
                c(&r);
            }
        }
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

/// What runs jobs, shared by callers and the progress thread: the queue, the executor, and
/// whose turn it is to run.
///
/// One thread at a time runs jobs: the one holding the executor's lock, its [`Turn`], taken
/// with `try_lock` and never waited on. The hot path — a blocking call on an idle communicator
/// — takes it with one compare-and-swap and lets it go, touching the queue's lock only when
/// someone needs telling: `attention` counts the queued jobs and the threads asleep on
/// `progressed`. A party that starts to wait raises `attention` and then looks at what it waits
/// for (`running`, which says whether the lock is held: a lock cannot be asked); a runner
/// changes what it looks at and then reads `attention`. Both sides use sequentially consistent
/// operations, so at least one sees the other (Dekker): no wake-up is lost.
pub(crate) struct Runner {
    queue: Mutex<Queue>,
    /// The executor; holding its lock is the turn to run jobs.
    exec: Mutex<Executor>,
    /// Whether a [`Turn`] is out: set after the lock is taken, cleared before it is let go.
    running: AtomicBool,
    attention: AtomicU32,
    /// Signalled when work is queued for the progress thread, or it should end.
    work_ready: Condvar,
    /// Signalled when a job finishes or the executor is free again.
    progressed: Condvar,
    pub abort: Arc<AtomicBool>,
    /// Set once `Queue::broken` is, for a check without the queue's lock.
    is_broken: AtomicBool,
}

/// The turn to run jobs: the executor, held by one thread. Letting it go (dropping it, a panic
/// too) clears `running` before the lock and then wakes whoever needs telling.
struct Turn<'r> {
    runner: &'r Runner,
    exec: ManuallyDrop<MutexGuard<'r, Executor>>,
}

impl std::ops::Deref for Turn<'_> {
    type Target = Executor;
    fn deref(&self) -> &Executor {
        &self.exec
    }
}

impl std::ops::DerefMut for Turn<'_> {
    fn deref_mut(&mut self) -> &mut Executor {
        &mut self.exec
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.runner.running.store(false, Ordering::SeqCst);
        // SAFETY: dropped once, here, and never used after.
        unsafe { ManuallyDrop::drop(&mut self.exec) };
        if self.runner.attention.load(Ordering::SeqCst) > 0 {
            self.runner.wake(&lock(&self.runner.queue));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent (every critical section
    // is a few assignments), so a poisoned lock is used as it is.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Runner {
    pub(crate) fn new(exec: Executor) -> Arc<Runner> {
        let abort = exec.abort.clone();
        Arc::new(Runner {
            queue: Mutex::new(Queue::default()),
            exec: Mutex::new(exec),
            running: AtomicBool::new(false),
            attention: AtomicU32::new(0),
            work_ready: Condvar::new(),
            progressed: Condvar::new(),
            abort,
            is_broken: AtomicBool::new(false),
        })
    }

    /// Claims the executor's turn if nobody holds it.
    fn claim(&self) -> Option<Turn<'_>> {
        let exec = match self.exec.try_lock() {
            Ok(e) => e,
            // A job that panicked leaves the executor as a failed job does (its links may be
            // mid-message, and the next call's mismatch says so).
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        self.running.store(true, Ordering::SeqCst);
        Some(Turn { runner: self, exec: ManuallyDrop::new(exec) })
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
        let mut turn = loop {
            match self.claim() {
                Some(t) => break t,
                None => q = self.sleep(q, None, || !self.running.load(Ordering::SeqCst)),
            }
        };
        drop(q);
        f(&mut turn)
    }

    /// Queues `job` for the progress thread; its handle.
    pub(crate) fn submit(self: &Arc<Runner>, task: Task) -> Work {
        let state = Arc::new(WorkState::default());
        let mut q = lock(&self.queue);
        q.jobs.push_back(Queued { task, state: state.clone() });
        self.attention.fetch_add(1, Ordering::SeqCst);
        if !self.running.load(Ordering::SeqCst) {
            self.wake(&q);
        }
        Work { state, runner: self.clone() }
    }

    /// Runs a blocking call's `job`, admitted in call order while the caller holds `order`
    /// (the lock that orders its calls, let go here): on this thread when nothing is queued or
    /// running, the job never moved, else queued behind the others and waited for.
    pub(crate) fn run_blocking<G>(self: &Arc<Runner>, order: G, mut task: Task) -> Result<()> {
        if let Some(mut turn) = self.claim_idle() {
            drop(order);
            return self.run_job(&mut turn, &mut task);
        }
        let work = self.submit(task);
        drop(order);
        work.wait()
    }

    /// Claims the executor for a blocking call admitted under the lock that orders calls, if
    /// nothing is queued or running.
    fn claim_idle(&self) -> Option<Turn<'_>> {
        // Nothing queued (submissions hold the caller's lock, so none can be added meanwhile)
        // and nobody running: this call is next.
        if self.attention.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let turn = self.claim()?;
        // Someone started waiting meanwhile: let go, and take the common path.
        (self.attention.load(Ordering::SeqCst) == 0).then_some(turn)
    }

    /// Runs `task` on the executor `turn` holds, after the agreement it carries. An agreement
    /// that fails has no caller: the failure breaks the communicator and is kept for the next
    /// call ([`Queue::unseen`]), which is this task.
    fn run_job(&self, turn: &mut Turn<'_>, task: &mut Task) -> Result<()> {
        let _executor = crate::cuda::OnExecutor::enter();
        if let Some(mut agreement) = task.agreement.take() {
            let _ = self.run_one(turn, &mut agreement);
        }
        self.run_one(turn, task)
    }

    /// Runs one task's job on the executor `turn` holds.
    fn run_one(&self, turn: &mut Turn<'_>, task: &mut Task) -> Result<()> {
        let exec: &mut Executor = turn;
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
                Job::Resident(r) => Some(&r.header),
                Job::Staged(s) => Some(&s.header),
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
            q.broken = Some(e.clone());
            if super::agree::unwaited(task) {
                q.unseen = Some(e.clone());
            }
        }
        drop(q);
        self.is_broken.store(true, Ordering::Release);
        Err(e)
    }

    /// Runs a queued job on `turn`, records its result, lets the turn go (which wakes the
    /// waiters) and then runs the work's completions.
    fn execute(&self, (mut item, mut turn): (Queued, Turn<'_>)) {
        let result = self.run_job(&mut turn, &mut item.task);
        let finished = item.state.finish(result);
        drop(turn);
        finished.notify();
    }

    /// Takes the next queued job, claiming the executor's turn; none if the queue is empty or
    /// someone runs.
    /// (The caller holds the queue's lock, so no turn may be let go here: letting go may lock
    /// the queue.)
    fn take(&self, q: &mut Queue) -> Option<(Queued, Turn<'_>)> {
        let item = q.jobs.pop_front()?;
        match self.claim() {
            Some(turn) => {
                self.attention.fetch_sub(1, Ordering::SeqCst);
                Some((item, turn))
            }
            None => {
                q.jobs.push_front(item);
                None
            }
        }
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
        lock(&self.queue).broken.clone()
    }

    /// Fails every queued job with `why` (an abort), without running it.
    pub(crate) fn drain(&self, why: impl Fn() -> Error) {
        let mut q = lock(&self.queue);
        let jobs: Vec<Queued> = q.jobs.drain(..).collect();
        self.attention.fetch_sub(jobs.len() as u32, Ordering::SeqCst);
        let mut finished = Vec::with_capacity(jobs.len());
        for item in jobs {
            item.task.job.release();
            finished.push(item.state.finish(Err(why())));
        }
        self.wake(&q);
        drop(q);
        finished.into_iter().for_each(Finished::notify);
    }
}

/// A queued call: wait for it, test it, or read its error. Dropping it does not cancel the
/// call (it still runs, in order). Clones are handles of the same call.
#[derive(Clone)]
pub struct Work {
    state: Arc<WorkState>,
    runner: Arc<Runner>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work").field("done", &self.state.done.load(Ordering::Relaxed)).finish_non_exhaustive()
    }
}

impl Work {
    /// A handle of a call that is already done (an empty call).
    pub(crate) fn done(runner: &Arc<Runner>) -> Work {
        let state = WorkState::default();
        state.finish(Ok(())).notify();
        Work { state: Arc::new(state), runner: runner.clone() }
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

    /// Runs `completion` with the call's result once it has completed: on the thread that
    /// finished it (the progress thread, or a waiter that ran it), after that thread has let go
    /// of the executor, so a completion may make calls and wait for them; at once, on this
    /// thread, if the call has completed. Keep it short: later calls wait while it runs on
    /// the progress thread.
    pub fn on_complete(&self, completion: impl FnOnce(&Result<()>) + Send + 'static) {
        self.state.on_complete(Box::new(completion));
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
        let runner = &self.runner;
        loop {
            if let Some(r) = self.state.outcome() {
                return Some(r);
            }
            let mut q = lock(&runner.queue);
            if self.state.done.load(Ordering::SeqCst) {
                continue;
            }
            // Help: run the oldest queued job while nobody else runs one (it is ours, or one
            // that must run before ours).
            if deadline.is_none() {
                if let Some(item) = runner.take(&mut q) {
                    drop(q);
                    runner.execute(item);
                    continue;
                }
            }
            let done = || self.state.done.load(Ordering::SeqCst);
            match deadline {
                // Woken when a job finishes: ours, or one before it, which frees the executor
                // for this thread to help.
                None => drop(runner.sleep(q, None, || done() || !runner.running.load(Ordering::SeqCst))),
                // Without helping (a job run here could outlast the deadline): ours only.
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    drop(runner.sleep(q, Some(left), done));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Settings;

    fn runner() -> Arc<Runner> {
        let settings = Settings::new(1 << 19, 1 << 20, Duration::from_secs(5), false);
        Runner::new(Executor::new(0, vec![None], settings, Arc::new(AtomicBool::new(false))))
    }

    #[test]
    fn a_panic_on_the_executor_lets_the_turn_go() {
        let r = runner();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.with_executor(|_| panic!("a job panicked"));
        }));
        assert!(panicked.is_err());
        assert!(!r.busy(), "the turn is still out after the panic");
        // The next user of the executor gets it (before the turn was a guard, it waited forever).
        let (tx, rx) = std::sync::mpsc::channel();
        let again = r.clone();
        std::thread::spawn(move || tx.send(again.with_executor(|e| e.rank)).unwrap());
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(0));
    }
}

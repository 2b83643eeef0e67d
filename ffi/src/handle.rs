//! What an `ncclComm_t` points at: a [`Handle`] shared between the C caller and any thread
//! working on it (a non-blocking init, an abort from a watchdog thread).
//!
//! The pointer a caller holds is an `Arc<Handle>` turned raw. Every entry point first looks it
//! up in the table of live handles, so a destroyed or made-up pointer is an
//! `ncclInvalidArgument`, not a use after free; the lookup takes a reference of its own, so a
//! concurrent `ncclCommAbort` frees nothing another thread still uses.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use topoccl::{AbortHandle, Communicator, Dtype, Health, Scalar, UniqueId};

use crate::abi::{ncclComm, ncclComm_t, ncclResult_t, NCCL_IN_PROGRESS, NCCL_SUCCESS};
use crate::error::{invalid, usage, Error, Result};

/// Where a communicator is in its life.
pub enum Phase {
    /// Init has not finished (a group not yet ended, or a non-blocking init).
    Starting,
    Ready(Box<Communicator>),
    /// `ncclCommFinalize` ran: only destroy is allowed.
    Finalized,
    /// Init failed with this code and message.
    Failed(ncclResult_t, String),
}

/// A PreMulSum operator: its type and scalar (bytes, or where to read them at each call).
#[derive(Clone, Copy)]
pub struct PreMulSum {
    pub dtype: Dtype,
    pub scalar: Scalar,
}

/// One communicator of the C API.
pub struct Handle {
    /// Known at creation for `ncclCommInitRank`; for a split's child once the split is done.
    rank: AtomicU32,
    nranks: AtomicU32,
    phase: Mutex<Phase>,
    started: Condvar,
    abort: OnceLock<AbortHandle>,
    /// Whether the communicator failed, readable while a call runs (calls queued on a stream
    /// fail where nobody waits for them).
    health: OnceLock<Health>,
    /// `ncclCommGetAsyncError`'s answer, readable without the lock a running call holds.
    async_error: AtomicI32,
    /// Operators made by `ncclRedOpCreatePreMulSum`: id = `ncclNumOps` + index.
    pub ops: Mutex<Vec<Option<PreMulSum>>>,
    /// Ranges given to `ncclCommRegister` (address, length), by handle id.
    pub registrations: Mutex<Vec<Option<(usize, usize)>>>,
    /// Collective calls so far (NCCL's `opCount` in logs).
    pub op_count: AtomicU64,
    /// `ncclCommRevoke` ran: calls are refused; destroy, split and shrink are not.
    revoked: AtomicBool,
    /// Between `ncclCommSuspend` and `ncclCommResume`: calls are refused.
    suspended: AtomicBool,
    /// The id `ncclCommGetUniqueId` made for a grow, until the grow consumes it.
    pub grow_id: Mutex<Option<UniqueId>>,
    /// Windows registered on this communicator, in registration order (`window`).
    pub windows: Mutex<crate::window::Windows>,
}

fn live() -> MutexGuard<'static, Vec<usize>> {
    static LIVE: OnceLock<Mutex<Vec<usize>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new())).lock().unwrap_or_else(|p| p.into_inner())
}

impl Handle {
    /// A handle whose init has not finished.
    pub fn starting(rank: u32, nranks: u32) -> Arc<Handle> {
        Arc::new(Handle {
            rank: AtomicU32::new(rank),
            nranks: AtomicU32::new(nranks),
            phase: Mutex::new(Phase::Starting),
            started: Condvar::new(),
            abort: OnceLock::new(),
            health: OnceLock::new(),
            async_error: AtomicI32::new(NCCL_IN_PROGRESS),
            ops: Mutex::new(Vec::new()),
            registrations: Mutex::new(Vec::new()),
            op_count: AtomicU64::new(0),
            revoked: AtomicBool::new(false),
            suspended: AtomicBool::new(false),
            grow_id: Mutex::new(None),
            windows: Mutex::new(Default::default()),
        })
    }

    /// Records how init ended and wakes anyone waiting for it.
    pub fn finish_start(&self, result: Result<Communicator>) {
        let mut phase = self.lock();
        match result {
            Ok(comm) => {
                let _ = self.abort.set(comm.abort_handle());
                let _ = self.health.set(comm.health());
                self.rank.store(comm.rank(), Ordering::Release);
                self.nranks.store(comm.nranks(), Ordering::Release);
                *phase = Phase::Ready(Box::new(comm));
                self.async_error.store(NCCL_SUCCESS, Ordering::Release);
            }
            Err(e) => {
                let code = e.code();
                *phase = Phase::Failed(code, e.to_string());
                self.async_error.store(code, Ordering::Release);
            }
        }
        self.started.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The phase once init has finished.
    fn settled(&self) -> MutexGuard<'_, Phase> {
        let mut phase = self.lock();
        while matches!(*phase, Phase::Starting) {
            phase = self.started.wait(phase).unwrap_or_else(|p| p.into_inner());
        }
        phase
    }

    /// Runs `f` on the communicator once it is ready, unless it was revoked or is suspended;
    /// a failure that breaks the communicator becomes its asynchronous error.
    pub fn with_comm<R>(&self, f: impl FnOnce(&mut Communicator) -> Result<R>) -> Result<R> {
        if self.revoked.load(Ordering::Acquire) {
            return Err(usage(
                "the communicator was revoked (ncclCommRevoke): only destroy, split and shrink may follow",
            ));
        }
        if self.suspended.load(Ordering::Acquire) {
            return Err(usage("the communicator is suspended (ncclCommSuspend): resume it first"));
        }
        self.with_comm_any(f)
    }

    /// [`Handle::with_comm`] also on a revoked or suspended communicator (to shrink or split it).
    pub fn with_comm_any<R>(&self, f: impl FnOnce(&mut Communicator) -> Result<R>) -> Result<R> {
        let mut phase = self.settled();
        let comm = match &mut *phase {
            Phase::Ready(c) => c,
            Phase::Finalized => return Err(usage("the communicator was finalized: only ncclCommDestroy may follow")),
            Phase::Failed(code, why) => return Err(failed_init(*code, why)),
            Phase::Starting => return Err(Error::Panic("init not settled".into())),
        };
        let result = f(comm);
        if result.is_err() && comm.error().is_some() {
            if let Err(e) = &result {
                self.async_error.store(e.code(), Ordering::Release);
            }
        }
        result
    }

    /// Records a failure's code as the communicator's asynchronous error, if it broke it.
    /// Takes no lock of the handle's: it runs in work completions, on the progress thread,
    /// which a destroy or abort holding that lock may be waiting for.
    pub fn note_failure(&self, code: ncclResult_t) {
        if self.health.get().and_then(Health::failure).is_some() {
            self.async_error.store(code, Ordering::Release);
        }
    }

    /// This rank and the rank count, once init has finished (also after finalize).
    pub fn identity(&self) -> Result<(u32, u32)> {
        let phase = self.settled();
        if let Phase::Failed(code, why) = &*phase {
            return Err(failed_init(*code, why));
        }
        Ok((self.rank.load(Ordering::Acquire), self.nranks.load(Ordering::Acquire)))
    }

    /// The rank as known so far (for logs; `u32::MAX` before a split's child exists).
    pub fn rank_hint(&self) -> u32 {
        self.rank.load(Ordering::Relaxed)
    }

    /// `ncclCommGetAsyncError`: never waits on a running call.
    pub fn async_error(&self) -> ncclResult_t {
        let code = self.async_error.load(Ordering::Acquire);
        if code != NCCL_SUCCESS {
            return code;
        }
        match self.health.get().and_then(Health::failure) {
            Some(e) => Error::from(e).code(),
            None => code,
        }
    }

    /// Marks the communicator finalized once every call queued on it has completed on the host
    /// (calls on streams included).
    pub fn finalize(&self) -> Result<()> {
        let mut phase = self.settled();
        match &*phase {
            Phase::Ready(comm) => {
                let flushed = comm.flush();
                *phase = Phase::Finalized;
                flushed.map_err(Error::from)
            }
            Phase::Finalized => Err(usage("ncclCommFinalize called twice")),
            Phase::Failed(code, why) => Err(failed_init(*code, why)),
            Phase::Starting => Err(Error::Panic("init not settled".into())),
        }
    }

    /// Ends the communicator: `abort` first stops a call running in another thread.
    pub fn close(&self, abort: bool) -> Result<()> {
        if abort {
            self.abort_calls();
        }
        let mut phase = self.settled();
        match std::mem::replace(&mut *phase, Phase::Finalized) {
            Phase::Ready(comm) if abort => (*comm).abort(),
            // Destroying after an error is the normal way out; the error was reported already.
            Phase::Ready(comm) => drop((*comm).destroy()),
            _ => {}
        }
        Ok(())
    }

    /// Stops every call in flight and refuses new ones (`ncclCommRevoke`).
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
        self.abort_calls();
    }

    /// Stops in-flight calls (an abort's, a revoke's and `NCCL_SHRINK_ABORT`'s first step).
    pub fn abort_calls(&self) {
        if let Some(a) = self.abort.get() {
            a.abort();
        }
    }

    /// `ncclCommSuspend` (true) and `ncclCommResume` (false); whether it was suspended before.
    pub fn set_suspended(&self, suspended: bool) -> bool {
        self.suspended.swap(suspended, Ordering::AcqRel)
    }

    pub fn is_suspended(&self) -> bool {
        self.suspended.load(Ordering::Acquire)
    }

    /// Gives the handle to C: the pointer stays valid until [`release`].
    pub fn publish(self: Arc<Handle>) -> ncclComm_t {
        let p = Arc::into_raw(self) as *mut ncclComm;
        live().push(p as usize);
        p
    }
}

fn failed_init(code: c_int, why: &str) -> Error {
    Error::with_code(code, format!("the communicator's init failed: {why}"))
}

/// The handle behind a caller's pointer, if it is a live one.
pub fn lookup(comm: ncclComm_t) -> Result<Arc<Handle>> {
    if comm.is_null() {
        return Err(invalid("comm is NULL"));
    }
    let table = live();
    if !table.contains(&(comm as usize)) {
        return Err(invalid(format!("{comm:p} is not a communicator (destroyed, aborted or never created)")));
    }
    let p = comm as *const Handle;
    // SAFETY: `p` came from `Arc::into_raw` in `publish` and is still in the live table, so
    // the reference it stands for has not been released; `release` takes the table's lock
    // before dropping it, and we hold that lock while taking our own reference.
    let handle = unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    };
    drop(table);
    Ok(handle)
}

/// Takes the caller's pointer out of the live table and drops the reference it stood for.
pub fn release(comm: ncclComm_t) -> Result<Arc<Handle>> {
    let handle = lookup(comm)?;
    let mut table = live();
    if let Some(i) = table.iter().position(|&p| p == comm as usize) {
        table.swap_remove(i);
        // SAFETY: the pointer was in the live table (checked under this lock), so the reference
        // `publish` leaked is still owned by the table; removing the entry hands it back here,
        // exactly once.
        drop(unsafe { Arc::from_raw(comm as *const Handle) });
    }
    Ok(handle)
}

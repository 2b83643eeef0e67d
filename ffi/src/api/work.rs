//! topoccl's extension for host memory (`include/topoccl.h`): a group ended without waiting,
//! and the handle of its calls. PyTorch's backend is its user: its work objects are these.
//!
//! A `topocclWork_t` is an id, never dereferenced: every entry point looks it up in the table
//! of live works, so a freed or made-up handle is an `ncclInvalidArgument`.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::{extension, guard};
use crate::abi::*;
use crate::error::{invalid, usage, Error, Result};
use crate::group::{self, Queued};
use crate::raw;

/// The extension's version (`TOPOCCL_EXT_VERSION`).
pub const EXT_VERSION: c_int = 2;

/// `topocclWork_t`: an opaque pointer-sized id.
#[allow(non_camel_case_types)]
pub type topocclWork_t = *mut c_void;

/// `topocclCompletion_t`.
#[allow(non_camel_case_types)]
pub type topocclCompletion_t =
    Option<unsafe extern "C" fn(arg: *mut c_void, result: ncclResult_t, message: *const c_char)>;

/// One ended group's calls.
struct GroupWork {
    parts: Queued,
    /// A completion was registered (one per work).
    completion_set: AtomicBool,
}

impl GroupWork {
    fn works(&self) -> impl Iterator<Item = (&crate::handle::Handle, &topoccl::Work)> {
        self.parts.iter().flat_map(|(h, ws)| ws.iter().map(move |w| (&**h, w)))
    }
}

fn table() -> MutexGuard<'static, HashMap<usize, Arc<GroupWork>>> {
    static WORKS: OnceLock<Mutex<HashMap<usize, Arc<GroupWork>>>> = OnceLock::new();
    WORKS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

fn lookup(work: topocclWork_t) -> Result<Arc<GroupWork>> {
    table()
        .get(&(work as usize))
        .cloned()
        .ok_or_else(|| invalid(format!("{work:p} is not a topocclWork_t (freed, or never made)")))
}

/// A failed call's error, also made the communicator's asynchronous error.
fn failed(h: &crate::handle::Handle, e: topoccl::Error) -> Error {
    let e = Error::from(e);
    h.note_failure(e.code());
    e
}

fn ext_version(out: *mut c_int) -> ncclResult_t {
    guard("topocclExtVersion", || {
        // SAFETY: `out` is NULL or writable (the API's contract).
        unsafe { raw::put(out, EXT_VERSION, "version") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn group_end_async(out: *mut topocclWork_t) -> ncclResult_t {
    guard("topocclGroupEndAsync", || {
        if out.is_null() {
            // The group still ends (as ncclGroupEnd's would), running its calls to the end.
            let _ = group::end();
            return Err(invalid("work is NULL (the group ran to completion)"));
        }
        let parts = group::end_async()?;
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // Ids never repeat in a process's life, and are never 0 (NULL).
        let id = NEXT.fetch_add(1, Ordering::Relaxed) as usize;
        table().insert(id, Arc::new(GroupWork { parts, completion_set: AtomicBool::new(false) }));
        // SAFETY: `out` is not NULL and writable (the API's contract).
        unsafe { raw::put(out, id as topocclWork_t, "work") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn work_test(work: topocclWork_t, done: *mut c_int) -> ncclResult_t {
    guard("topocclWorkTest", || {
        let w = lookup(work)?;
        let mut all = true;
        for (h, work) in w.works() {
            match work.test() {
                Ok(d) => all &= d,
                Err(e) => return Err(failed(h, e)),
            }
        }
        // SAFETY: `done` is NULL or writable (the API's contract).
        unsafe { raw::put(done, c_int::from(all), "done") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn work_wait(work: topocclWork_t, timeout_ms: i64) -> ncclResult_t {
    guard("topocclWorkWait", || {
        let w = lookup(work)?;
        let deadline = u64::try_from(timeout_ms).ok().map(|ms| Instant::now() + Duration::from_millis(ms));
        for (h, work) in w.works() {
            let r = match deadline {
                None => work.wait(),
                Some(d) => match work.wait_timeout(d.saturating_duration_since(Instant::now())) {
                    Some(r) => r,
                    None => return Ok(NCCL_IN_PROGRESS),
                },
            };
            r.map_err(|e| failed(h, e))?;
        }
        Ok(NCCL_SUCCESS)
    })
}

/// What a registered completion is told once every call of a work has ended.
struct Countdown {
    left: AtomicUsize,
    first_error: Mutex<Option<(ncclResult_t, String)>>,
    notify: unsafe extern "C" fn(*mut c_void, ncclResult_t, *const c_char),
    /// The caller's argument, an address handed back as it was given.
    arg: usize,
}

impl Countdown {
    fn one_ended(&self, h: &crate::handle::Handle, r: &topoccl::Result<()>) {
        if let Err(e) = r {
            let e = failed(h, e.clone());
            let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert((e.code(), e.to_string()));
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.tell();
        }
    }

    fn tell(&self) {
        let first = self.first_error.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (code, message) = first.unwrap_or((NCCL_SUCCESS, String::new()));
        let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: `notify` and `arg` are what the caller registered, which the API's contract
        // says may be called once, from any thread, with this argument; the message outlives
        // the call.
        unsafe { (self.notify)(self.arg as *mut c_void, code, message.as_ptr()) };
    }
}

fn work_on_complete(work: topocclWork_t, f: topocclCompletion_t, arg: *mut c_void) -> ncclResult_t {
    guard("topocclWorkOnComplete", || {
        let w = lookup(work)?;
        let Some(notify) = f else { return Err(invalid("the completion function is NULL")) };
        if w.completion_set.swap(true, Ordering::AcqRel) {
            return Err(usage("this work already has a completion (one per work)"));
        }
        let n = w.works().count();
        let countdown =
            Arc::new(Countdown { left: AtomicUsize::new(n), first_error: Mutex::new(None), notify, arg: arg as usize });
        if n == 0 {
            countdown.tell();
        }
        for (h, work) in &w.parts {
            for one in work {
                let (c, h) = (countdown.clone(), h.clone());
                one.on_complete(move |r| c.one_ended(&h, r));
            }
        }
        Ok(NCCL_SUCCESS)
    })
}

fn work_free(work: topocclWork_t) -> ncclResult_t {
    guard("topocclWorkFree", || {
        if work.is_null() {
            return Ok(NCCL_SUCCESS);
        }
        table()
            .remove(&(work as usize))
            .map(drop)
            .ok_or_else(|| invalid(format!("{work:p} is not a topocclWork_t")))?;
        Ok(NCCL_SUCCESS)
    })
}

extension! {
    /// The extension's version.
    topocclExtVersion(version: *mut c_int) = ext_version
}
extension! {
    /// Ends the outermost group, returning once its calls are queued.
    topocclGroupEndAsync(work: *mut topocclWork_t) = group_end_async
}
extension! {
    /// Whether a work has completed.
    topocclWorkTest(work: topocclWork_t, done: *mut c_int) = work_test
}
extension! {
    /// Waits for a work, at most `timeout_ms` when it is not negative.
    topocclWorkWait(work: topocclWork_t, timeout_ms: i64) = work_wait
}
extension! {
    /// Calls `f(arg, result, message)` once when the work ends.
    topocclWorkOnComplete(work: topocclWork_t, f: topocclCompletion_t, arg: *mut c_void) = work_on_complete
}
extension! {
    /// Releases a work handle.
    topocclWorkFree(work: topocclWork_t) = work_free
}

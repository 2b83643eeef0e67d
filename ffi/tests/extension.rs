//! topoccl.h's extension, called as a C program would (the functions this crate exports):
//! a group ended without waiting gives a work handle whose test, wait, completion and free
//! behave as the header says, and made-up or freed handles are refused, never dereferenced.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::mpsc;
use std::time::Duration;

use nccl::abi::*;
use nccl::*;

fn one_rank_comm() -> ncclComm_t {
    // SAFETY: out-parameters of the right types, as nccl.h declares them.
    unsafe {
        let mut id: ncclUniqueId = std::mem::zeroed();
        assert_eq!(ncclGetUniqueId(&mut id), NCCL_SUCCESS);
        let mut comm: ncclComm_t = std::ptr::null_mut();
        assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), NCCL_SUCCESS);
        comm
    }
}

unsafe extern "C" fn told(arg: *mut c_void, result: ncclResult_t, message: *const c_char) {
    // SAFETY: `arg` is the sender the test registered (Box::into_raw), told once.
    let tx = unsafe { Box::from_raw(arg as *mut mpsc::Sender<(ncclResult_t, String)>) };
    // SAFETY: the message is a C string valid during this call (topoccl.h).
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
    tx.send((result, text)).unwrap();
}

#[test]
fn a_group_ended_without_waiting_completes_through_its_handle() {
    let comm = one_rank_comm();
    let n = 1 << 16;
    let mut buf = vec![1.5f32; n];
    let mut work: topocclWork_t = std::ptr::null_mut();
    // SAFETY: the buffer outlives the work (waited for below); handles are the library's.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        let p = buf.as_mut_ptr() as *mut c_void;
        assert_eq!(ncclAllReduce(p, p, n, 7, 0, comm, std::ptr::null_mut()), NCCL_SUCCESS);
        assert_eq!(topocclGroupEndAsync(&mut work), NCCL_SUCCESS);
        assert!(!work.is_null());
        let (tx, rx) = mpsc::channel();
        let arg = Box::into_raw(Box::new(tx)) as *mut c_void;
        assert_eq!(topocclWorkOnComplete(work, Some(told), arg), NCCL_SUCCESS);
        // One completion per work.
        assert_eq!(topocclWorkOnComplete(work, Some(told), std::ptr::null_mut()), NCCL_INVALID_USAGE);
        assert_eq!(topocclWorkWait(work, -1), NCCL_SUCCESS);
        let mut done: c_int = 0;
        assert_eq!(topocclWorkTest(work, &mut done), NCCL_SUCCESS);
        assert_eq!(done, 1);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok((NCCL_SUCCESS, String::new())));
        assert_eq!(topocclWorkFree(work), NCCL_SUCCESS);
        // Freed: refused, not used.
        assert_eq!(topocclWorkWait(work, 0), NCCL_INVALID_ARGUMENT);
        assert_eq!(topocclWorkFree(work), NCCL_INVALID_ARGUMENT);
        assert_eq!(topocclWorkTest(0xdead0 as topocclWork_t, &mut done), NCCL_INVALID_ARGUMENT);
        assert_eq!(topocclWorkFree(std::ptr::null_mut()), NCCL_SUCCESS);
        // An empty group: a completed work, told at once.
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(topocclGroupEndAsync(&mut work), NCCL_SUCCESS);
        assert_eq!(topocclWorkWait(work, 0), NCCL_SUCCESS);
        assert_eq!(topocclWorkFree(work), NCCL_SUCCESS);
        // A bad call in the group: nothing runs, the end says why.
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_ne!(ncclAllReduce(p, p, n, 99, 0, comm, std::ptr::null_mut()), NCCL_SUCCESS);
        assert_eq!(topocclGroupEndAsync(&mut work), NCCL_INVALID_USAGE);
        assert!(CStr::from_ptr(ncclGetLastError(comm)).to_string_lossy().contains("nothing in it ran"));
        let mut version = 0;
        assert_eq!(topocclExtVersion(&mut version), NCCL_SUCCESS);
        assert_eq!(version, 1);
        assert_eq!(ncclCommDestroy(comm), NCCL_SUCCESS);
    }
    assert!(buf.iter().all(|&x| x == 1.5), "a one-rank sum is the input");
}

/// A failed call's work reports the error to every way of asking: test, wait, the completion.
#[test]
fn a_failed_call_reports_through_its_work() {
    let comm = one_rank_comm();
    let mut buf = vec![0u8; 64];
    let mut work: topocclWork_t = std::ptr::null_mut();
    // SAFETY: as above.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        let p = buf.as_mut_ptr() as *mut c_void;
        assert_eq!(ncclAllReduce(p, p, 64, 0, 0, comm, std::ptr::null_mut()), NCCL_SUCCESS);
        assert_eq!(topocclGroupEndAsync(&mut work), NCCL_SUCCESS);
        assert_eq!(topocclWorkWait(work, -1), NCCL_SUCCESS);
        // Aborted: a later call fails, and its work says so.
        assert_eq!(ncclCommAbort(comm), NCCL_SUCCESS);
        assert_eq!(topocclWorkFree(work), NCCL_SUCCESS);
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_ne!(ncclAllReduce(p, p, 64, 0, 0, comm, std::ptr::null_mut()), NCCL_SUCCESS);
        assert_ne!(topocclGroupEndAsync(&mut work), NCCL_SUCCESS);
    }
}

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
        assert_eq!(version, 2);
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

/// `n` ranks as threads of this process, each with its communicator; `f`'s results in rank order.
fn on_ranks<R: Send>(n: c_int, f: impl Fn(c_int, ncclComm_t) -> R + Sync) -> Vec<R> {
    // SAFETY: an out-parameter of the right type.
    let id = unsafe {
        let mut id: ncclUniqueId = std::mem::zeroed();
        assert_eq!(ncclGetUniqueId(&mut id), NCCL_SUCCESS);
        id
    };
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                let f = &f;
                s.spawn(move || {
                    let mut comm: ncclComm_t = std::ptr::null_mut();
                    // SAFETY: as above; the communicator is destroyed once, after `f`.
                    unsafe {
                        assert_eq!(ncclCommInitRank(&mut comm, n, id, r), NCCL_SUCCESS);
                        let out = f(r, comm);
                        assert_eq!(ncclCommDestroy(comm), NCCL_SUCCESS);
                        out
                    }
                })
            })
            .collect();
        ranks.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn tagged_calls_match_by_tag_and_a_receive_from_any_source_names_its_sender() {
    const INT32: ncclDataType_t = 2;
    let got = on_ranks(3, |rank, comm| {
        let null = std::ptr::null_mut();
        let mut got = Vec::new();
        // SAFETY: buffers and sources outlive the calls (waited for before they go).
        unsafe {
            if rank == 0 {
                // Two receives from any source in one asynchronous group, then tag 2 before
                // tag 1 from rank 1 (which sent them the other way round).
                let mut bufs = [[0i32; 4]; 2];
                let mut sources = [-7 as c_int; 2];
                assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
                for (b, s) in bufs.iter_mut().zip(&mut sources) {
                    let p = b.as_mut_ptr() as *mut c_void;
                    assert_eq!(topocclRecvTagged(p, 4, INT32, -1, 9, s, comm, null), NCCL_SUCCESS);
                }
                let mut work: topocclWork_t = null;
                assert_eq!(topocclGroupEndAsync(&mut work), NCCL_SUCCESS);
                assert_eq!(topocclWorkWait(work, -1), NCCL_SUCCESS);
                assert_eq!(topocclWorkFree(work), NCCL_SUCCESS);
                for (b, s) in bufs.iter().zip(sources) {
                    got.push((s, b[0] == s * 10 && b.iter().all(|&v| v == b[0])));
                }
                let (mut two, mut one) = ([0i32; 2], [0i32; 2]);
                let mut from: c_int = -7;
                assert_eq!(topocclRecvTagged(two.as_mut_ptr().cast(), 2, INT32, 1, 2, &mut from, comm, null), 0);
                assert_eq!(
                    topocclRecvTagged(one.as_mut_ptr().cast(), 2, INT32, 1, 1, std::ptr::null_mut(), comm, null),
                    0
                );
                got.push((from, two == [2, 2] && one == [1, 1]));
                // Refused: a tag out of range, any source for a send or for NCCL's own receive.
                assert_eq!(topocclSendTagged(one.as_ptr().cast(), 2, INT32, 1, -3, comm, null), NCCL_INVALID_ARGUMENT);
                assert_eq!(topocclSendTagged(one.as_ptr().cast(), 2, INT32, -1, 0, comm, null), NCCL_INVALID_ARGUMENT);
                assert_eq!(ncclRecv(one.as_mut_ptr().cast(), 2, INT32, -1, comm, null), NCCL_INVALID_ARGUMENT);
            } else {
                let mine = [rank * 10; 4];
                assert_eq!(topocclSendTagged(mine.as_ptr().cast(), 4, INT32, 0, 9, comm, null), NCCL_SUCCESS);
                if rank == 1 {
                    for tag in [1, 2] {
                        let v = [tag; 2];
                        assert_eq!(topocclSendTagged(v.as_ptr().cast(), 2, INT32, 0, tag, comm, null), NCCL_SUCCESS);
                    }
                }
            }
            // Still in step: a collective after them.
            let mut x = [1i32];
            assert_eq!(ncclAllReduce(x.as_ptr().cast(), x.as_mut_ptr().cast(), 1, INT32, 0, comm, null), 0);
            assert_eq!(x, [3]);
        }
        got
    });
    let mut senders: Vec<c_int> = got[0][..2].iter().map(|g| g.0).collect();
    senders.sort_unstable();
    assert_eq!(senders, [1, 2]);
    assert!(got[0].iter().all(|g| g.1), "{:?}", got[0]);
    assert_eq!(got[0][2].0, 1);
}

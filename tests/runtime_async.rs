//! Asynchronous calls and their work handles: calls complete on the progress thread without
//! the caller, in call order; `test`, `wait`, `wait_timeout` and `error` say how they ended;
//! an error breaks the calls queued after it; abort ends the running call and the queued ones.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use topoccl::{Collective, CollectiveCall, Element, Error, ReduceOp, TransportPolicy};

fn sum_call<T: Element>(count: usize) -> CollectiveCall {
    CollectiveCall::new(Collective::AllReduce, T::DTYPE, count).reduced_with(ReduceOp::Sum)
}

#[test]
fn queued_calls_complete_without_the_caller_and_in_order() {
    for transport in [TransportPolicy::Tcp, TransportPolicy::Shm] {
        let got = common::on_ranks(3, &common::config(transport, 60.0), |comm| {
            let r = comm.rank() as f64;
            let sizes = [1usize << 20, 7, 100_003, 1 << 16];
            let pending: Vec<_> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let send = vec![r + i as f64; n];
                    comm.submit_owned(&sum_call::<f64>(n), send, vec![0.0; n]).unwrap()
                })
                .collect();
            // The caller does nothing: the progress thread runs them. Completion is in call
            // order: a call is never done while an earlier one is not.
            let t = Instant::now();
            let mut order_kept = true;
            loop {
                let done: Vec<bool> = pending.iter().map(|p| p.work().test().unwrap()).collect();
                order_kept &= done.windows(2).all(|w| w[0] || !w[1]);
                if done.iter().all(|&d| d) {
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(30), "calls did not complete on their own");
                sleep(Duration::from_millis(1));
            }
            let sums: Vec<bool> = pending
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let (_, recv) = p.wait().unwrap();
                    recv.iter().all(|&x| x == 3.0 + 3.0 * i as f64)
                })
                .collect();
            (order_kept, sums)
        });
        for (r, (order_kept, sums)) in got.into_iter().enumerate() {
            assert!(order_kept, "rank {r} over {transport:?}: completion out of call order");
            assert!(sums.iter().all(|&s| s), "rank {r} over {transport:?}: {sums:?}");
        }
    }
}

#[test]
fn blocking_and_queued_calls_share_one_order() {
    let got = common::on_ranks(2, &common::config(TransportPolicy::Auto, 60.0), |comm| {
        let n = 50_000;
        let first = comm.submit_owned(&sum_call::<i64>(n), vec![1i64; n], vec![0; n]).unwrap();
        // A blocking call made after it runs after it (it waits for, and may help run, the
        // queued one).
        let mut mid = [comm.rank() as i64 + 1];
        comm.all_reduce_in_place(&mut mid, ReduceOp::Sum).unwrap();
        let last = comm.submit_owned(&sum_call::<i64>(3), vec![5i64; 3], vec![0; 3]).unwrap();
        assert!(first.work().test().unwrap(), "an earlier queued call was not done after a later blocking one");
        let (_, a) = first.wait().unwrap();
        let (_, c) = last.wait().unwrap();
        (a.iter().all(|&x| x == 2), mid[0], c)
    });
    for (ok, mid, c) in got {
        assert!(ok);
        assert_eq!(mid, 3);
        assert_eq!(c, vec![10, 10, 10]);
    }
}

#[test]
fn a_failed_call_reports_its_error_and_breaks_the_ones_queued_after_it() {
    let got = common::on_ranks(2, &common::config(TransportPolicy::Auto, 20.0), |comm| {
        let n = 1000;
        let bad = if comm.rank() == 0 {
            comm.submit_owned(&sum_call::<f32>(n), vec![1.0f32; n], vec![0.0; n]).unwrap()
        } else {
            let call = CollectiveCall::new(Collective::AllGather, f32::DTYPE, n / 2);
            comm.submit_owned(&call, vec![1.0f32; n / 2], vec![0.0; n]).unwrap()
        };
        let after = comm.submit_owned(&sum_call::<f32>(4), vec![1.0f32; 4], vec![0.0; 4]).unwrap();
        let first = bad.work().wait_timeout(Duration::from_secs(15)).expect("the mismatch was not noticed");
        let second = after.wait().err();
        (first.err(), bad.work().error().map(|e| e.to_string()), second)
    });
    let mut mismatches = 0;
    for (r, (first, error, second)) in got.into_iter().enumerate() {
        // A rank that only sent may have finished its part before noticing; the one that
        // received the other's message must fail with a mismatch naming both calls.
        if let Some(e) = &first {
            mismatches += usize::from(matches!(e.seen(), Error::Mismatch { .. }));
            assert_eq!(error.as_deref(), Some(e.to_string().as_str()));
            let second = second.unwrap_or_else(|| panic!("rank {r}: a call after the failure ran"));
            assert!(matches!(second, Error::Broken(_)), "rank {r}: {second}");
        }
    }
    assert!(mismatches >= 1);
}

#[test]
fn abort_ends_the_running_call_and_the_queued_ones() {
    let got = common::on_ranks(2, &common::config(TransportPolicy::Auto, 60.0), |comm| {
        if comm.rank() == 1 {
            // Never calls: rank 0's calls wait for it.
            sleep(Duration::from_millis(1500));
            return None;
        }
        let works: Vec<_> = (0..3)
            .map(|i| comm.submit_owned(&sum_call::<u8>(10 + i), vec![1u8; 10 + i], vec![0; 10 + i]).unwrap())
            .collect();
        sleep(Duration::from_millis(200));
        // One runs (waiting for rank 1), two are queued.
        assert!(works.iter().all(|w| !w.work().test().unwrap()));
        let t = Instant::now();
        comm.abort_handle().abort();
        let errors: Vec<Error> = works.into_iter().map(|w| w.wait().unwrap_err()).collect();
        let after = comm.all_reduce(&[1u8], &mut [0], ReduceOp::Sum).unwrap_err();
        Some((errors, t.elapsed(), after))
    });
    let (errors, took, after) = got.into_iter().next().flatten().unwrap();
    for e in &errors {
        assert!(matches!(e, Error::Aborted | Error::Broken(_)), "{e}");
    }
    assert!(matches!(errors[0], Error::Aborted), "the running call: {}", errors[0]);
    assert!(took < Duration::from_millis(1000), "{took:?}");
    assert!(matches!(after, Error::Aborted | Error::Broken(_)), "{after}");
}

#[test]
fn aborting_the_communicator_fails_queued_work_at_once() {
    let got = common::on_ranks(2, &common::config(TransportPolicy::Auto, 60.0), |comm| {
        if comm.rank() == 1 {
            sleep(Duration::from_millis(800));
            return None;
        }
        let (a, b) = (vec![1i32; 4], vec![2i32; 4]);
        let mut out = vec![0i32; 4];
        let mut out2 = vec![0i32; 4];
        // SAFETY: the buffers outlive the works, which are waited for below.
        let works = unsafe {
            [
                comm.submit(
                    &sum_call::<i32>(4),
                    topoccl::Buffer::host(a.as_ptr()),
                    topoccl::Buffer::host(out.as_mut_ptr()),
                )
                .unwrap(),
                comm.submit(
                    &sum_call::<i32>(4),
                    topoccl::Buffer::host(b.as_ptr()),
                    topoccl::Buffer::host(out2.as_mut_ptr()),
                )
                .unwrap(),
            ]
        };
        let t = Instant::now();
        let handle = comm.abort_handle();
        handle.abort();
        let results: Vec<Option<Error>> = works.iter().map(|w| w.wait().err()).collect();
        Some((results, t.elapsed()))
    });
    let (results, took) = got.into_iter().next().flatten().unwrap();
    assert!(results.iter().all(|e| matches!(e, Some(Error::Aborted) | Some(Error::Broken(_)))), "{results:?}");
    assert!(took < Duration::from_millis(1000), "{took:?}");
}

#[test]
fn dropping_a_communicator_while_another_thread_waits_on_its_work_does_not_hang() {
    // Rank 1 never calls, so rank 0's work waits; a second thread of rank 0 waits on it (and
    // may be the one running it) while the owner drops the communicator, which aborts what is
    // busy. The drop must return and the waiter must get the abort, whichever thread ran it.
    let id = topoccl::UniqueId::new().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let cfg = common::config(TransportPolicy::Auto, 30.0);
    let id1 = id.clone();
    let cfg1 = cfg.clone();
    let idle = std::thread::spawn(move || {
        let comm = topoccl::Communicator::init_with(&id1, 1, 2, cfg1).unwrap();
        sleep(Duration::from_millis(1500));
        drop(comm);
    });
    std::thread::spawn(move || {
        let comm = topoccl::Communicator::init_with(&id, 0, 2, cfg).unwrap();
        let n = 1 << 16;
        let pending = comm.submit_owned(&sum_call::<f32>(n), vec![1.0f32; n], vec![0.0; n]).unwrap();
        let waiter = std::thread::spawn(move || pending.wait().err());
        sleep(Duration::from_millis(200));
        drop(comm);
        let e = waiter.join().unwrap();
        let _ = done_tx.send(e);
    });
    let e = done_rx.recv_timeout(Duration::from_secs(10)).expect("dropping the communicator hung");
    assert!(matches!(e, Some(Error::Aborted) | Some(Error::Broken(_))), "{e:?}");
    idle.join().unwrap();
}

/// A completion runs once per call with the call's result: at once if registered after the
/// call ended, else on the thread that finished it, after it let go of the executor (so the
/// completion may wait for the communicator: here it waits for a later call, which would
/// hang if it ran while the executor was held).
#[test]
fn completions_run_once_with_the_result_and_may_wait_for_later_calls() {
    use std::sync::mpsc;
    let got = common::on_ranks(2, &common::config(TransportPolicy::Shm, 60.0), |comm| {
        let n = 1 << 16;
        let first = comm.submit_owned(&sum_call::<f32>(n), vec![1.0f32; n], vec![0.0; n]).unwrap();
        let second = comm.submit_owned(&sum_call::<f32>(n), vec![2.0f32; n], vec![0.0; n]).unwrap();
        let later = second.work().clone();
        let first_work = first.work().clone();
        let (tx, rx) = mpsc::channel();
        let tx2 = tx.clone();
        first.work().on_complete(move |r| {
            // Waits for the second call from inside the first one's completion.
            let waited = later.wait().is_ok();
            tx.send(("first", r.is_ok(), waited)).unwrap();
        });
        let (_, sums) = second.wait().unwrap();
        let (_, firsts) = first.wait().unwrap();
        // Registered after the end: runs at once, here.
        first_work.on_complete(move |r| tx2.send(("after", r.is_ok(), true)).unwrap());
        let mut told: Vec<_> = rx.iter().take(2).collect();
        told.sort();
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "a completion ran twice");
        (told, firsts.iter().all(|&x| x == 2.0), sums.iter().all(|&x| x == 4.0))
    });
    for (r, (told, a, b)) in got.into_iter().enumerate() {
        assert_eq!(told, vec![("after", true, true), ("first", true, true)], "rank {r}");
        assert!(a && b, "rank {r}: wrong sums");
    }
}

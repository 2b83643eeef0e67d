//! The runtime's behaviour beyond correct sums: every algorithm through the one executor,
//! point-to-point and groups, split, bad arguments, mismatched calls, deadlines and abort.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use topoccl::{Communicator, Config, Error, ReduceOp, TransportPolicy, UniqueId};

fn cfg() -> Config {
    common::config(TransportPolicy::Auto, 60.0)
}

#[test]
fn every_algorithm_runs_through_the_one_executor() {
    for algo in ["ring", "tree", "rhd", "hier"] {
        for n in [3u32, 4] {
            let c = Config { algo: Some(algo.to_string()), ..cfg() };
            let results = common::on_ranks(n, &c, |comm| {
                let me = comm.rank() as f64;
                let mut bad = Vec::new();
                for len in [1usize, 13, 4096, 100_003] {
                    let send: Vec<f64> = (0..len).map(|i| (i % 17) as f64 + me).collect();
                    let mut out = vec![0.0; len];
                    comm.all_reduce(&send, &mut out, ReduceOp::Sum).unwrap();
                    let tri = f64::from(n * (n - 1) / 2);
                    if (0..len).any(|i| out[i] != (i % 17) as f64 * f64::from(n) + tri) {
                        bad.push(format!("{algo} all_reduce {len}"));
                    }
                    let mut b = if comm.rank() == 1 { send.clone() } else { vec![0.0; len] };
                    comm.broadcast_in_place(&mut b, 1).unwrap();
                    if (0..len).any(|i| b[i] != (i % 17) as f64 + 1.0) {
                        bad.push(format!("{algo} broadcast {len}"));
                    }
                    let mut r = if comm.rank() == 2 { vec![0.0; len] } else { Vec::new() };
                    comm.reduce(&send, &mut r, ReduceOp::Max, 2).unwrap();
                    if comm.rank() == 2 && (0..len).any(|i| r[i] != (i % 17) as f64 + f64::from(n - 1)) {
                        bad.push(format!("{algo} reduce {len}"));
                    }
                }
                bad
            });
            let bad: Vec<String> = results.into_iter().flatten().collect();
            assert!(bad.is_empty(), "n={n}: {bad:?}");
        }
    }
}

#[test]
fn a_single_rank_communicator_copies() {
    let out = common::on_ranks(1, &cfg(), |comm| {
        let mut v = vec![0u32; 5];
        comm.all_reduce(&[1, 2, 3, 4, 5], &mut v, ReduceOp::Prod).unwrap();
        let mut g = vec![0u32; 2];
        comm.all_gather(&[7, 8], &mut g).unwrap();
        (v, g)
    });
    assert_eq!(out[0], (vec![1, 2, 3, 4, 5], vec![7, 8]));
}

#[test]
fn grouped_sends_and_receives_exchange_around_a_ring() {
    for transport in [TransportPolicy::Tcp, TransportPolicy::Shm] {
        let c = common::config(transport, 60.0);
        let got = common::on_ranks(4, &c, |comm| {
            let (n, r) = (comm.nranks(), comm.rank());
            // Both directions at once, large enough to need slicing and back-pressure.
            let right: Vec<i64> = (0..3_000_001).map(|i| i * 10 + i64::from(r)).collect();
            let left = vec![i64::from(r); 5];
            let (mut from_left, mut from_right) = (vec![0i64; 3_000_001], vec![0i64; 5]);
            let mut g = comm.group();
            g.send(&right, (r + 1) % n).unwrap();
            g.send(&left, (r + n - 1) % n).unwrap();
            g.recv(&mut from_left, (r + n - 1) % n).unwrap();
            g.recv(&mut from_right, (r + 1) % n).unwrap();
            g.end().unwrap();
            // A blocking pair: even ranks send first.
            let mut one = [0u8; 3];
            if r % 2 == 0 {
                comm.send(&[r as u8; 3], r + 1).unwrap();
            } else {
                comm.recv(&mut one, r - 1).unwrap();
            }
            (from_left[2] == 20 + i64::from((r + n - 1) % n), from_right == vec![i64::from((r + 1) % n); 5], one)
        });
        for (r, (a, b, one)) in got.into_iter().enumerate() {
            assert!(a && b, "rank {r} over {transport:?}");
            if r % 2 == 1 {
                assert_eq!(one, [r as u8 - 1; 3]);
            }
        }
    }
}

#[test]
fn split_makes_working_sub_communicators() {
    let got = common::on_ranks(5, &cfg(), |comm| {
        let r = comm.rank();
        // Evens and odds, reversed by key; rank 4 sits out.
        let color = if r == 4 { None } else { Some(r % 2) };
        let sub = comm.split(color, -(r as i32)).unwrap();
        let sub = sub?;
        let mut sum = [0u32];
        sub.all_reduce(&[r], &mut sum, ReduceOp::Sum).unwrap();
        // The parent still works afterwards.
        Some((sub.rank(), sub.nranks(), sum[0]))
    });
    assert_eq!(got, vec![Some((1, 2, 2)), Some((1, 2, 4)), Some((0, 2, 2)), Some((0, 2, 4)), None]);
}

#[test]
fn bad_arguments_are_typed_errors_and_leave_the_communicator_usable() {
    let got = common::on_ranks(2, &cfg(), |comm| {
        let mut errs = Vec::new();
        let mut out = vec![0f32; 3];
        errs.push(comm.all_reduce(&[1.0f32; 4], &mut out, ReduceOp::Sum).unwrap_err());
        errs.push(comm.reduce_scatter(&[1.0f32; 5], &mut out, ReduceOp::Sum).unwrap_err());
        errs.push(comm.broadcast(&[1.0f32; 3], &mut out, 7).unwrap_err());
        errs.push(comm.send(&[1u8], 2).unwrap_err());
        errs.push(comm.all_to_all(&[1u8; 3], &mut [0u8; 3]).unwrap_err());
        let ok = comm.all_reduce(&[1.0f32; 3], &mut out, ReduceOp::Sum).is_ok() && out == [2.0; 3];
        (errs.into_iter().map(|e| matches!(e, Error::InvalidArgument(_))).collect::<Vec<_>>(), ok)
    });
    for (kinds, ok) in got {
        assert!(kinds.iter().all(|&k| k), "{kinds:?}");
        assert!(ok);
    }
}

/// The errors the two ranks got. A rank that only sends may finish before its peer notices
/// (sends are eager), so not every rank need fail; at least one must.
fn mismatch(f: impl Fn(&mut Communicator) -> topoccl::Result<()> + Sync) -> Vec<Error> {
    let errs: Vec<Error> = common::on_ranks(2, &common::config(TransportPolicy::Auto, 20.0), |comm| f(comm).err())
        .into_iter()
        .flatten()
        .collect();
    assert!(!errs.is_empty(), "a mismatch went unnoticed");
    errs
}

#[test]
fn mismatched_calls_name_both_sides() {
    let errs = mismatch(|comm| {
        let mut out = vec![0f32; 10];
        if comm.rank() == 0 {
            comm.all_reduce(&[1.0f32; 10], &mut out, ReduceOp::Sum)
        } else {
            comm.all_gather(&[1.0f32; 5], &mut out)
        }
    });
    let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert!(
        errs.iter().any(|e| matches!(e.seen(), Error::Mismatch { .. }))
            && text.iter().any(|t| t.contains("all_reduce") && t.contains("all_gather")),
        "{text:?}"
    );

    let errs = mismatch(|comm| {
        let n = if comm.rank() == 0 { 10 } else { 12 };
        comm.all_reduce(&vec![1u32; n], &mut vec![0; n], ReduceOp::Sum)
    });
    let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert!(text.iter().any(|t| t.contains("of 10 × uint32") && t.contains("of 12 × uint32")), "{text:?}");

    let errs = mismatch(|comm| {
        if comm.rank() == 0 {
            comm.broadcast_in_place(&mut [0f64; 8], 0)
        } else {
            comm.broadcast_in_place(&mut [0i64; 8], 0)
        }
    });
    let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert!(text.iter().any(|t| t.contains("double") && t.contains("int64")), "{text:?}");

    let errs = mismatch(|comm| {
        let n = if comm.rank() == 0 { 4 } else { 6 };
        if comm.rank() == 0 {
            comm.send(&vec![1u16 as u8; n], 1)
        } else {
            comm.recv(&mut vec![0u8; n], 0)
        }
    });
    assert!(errs.iter().any(|e| e.to_string().contains("send/recv")), "{errs:?}");
}

#[test]
fn a_rank_that_never_calls_times_out_naming_it() {
    let c = common::config(TransportPolicy::Auto, 1.0);
    let got = common::on_ranks(2, &c, |comm| {
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(2500));
            return None;
        }
        let t = Instant::now();
        let e = comm.all_reduce(&[1.0f32; 100], &mut [0.0; 100], ReduceOp::Sum).unwrap_err();
        // Refused afterwards.
        let again = comm.all_reduce(&[1.0f32; 100], &mut [0.0; 100], ReduceOp::Sum).unwrap_err();
        Some((e, t.elapsed(), again))
    });
    let (e, took, again) = got.into_iter().next().flatten().unwrap();
    assert!(matches!(e.seen(), Error::Timeout { .. }), "{e}");
    // The ranks share a process (and its watch service): rank 1 itself answers, idle.
    assert!(e.to_string().contains("rank 1 has not started call #0"), "{e}");
    assert!(took < Duration::from_millis(2000), "{took:?}");
    assert!(matches!(again, Error::Broken(_)), "{again}");
}

#[test]
fn abort_unblocks_a_waiting_call() {
    let got = common::on_ranks(2, &cfg(), |comm| {
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1500));
            return None;
        }
        let h = comm.abort_handle();
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                h.abort();
            });
            let e = comm.all_reduce(&[1u8; 10], &mut [0; 10], ReduceOp::Sum).unwrap_err();
            Some((e, t.elapsed()))
        })
    });
    let (e, took) = got.into_iter().next().flatten().unwrap();
    assert!(matches!(e, Error::Aborted), "{e}");
    assert!(took < Duration::from_millis(1200), "{took:?}");
}

#[test]
fn strangers_at_the_rendezvous_are_ignored() {
    let id = UniqueId::new().unwrap();
    let mut s = std::net::TcpStream::connect(id.root_addr()).unwrap();
    s.write_all(&[0x42; 64]).unwrap();
    let id2 = UniqueId::from_bytes(&id.to_bytes()).unwrap();
    let sums: Vec<u64> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2u32)
            .map(|r| {
                let id = id2.clone();
                sc.spawn(move || {
                    let comm = Communicator::init_with(&id, r, 2, cfg()).unwrap();
                    let mut out = [0u64];
                    comm.all_reduce(&[u64::from(r) + 1], &mut out, ReduceOp::Sum).unwrap();
                    out[0]
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, [3, 3]);
}

#[test]
fn init_without_the_other_ranks_fails_with_a_clear_message() {
    let id = UniqueId::new().unwrap();
    let t = Instant::now();
    let e = Communicator::init_with(&id, 0, 2, common::config(TransportPolicy::Auto, 1.0)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(e.to_string().contains("rendezvous"), "{e}");
}

//! How point-to-point messages find their receives: tags (streams of their own, matched out of
//! order), receives from any source (the first message any peer sent, its source reported),
//! and what follows them staying in step.

mod common;

use std::time::{Duration, Instant};

use topoccl::{Error, ReduceOp, Source, TransportPolicy, MAX_TAG};

const TRANSPORTS: [TransportPolicy; 2] = [TransportPolicy::Tcp, TransportPolicy::Shm];

#[test]
fn tagged_messages_match_their_tag_whatever_the_order_they_were_sent_in() {
    for transport in TRANSPORTS {
        let c = common::config(transport, 30.0);
        let got = common::on_ranks(2, &c, |comm| {
            // Large enough to be sliced, and to fill a shared-memory ring behind it.
            let big: Vec<i64> = (0..2_000_003).collect();
            if comm.rank() == 0 {
                let mut g = comm.group();
                g.send_tagged(&big, 1, 5).unwrap();
                g.end().unwrap();
                let mut g = comm.group();
                g.send_tagged(&[7i64; 3], 1, 7).unwrap();
                g.end().unwrap();
                comm.send(&[1i64, 2], 1).unwrap();
                None
            } else {
                // Untagged first, then tag 7, then tag 5: each takes its own message.
                let (mut plain, mut seven, mut five) = ([0i64; 2], [0i64; 3], vec![0i64; big.len()]);
                comm.recv(&mut plain, 0).unwrap();
                let mut g = comm.group();
                g.recv_tagged(&mut seven, Source::Rank(0), 7, None).unwrap();
                g.end().unwrap();
                let mut g = comm.group();
                g.recv_tagged(&mut five, Source::Rank(0), 5, None).unwrap();
                g.end().unwrap();
                Some((plain, seven, five == big))
            }
        });
        assert_eq!(got[1], Some(([1, 2], [7; 3], true)), "{transport:?}");
    }
}

#[test]
fn a_receive_from_any_source_takes_every_senders_messages_and_names_them() {
    for transport in TRANSPORTS {
        let c = common::config(transport, 30.0);
        let got = common::on_ranks(4, &c, |comm| {
            let (n, r) = (comm.nranks(), comm.rank());
            // Small ones, then sliced ones (a sliced message comes whole from its one source),
            // each size on a tag of its own: a receive from any source takes any message of its
            // tag, so one sender's large one may come before another's small one.
            let lens = [3usize, 600_001];
            let tag = |len: usize| if len == 3 { 9 } else { 10 };
            let mut seen = Vec::new();
            if r == 0 {
                for len in lens {
                    for _ in 0..2 * (n - 1) {
                        let mut buf = vec![-1i32; len];
                        let from = comm.recv_from_any(&mut buf, tag(len)).unwrap();
                        let whole = buf.iter().enumerate().all(|(i, &v)| v == (from * 1000) as i32 + (i % 7) as i32);
                        seen.push((len, from, whole));
                    }
                }
            } else {
                for len in lens {
                    let mine: Vec<i32> = (0..len).map(|i| (r * 1000) as i32 + (i % 7) as i32).collect();
                    for _ in 0..2 {
                        let mut g = comm.group();
                        g.send_tagged(&mine, 0, tag(len)).unwrap();
                        g.end().unwrap();
                    }
                }
            }
            // Ordered receives and collectives carry on in step afterwards.
            let mut back = [0u32];
            if r == 0 {
                for p in 1..n {
                    comm.recv(&mut back, p).unwrap();
                    assert_eq!(back, [p]);
                }
            } else {
                comm.send(&[r], 0).unwrap();
            }
            let mut sum = [0u32];
            comm.all_reduce(&[r], &mut sum, ReduceOp::Sum).unwrap();
            (seen, sum[0])
        });
        assert!(got.iter().all(|(_, s)| *s == 6), "{transport:?}");
        let seen = &got[0].0;
        for len in [3usize, 600_001] {
            let mut froms: Vec<u32> = seen.iter().filter(|s| s.0 == len).map(|s| s.1).collect();
            froms.sort_unstable();
            assert_eq!(froms, [1, 1, 2, 2, 3, 3], "{transport:?} {len}");
        }
        assert!(seen.iter().all(|s| s.2), "{transport:?}: {seen:?}");
    }
}

#[test]
fn a_receive_from_any_source_beside_a_send_in_one_group_does_not_deadlock() {
    let got = common::on_ranks(2, &common::config(TransportPolicy::Auto, 30.0), |comm| {
        let r = comm.rank();
        let mut buf = [0u64; 4];
        let mut source = u32::MAX;
        let mine = [u64::from(r) + 10; 4];
        let mut g = comm.group();
        g.send_tagged(&mine, 1 - r, 3).unwrap();
        g.recv_tagged(&mut buf, Source::Any, 3, Some(&mut source)).unwrap();
        g.end().unwrap();
        (buf, source)
    });
    assert_eq!(got, vec![([11; 4], 1), ([10; 4], 0)]);
}

#[test]
fn bad_tags_and_racing_receives_are_refused_and_leave_the_communicator_usable() {
    let got = common::on_ranks(2, &common::config(TransportPolicy::Auto, 30.0), |comm| {
        let mut errs = Vec::new();
        let mut a = [0u8; 2];
        let mut b = [0u8; 2];
        let mut g = comm.group();
        errs.push(g.send_tagged(&[1u8], 1 - comm.rank(), MAX_TAG + 1).unwrap_err());
        g.recv_tagged(&mut a, Source::Any, 4, None).unwrap();
        g.recv_tagged(&mut b, Source::Rank(1 - comm.rank()), 4, None).unwrap();
        errs.push(g.end().unwrap_err());
        // A send to itself pairs, in order, with a receive from itself of the same tag.
        let me = comm.rank();
        let mut g = comm.group();
        g.send_tagged(&[1u8, 2], me, 1).unwrap();
        g.recv_tagged(&mut a, Source::Rank(me), 2, None).unwrap();
        errs.push(g.end().unwrap_err());
        let mut sum = [0u8];
        comm.all_reduce(&[1u8], &mut sum, ReduceOp::Sum).unwrap();
        (errs.iter().map(|e| matches!(e, Error::InvalidArgument(_))).collect::<Vec<_>>(), sum[0])
    });
    assert_eq!(got, vec![(vec![true, true, true], 2); 2]);
    // Alone, no rank could ever send one.
    let alone = common::on_ranks(1, &common::config(TransportPolicy::Auto, 30.0), |comm| {
        comm.recv_from_any(&mut [0u8; 1], 0).unwrap_err()
    });
    assert!(matches!(alone[0], Error::InvalidArgument(_)), "{}", alone[0]);
}

#[test]
fn a_receive_from_any_source_fails_at_the_timeout_or_when_every_peer_has_gone() {
    // Nobody sends: the timeout, not a hang.
    let c = common::config(TransportPolicy::Auto, 1.0);
    let got = common::on_ranks(2, &c, |comm| {
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_secs(3));
            return None;
        }
        let t = Instant::now();
        let e = comm.recv_from_any(&mut [0u8; 4], 0).unwrap_err();
        Some((e, t.elapsed()))
    });
    let (e, took) = got[0].as_ref().unwrap();
    assert!(matches!(e, Error::Timeout { .. } | Error::Fault { .. }), "{e}");
    assert!(e.to_string().contains("any rank"), "{e}");
    assert!(*took >= Duration::from_secs(1) && *took < Duration::from_secs(3), "{took:?}");
    // The peer leaves: at once.
    let got = common::on_ranks(2, &common::config(TransportPolicy::Tcp, 30.0), |comm| {
        if comm.rank() == 1 {
            return None;
        }
        let t = Instant::now();
        let e = comm.recv_from_any(&mut [0u8; 4], 0).unwrap_err();
        Some((e, t.elapsed()))
    });
    let (e, took) = got[0].as_ref().unwrap();
    assert!(matches!(e, Error::PeerFailed { .. } | Error::Fault { .. }), "{e}");
    assert!(*took < Duration::from_secs(10), "{took:?}");
}

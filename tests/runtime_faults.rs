//! Faults injected into real connections (`topoccl_transports::fault`, put around a rank's
//! connections through the transport table's wrapper): a peer whose connection drops, a
//! corrupted message header, a link that stops moving. Every rank must end with an error that
//! says what happened, promptly, and no rank may hang or report success.

mod common;
mod verbs_standin;

use std::sync::Arc;
use std::time::{Duration, Instant};

use topoccl::transports::fault::{Fault, Faulty};
use topoccl::transports::{Connection, TransportTable};
use topoccl::{Config, Error, ReduceOp, TransportPolicy};

/// Rank 0's connection to rank 1 suffers `fault`; every other connection is sound.
fn with_fault(transport: TransportPolicy, timeout_s: f64, fault: Fault) -> impl Fn(u32) -> Config + Sync {
    move |r| {
        let mut cfg = match transport {
            TransportPolicy::Ib => verbs_standin::config(timeout_s),
            _ => common::config(transport, timeout_s),
        };
        if r == 0 {
            let wrap = move |peer: u32, c: Box<dyn Connection>| -> Box<dyn Connection> {
                if peer == 1 {
                    Box::new(Faulty::new(c, fault))
                } else {
                    c
                }
            };
            cfg.transports = TransportTable::new().wrapped(Arc::new(wrap));
        }
        cfg
    }
}

/// A 3-rank all-reduce large enough to need many messages; each rank's error and how long it
/// took to come.
fn all_reduce_under(cfg: impl Fn(u32) -> Config + Sync) -> Vec<(Option<Error>, Duration)> {
    common::on_ranks_with(3, cfg, |comm| {
        let send = vec![1.0f32; 1 << 20];
        let mut recv = vec![0.0f32; 1 << 20];
        let t = Instant::now();
        let mut first = None;
        // A few calls: the fault may strike in the first or a later one.
        for _ in 0..4 {
            if let Err(e) = comm.all_reduce(&send, &mut recv, ReduceOp::Sum) {
                first = Some(e);
                break;
            }
        }
        (first, t.elapsed())
    })
}

#[test]
fn a_connection_that_drops_mid_call_fails_every_rank_promptly() {
    for transport in [TransportPolicy::Tcp, TransportPolicy::Shm, TransportPolicy::Ib] {
        let got = all_reduce_under(with_fault(transport, 30.0, Fault::CloseAfter(5)));
        for (r, (e, took)) in got.iter().enumerate() {
            let e = e.as_ref().unwrap_or_else(|| panic!("rank {r} over {transport:?} finished despite the fault"));
            assert!(
                matches!(e.seen(), Error::PeerFailed { .. } | Error::Transport { .. } | Error::Broken(_)),
                "rank {r} over {transport:?}: {e}"
            );
            assert!(*took < Duration::from_secs(10), "rank {r} over {transport:?} took {took:?}: {e}");
        }
    }
}

#[test]
fn a_corrupted_header_is_a_mismatch_not_wrong_data() {
    let got = all_reduce_under(with_fault(TransportPolicy::Tcp, 30.0, Fault::CorruptMeta(0)));
    // Rank 1 reads the corrupted message; every rank fails (its failure closes its
    // connections, which reaches the others).
    let (e1, _) = &got[1];
    let e1 = e1.as_ref().expect("rank 1 accepted a corrupted message");
    assert!(matches!(e1.seen(), Error::Mismatch { .. }), "{e1}");
    assert!(e1.to_string().contains("not from a topoccl call"), "{e1}");
    assert!(got.iter().all(|(e, _)| e.is_some()), "a rank finished: {got:?}");
}

#[test]
fn a_link_that_stops_moving_times_out_naming_who_waits() {
    for transport in [TransportPolicy::Tcp, TransportPolicy::Ib] {
        stalled_link_times_out(transport);
    }
}

fn stalled_link_times_out(transport: TransportPolicy) {
    let got = all_reduce_under(with_fault(transport, 1.5, Fault::StallAfter(2)));
    let timeouts: Vec<&Error> =
        got.iter().filter_map(|(e, _)| e.as_ref()).filter(|e| matches!(e.seen(), Error::Timeout { .. })).collect();
    assert!(!timeouts.is_empty(), "{got:?}");
    for e in &timeouts {
        let text = e.to_string();
        assert!(text.contains("all_reduce") && text.contains("waits for"), "{transport:?}: {text}");
    }
    for (r, (e, took)) in got.iter().enumerate() {
        assert!(e.is_some(), "rank {r} over {transport:?} finished over a dead link");
        assert!(*took < Duration::from_secs(8), "rank {r} over {transport:?} took {took:?}");
    }
}

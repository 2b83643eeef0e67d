//! The transport table: a user's transport is asked first and connects the pairs it can; one
//! that declines during set-up hands the pair's streams on to the next; the built-in policy
//! still applies after them.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use topoccl::transports::tcp::TcpTransport;
use topoccl::transports::{Connected, Locality, PeerSetup, Result, Transport, TransportTable};
use topoccl::{ReduceOp, TransportPolicy};

/// TCP, as a user's transport: it connects the pairs whose lower rank is even and declines
/// the others during set-up (it is made for one rank, `me`, so both sides know the pair).
struct Even {
    me: u32,
    made: Arc<AtomicUsize>,
}

impl Transport for Even {
    fn name(&self) -> &'static str {
        "user-tcp"
    }
    fn can_connect(&self, _: &Locality, _: &Locality) -> bool {
        true
    }
    fn connect(&self, setup: PeerSetup) -> Result<Connected> {
        if self.me.min(setup.rank) % 2 == 1 {
            return Ok(Connected::Declined { setup, why: "odd pair".into() });
        }
        self.made.fetch_add(1, Ordering::Relaxed);
        TcpTransport { sockets: 1 }.connect(setup)
    }
}

#[test]
fn user_transports_come_first_and_declined_pairs_go_down_the_table() {
    let made = Arc::new(AtomicUsize::new(0));
    let cfg = |r: u32| {
        let mut cfg = common::config(TransportPolicy::Shm, 60.0);
        cfg.transports = TransportTable::new().try_with(Arc::new(Even { me: r, made: made.clone() })).unwrap();
        cfg
    };
    let got = common::on_ranks_with(4, cfg, |comm| {
        let mut v = [comm.rank() as u64 + 1];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        (v[0], comm.transports())
    });
    for (r, (sum, transports)) in got.iter().enumerate() {
        assert_eq!(*sum, 10);
        for (p, t) in transports.iter().enumerate() {
            let want = match (r.min(p), p == r) {
                (_, true) => None,
                (lower, _) if lower % 2 == 0 => Some("tcp"),
                _ => Some("shm"),
            };
            // The user's transport is TCP underneath, so it reports "tcp".
            assert_eq!(*t, want, "rank {r} to {p}: {transports:?}");
        }
    }
    // Pairs (0,1) (0,2) (0,3) (2,3) on both sides.
    assert_eq!(made.load(Ordering::Relaxed), 8);
}

#[test]
fn a_pair_no_transport_connects_is_an_error_naming_it() {
    let table = TransportTable::new();
    let (a, b) = (Locality::host(1), Locality::host(2));
    assert!(table.select(&a, &b).is_none());
    let setup = PeerSetup {
        streams: Vec::new(),
        creator: true,
        rank: 3,
        peer: "rank 3".into(),
        timeout: std::time::Duration::from_secs(1),
    };
    let e = table.connect(&a, &b, setup).err().expect("connected through an empty table").to_string();
    assert!(e.contains("rank 3") && e.contains("table is empty"), "{e}");
    // Shared memory cannot reach another host, so a shared-memory-only table has nothing either.
    let shm = TransportTable::new().try_with(Arc::new(topoccl::transports::shm::ShmTransport::default())).unwrap();
    assert!(shm.select(&a, &b).is_none() && shm.select(&a, &a).is_some());
}

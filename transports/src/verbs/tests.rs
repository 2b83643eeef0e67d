//! The verbs transport over the stand-in library (`standins/ibverbs`, opened by path in this
//! process: its emulated NIC connects two queue pairs of one process as it would two hosts).

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::*;
use crate::tcp::tests::socket_pairs;
use crate::testing::{recv, Kept};
use crate::{Message, Region, META_BYTES};

/// The stand-in's shared library, built if cargo has not yet.
fn standin() -> String {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe.parent().and_then(|d| d.parent()).expect("target/<profile>").to_path_buf();
    let lib: PathBuf = profile.join("libibverbs_standin.so");
    if !lib.exists() {
        let release = profile.file_name().is_some_and(|n| n == "release");
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "topoccl-standin-ibverbs"])
            .args(release.then_some("--release"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build of the stand-in");
        assert!(status.success(), "building the stand-in libibverbs failed");
    }
    lib.display().to_string()
}

fn transport(ring_bytes: usize) -> VerbsTransport {
    let settings = VerbsSettings { library: Some(standin()), ring_bytes, ..VerbsSettings::default() };
    VerbsTransport::open(&settings, 0, true).expect("the stand-in opens")
}

fn setup(stream: TcpStream, creator: bool) -> PeerSetup {
    PeerSetup {
        streams: vec![stream],
        creator,
        rank: u32::from(!creator),
        peer: format!("rank {}", u32::from(!creator)),
        timeout: Duration::from_secs(10),
    }
}

/// Two connected ends.
fn pair(ring_bytes: usize) -> (Box<dyn Connection>, Box<dyn Connection>) {
    let (a, b, _) = pair_of(&transport(ring_bytes));
    (a, b)
}

/// Two ends connected by `t`, and `t` (for its counts).
fn pair_of(t: &VerbsTransport) -> (Box<dyn Connection>, Box<dyn Connection>, VerbsCounts) {
    let (mut a, mut b) = socket_pairs(1);
    let (a, b) = (a.remove(0), b.remove(0));
    let connected = |r: Result<Connected>| match r.expect("connect") {
        Connected::Connection(c) => c,
        Connected::Declined { why, .. } => panic!("declined: {why}"),
    };
    std::thread::scope(|s| {
        let peer = s.spawn(|| connected(t.connect(setup(b, false))));
        let me = connected(t.connect(setup(a, true)));
        (me, peer.join().expect("peer thread"), t.counts())
    })
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Progresses both ends until `a` has received `want` messages of `tag` from `b`.
fn drain(a: &mut dyn Connection, b: &mut dyn Connection, tag: u32, want: usize) -> Vec<Message> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < want {
        assert!(Instant::now() < deadline, "only {} of {want} messages arrived", got.len());
        a.progress().expect("progress");
        b.progress().expect("progress");
        while let Some(m) = recv(a, tag) {
            got.push(m);
        }
    }
    got
}

#[test]
fn messages_of_every_size_cross_both_ways_through_a_small_ring() {
    let mut kept = Kept::default();
    let (mut a, mut b) = pair(64 << 10);
    assert_eq!(a.transport(), "ib");
    let sizes = [0usize, 1, 100, 4095, 4096, 70_000, 1 << 20, (3 << 20) + 7];
    for (i, &n) in sizes.iter().enumerate() {
        let meta = [i as u8; META_BYTES];
        kept.send(a.as_mut(), 5, &meta, &pattern(n, i as u8)).unwrap();
        kept.send(b.as_mut(), 6, &meta, &pattern(n, 100 + i as u8)).unwrap();
    }
    let at_b = drain(b.as_mut(), a.as_mut(), 5, sizes.len());
    let at_a = drain(a.as_mut(), b.as_mut(), 6, sizes.len());
    for (i, &n) in sizes.iter().enumerate() {
        assert_eq!(at_b[i].meta, [i as u8; META_BYTES]);
        assert!(at_b[i].data == pattern(n, i as u8), "message {i} ({n} B) a→b differs");
        assert!(at_a[i].data == pattern(n, 100 + i as u8), "message {i} ({n} B) b→a differs");
    }
}

#[test]
fn a_closed_peer_is_noticed() {
    let (mut a, mut b) = pair(64 << 10);
    b.close();
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.closed().is_none() {
        assert!(Instant::now() < deadline, "the peer's close went unnoticed");
        let _ = a.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_peer_that_cannot_set_up_declines_and_the_stream_stays_usable() {
    let t = transport(64 << 10);
    let (mut a, mut b) = socket_pairs(1);
    let (a, mut b) = (a.remove(0), b.remove(0));
    let fake = std::thread::spawn(move || {
        let mut theirs = [0u8; RECORD_BYTES];
        b.read_exact(&mut theirs).unwrap();
        assert_eq!(decode(&theirs, "rank 0").unwrap().map(|r| r.ring.len), Some(64 << 10));
        b.write_all(&encode(None)).unwrap();
        b.write_all(b"after").unwrap();
        b
    });
    match t.connect(setup(a, true)).expect("connect") {
        Connected::Declined { mut setup, why } => {
            assert!(why.contains("could not set up"), "{why}");
            let mut after = [0u8; 5];
            setup.streams[0].read_exact(&mut after).unwrap();
            assert_eq!(&after, b"after");
        }
        Connected::Connection(_) => panic!("connected to a peer that could not set up"),
    }
    fake.join().unwrap();
}

#[test]
fn records_round_trip_and_impossible_rings_are_refused() {
    let r = Record {
        endpoint: Endpoint { qpn: 77, lid: 3, gid: ibv_gid { raw: [9; 16] }, link_layer: 2, mtu: 5 },
        ring: RemoteRing { addr: 0x1000, rkey: 42, len: 1 << 20 },
        odp: true,
    };
    assert_eq!(decode(&encode(Some(&r)), "p").unwrap(), Some(r));
    assert_eq!(decode(&encode(None), "p").unwrap(), None);
    let mut tiny = encode(Some(&r));
    tiny[45..53].copy_from_slice(&16u64.to_le_bytes());
    assert!(decode(&tiny, "p").is_err());
    let mut foreign = encode(Some(&r));
    foreign[0] = b'X';
    assert!(decode(&foreign, "p").is_err());
}

#[test]
fn the_port_is_described_with_the_dmabuf_probe_answer() {
    let d = transport(64 << 10).describe();
    // The stand-in answers as rdma-core without kernel dma-buf support does.
    assert!(
        d.starts_with("mlx5_0:1 (RoCE, GID 1, MTU 4096; host receives offered (on-demand paging); no dma-buf: ibv_reg_dmabuf_mr: Operation not supported"),
        "{d}"
    );
    assert!(d.ends_with("libibverbs_standin.so"), "{d}");
}

/// Progresses both ends for a while.
fn settle(a: &mut dyn Connection, b: &mut dyn Connection) {
    for _ in 0..200 {
        a.progress().expect("progress");
        b.progress().expect("progress");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `b` receives the next message of `tag`: its region (where it lay) and bytes.
fn received(a: &mut dyn Connection, b: &mut dyn Connection, tag: u32) -> (Region, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "nothing arrived");
        a.progress().expect("progress");
        b.progress().expect("progress");
        let mut got = None;
        b.recv_with(tag, &mut |_, r| got = Some((r, crate::testing::bytes(r)))).expect("recv");
        if let Some(g) = got {
            return g;
        }
    }
}

#[test]
fn offered_receives_are_written_in_place_and_late_offers_go_unused() {
    let mut kept = Kept::default();
    let t = transport(256 << 10);
    let (mut a, mut b, _) = pair_of(&t);
    assert!(a.one_sided() && b.one_sided());
    let mut dst = vec![0u8; 1 << 20];
    let region = Region::of_mut(&mut dst);
    // SAFETY: `dst` lives to the end of the test, untouched until the message is received.
    unsafe { b.offer(3, region).unwrap() };
    settle(a.as_mut(), b.as_mut());
    let ticket = kept.send(a.as_mut(), 3, &[1; META_BYTES], &pattern(1 << 20, 7)).unwrap();
    let (at, bytes) = received(a.as_mut(), b.as_mut(), 3);
    assert_eq!(at, region, "handed over where it was offered");
    assert!(bytes == pattern(1 << 20, 7));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.sent(ticket) {
        assert!(Instant::now() < deadline, "the write never completed");
        a.progress().unwrap();
    }
    // Sent before the receiver offered: the offer comes too late and goes unused.
    kept.send(a.as_mut(), 3, &[2; META_BYTES], &pattern(1 << 20, 9)).unwrap();
    settle(a.as_mut(), b.as_mut());
    let mut dst2 = vec![0u8; 1 << 20];
    // SAFETY: as above.
    unsafe { b.offer(3, Region::of_mut(&mut dst2)).unwrap() };
    let (at, bytes) = received(a.as_mut(), b.as_mut(), 3);
    assert_ne!(at.addr, dst2.as_ptr() as usize);
    assert!(bytes == pattern(1 << 20, 9));
    // The next message is not written into that stale offer either.
    kept.send(a.as_mut(), 3, &[3; META_BYTES], &pattern(1 << 20, 11)).unwrap();
    let (_, bytes) = received(a.as_mut(), b.as_mut(), 3);
    assert!(bytes == pattern(1 << 20, 11));
    assert!(dst2.iter().all(|&x| x == 0), "a stale offer was written");
    let c = t.counts();
    assert_eq!((c.direct_messages, c.ring_messages, c.offers), (1, 2, 2), "{c:?}");
}

#[test]
fn a_closed_receiver_is_not_written() {
    let mut kept = Kept::default();
    let (mut a, mut b) = pair(256 << 10);
    let mut dst = vec![0u8; 1 << 20];
    // SAFETY: `dst` lives to the end of the test.
    unsafe { b.offer(4, Region::of_mut(&mut dst)).unwrap() };
    settle(a.as_mut(), b.as_mut());
    b.close();
    // The sender still holds the offer (it has not seen the close) and writes into it.
    let _ = kept.send(a.as_mut(), 4, &[0; META_BYTES], &pattern(1 << 20, 5));
    for _ in 0..200 {
        let _ = a.progress();
        std::thread::sleep(Duration::from_micros(500));
    }
    assert!(dst.iter().all(|&x| x == 0), "a write landed after the receiver closed");
}

//! The IPC protocol on host memory ([`device::host::HostDevice`]): both ranks in this process,
//! so the windows are reached by address (the handle path is the core crate's stand-in tests).

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::device::host::HostDevice;
use super::*;
use crate::{Connection, MemSpace, Meta, Region, META_BYTES};

fn id(ordinal: u32, family: u8) -> DeviceId {
    DeviceId { uuid: [family; 16], pci_bus: u64::from(ordinal), ordinal }
}

fn transport(window_bytes: usize) -> IpcTransport {
    IpcTransport::new(
        Arc::new(HostDevice::new(id(0, 1))),
        window_bytes,
        ShmTransport { ring_bytes: 1 << 16, direct: false },
    )
}

fn setups() -> (PeerSetup, PeerSetup) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let b = l.accept().unwrap().0;
    let t = Duration::from_secs(10);
    (
        PeerSetup { streams: vec![a], creator: true, rank: 1, peer: "rank 1".into(), timeout: t },
        PeerSetup { streams: vec![b], creator: false, rank: 0, peer: "rank 0".into(), timeout: t },
    )
}

fn pair(a: &IpcTransport, b: &IpcTransport) -> (Result<Connected>, Result<Connected>) {
    let (sa, sb) = setups();
    std::thread::scope(|s| {
        let h = s.spawn(|| b.connect(sb));
        (a.connect(sa), h.join().unwrap())
    })
}

fn connected(c: Result<Connected>) -> Box<dyn Connection> {
    match c.unwrap() {
        Connected::Connection(c) => c,
        Connected::Declined { why, .. } => panic!("declined: {why}"),
    }
}

fn meta(n: u8) -> Meta {
    [n; META_BYTES]
}

/// "Device" memory of the host stand-in: a region of space `Device(0)` over host bytes.
fn dev(v: &[u8]) -> Region {
    Region::new(MemSpace::Device(0), v.as_ptr() as usize, v.len())
}

/// Receives the next message of `tag`, copied, progressing both sides until it comes; releases
/// it when `release`.
fn recv(rx: &mut dyn Connection, tx: &mut dyn Connection, tag: u32, release: bool) -> (Meta, MemSpace, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        tx.progress().unwrap();
        rx.progress().unwrap();
        let mut got = None;
        let ok = rx
            .recv_with(tag, &mut |m, r| {
                // SAFETY: host memory (the host stand-in's "device" too), valid for the call.
                got = Some((*m, r.space, unsafe { std::slice::from_raw_parts(r.addr as *const u8, r.len) }.to_vec()));
            })
            .unwrap();
        if ok {
            if release {
                rx.release();
            }
            return got.unwrap();
        }
        assert!(Instant::now() < deadline, "message of tag {tag} never came");
    }
}

#[test]
fn device_and_host_messages_keep_their_order_per_tag_and_arrive_exact() {
    let t = transport(1 << 16);
    let (a, b) = pair(&t, &t);
    let (mut a, mut b) = (connected(a), connected(b));
    assert_eq!(a.transport(), "cuda-ipc");
    assert!(a.lends() && a.reaches(MemSpace::Device(0)) && a.reaches(MemSpace::Host));
    assert!(!a.reaches(MemSpace::Device(1)));
    let payloads: Vec<Vec<u8>> =
        (0..12u8).map(|i| (0..1000 + i as usize * 37).map(|j| (j as u8) ^ i).collect()).collect();
    // Tags 1 and 2 interleaved, device and host messages mixed within each tag.
    for (i, p) in payloads.iter().enumerate() {
        let region = if i % 3 == 0 { Region::of(p) } else { dev(p) };
        // SAFETY: the payloads outlive both connections' use of them (received below).
        unsafe { a.send(1 + (i % 2) as u32, &meta(i as u8), region) }.unwrap();
    }
    for tag in [2u32, 1] {
        for (i, p) in payloads.iter().enumerate().filter(|(i, _)| 1 + (i % 2) as u32 == tag) {
            let (m, space, bytes) = recv(&mut *b, &mut *a, tag, true);
            assert_eq!(m, meta(i as u8));
            assert_eq!(space, if i % 3 == 0 { MemSpace::Host } else { MemSpace::Device(0) });
            assert_eq!(&bytes, p, "message {i}");
        }
    }
}

#[test]
fn a_full_window_holds_sends_back_until_released_in_window_order() {
    // Room for two 512-byte messages.
    let t = transport(1024);
    let (a, b) = pair(&t, &t);
    let (mut a, mut b) = (connected(a), connected(b));
    let data: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 1; 512]).collect();
    // SAFETY: the payloads outlive the connections' use of them.
    let tickets: Vec<_> = [(1u32, 0usize), (2, 1), (2, 2)]
        .iter()
        .map(|&(tag, i)| unsafe { a.send(tag, &meta(i as u8), dev(&data[i])) }.unwrap())
        .collect();
    a.progress().unwrap();
    assert!(a.backlog() >= 512, "the third message must wait for room");
    // Tag 2's first message is second in the window: releasing it frees nothing yet.
    let (_, _, got) = recv(&mut *b, &mut *a, 2, true);
    assert_eq!(got, data[1]);
    for _ in 0..100 {
        a.progress().unwrap();
    }
    assert!(a.backlog() >= 512, "space was given back out of window order");
    assert!(!a.sent(tickets[2]));
    let (_, _, got) = recv(&mut *b, &mut *a, 1, true);
    assert_eq!(got, data[0]);
    let (_, _, got) = recv(&mut *b, &mut *a, 2, true);
    assert_eq!(got, data[2]);
    a.progress().unwrap();
    assert_eq!(a.backlog(), 0);
    assert!(tickets.iter().all(|&t| a.sent(t)));
}

#[test]
fn an_unreleased_window_stops_the_sender_and_a_release_restarts_it() {
    let t = transport(1024);
    let (a, b) = pair(&t, &t);
    let (mut a, mut b) = (connected(a), connected(b));
    let data: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; 1000]).collect();
    for (i, d) in data.iter().enumerate() {
        // SAFETY: the payloads outlive the connections' use of them.
        unsafe { a.send(3, &meta(i as u8), dev(d)) }.unwrap();
    }
    // Each message takes the whole window: one at a time, each only after the last's release.
    for (i, d) in data.iter().enumerate() {
        let (m, _, got) = recv(&mut *b, &mut *a, 3, false);
        assert_eq!((m, &got), (meta(i as u8), d));
        for _ in 0..50 {
            a.progress().unwrap();
            let mut more = false;
            b.recv_with(3, &mut |_, _| more = true).unwrap();
            assert!(!more, "a message landed in window space still lent");
        }
        b.release();
    }
}

#[test]
fn reserved_tags_foreign_memory_and_oversized_messages_are_refused() {
    let t = transport(1024);
    let (a, b) = pair(&t, &t);
    let (mut a, _b) = (connected(a), connected(b));
    let v = vec![0u8; 2048];
    // SAFETY: refused before any memory is read.
    unsafe {
        assert!(a.send(DEVICE_BIT | 1, &meta(0), Region::of(&v[..8])).is_err());
        assert!(a.send(1, &meta(0), Region::new(MemSpace::Device(3), v.as_ptr() as usize, 8)).is_err());
        let err = a.send(1, &meta(0), dev(&v)).unwrap_err().to_string();
        assert!(err.contains("TOPOCCL_IPC_BYTES"), "{err}");
    }
}

/// Fails every allocation: a device that cannot give the pair a window.
struct NoMemory(HostDevice);

impl DeviceAccess for NoMemory {
    fn device(&self) -> DeviceId {
        self.0.device()
    }
    fn can_reach(&self, peer: &DeviceId) -> bool {
        self.0.can_reach(peer)
    }
    fn enable_peer(&self, ordinal: u32) -> Result<()> {
        self.0.enable_peer(ordinal)
    }
    fn alloc(&self, _len: usize) -> Result<Box<dyn ExportedMemory>> {
        Err(Error::Unsupported("out of device memory".into()))
    }
    fn allocation(&self, addr: u64) -> Result<Option<crate::registration::Allocation>> {
        self.0.allocation(addr)
    }
    fn export(&self, base: u64) -> Result<Option<[u8; IPC_HANDLE_BYTES]>> {
        self.0.export(base)
    }
    fn open(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Box<dyn ImportedMemory>> {
        self.0.open(handle)
    }
    unsafe fn register(&self, addr: usize, len: usize) -> Result<Box<dyn RegisteredHost>> {
        // SAFETY: passed on under the same contract.
        unsafe { self.0.register(addr, len) }
    }
    fn queue(&self) -> Result<Box<dyn DeviceQueue>> {
        self.0.queue()
    }
}

#[test]
fn a_side_that_cannot_set_up_makes_both_decline_with_the_streams_intact() {
    let good = transport(1024);
    let bad = IpcTransport { access: Arc::new(NoMemory(HostDevice::new(id(0, 1)))), ..good.clone() };
    let (a, b) = pair(&good, &bad);
    for (c, who) in [(a, "rank 1 could not"), (b, "out of device memory")] {
        match c.unwrap() {
            Connected::Declined { why, setup } => {
                assert!(why.contains(who), "{why}");
                assert_eq!(setup.streams.len(), 1);
            }
            Connected::Connection(_) => panic!("a pair without a window connected"),
        }
    }
}

#[test]
fn pairs_connect_by_device_reach_on_one_host() {
    let t = transport(1024);
    let me = Locality { host: 7, pid: 1, device: Some(id(0, 1)), rdma: false };
    let near = Locality { host: 7, pid: 2, device: Some(id(1, 1)), rdma: false };
    let far = Locality { host: 7, pid: 2, device: Some(id(1, 2)), rdma: false };
    assert!(t.can_connect(&me, &near));
    assert!(!t.can_connect(&me, &far), "devices that cannot reach each other");
    assert!(!t.can_connect(&me, &Locality { host: 8, ..near }), "another host");
    assert!(!t.can_connect(&me, &Locality::host(7)), "a rank without a GPU");
    assert!(!t.can_connect(&Locality { device: Some(id(5, 1)), ..me }, &near), "not this transport's device");
}

/// A transport over its own host device, which the test tells about allocations.
fn with_device(window_bytes: usize) -> (IpcTransport, Arc<HostDevice>) {
    let d = Arc::new(HostDevice::new(id(0, 1)));
    (IpcTransport::new(d.clone(), window_bytes, ShmTransport { ring_bytes: 1 << 16, direct: false }), d)
}

fn allocate(d: &HostDevice, v: &[u8], buffer_id: u64) {
    let mut all = d.allocations.lock().unwrap();
    all.retain(|a| a.base != v.as_ptr() as u64);
    all.push(crate::registration::Allocation { base: v.as_ptr() as u64, len: v.len() as u64, buffer_id });
}

/// Lets the two sides read what the other wrote.
fn settle(a: &mut dyn Connection, b: &mut dyn Connection) {
    for _ in 0..4 {
        a.progress().unwrap();
        b.progress().unwrap();
    }
}

/// Receives the next message of `tag`: where it lay, and its bytes.
fn recv_where(rx: &mut dyn Connection, tx: &mut dyn Connection, tag: u32) -> (usize, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        tx.progress().unwrap();
        rx.progress().unwrap();
        let mut got = None;
        let ok = rx
            .recv_with(tag, &mut |_, r| {
                // SAFETY: host memory (the host stand-in's "device" too), valid for the call.
                got = Some((r.addr, unsafe { std::slice::from_raw_parts(r.addr as *const u8, r.len) }.to_vec()))
            })
            .unwrap();
        if ok {
            rx.release();
            return got.unwrap();
        }
        assert!(Instant::now() < deadline, "message of tag {tag} never came");
    }
}

/// A pair with 1 MiB windows where `b` offers: its transport, device and connection, and `a`'s.
struct Offering {
    ta: IpcTransport,
    tb: IpcTransport,
    db: Arc<HostDevice>,
    a: Box<dyn Connection>,
    b: Box<dyn Connection>,
}

fn offering() -> Offering {
    let (ta, _) = with_device(1 << 20);
    let (tb, db) = with_device(1 << 20);
    let (a, b) = pair(&ta, &tb);
    Offering { a: connected(a), b: connected(b), ta, tb, db }
}

const SLOT: usize = 64 << 10;

#[test]
fn offered_destinations_are_written_directly_through_one_cached_registration() {
    let Offering { ta, tb, db, mut a, mut b } = offering();
    assert!(b.one_sided());
    let dst = vec![0u8; 4 * SLOT];
    allocate(&db, &dst, 1);
    let src: Vec<u8> = (0..SLOT).map(|i| (i * 7 + 1) as u8).collect();
    for k in 0..4 {
        let slot = Region::new(MemSpace::Device(0), dst.as_ptr() as usize + k * SLOT, SLOT);
        // SAFETY: `dst` outlives the connections, and nothing else touches it meanwhile.
        unsafe { b.offer(5, slot) }.unwrap();
        settle(&mut *a, &mut *b);
        // SAFETY: `src` outlives the send.
        unsafe { a.send(5, &meta(k as u8), dev(&src)) }.unwrap();
        let (at, bytes) = recv_where(&mut *b, &mut *a, 5);
        assert_eq!(at, slot.addr, "message {k} was not put where it was offered: {:?} {:?}", ta.counts(), tb.counts());
        assert_eq!(bytes, src);
    }
    let (sent, offered) = (ta.counts(), tb.counts());
    assert_eq!((sent.direct_messages, sent.window_messages), (4, 0), "{sent:?}");
    assert_eq!((offered.offers, offered.announced, offered.revoked), (4, 1, 0), "{offered:?}");
    assert_eq!((offered.cache.registered, offered.cache.hits), (1, 3), "{offered:?}");
    assert_eq!(db.exports.load(std::sync::atomic::Ordering::Relaxed), 1, "one handle per buffer");
}

#[test]
fn a_buffer_freed_while_registered_is_registered_again_and_revoked_at_the_peer() {
    let Offering { ta, tb, db, mut a, mut b } = offering();
    let dst = vec![0u8; SLOT];
    for (round, buffer_id) in [1u64, 1, 2, 3].into_iter().enumerate() {
        // The "driver" says what lies at `dst` now: ids 2 and 3 are new allocations there.
        allocate(&db, &dst, buffer_id);
        let src = vec![round as u8 + 1; SLOT];
        // SAFETY: as above.
        unsafe { b.offer(6, dev(&dst)) }.unwrap();
        settle(&mut *a, &mut *b);
        // SAFETY: `src` outlives the send.
        unsafe { a.send(6, &meta(0), dev(&src)) }.unwrap();
        let (at, bytes) = recv_where(&mut *b, &mut *a, 6);
        assert_eq!(at, dst.as_ptr() as usize, "round {round}");
        assert!(bytes == src, "round {round}");
    }
    let c = tb.counts();
    assert_eq!((c.announced, c.revoked, c.cache.registered, c.cache.stale), (3, 2, 3, 2), "{c:?}");
    assert_eq!(ta.counts().direct_messages, 4);
}

#[test]
fn an_offer_seen_too_late_goes_unused() {
    let Offering { ta, db, mut a, mut b, .. } = offering();
    let dst = vec![0u8; SLOT];
    allocate(&db, &dst, 1);
    let src = vec![9u8; SLOT];
    // Message 0 is on its way before the offer for it is made.
    // SAFETY: `src` and `dst` outlive the connections' use of them.
    unsafe { a.send(7, &meta(0), dev(&src)) }.unwrap();
    // SAFETY: as above.
    unsafe { b.offer(7, dev(&dst)) }.unwrap();
    let (at, bytes) = recv_where(&mut *b, &mut *a, 7);
    assert_ne!(at, dst.as_ptr() as usize);
    assert_eq!(bytes, src);
    // Message 1 must not use the offer made for message 0.
    settle(&mut *a, &mut *b);
    // SAFETY: as above.
    unsafe { a.send(7, &meta(1), dev(&src)) }.unwrap();
    let (at, _) = recv_where(&mut *b, &mut *a, 7);
    assert_ne!(at, dst.as_ptr() as usize);
    assert!(dst.iter().all(|&x| x == 0), "the stale offer was written");
    assert_eq!(ta.counts().direct_messages, 0);
}

#[test]
fn a_closed_receiver_takes_its_offers_back() {
    let Offering { ta, db, mut a, mut b, .. } = offering();
    let dst = vec![0u8; SLOT];
    allocate(&db, &dst, 1);
    // SAFETY: `dst` outlives the connections.
    unsafe { b.offer(8, dev(&dst)) }.unwrap();
    settle(&mut *a, &mut *b);
    b.close();
    let src = vec![3u8; SLOT];
    // The sender holds the offer; the send itself may fail (the peer has gone), but must not
    // write the memory the closed side has taken back.
    // SAFETY: `src` outlives the send.
    let _ = unsafe { a.send(8, &meta(0), dev(&src)) };
    let _ = a.progress();
    assert!(dst.iter().all(|&x| x == 0), "a revoked offer was written");
    assert_eq!(ta.counts().direct_messages, 0);
}

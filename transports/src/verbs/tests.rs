//! The verbs transport over the stand-in library (`standins/ibverbs`, opened by path in this
//! process: its emulated NIC connects two queue pairs of one process as it would two hosts).

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::*;
use crate::tcp::tests::socket_pairs;
use crate::testing::{recv, Kept};
use crate::{Connection, MemSpace};
use crate::{Message, Region, META_BYTES};
use regions::Access;

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

fn verbs_settings(ring_bytes: usize) -> VerbsSettings {
    VerbsSettings { library: Some(standin()), ring_bytes, ..VerbsSettings::default() }
}

fn transport(ring_bytes: usize) -> VerbsTransport {
    VerbsTransport::open(&verbs_settings(ring_bytes), 0, true).expect("the stand-in opens")
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
    let t = transport(ring_bytes);
    pair_between(&t, &t)
}

/// Two connected ends, `a` made by `ta` and `b` by `tb`.
fn pair_between(ta: &VerbsTransport, tb: &VerbsTransport) -> (Box<dyn Connection>, Box<dyn Connection>) {
    let (mut a, mut b) = socket_pairs(1);
    let (a, b) = (a.remove(0), b.remove(0));
    let connected = |r: Result<Connected>| match r.expect("connect") {
        Connected::Connection(c) => c,
        Connected::Declined { why, .. } => panic!("declined: {why}"),
    };
    std::thread::scope(|s| {
        let peer = s.spawn(|| connected(tb.connect(setup(b, false))));
        let me = connected(ta.connect(setup(a, true)));
        (me, peer.join().expect("peer thread"))
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
        device: false,
        lanes: vec![],
    };
    assert_eq!(decode(&encode(Some(&r)), "p").unwrap(), Some(r.clone()));
    let d = Record { odp: false, device: true, lanes: (100..115).collect(), ..r.clone() };
    assert_eq!(decode(&encode(Some(&d)), "p").unwrap(), Some(d));
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
    // The stand-in registers dma-bufs unless told otherwise (TOPOCCL_STANDIN_IB_DMABUF=0: the
    // runtime_verbs fallback test reads the other answer).
    assert!(
        d.starts_with("mlx5_0:1 (RoCE, GID 1, MTU 4096; host receives offered (on-demand paging); GPU memory written and read by the NIC where the driver exports dma-bufs)"),
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
    let (mut a, mut b) = pair_between(&t, &t);
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

/// "Device" memory as the stand-in CUDA driver makes it: a memfd, mapped (here readable by
/// the test, where a device pointer would not be), whose dma-buf is the memfd reopened and
/// positioned at the exported range.
struct MemfdDevice {
    file: std::fs::File,
    map: usize,
    len: usize,
    buffer_id: u64,
    exports: std::sync::atomic::AtomicUsize,
    flushes: std::sync::atomic::AtomicUsize,
}

impl MemfdDevice {
    fn new(len: usize, buffer_id: u64) -> MemfdDevice {
        use std::os::fd::FromRawFd;
        // SAFETY: a fresh memfd, owned by the File; sized, then mapped shared.
        let file = unsafe { std::fs::File::from_raw_fd(libc::memfd_create(c"device".as_ptr(), libc::MFD_CLOEXEC)) };
        file.set_len(len as u64).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a shared mapping of the whole file.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        MemfdDevice {
            file,
            map: map as usize,
            len,
            buffer_id,
            exports: Default::default(),
            flushes: Default::default(),
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.map as *const u8, self.len) }
    }
}

impl Drop for MemfdDevice {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.len) };
    }
}

impl DeviceAccess for MemfdDevice {
    fn device(&self) -> crate::ipc::DeviceId {
        crate::ipc::DeviceId { uuid: [7; 16], pci_bus: 0, ordinal: 0 }
    }
    fn can_reach(&self, _: &crate::ipc::DeviceId) -> bool {
        false
    }
    fn enable_peer(&self, _: u32) -> Result<()> {
        Ok(())
    }
    fn alloc(&self, _: usize) -> Result<Box<dyn crate::ipc::ExportedMemory>> {
        Err(Error::Unsupported("test device".into()))
    }
    fn allocation(&self, addr: u64) -> Result<Option<crate::registration::Allocation>> {
        let inside = (self.map as u64..(self.map + self.len) as u64).contains(&addr);
        Ok(inside.then_some(crate::registration::Allocation {
            base: self.map as u64,
            len: self.len as u64,
            buffer_id: self.buffer_id,
        }))
    }
    fn export(&self, _: u64) -> Result<Option<[u8; crate::ipc::device::IPC_HANDLE_BYTES]>> {
        Ok(None)
    }
    fn open(&self, _: &[u8; crate::ipc::device::IPC_HANDLE_BYTES]) -> Result<Box<dyn crate::ipc::ImportedMemory>> {
        Err(Error::Unsupported("test device".into()))
    }
    unsafe fn register(&self, _: usize, _: usize) -> Result<Box<dyn crate::ipc::RegisteredHost>> {
        Err(Error::Unsupported("test device".into()))
    }
    fn queue(&self) -> Result<Box<dyn crate::ipc::DeviceQueue>> {
        Err(Error::Unsupported("test device".into()))
    }
    fn dmabuf(&self, base: u64, len: u64) -> Result<Option<std::os::fd::OwnedFd>> {
        use std::io::Seek;
        use std::os::fd::AsRawFd;
        assert_eq!((base % 4096, len % 4096), (0, 0), "dma-buf ranges are page aligned");
        let off = base - self.map as u64;
        assert!(off + len <= self.len as u64);
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
            .unwrap();
        f.seek(std::io::SeekFrom::Start(off)).unwrap();
        self.exports.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(f.into()))
    }
    fn flush_rdma_writes(&self) -> Result<()> {
        self.flushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

#[test]
fn device_receives_are_written_through_dma_buf_and_registered_once_per_allocation() {
    let mut kept = Kept::default();
    let plain = transport(256 << 10);
    let device = Arc::new(MemfdDevice::new(4 << 20, 1));
    let with_gpu = plain.for_pairs(true, 1).with_device(Some(device.clone()));
    let (mut a, mut b) = pair_between(&plain, &with_gpu);
    assert!(b.offers_into(MemSpace::Device(0)) && !b.offers_into(MemSpace::Device(1)));
    assert!(!b.reaches(MemSpace::Device(0)), "sends from device memory are staged");
    assert!(!a.offers_into(MemSpace::Device(0)), "the side without a GPU offers none");
    for (i, at) in [(0u8, 4096usize), (1, 1 << 20), (2, 3 << 20)] {
        let dst = Region::new(MemSpace::Device(0), device.map + at, 1 << 20);
        // SAFETY: inside the "device" mapping, which outlives the connections; nothing else
        // touches it until the message is received.
        unsafe { b.offer(5, dst).unwrap() };
        settle(a.as_mut(), b.as_mut());
        kept.send(a.as_mut(), 5, &[i; META_BYTES], &pattern(1 << 20, 40 + i)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut got = None;
        while got.is_none() {
            assert!(Instant::now() < deadline, "nothing arrived");
            a.progress().unwrap();
            b.progress().unwrap();
            b.recv_with(5, &mut |_, r| got = Some(r)).unwrap();
        }
        assert_eq!(got, Some(dst), "handed over where it was offered, in device memory");
        assert!(device.bytes()[at..at + (1 << 20)] == pattern(1 << 20, 40 + i));
    }
    let c = with_gpu.counts();
    assert_eq!((c.offers, c.device_registrations), (3, 1), "{c:?}");
    assert_eq!(plain.counts().direct_messages, 3);
    assert_eq!(device.exports.load(std::sync::atomic::Ordering::Relaxed), 1, "one registration per allocation");
    assert_eq!(device.flushes.load(std::sync::atomic::Ordering::Relaxed), 3, "each message flushed before use");
}

#[test]
fn a_freed_and_reallocated_device_buffer_is_registered_anew() {
    let plain = transport(256 << 10);
    let first = MemfdDevice::new(1 << 20, 1);
    let regions = &plain.nic.regions;
    let pd = &plain.nic.pd;
    let a = regions.cover_device(pd, &first, first.map + 64, 4096, Access::Write).unwrap().expect("registered");
    let again = regions.cover_device(pd, &first, first.map + 8192, 4096, Access::Write).unwrap().expect("cached");
    assert!(Arc::ptr_eq(&a, &again));
    // The same addresses under another buffer id: the driver says the memory is new.
    let fake = MemfdDevice {
        file: first.file.try_clone().unwrap(),
        map: first.map,
        len: first.len,
        buffer_id: 2,
        exports: Default::default(),
        flushes: Default::default(),
    };
    let b = regions.cover_device(pd, &fake, first.map + 64, 4096, Access::Write).unwrap().expect("registered");
    assert!(!Arc::ptr_eq(&a, &b), "a stale registration was reused");
    assert_eq!(regions.device_len(), 1, "the stale one was dropped");
    // Memory that is not the device's is not registered.
    let host = vec![0u8; 8192];
    assert!(regions.cover_device(pd, &first, host.as_ptr() as usize, 4096, Access::Write).unwrap().is_none());
    // `first` unmaps the memory they share.
    std::mem::forget(fake);
}

#[test]
fn large_writes_are_striped_over_the_lanes_and_later_sends_of_their_tag_wait_for_the_frame() {
    let mut kept = Kept::default();
    let settings = VerbsSettings { qps_per_connection: 4, ..verbs_settings(256 << 10) };
    let t = VerbsTransport::open(&settings, 0, true).expect("the stand-in opens");
    let (mut a, mut b) = pair_between(&t, &t);
    let len = 1 << 20;
    let mut dst = vec![0u8; len];
    let mut tickets = Vec::new();
    for round in 0..8u8 {
        let region = Region::of_mut(&mut dst);
        // SAFETY: `dst` outlives the connections and is only read here after the receive.
        unsafe { b.offer(6, region).unwrap() };
        settle(a.as_mut(), b.as_mut());
        // The striped message, then two of the same tag right behind it (held until its frame
        // is out), one small, one large without an offer.
        tickets.push(kept.send(a.as_mut(), 6, &[round; META_BYTES], &pattern(len, round)).unwrap());
        tickets.push(kept.send(a.as_mut(), 6, &[round; META_BYTES], &pattern(100, round + 1)).unwrap());
        tickets.push(kept.send(a.as_mut(), 6, &[round; META_BYTES], &pattern(len, round + 2)).unwrap());
        let (at, bytes) = received(a.as_mut(), b.as_mut(), 6);
        assert_eq!(at, region, "round {round}: written in place");
        assert!(bytes == pattern(len, round), "round {round}: a part had not landed when the frame came");
        assert!(received(a.as_mut(), b.as_mut(), 6).1 == pattern(100, round + 1), "round {round}");
        assert!(received(a.as_mut(), b.as_mut(), 6).1 == pattern(len, round + 2), "round {round}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tickets.iter().all(|&tk| a.sent(tk)) || a.backlog() > 0 {
        assert!(Instant::now() < deadline, "sends never completed");
        a.progress().unwrap();
        b.progress().unwrap();
    }
    let c = t.counts();
    assert_eq!((c.direct_messages, c.striped_messages, c.ring_messages), (8, 8, 16), "{c:?}");
}

#[test]
fn sends_from_device_memory_go_straight_into_the_peers_offer_and_only_there() {
    let plain = transport(256 << 10);
    let device = Arc::new(MemfdDevice::new(2 << 20, 1));
    let with_gpu = plain.for_pairs(true, 1).with_device(Some(device.clone()));
    let (mut a, mut b) = pair_between(&with_gpu, &plain);
    let len = 1 << 20;
    let src = Region::new(MemSpace::Device(0), device.map + 4096, len);
    // SAFETY: the test's own mapping, written before any send reads it.
    unsafe { std::slice::from_raw_parts_mut(src.addr as *mut u8, len) }.copy_from_slice(&pattern(len, 3));
    assert!(!a.reaches(MemSpace::Device(0)), "device memory is not read for every send");
    assert!(!a.sends_from(7, src, 0), "no offer yet: the executor stages it");
    assert!(!a.sends_from(7, Region::new(MemSpace::Device(1), src.addr, len), 0), "another GPU's memory");
    let mut dst = vec![0u8; len];
    let region = Region::of_mut(&mut dst);
    // SAFETY: `dst` outlives the connections, untouched until the message is received.
    unsafe { b.offer(7, region).unwrap() };
    settle(a.as_mut(), b.as_mut());
    assert!(!a.sends_from(7, src.sub(0, len / 2).unwrap(), 0), "the offer is for another length");
    assert!(!a.sends_from(7, src, 1), "the offer is for the tag's next message, not the one after");
    assert!(a.sends_from(7, src, 0), "offered: the NIC reads the GPU memory itself");
    // SAFETY: the mapping outlives the connections and is not written again.
    let ticket = unsafe { a.send(7, &[9; META_BYTES], src).unwrap() };
    let (at, bytes) = received(a.as_mut(), b.as_mut(), 7);
    assert_eq!(at, region);
    assert!(bytes == pattern(len, 3));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.sent(ticket) {
        assert!(Instant::now() < deadline, "the write never completed");
        a.progress().unwrap();
    }
    let c = with_gpu.counts();
    assert_eq!((c.device_sends, c.direct_messages, c.ring_messages, c.device_registrations), (1, 1, 0, 1), "{c:?}");
}

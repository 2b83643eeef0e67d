//! Shared memory between ranks on one host: one-sided transfers into memory the receiver
//! exposes. Each direction is a single-producer single-consumer ring in one memfd segment: the
//! receiver's staging window, which the sender writes frames into (the framing TCP uses) and
//! signals by advancing the ring's head; the receiver signals back by advancing its tail. Where
//! the two processes may write each other's memory, large payloads go straight into a
//! destination the receiver offered ([`ShmConnection`], and `direct`).
//!
//! The TCP stream the bootstrap opened to the peer stays open beside the rings as a liveness
//! line: when the peer's process dies the kernel closes it, and a rank waiting on the ring
//! notices within milliseconds instead of spinning until its deadline. If the peer cannot map
//! the segment (another container, `/proc` hidden), both sides decline, and the transport table
//! gives the pair to the next transport on the streams they already have.

pub(crate) mod connection;
mod direct;
pub(crate) mod ring;
pub(crate) mod segment;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::{Connected, Locality, PeerSetup, Transport};
use connection::ShmByteStream;
pub use connection::ShmConnection;
use ring::{Ring, RING_HEADER_BYTES};
use segment::Segment;

/// Default data bytes per direction.
pub const DEFAULT_RING_BYTES: usize = 4 << 20;
/// The largest ring a peer may announce: the most `TOPOCCL_SHM_BYTES` may be set
/// to, and small enough that the segment's size cannot overflow.
pub const MAX_RING_BYTES: usize = 1 << 30;
const HANDSHAKE_MAGIC: &[u8; 4] = b"TSHM";

/// The shared-memory backend.
#[derive(Debug, Clone, Copy)]
pub struct ShmTransport {
    /// Data bytes per direction.
    pub ring_bytes: usize,
    /// Whether to put large payloads straight into offered destinations where the processes
    /// may write each other's memory (probed; the ring alone otherwise).
    pub direct: bool,
}

impl Default for ShmTransport {
    fn default() -> ShmTransport {
        ShmTransport { ring_bytes: DEFAULT_RING_BYTES, direct: false }
    }
}

/// Whether each side can write the other's memory: each writes a probe into the other's
/// process and reports; the peer's process id where both succeeded.
fn probe_direct(control: &mut TcpStream, peer: &str) -> Result<Option<u32>> {
    let probe = direct::Probe::new();
    let mut me = [0u8; 12];
    me[..4].copy_from_slice(&std::process::id().to_le_bytes());
    me[4..].copy_from_slice(&(probe.addr() as u64).to_le_bytes());
    control.write_all(&me).map_err(|e| hs(peer, e))?;
    let mut them = [0u8; 12];
    control.read_exact(&mut them).map_err(|e| hs(peer, e))?;
    let pid = u32::from_le_bytes([them[0], them[1], them[2], them[3]]);
    let mut addr = [0u8; 8];
    addr.copy_from_slice(&them[4..]);
    let wrote = direct::write(pid, u64::from_le_bytes(addr) as usize, &direct::PROBE_MAGIC);
    control.write_all(&[u8::from(wrote)]).map_err(|e| hs(peer, e))?;
    let mut theirs = [0u8; 1];
    control.read_exact(&mut theirs).map_err(|e| hs(peer, e))?;
    // The peer wrote (or failed to) before it said so; both verdicts are in now.
    let landed = probe.written();
    control.write_all(&[u8::from(landed)]).map_err(|e| hs(peer, e))?;
    let mut their_landed = [0u8; 1];
    control.read_exact(&mut their_landed).map_err(|e| hs(peer, e))?;
    Ok((wrote && landed && theirs[0] == 1 && their_landed[0] == 1).then_some(pid))
}

fn hs(peer: &str, e: io::Error) -> Error {
    Error::io(format!("shared-memory handshake with {peer}"), e)
}

fn ring_span(ring_bytes: usize) -> usize {
    (RING_HEADER_BYTES + ring_bytes).next_multiple_of(4096)
}

impl ShmTransport {
    fn create(&self, control: &mut TcpStream, peer: &str) -> Result<Option<(Arc<Segment>, usize)>> {
        let span = ring_span(self.ring_bytes);
        let mut segment = Segment::create(2 * span)?;
        let fd = segment.raw_fd().ok_or_else(|| Error::Protocol("segment without a descriptor".into()))?;
        let mut msg = Vec::with_capacity(24);
        msg.extend_from_slice(HANDSHAKE_MAGIC);
        msg.extend_from_slice(&std::process::id().to_le_bytes());
        msg.extend_from_slice(&fd.to_le_bytes());
        msg.extend_from_slice(&(self.ring_bytes as u64).to_le_bytes());
        control.write_all(&msg).map_err(|e| hs(peer, e))?;
        let mut ok = [0u8; 1];
        control.read_exact(&mut ok).map_err(|e| hs(peer, e))?;
        if ok[0] != 1 {
            return Ok(None);
        }
        segment.release_file();
        Ok(Some((Arc::new(segment), span)))
    }

    fn join(&self, control: &mut TcpStream, peer: &str) -> Result<Option<(Arc<Segment>, usize)>> {
        let mut msg = [0u8; 20];
        control.read_exact(&mut msg).map_err(|e| hs(peer, e))?;
        if &msg[0..4] != HANDSHAKE_MAGIC {
            return Err(Error::Protocol(format!("{peer} did not start a shared-memory handshake")));
        }
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&msg[r]);
            w
        };
        let pid = u32::from_le_bytes(word(4..8));
        let fd = i32::from_le_bytes(word(8..12));
        let mut q = [0u8; 8];
        q.copy_from_slice(&msg[12..20]);
        let ring_bytes = u64::from_le_bytes(q);
        if ring_bytes == 0 || ring_bytes > MAX_RING_BYTES as u64 {
            return Err(Error::Protocol(format!(
                "{peer} announced shared-memory rings of {ring_bytes} bytes (1 to {MAX_RING_BYTES} expected)"
            )));
        }
        let span = ring_span(ring_bytes as usize);
        let opened = Segment::open(pid, fd, 2 * span);
        control.write_all(&[u8::from(opened.is_ok())]).map_err(|e| hs(peer, e))?;
        Ok(opened.ok().map(|s| (Arc::new(s), span)))
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    /// Ranks of one host.
    fn can_connect(&self, me: &Locality, peer: &Locality) -> bool {
        me.host == peer.host
    }

    fn connect(&self, setup: PeerSetup) -> Result<Connected> {
        Ok(match self.connect_shm(setup)? {
            Ok(c) => Connected::Connection(Box::new(c)),
            Err((setup, why)) => Connected::Declined { setup, why },
        })
    }
}

impl ShmTransport {
    /// [`Transport::connect`], with the connection as itself (the CUDA IPC backend carries its
    /// frames on one); `Err` when the pair declined, with the setup handed back.
    pub(crate) fn connect_shm(
        &self,
        mut setup: PeerSetup,
    ) -> Result<std::result::Result<ShmConnection, (PeerSetup, String)>> {
        let peer = setup.peer.clone();
        let Some(control) = setup.streams.first_mut() else {
            return Err(Error::Unsupported(format!("no control stream to {peer}")));
        };
        control.set_read_timeout(Some(setup.timeout)).map_err(|e| hs(&peer, e))?;
        let shared = if setup.creator { self.create(control, &peer)? } else { self.join(control, &peer)? };
        let Some((segment, span)) = shared else {
            // The peer could not map our memory (both sides know): the next transport.
            let why = format!("{peer} could not map this rank's shared memory");
            return Ok(Err((setup, why)));
        };
        let (tx_at, rx_at) = if setup.creator { (0, span) } else { (span, 0) };
        let ring_bytes = span - RING_HEADER_BYTES;
        let bad = || Error::Protocol("shared segment too small for its rings".into());
        let tx = Ring::new(segment.clone(), tx_at, ring_bytes).ok_or_else(bad)?;
        let rx = Ring::new(segment, rx_at, ring_bytes).ok_or_else(bad)?;
        let mut control = setup.streams.swap_remove(0);
        let direct = if self.direct { probe_direct(&mut control, &peer)? } else { None };
        control.set_nonblocking(true).map_err(|e| hs(&peer, e))?;
        let stream = ShmByteStream { tx, rx, control, peer, idle: 0, corrupt: None };
        Ok(Ok(ShmConnection::new(stream, direct)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{bytes, recv, Kept};
    use crate::{Connection, Region};
    use std::net::TcpListener;
    use std::time::Duration;

    fn pair(transport: &ShmTransport) -> (Box<dyn Connection>, Box<dyn Connection>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let b = l.accept().unwrap().0;
        let t = Duration::from_secs(10);
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                transport.connect(PeerSetup {
                    streams: vec![b],
                    creator: false,
                    rank: 0,
                    peer: "rank 0".into(),
                    timeout: t,
                })
            });
            let x = transport.connect(PeerSetup {
                streams: vec![a],
                creator: true,
                rank: 1,
                peer: "rank 1".into(),
                timeout: t,
            });
            let made = |c: Result<Connected>| match c.unwrap() {
                Connected::Connection(c) => c,
                Connected::Declined { why, .. } => panic!("declined: {why}"),
            };
            (made(x), made(h.join().unwrap()))
        })
    }

    #[test]
    fn an_absurd_ring_size_from_the_peer_is_an_error() {
        // Found by fuzzing: the announced size went unchecked into the segment's size, where
        // it overflowed.
        for announced in [0u64, u64::MAX, (MAX_RING_BYTES as u64) + 1] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let mut b = l.accept().unwrap().0;
            let mut msg = HANDSHAKE_MAGIC.to_vec();
            msg.extend_from_slice(&std::process::id().to_le_bytes());
            msg.extend_from_slice(&0i32.to_le_bytes());
            msg.extend_from_slice(&announced.to_le_bytes());
            a.write_all(&msg).unwrap();
            let err = ShmTransport::default().join(&mut b, "rank 3").err().expect("refused");
            assert!(err.to_string().contains("rank 3 announced shared-memory rings"), "{err}");
        }
    }

    #[test]
    fn messages_larger_than_the_ring_arrive_intact() {
        let mut kept = Kept::default();
        let transport = ShmTransport { ring_bytes: 64 << 10, direct: true };
        let (mut a, mut b) = pair(&transport);
        assert_eq!(a.transport(), "shm");
        let big: Vec<u8> = (0..1_000_003u32).map(|i| (i % 249) as u8).collect();
        kept.send(&mut *a, 5, &[9; 24], &big).unwrap();
        kept.send(&mut *a, 6, &[1; 24], &[]).unwrap();
        kept.send(&mut *b, 0, &[2; 24], b"back").unwrap();
        let (mut got5, mut got6, mut back) = (None, None, None);
        while got5.is_none() || got6.is_none() || back.is_none() {
            a.progress().unwrap();
            b.progress().unwrap();
            got5 = got5.or_else(|| recv(&mut *b, 5));
            got6 = got6.or_else(|| recv(&mut *b, 6));
            back = back.or_else(|| recv(&mut *a, 0));
        }
        assert_eq!(got5.unwrap().data, big);
        assert!(got6.unwrap().data.is_empty());
        assert_eq!(back.unwrap().data, b"back");
        assert_eq!(a.backlog(), 0);
        a.close();
        b.progress().unwrap();
        assert!(b.closed().is_some());
        assert!(kept.send(&mut *b, 0, &[0; 24], b"x").is_err());
    }

    fn payload(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|b| (b * 13 + i * 7) as u8).collect()
    }

    /// Frames left in the ring must never make the sender wait (they are moved out when the
    /// ring fills), must keep their order per tag, and may be taken in any tag order.
    #[test]
    fn frames_left_in_place_never_block_the_sender_and_keep_order() {
        let mut kept = Kept::default();
        let transport = ShmTransport { ring_bytes: 64 << 10, direct: true };
        let (mut a, mut b) = pair(&transport);
        let lens: Vec<usize> = (0..24).map(|i| if i == 5 { 9_001 } else { 8192 + 8 * i }).collect();
        for (i, &len) in lens.iter().enumerate() {
            kept.send(&mut *a, (i % 3) as u32, &[i as u8; 24], &payload(i, len)).unwrap();
        }
        // The receiver only progresses (takes nothing): the sender must still get rid of
        // everything, far more than the ring holds.
        let mut rounds = 0;
        while a.backlog() > 0 {
            a.progress().unwrap();
            b.progress().unwrap();
            rounds += 1;
            assert!(rounds < 1_000_000, "sender stuck with {} bytes", a.backlog());
        }
        for tag in [2u32, 0, 1] {
            for (i, &len) in lens.iter().enumerate().filter(|(i, _)| (*i % 3) as u32 == tag) {
                let mut got = None;
                while got.is_none() {
                    b.progress().unwrap();
                    b.recv_with(tag, &mut |m, d| got = Some((*m, bytes(d)))).unwrap();
                }
                let (meta, data) = got.unwrap();
                assert_eq!(meta, [i as u8; 24], "tag {tag}: frame {i} out of order");
                assert_eq!(data, payload(i, len));
            }
        }
        // A frame of another tag in the way is queued, and the wanted one found behind it.
        kept.send(&mut *a, 7, &[7; 24], &payload(70, 16384)).unwrap();
        kept.send(&mut *a, 8, &[8; 24], &payload(80, 16384)).unwrap();
        kept.send(&mut *a, 7, &[9; 24], &payload(71, 16384)).unwrap();
        let mut order = Vec::new();
        while order.len() < 3 {
            a.progress().unwrap();
            b.progress().unwrap();
            for tag in [8u32, 7] {
                b.recv_with(tag, &mut |m, d| order.push((m[0], bytes(d)))).unwrap();
            }
        }
        assert_eq!(order[0], (8, payload(80, 16384)));
        assert_eq!(order[1], (7, payload(70, 16384)));
        assert_eq!(order[2], (9, payload(71, 16384)));
    }

    /// A receive whose destination was offered in advance: the sender puts the payload
    /// straight there (one copy) and the message arrives as the destination itself; a send
    /// that comes before the offer, or one too small, goes through the ring.
    #[test]
    fn offered_destinations_are_written_directly_one_sided() {
        let mut kept = Kept::default();
        let transport = ShmTransport { ring_bytes: 1 << 20, direct: true };
        let (mut a, mut b) = pair(&transport);
        let big = payload(3, 300_000);
        let mut dst = vec![0u8; big.len()];
        let dst_region = Region::of_mut(&mut dst);
        // SAFETY: `dst` outlives the connections' use of it and is not touched meanwhile.
        unsafe { b.offer(4, dst_region).unwrap() };
        // The offer travels to the sender.
        for _ in 0..100 {
            b.progress().unwrap();
            a.progress().unwrap();
        }
        kept.send(&mut *a, 4, &[1; 24], &big).unwrap();
        let mut got = None;
        while got.is_none() {
            a.progress().unwrap();
            b.progress().unwrap();
            b.recv_with(4, &mut |m, r| got = Some((*m, r))).unwrap();
        }
        let (meta, region) = got.unwrap();
        assert_eq!(meta, [1; 24]);
        let direct = region == dst_region;
        if !direct {
            eprintln!("skipped the direct check: process_vm_writev is not permitted here");
        }
        assert_eq!(dst == big, direct);
        // The next message of the tag was not offered: it comes through the ring.
        kept.send(&mut *a, 4, &[2; 24], &big).unwrap();
        let mut second = None;
        while second.is_none() {
            a.progress().unwrap();
            b.progress().unwrap();
            b.recv_with(4, &mut |m, r| second = Some((*m, bytes(r)))).unwrap();
        }
        assert_eq!(second.unwrap(), ([2; 24], big.clone()));
        // An offer made after the message was sent goes unused; the message still arrives.
        kept.send(&mut *a, 5, &[3; 24], &big).unwrap();
        let mut late = vec![0u8; big.len()];
        // SAFETY: as above.
        unsafe { b.offer(5, Region::of_mut(&mut late)).unwrap() };
        let mut third = None;
        while third.is_none() {
            a.progress().unwrap();
            b.progress().unwrap();
            b.recv_with(5, &mut |m, r| third = Some((*m, bytes(r)))).unwrap();
        }
        assert_eq!(third.unwrap(), ([3; 24], big));
        assert!(late.iter().all(|&x| x == 0));
        a.close();
        b.close();
    }
}

//! TCP: the fallback that works everywhere. Non-blocking sockets with Nagle off; several
//! sockets per peer (message tags are spread over them, so parallel channels of a schedule use
//! parallel sockets and large transfers are not serialised behind one socket buffer).

use std::io::{self, IoSlice, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;

use nix::sys::socket::{sendmsg, MsgFlags};

use crate::error::{Error, Result};
use crate::framing::{ByteStream, Framed};
use crate::{Connected, Connection, Locality, Meta, PeerSetup, Region, Ticket, Transport, WaitFd};

/// Messages below this size wait for the executor's next round and leave in one `sendmsg`
/// with the others queued by then (larger ones are written at once, without a copy).
const COALESCE_BELOW: usize = 64 << 10;

/// A TCP socket as a non-blocking byte stream.
pub(crate) struct TcpByteStream {
    stream: TcpStream,
    peer: String,
}

impl TcpByteStream {
    pub(crate) fn new(stream: TcpStream, peer: &str) -> Result<TcpByteStream> {
        stream.set_nonblocking(true).map_err(|e| Error::io("making a socket non-blocking", e))?;
        stream.set_nodelay(true).map_err(|e| Error::io("disabling Nagle's algorithm", e))?;
        Ok(TcpByteStream { stream, peer: peer.to_string() })
    }

    fn closed(&self, e: Option<io::Error>) -> Error {
        Error::PeerClosed(match e {
            Some(e) => format!("{} over TCP: {e}", self.peer),
            None => format!("{} closed its TCP connection", self.peer),
        })
    }
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::NotConnected
    )
}

impl ByteStream for TcpByteStream {
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        // sendmsg with MSG_NOSIGNAL: a vanished peer must be an error, never a SIGPIPE that
        // kills a C program using the library.
        match sendmsg::<()>(self.stream.as_raw_fd(), bufs, &[], MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => Ok(n),
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => Ok(0),
            Err(errno) => {
                let e = io::Error::from(errno);
                if is_disconnect(&e) {
                    Err(self.closed(Some(e)))
                } else {
                    Err(Error::io(format!("sending to {}", self.peer), e))
                }
            }
        }
    }

    fn coalesce_below(&self) -> usize {
        COALESCE_BELOW
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.stream.read(buf) {
            Ok(0) => Err(self.closed(None)),
            Ok(n) => Ok(n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(0),
            Err(e) if is_disconnect(&e) => Err(self.closed(Some(e))),
            Err(e) => Err(Error::io(format!("receiving from {}", self.peer), e)),
        }
    }
}

/// A ticket holds the socket's index above this bit and the frame's number below.
const SOCKET_SHIFT: u32 = 48;

/// One or more sockets to one peer; tag `t` travels on socket `t % sockets`.
pub struct TcpConnection {
    sockets: Vec<Framed<TcpByteStream>>,
}

impl TcpConnection {
    /// Wraps connected, authenticated streams (at least one).
    pub fn new(streams: Vec<TcpStream>, peer: &str) -> Result<TcpConnection> {
        if streams.is_empty() {
            return Err(Error::Unsupported(format!("no TCP stream to {peer}")));
        }
        let sockets =
            streams.into_iter().map(|s| TcpByteStream::new(s, peer).map(Framed::new)).collect::<Result<Vec<_>>>()?;
        Ok(TcpConnection { sockets })
    }

    fn socket(&mut self, tag: u32) -> &mut Framed<TcpByteStream> {
        let i = tag as usize % self.sockets.len();
        &mut self.sockets[i]
    }
}

impl Connection for TcpConnection {
    fn transport(&self) -> &'static str {
        "tcp"
    }

    unsafe fn send(&mut self, tag: u32, meta: &Meta, data: Region) -> Result<Ticket> {
        let i = tag as usize % self.sockets.len();
        // SAFETY: host memory valid and unchanged until the ticket is done (this fn's contract,
        // passed on).
        let seq = unsafe { self.sockets[i].send(tag, meta, data)? };
        Ok(if seq == 0 { Ticket::DONE } else { Ticket((i as u64) << SOCKET_SHIFT | seq) })
    }

    fn sent(&self, t: Ticket) -> bool {
        if t == Ticket::DONE {
            return true;
        }
        let i = (t.0 >> SOCKET_SHIFT) as usize;
        self.sockets.get(i).map_or(true, |s| s.sent(t.0 & ((1 << SOCKET_SHIFT) - 1)))
    }

    fn backlog(&self) -> usize {
        self.sockets.iter().map(Framed::backlog).sum()
    }

    fn progress(&mut self) -> Result<bool> {
        let mut moved = false;
        for s in &mut self.sockets {
            moved |= s.progress()?;
        }
        Ok(moved)
    }

    fn recv_with(&mut self, tag: u32, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool> {
        self.socket(tag).recv_one(tag, f)
    }

    /// Closed once every socket is: a peer that finished closes them one after the other, and
    /// data it sent on a socket not yet at its end must still be read (a dead peer's sockets
    /// all close at once, so this costs no time in noticing it).
    fn closed(&self) -> Option<&str> {
        let mut why = None;
        for s in &self.sockets {
            why = Some(s.closed()?);
        }
        why
    }

    fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        for s in &self.sockets {
            if s.closed().is_none() {
                out.push(WaitFd { fd: s.stream.stream.as_raw_fd(), write: s.backlog() > 0 });
            }
        }
    }

    fn needs_spin(&self) -> bool {
        false
    }

    fn close(&mut self) {
        for s in &mut self.sockets {
            // Errors here mean the socket is already gone, which is what close wants.
            let _ = s.stream.stream.shutdown(Shutdown::Both);
            s.mark_closed("closed locally".to_string());
        }
    }
}

/// The TCP backend: connects any two ranks.
#[derive(Debug, Clone, Copy)]
pub struct TcpTransport {
    /// Sockets per peer.
    pub sockets: usize,
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn can_connect(&self, _: &Locality, _: &Locality) -> bool {
        true
    }

    fn streams(&self) -> usize {
        self.sockets.max(1)
    }

    fn connect(&self, setup: PeerSetup) -> Result<Connected> {
        Ok(Connected::Connection(Box::new(TcpConnection::new(setup.streams, &setup.peer)?)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testing::{recv, Kept};
    use std::net::TcpListener;

    pub(crate) fn socket_pairs(k: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut a = Vec::new();
        let mut b = Vec::new();
        for _ in 0..k {
            a.push(TcpStream::connect(addr).unwrap());
            b.push(l.accept().unwrap().0);
        }
        (a, b)
    }

    #[test]
    fn large_messages_cross_several_sockets_in_order() {
        let mut kept = Kept::default();
        let (a, b) = socket_pairs(2);
        let mut tx = TcpConnection::new(a, "rank 1").unwrap();
        let mut rx = TcpConnection::new(b, "rank 0").unwrap();
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        for tag in 0..4u32 {
            kept.send(&mut tx, tag, &[tag as u8; 24], &big[..big.len() - tag as usize]).unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 4 {
            tx.progress().unwrap();
            rx.progress().unwrap();
            for tag in 0..4u32 {
                if let Some(m) = recv(&mut rx, tag) {
                    assert_eq!(m.meta, [tag as u8; 24]);
                    assert_eq!(m.data, big[..big.len() - tag as usize]);
                    got.push(tag);
                }
            }
        }
        assert_eq!(tx.backlog(), 0);
        tx.close();
        while rx.closed().is_none() {
            rx.progress().unwrap();
        }
        assert!(rx.closed().unwrap().contains("rank 0"));
    }

    #[test]
    fn one_socket_at_its_end_does_not_lose_data_on_another() {
        let mut kept = Kept::default();
        let (a, b) = socket_pairs(2);
        let mut tx = TcpConnection::new(a, "rank 1").unwrap();
        let mut rx = TcpConnection::new(b, "rank 0").unwrap();
        kept.send(&mut tx, 1, &[1; 24], b"last words").unwrap();
        while tx.backlog() > 0 {
            tx.progress().unwrap();
        }
        // The peer finished: its first socket reaches its end before the data on the second
        // is read.
        tx.sockets[0].stream.stream.shutdown(Shutdown::Both).unwrap();
        while rx.sockets[0].closed().is_none() {
            rx.sockets[0].progress().unwrap();
        }
        assert!(rx.closed().is_none(), "the connection still has a live socket");
        let m = loop {
            rx.progress().unwrap();
            if let Some(m) = recv(&mut rx, 1) {
                break m;
            }
        };
        assert_eq!(m.data, b"last words");
        tx.close();
        while rx.closed().is_none() {
            rx.progress().unwrap();
        }
    }
}

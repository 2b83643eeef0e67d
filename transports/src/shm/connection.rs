//! A shared-memory connection: framing over the pair of rings, and the one-sided path beside
//! it.
//!
//! The rings are each receiver's staging window: the sender writes frames into the ring its
//! peer reads (memory the peer exposed at set-up) and advances its `head`; the receiver takes
//! them, in place where it can, and advances `tail`. Where both processes may write each other's
//! memory ([`direct`](super::direct)), a receive whose destination is known in advance goes
//! further: the receiver offers the destination ([`Connection::offer`]), and the sender puts a
//! large payload straight there and signals with a frame that carries none, one copy in all.
//!
//! Tags with the top bit set are this module's: offers travel as `OFFER_TAG`, and a message
//! put straight into its destination arrives as its tag with `DIRECT_BIT` (both in `numbered`). Offers and puts are
//! numbered per tag (the n-th message of a tag), so an offer the sender sees too late is simply
//! not used: that message went through the ring.

use std::io::{self, IoSlice, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;

use super::direct::{self, DIRECT_MIN_BYTES};
use super::ring::{Corrupt, Ring};
use crate::error::{Error, Result};
use crate::framing::{ByteStream, Framed, Peeked};
use crate::numbered::{decode_offer, encode_offer, reserved, Numbered, DIRECT_BIT, OFFER_TAG};
use crate::{Connection, Meta, Region, Ticket, WaitFd, MAX_MESSAGE_BYTES};

/// How many empty reads between two checks of the liveness line.
const LIVENESS_EVERY: u32 = 512;

pub(crate) struct ShmByteStream {
    pub(crate) tx: Ring,
    pub(crate) rx: Ring,
    pub(crate) control: TcpStream,
    pub(crate) peer: String,
    pub(crate) idle: u32,
    /// Set once the peer published an impossible ring position: every later use fails.
    pub(crate) corrupt: Option<String>,
}

impl ShmByteStream {
    /// Records (once) and returns the error for a corrupt ring position.
    fn corrupted(&mut self, c: Corrupt) -> Error {
        let why = self.corrupt.get_or_insert_with(|| format!("{} corrupted the shared-memory ring: {c}", self.peer));
        Error::Protocol(why.clone())
    }

    /// Checks the liveness line now and then; an error once the peer is gone.
    fn check_peer(&mut self) -> Result<()> {
        if let Some(why) = &self.corrupt {
            return Err(Error::Protocol(why.clone()));
        }
        if self.rx.is_closed() {
            return Err(Error::PeerClosed(format!("{} closed its shared-memory connection", self.peer)));
        }
        self.idle += 1;
        if self.idle < LIVENESS_EVERY {
            return Ok(());
        }
        self.idle = 0;
        let mut byte = [0u8; 1];
        match self.control.read(&mut byte) {
            Ok(0) => Err(Error::PeerClosed(format!("{} is gone (its liveness socket closed)", self.peer))),
            Ok(_) => Err(Error::Protocol(format!("unexpected byte from {} on the liveness socket", self.peer))),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(()),
            Err(e) => Err(Error::PeerClosed(format!("{} is gone: {e}", self.peer))),
        }
    }
}

impl ByteStream for ShmByteStream {
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        let n = self.tx.write(bufs).map_err(|c| self.corrupted(c))?;
        if n == 0 {
            self.check_peer()?;
        }
        Ok(n)
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let n = self.rx.read(buf).map_err(|c| self.corrupted(c))?;
        if n == 0 && !buf.is_empty() {
            if let Err(gone) = self.check_peer() {
                // The peer may have written its last bytes after the read found the ring
                // empty, then closed (or exited): those bytes come first. (Its writes are
                // published before its close, which the check acquired.)
                let n = self.rx.read(buf).map_err(|c| self.corrupted(c))?;
                if n == 0 {
                    return Err(gone);
                }
                self.idle = 0;
                return Ok(n);
            }
        } else {
            self.idle = 0;
        }
        Ok(n)
    }

    /// None once the ring is corrupt: the framing then reads, which reports it.
    fn peek(&mut self, want: usize) -> Option<Peeked<'_>> {
        if self.corrupt.is_some() {
            return None;
        }
        if let Err(c) = self.rx.readable(want) {
            self.corrupted(c);
            return None;
        }
        self.rx.peek(want).ok()
    }

    fn consume(&mut self, n: usize) {
        self.idle = 0;
        self.rx.consume(n);
    }

    fn check_alive(&mut self) -> Result<()> {
        self.check_peer()
    }
}

/// A shared-memory connection.
pub struct ShmConnection {
    framed: Framed<ShmByteStream>,
    /// The peer's process id, where direct puts work both ways (probed at set-up).
    direct: Option<u32>,
    /// Messages numbered per tag, and the destinations offered for them each way.
    numbered: Numbered<Region>,
}

impl ShmConnection {
    pub(crate) fn new(stream: ShmByteStream, direct: Option<u32>) -> ShmConnection {
        ShmConnection { framed: Framed::new(stream), direct, numbered: Numbered::default() }
    }

    /// Whether messages may be put straight into offered destinations.
    pub fn direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Queues a frame under a tag reserved for the backends (the CUDA IPC connection's
    /// descriptors), never put straight into an offer.
    ///
    /// # Safety
    /// As for [`Connection::send`].
    pub(crate) unsafe fn send_reserved(&mut self, tag: u32, meta: &Meta, data: Region) -> Result<Ticket> {
        // SAFETY: this fn's contract, passed on.
        let seq = unsafe { self.framed.send(tag, meta, data)? };
        Ok(if seq == 0 { Ticket::DONE } else { Ticket(seq) })
    }

    /// Hands the next message of `tag` or of `alt`, whichever comes first in the stream, to `f`
    /// (with whether it was `alt`'s). For a connection without direct puts (nothing numbered).
    pub(crate) fn recv_either(&mut self, tag: u32, alt: u32, f: &mut dyn FnMut(bool, &Meta, Region)) -> Result<bool> {
        debug_assert!(self.direct.is_none());
        self.framed.recv_first(&[tag, alt], &mut |t, m, r| f(t == alt, m, r))
    }

    /// Hands the next message of a tag reserved for the backends to `f` if it has arrived,
    /// moving only frames of at most `small` payload bytes out of its way; whether it did.
    pub(crate) fn recv_reserved(&mut self, tag: u32, small: usize, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool> {
        self.framed.recv_past_small(tag, small, f)
    }

    /// Looks at the liveness line now and then (every call counts towards the next look), and
    /// records the peer closed once it is gone: for a caller waiting on something other than
    /// this connection's ring (the CUDA IPC connection's window space and landings).
    pub(crate) fn check_alive(&mut self) {
        if self.framed.closed().is_some() {
            return;
        }
        if let Err(Error::PeerClosed(why)) = self.framed.stream.check_alive() {
            self.framed.mark_closed(why);
        }
    }

    /// Takes the offers that have arrived (never spilling a frame left in the ring for the
    /// executor: an offer stuck behind one is used late or not at all).
    fn take_offers(&mut self) {
        let numbered = &mut self.numbered;
        while self.framed.recv_queued(OFFER_TAG, &mut |m, _| {
            let (tag, message, dst, _) = decode_offer(m);
            numbered.peer_offered(tag, message, dst);
        }) {}
    }

    /// Numbers the next message of `tag` and puts it straight into the peer's offer for it,
    /// if there is one; whether it did.
    fn put_numbered(&mut self, tag: u32, data: Region) -> bool {
        let message = self.numbered.next_sent(tag);
        self.put(tag, message, data)
    }

    /// Puts `data` straight into the offer for message `message` of `tag`, if there is one
    /// and the peer still accepts it; whether it did.
    fn put(&mut self, tag: u32, message: u32, data: Region) -> bool {
        let Some(pid) = self.direct else { return false };
        if data.len < DIRECT_MIN_BYTES {
            return false;
        }
        self.take_offers();
        let Some(dst) = self.numbered.take_offer(tag, message, |d| d.len == data.len) else {
            return false;
        };
        // SAFETY: host memory valid for reads now (`send`'s contract).
        let bytes = unsafe { data.bytes() };
        direct::put(&self.framed.stream.tx.direct_flags(), pid, dst, bytes)
    }
}

impl Connection for ShmConnection {
    fn transport(&self) -> &'static str {
        "shm"
    }

    unsafe fn send(&mut self, tag: u32, meta: &Meta, data: Region) -> Result<Ticket> {
        reserved(tag)?;
        if self.direct.is_some() && self.put_numbered(tag, data) {
            // In place at the peer: the frame only says so.
            // SAFETY: an empty region.
            unsafe { self.framed.send(tag | DIRECT_BIT, meta, Region::EMPTY)? };
            return Ok(Ticket::DONE);
        }
        // SAFETY: host memory valid and unchanged until the ticket is done (this fn's contract,
        // passed on).
        let seq = unsafe { self.framed.send(tag, meta, data)? };
        Ok(if seq == 0 { Ticket::DONE } else { Ticket(seq) })
    }

    fn sent(&self, t: Ticket) -> bool {
        t == Ticket::DONE || self.framed.sent(t.0)
    }

    fn backlog(&self) -> usize {
        self.framed.backlog()
    }

    fn progress(&mut self) -> Result<bool> {
        self.framed.progress()
    }

    fn recv_with(&mut self, tag: u32, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool> {
        reserved(tag)?;
        if self.direct.is_none() {
            // Nothing is numbered without direct puts.
            return self.framed.recv_one(tag, f);
        }
        self.numbered.recv(&mut self.framed, tag, |d| *d, f)
    }

    unsafe fn offer(&mut self, tag: u32, dst: Region) -> Result<()> {
        reserved(tag)?;
        if self.direct.is_none() || !(DIRECT_MIN_BYTES..=MAX_MESSAGE_BYTES).contains(&dst.len) {
            return Ok(());
        }
        let Some(message) = self.numbered.offer(tag, dst) else { return Ok(()) };
        // SAFETY: an empty region.
        unsafe { self.framed.send(OFFER_TAG, &encode_offer(tag, message, dst, 0), Region::EMPTY)? };
        Ok(())
    }

    fn one_sided(&self) -> bool {
        self.direct.is_some()
    }

    fn backlog_limit(&self) -> Option<usize> {
        Some(1)
    }

    fn closed(&self) -> Option<&str> {
        self.framed.closed()
    }

    fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        if self.framed.closed().is_none() {
            out.push(WaitFd { fd: self.framed.stream.control.as_raw_fd(), write: false });
        }
    }

    fn needs_spin(&self) -> bool {
        self.framed.closed().is_none()
    }

    fn close(&mut self) {
        // No put lands in memory this side offered once the connection is closed.
        if self.direct.is_some() {
            direct::revoke(&self.framed.stream.rx.direct_flags());
        }
        self.numbered.clear_offered();
        self.framed.stream.tx.close();
        self.framed.stream.rx.close();
        let _ = self.framed.stream.control.shutdown(Shutdown::Both);
        self.framed.mark_closed("closed locally".to_string());
    }
}

impl Drop for ShmConnection {
    fn drop(&mut self) {
        if self.direct.is_some() {
            direct::revoke(&self.framed.stream.rx.direct_flags());
        }
    }
}

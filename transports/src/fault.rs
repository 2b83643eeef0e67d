//! Faults on purpose: a [`Connection`] wrapper that misbehaves as a broken network or a
//! crashed peer would, so tests can prove that every failure ends in an error naming the call
//! and the rank, never in a hang or in wrong data. Put it around a communicator's connections
//! with a [`ConnectionWrapper`](crate::ConnectionWrapper).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::{Connection, Meta, Region, Ticket, WaitFd};

/// What goes wrong, counted in sends through the wrapped connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The connection closes itself once this many sends went through (a peer that crashed:
    /// the other side sees the connection drop).
    CloseAfter(u64),
    /// The send with this index (from 0) carries a corrupted header (a foreign or confused
    /// sender).
    CorruptMeta(u64),
    /// Once this many sends went through, nothing moves any more in either direction, and the
    /// connection stays open (a hung peer or a black-holed link).
    StallAfter(u64),
}

/// A connection that lets `fault` happen. `sends` counts the sends that went through (shared,
/// so a test can watch it).
pub struct Faulty {
    inner: Box<dyn Connection>,
    fault: Fault,
    sends: Arc<AtomicU64>,
}

impl Faulty {
    pub fn new(inner: Box<dyn Connection>, fault: Fault) -> Faulty {
        Faulty { inner, fault, sends: Arc::new(AtomicU64::new(0)) }
    }

    /// The counter of sends that went through.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.sends.clone()
    }

    fn stalled(&self) -> bool {
        matches!(self.fault, Fault::StallAfter(n) if self.sends.load(Ordering::Relaxed) >= n)
    }
}

impl Connection for Faulty {
    fn transport(&self) -> &'static str {
        self.inner.transport()
    }

    fn reaches(&self, space: crate::MemSpace) -> bool {
        self.inner.reaches(space)
    }

    unsafe fn send(&mut self, tag: u32, meta: &Meta, data: Region) -> Result<Ticket> {
        let done = self.sends.load(Ordering::Relaxed);
        if matches!(self.fault, Fault::CloseAfter(n) if done >= n) {
            self.inner.close();
            return Err(Error::PeerClosed("closed by fault injection".into()));
        }
        if self.stalled() {
            // Accepted and lost: it never leaves, and its memory is not read.
            self.sends.fetch_add(1, Ordering::Relaxed);
            return Ok(Ticket::DONE);
        }
        let mut meta = *meta;
        if self.fault == Fault::CorruptMeta(done) {
            for b in &mut meta {
                *b ^= 0x5a;
            }
        }
        self.sends.fetch_add(1, Ordering::Relaxed);
        // SAFETY: passed on under the same contract.
        unsafe { self.inner.send(tag, &meta, data) }
    }

    fn sent(&self, ticket: Ticket) -> bool {
        self.inner.sent(ticket)
    }

    fn backlog(&self) -> usize {
        self.inner.backlog()
    }

    fn progress(&mut self) -> Result<bool> {
        if self.stalled() {
            return Ok(false);
        }
        self.inner.progress()
    }

    fn recv_with(&mut self, tag: u32, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool> {
        if self.stalled() {
            return Ok(false);
        }
        self.inner.recv_with(tag, f)
    }

    unsafe fn offer(&mut self, tag: u32, dst: Region) -> Result<()> {
        if self.stalled() {
            return Ok(());
        }
        // SAFETY: passed on under the same contract.
        unsafe { self.inner.offer(tag, dst) }
    }

    fn one_sided(&self) -> bool {
        self.inner.one_sided()
    }

    fn offers_into(&self, space: crate::MemSpace) -> bool {
        self.inner.offers_into(space)
    }

    fn sends_from(&mut self, tag: u32, data: Region, ahead: u32) -> bool {
        self.inner.sends_from(tag, data, ahead)
    }

    fn lends(&self) -> bool {
        self.inner.lends()
    }

    fn release(&mut self) {
        self.inner.release()
    }

    fn backlog_limit(&self) -> Option<usize> {
        self.inner.backlog_limit()
    }

    fn closed(&self) -> Option<&str> {
        self.inner.closed()
    }

    fn device_peer(&self) -> Option<std::sync::Arc<crate::ipc::DevicePeer>> {
        self.inner.device_peer()
    }

    fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        self.inner.wait_fds(out)
    }

    fn needs_spin(&self) -> bool {
        self.inner.needs_spin()
    }

    fn close(&mut self) {
        self.inner.close()
    }
}

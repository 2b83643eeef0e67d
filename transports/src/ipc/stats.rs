//! What a CUDA IPC transport's connections have done, counted across all of them: which way
//! device messages went, and what the registrations cost. Tests read it to tell the one-sided
//! path from the window; a user reads it to see whether buffers were registered at all (pool
//! memory never is).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::registration::CacheCounts;

/// Counters shared by a transport and its connections.
#[derive(Debug, Default)]
pub struct IpcStats {
    window: AtomicU64,
    direct: AtomicU64,
    offers: AtomicU64,
    announced: AtomicU64,
    revoked: AtomicU64,
    opened: AtomicU64,
    closed: AtomicU64,
}

/// A snapshot of [`IpcStats`] and of the transport's registration cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpcCounts {
    /// Device messages sent through the receiver's window (two copies: in, and out again).
    pub window_messages: u64,
    /// Device messages copied straight into the buffer the receiver offered (one copy).
    pub direct_messages: u64,
    /// Destinations this side offered.
    pub offers: u64,
    /// Registrations this side announced to peers, and revoked at them (their buffer freed, or
    /// too many announced).
    pub announced: u64,
    pub revoked: u64,
    /// Peers' registrations opened here, and closed again.
    pub opened: u64,
    pub closed: u64,
    /// This side's registration cache.
    pub cache: CacheCounts,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    Window,
    Direct,
    Offer,
    Announced,
    Revoked,
    Opened,
    Closed,
}

impl IpcStats {
    pub(crate) fn add(&self, c: Counter) {
        let a = match c {
            Counter::Window => &self.window,
            Counter::Direct => &self.direct,
            Counter::Offer => &self.offers,
            Counter::Announced => &self.announced,
            Counter::Revoked => &self.revoked,
            Counter::Opened => &self.opened,
            Counter::Closed => &self.closed,
        };
        a.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, cache: CacheCounts) -> IpcCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IpcCounts {
            window_messages: g(&self.window),
            direct_messages: g(&self.direct),
            offers: g(&self.offers),
            announced: g(&self.announced),
            revoked: g(&self.revoked),
            opened: g(&self.opened),
            closed: g(&self.closed),
            cache,
        }
    }
}

//! Sends in flight: what keeps the schedule's eager sends eager when a connection reads a
//! queued payload from where it lies (no copy) as it drains.
//!
//! Every send whose ticket is not done is remembered with the bytes it still reads, and a step
//! that would write any of them waits until it is done; a receive-reduce-send reduces into a
//! forwarding slice no send still reads, from a pool kept between runs. Sends always complete
//! without this rank's other steps (the peer drains), so the waits cannot deadlock.

use topoccl_transports::{Region, Ticket};

use super::engine::Links;
use super::ops::{LocalOps, Workspace};
use crate::error::Result;

/// Slices a receive-reduce-send may have in flight at once (each waiting for its send).
const MAX_FORWARD_SLICES: usize = 32;

/// A send whose payload the connection still reads.
#[derive(Debug, Clone, Copy)]
struct Send {
    region: Region,
    peer: u32,
    ticket: Ticket,
}

/// The sends of one run that are not done yet.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    sends: Vec<Send>,
}

impl InFlight {
    pub(crate) fn is_empty(&self) -> bool {
        self.sends.is_empty()
    }

    /// Remembers a send to `peer` reading `region`, unless its ticket is already done.
    pub(crate) fn push(&mut self, region: Region, peer: u32, ticket: Ticket) {
        if ticket != Ticket::DONE {
            self.sends.push(Send { region, peer, ticket });
        }
    }

    /// Whether `r` may be written now: no send in flight still reads any of its bytes. Sends
    /// found done are forgotten.
    pub(crate) fn clear_to_write(&mut self, links: &Links, r: Region) -> bool {
        if self.sends.is_empty() || r.is_empty() {
            return true;
        }
        let mut clear = true;
        self.sends.retain(|f| {
            let done = links.get(f.peer as usize).and_then(Option::as_ref).map_or(true, |l| l.sent(f.ticket));
            if !done && f.region.overlaps(&r) {
                clear = false;
            }
            !done
        });
        clear
    }

    /// A slice of `n` bytes of `pool` that no send in flight reads (the pool grows, by slices
    /// of at least `min_bytes`, up to a bound), or `None` while every slice is being sent.
    pub(crate) fn forward_slice(
        &mut self,
        links: &Links,
        pool: &mut Vec<Workspace>,
        ops: &mut dyn LocalOps,
        n: usize,
        min_bytes: usize,
    ) -> Result<Option<Region>> {
        for w in pool.iter() {
            let Some(r) = w.region().sub(0, n) else { continue };
            if self.clear_to_write(links, r) {
                return Ok(Some(r));
            }
        }
        if pool.len() >= MAX_FORWARD_SLICES {
            return Ok(None);
        }
        let w = ops.alloc(n.max(min_bytes))?;
        let r = w.region().sub(0, n);
        pool.push(w);
        Ok(r)
    }
}

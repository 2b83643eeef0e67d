//! Sends in flight: what keeps the schedule's eager sends eager when a connection reads a
//! queued payload from where it lies (no copy) as it drains, and when the payload must first be
//! staged into host memory by a local operation that has not finished yet.
//!
//! Every send whose ticket is not done is remembered with the bytes it still reads, and a step
//! that would write any of them waits until it is done; a receive-reduce-send reduces into a
//! forwarding slice no send still reads, from a pool kept between runs.
//!
//! A payload in memory its connection cannot reach (device memory, over TCP or shared memory)
//! is copied by the local operations into a host staging slice, and the send waits, **staged**,
//! until that copy's [`Fence`] is done. Messages of one tag must leave in the order they were
//! sent, and operations complete in submission order, so staged sends form one queue and every
//! send made while it is not empty joins its end. Sends always complete without this rank's
//! other steps (the peer drains, the device finishes), so none of these waits can deadlock.

use std::collections::VecDeque;

use topoccl_transports::{Connection, Meta, Region, Ticket};

use super::engine::{transport_error, Links};
use crate::error::{Error, Result};
use crate::ops::{Fence, LocalOps, Workspace};

/// Slices of each pool (forwarding, staging) one run may have in flight at once.
const MAX_SLICES: usize = 32;

/// A send whose payload the connection still reads.
#[derive(Debug, Clone, Copy)]
struct Posted {
    region: Region,
    peer: u32,
    ticket: Ticket,
}

/// A send waiting for the local operation that fills its payload.
#[derive(Debug, Clone, Copy)]
struct Staged {
    region: Region,
    peer: u32,
    tag: u32,
    /// Index of its call header among the run's.
    meta: u32,
    fence: Fence,
}

/// The sends of one run that are not done yet, and the received messages it still reads.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    posted: Vec<Posted>,
    staged: VecDeque<Staged>,
    /// Messages lent by their connection ([`Connection::lends`]) and the local operation that
    /// reads them last: each goes back once that is done, in the order received.
    lent: VecDeque<(u32, Fence)>,
}

fn link(links: &mut Links, peer: u32) -> Result<&mut Box<dyn Connection>> {
    links
        .get_mut(peer as usize)
        .and_then(Option::as_mut)
        .ok_or_else(|| Error::Internal(format!("no connection to rank {peer}")))
}

impl InFlight {
    pub(crate) fn is_empty(&self) -> bool {
        self.posted.is_empty() && self.staged.is_empty()
    }

    /// How many sends of `tag` to `peer` wait here to be handed to its connection.
    pub(crate) fn queued(&self, peer: u32, tag: u32) -> u32 {
        self.staged.iter().filter(|s| s.peer == peer && s.tag == tag).count() as u32
    }

    /// Whether sends, or lent messages, wait for local operations (the run must poll them, not
    /// sleep).
    pub(crate) fn staging(&self) -> bool {
        !self.staged.is_empty() || !self.lent.is_empty()
    }

    /// Whether every send is done with its memory (a connection may read it after its backlog
    /// is gone: CUDA IPC's copies run on the device). Done sends are forgotten.
    pub(crate) fn all_sent(&mut self, links: &Links) -> bool {
        self.posted.retain(|f| !links.get(f.peer as usize).and_then(Option::as_ref).map_or(true, |l| l.sent(f.ticket)));
        self.posted.is_empty() && self.staged.is_empty()
    }

    /// Records a message received from `peer`'s lending connection, read by the local
    /// operations up to `fence`.
    pub(crate) fn lend(&mut self, peer: u32, fence: Fence) {
        self.lent.push_back((peer, fence));
    }

    /// Gives back the lent messages no operation reads any more, in order; whether any went.
    pub(crate) fn release_read(&mut self, links: &mut Links, ops: &mut dyn LocalOps) -> Result<bool> {
        let mut moved = false;
        while let Some(&(peer, fence)) = self.lent.front() {
            if !ops.done(fence)? {
                break;
            }
            link(links, peer)?.release();
            self.lent.pop_front();
            moved = true;
        }
        Ok(moved)
    }

    /// Sends `data` to `peer` now if nothing is staged before it, else queues it behind the
    /// staged sends (`fence`: the operation that fills `data`, [`Fence::DONE`] if none).
    ///
    /// # Safety
    /// `data` must stay valid and unchanged until the send is done: a span of the run's buffers
    /// or a slice of the executor's pools, which no step writes while a send reads it.
    pub(crate) unsafe fn send(
        &mut self,
        links: &mut Links,
        peer: u32,
        tag: u32,
        meta: (u32, &Meta),
        data: Region,
        fence: Fence,
    ) -> Result<()> {
        if self.staged.is_empty() && fence == Fence::DONE {
            // SAFETY: this fn's contract.
            let ticket = unsafe { link(links, peer)?.send(tag, meta.1, data) }.map_err(transport_error(peer))?;
            self.push(data, peer, ticket);
        } else {
            self.staged.push_back(Staged { region: data, peer, tag, meta: meta.0, fence });
        }
        Ok(())
    }

    /// Posts the staged sends whose payload is ready, in order; whether any was posted.
    pub(crate) fn post_ready(&mut self, links: &mut Links, ops: &mut dyn LocalOps, metas: &[Meta]) -> Result<bool> {
        let mut moved = false;
        while let Some(s) = self.staged.front().copied() {
            if !ops.done(s.fence)? {
                break;
            }
            let meta = metas.get(s.meta as usize).ok_or_else(|| Error::Internal("a send without its header".into()))?;
            // SAFETY: the payload is a staging slice no step writes until this send is done
            // (`clear_to_write` counts staged and posted sends alike).
            let ticket =
                unsafe { link(links, s.peer)?.send(s.tag, meta, s.region) }.map_err(transport_error(s.peer))?;
            self.staged.pop_front();
            self.push(s.region, s.peer, ticket);
            moved = true;
        }
        Ok(moved)
    }

    /// Remembers a posted send to `peer` reading `region`, unless its ticket is already done.
    fn push(&mut self, region: Region, peer: u32, ticket: Ticket) {
        if ticket != Ticket::DONE {
            self.posted.push(Posted { region, peer, ticket });
        }
    }

    /// Whether `r` may be written now: no send, staged or in flight, still reads any of its
    /// bytes. Posted sends found done are forgotten.
    pub(crate) fn clear_to_write(&mut self, links: &Links, r: Region) -> bool {
        if self.is_empty() || r.is_empty() {
            return true;
        }
        let mut clear = !self.staged.iter().any(|s| s.region.overlaps(&r));
        self.posted.retain(|f| {
            let done = links.get(f.peer as usize).and_then(Option::as_ref).map_or(true, |l| l.sent(f.ticket));
            if !done && f.region.overlaps(&r) {
                clear = false;
            }
            !done
        });
        clear
    }

    /// A slice of `n` bytes of `pool` that no send reads (the pool grows, by slices of at
    /// least `min_bytes` from `alloc`, up to a bound), or `None` while every slice is being sent.
    pub(crate) fn free_slice(
        &mut self,
        links: &Links,
        pool: &mut Vec<Workspace>,
        alloc: &mut dyn FnMut(usize) -> Result<Workspace>,
        n: usize,
        min_bytes: usize,
    ) -> Result<Option<Region>> {
        for w in pool.iter() {
            let Some(r) = w.region().sub(0, n) else { continue };
            if self.clear_to_write(links, r) {
                return Ok(Some(r));
            }
        }
        if pool.len() >= MAX_SLICES {
            return Ok(None);
        }
        let w = alloc(n.max(min_bytes))?;
        let r = w.region().sub(0, n);
        pool.push(w);
        Ok(r)
    }
}

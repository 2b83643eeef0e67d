//! The one executor: runs a [`Program`] (any schedule of the IR, or grouped point-to-point
//! transfers) over the rank's connections.
//!
//! A single thread drives everything, as an event loop: it moves bytes on every connection
//! the program uses, then advances every channel as far as it can. Each step is cut into
//! slices of `slice_bytes`, so that a forwarding step (receive-reduce-send, …) passes on the
//! first slice while the next is still on the wire, which pipelines a chunk across the hops of
//! a ring or tree. Sends are eager (the transport writes them out, or queues them and reads the
//! payload from where it lies as the connection drains) but held back while a connection's
//! backlog is above `max_backlog`, so memory stays bounded without ever making a sender wait on
//! a receiver that is itself waiting (receivers always drain).
//!
//! Because a queued send still reads its payload, a step that would write bytes such a send
//! still reads waits until it is done ([`InFlight`]). Local work is submitted, not waited for
//! ([`LocalOps`] returns fences): a payload in memory its connection cannot reach (device
//! memory over shared memory or TCP) is copied into a host staging slice and its send waits,
//! staged, until that copy is done, while the loop goes on with everything else.
//!
//! Nothing here waits without a deadline: when no byte and no step moves for `timeout`, the
//! call fails with what each channel is stuck on; a closed peer fails it at once; `abort`
//! ends it within milliseconds.

mod check;
mod receive;
mod stuck;

pub(crate) use check::check;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use topoccl_transports::{wait, Connection, MemSpace, Meta, Region, WaitFd};

use super::inflight::InFlight;
use super::memory::Memory;
use super::p2p::ANY_SOURCE;
use super::program::{Action, Program, ProgramStep};
use crate::diag::Board;
use crate::error::{Error, Result};
use crate::ops::{Fence, LocalOps, Workspace};
use crate::types::{Dtype, ReduceOp};
use crate::wire::CallHeader;

/// Idle rounds spent spinning, then yielding, before sleeping (shared memory).
const SPIN_ROUNDS: u32 = 256;
const YIELD_ROUNDS: u32 = 2048;
/// Channel states kept on the stack.
const INLINE_CHANNELS: usize = 16;
/// Idle rounds between two checks of the clock and the abort flag.
const CHECK_EVERY: u32 = 64;
/// A run idle this long publishes what it waits for on its board.
const STALL_REPORT: Duration = Duration::from_millis(100);
/// The header of a step that exchanges no message (a local copy or reduction).
const NO_META: Meta = [0; topoccl_transports::META_BYTES];
/// A connection per rank (`None` for this rank itself).
pub(crate) type Links = [Option<Box<dyn Connection>>];

/// Settings of one run.
pub(crate) struct RunConfig<'c> {
    pub rank: u32,
    pub dtype: Dtype,
    pub op: ReduceOp,
    pub slice_bytes: usize,
    pub max_backlog: usize,
    pub timeout: Duration,
    pub abort: &'c AtomicBool,
    /// The collective being run (`None`: grouped send/recv), for error messages.
    pub call: Option<CallHeader>,
    /// More ranks share this host than it has cores: waiting ranks must give their core away
    /// at once (the peer they wait for may be the one not running), not spin.
    pub oversubscribed: bool,
    /// Where a stalled run says what it waits for, so that peers asking find out.
    pub board: Option<&'c Board>,
}

impl RunConfig<'_> {
    fn what(&self) -> String {
        self.call.map_or_else(|| "grouped send/recv".to_string(), |c| c.describe())
    }
}

/// How far a channel is: slices `< slice` of `step` are done, and slices `< trail` of the step
/// after it, where that step trails `step` slice by slice (`ProgramChannel::trails`).
#[derive(Debug, Clone, Copy, Default)]
struct ChannelState {
    step: usize,
    slice: usize,
    trail: usize,
    /// The destination of slice `slice` was offered to the sender ([`Connection::offer`]).
    offered: bool,
}

impl ChannelState {
    /// Whether slice `slice` of step `step` of this channel is done.
    fn done(&self, step: usize, slice: usize, slicewise: bool) -> bool {
        self.step > step
            || (slicewise && self.step == step && self.slice > slice)
            || (slicewise && self.step + 1 == step && self.trail > slice)
    }
}

struct Run<'r> {
    prog: &'r Program,
    /// Call headers the steps' messages carry (`ProgramStep::meta` indexes them).
    metas: &'r [Meta],
    mem: &'r Memory,
    links: &'r mut Links,
    ops: &'r mut dyn LocalOps,
    cfg: &'r RunConfig<'r>,
    state: &'r mut [ChannelState],
    /// The last local operation submitted (operations complete in order: once it is done,
    /// everything the run has written so far is).
    last: Fence,
    /// Slices a receive-reduce-send step reduces into before sending them on.
    forward: &'r mut Vec<Workspace>,
    /// Host slices payloads are staged into for connections that cannot reach their memory.
    staging: &'r mut Vec<Workspace>,
    inflight: InFlight,
    /// Per call header (`ProgramStep::meta`), the peer its messages come from: a receive from
    /// any source's is filled in once it has matched ([`ANY_SOURCE`] until then).
    sources: &'r mut [u32],
    /// Which peer a receive from any source asks first.
    any_turn: usize,
}

/// What one run works with besides its program: the buffers, the connections, the local
/// operations and the forwarding and staging slices kept between runs.
pub(crate) struct Resources<'r> {
    pub mem: &'r Memory,
    pub links: &'r mut Links,
    pub ops: &'r mut dyn LocalOps,
    /// The last operation submitted before the run that wrote what it reads.
    pub written: Fence,
    pub forward: &'r mut Vec<Workspace>,
    pub staging: &'r mut Vec<Workspace>,
    /// Per call header, its transfer's peer; the run fills in those of receives from any
    /// source (empty for a collective).
    pub sources: &'r mut [u32],
}

fn link(links: &mut Links, peer: u32) -> Result<&mut Box<dyn Connection>> {
    links
        .get_mut(peer as usize)
        .and_then(Option::as_mut)
        .ok_or_else(|| Error::Internal(format!("no connection to rank {peer}")))
}

pub(super) fn transport_error(peer: u32) -> impl FnOnce(topoccl_transports::Error) -> Error {
    move |e| match e {
        topoccl_transports::Error::PeerClosed(reason) => Error::PeerFailed { peer, reason },
        other => Error::Transport { peer, source: other },
    }
}

/// Runs `prog` to completion: every step done and every byte handed to the transports.
///
/// # Safety
/// Every region of `res.mem` must be valid memory the local operations and the connections
/// reach, used by nothing else until this returns (the promise the executor's callers make).
pub(crate) unsafe fn run(prog: &Program, metas: &[Meta], res: Resources<'_>, cfg: &RunConfig<'_>) -> Result<()> {
    // Most programs have a few channels: keep their state on the stack (no allocation per call).
    let mut inline = [ChannelState::default(); INLINE_CHANNELS];
    let mut heap = Vec::new();
    let state: &mut [ChannelState] = match inline.get_mut(..prog.channels.len()) {
        Some(s) => s,
        None => {
            heap.resize(prog.channels.len(), ChannelState::default());
            &mut heap
        }
    };
    let Resources { mem, links, ops, written, forward, staging, sources } = res;
    let mut run = Run {
        prog,
        metas,
        mem,
        links,
        ops,
        cfg,
        state,
        last: written,
        forward,
        staging,
        inflight: InFlight::default(),
        sources,
        any_turn: 0,
    };
    // A run that fails part-way leaves the ranks out of step, whatever the cause: never an
    // error a caller could take for a rejected argument (which leaves the communicator usable).
    run.run().map_err(|e| match e {
        Error::InvalidArgument(m) => Error::Internal(m),
        e => e,
    })
}

impl Run<'_> {
    fn run(&mut self) -> Result<()> {
        // Clock reads cost as much as a spin round and most idle episodes last a few rounds,
        // so while spinning the clock is read every CHECK_EVERY idle rounds (the deadline is
        // late by those few microseconds); once the loop sleeps in poll(2), every round.
        let mut idle_since: Option<Instant> = None;
        let mut idle_rounds = 0u32;
        let mut slept = false;
        let mut fds: Vec<WaitFd> = Vec::new();
        let mut round = 0usize;
        let mut reported = false;
        // Whether a channel may move: something changed since the channels last all waited.
        // A channel waits only for its connections (a message, room, a send done), for other
        // channels, or for a staged send's copy; when none of those moved, advancing the
        // channels again finds them all still waiting, so an idle round only polls the
        // connections (which shortens the time from a message's arrival to its use).
        let mut dirty = true;
        loop {
            let mut moved = false;
            // The channels go first: a run's first sends leave before it looks at anything
            // that arrived (on a peer's critical path, not this rank's).
            if dirty {
                dirty = false;
                // Channels take turns at going first: room freed on a connection goes to the
                // first channel that asks, and a fixed order let low channels (one tree's
                // lanes) keep a shared connection's backlog to themselves while later ones
                // (another tree's, whose data the next hop is waiting for) starved.
                let nch = self.prog.channels.len();
                let first = if nch == 0 { 0 } else { round % nch };
                round = round.wrapping_add(1);
                let mut done = true;
                for c in (first..nch).chain(0..first) {
                    if self.advance(c)? {
                        moved = true;
                        dirty = true;
                    }
                    done &= self.state[c].step == self.prog.channels[c].steps.len();
                }
                if done && self.flushed()? {
                    return Ok(());
                }
            }
            if self.inflight.staging() {
                let posted = self.inflight.post_ready(self.links, &mut *self.ops, self.metas)?;
                if self.inflight.release_read(self.links, &mut *self.ops)? || posted {
                    moved = true;
                    dirty = true;
                }
            }
            for &p in &self.prog.peers {
                let l = link(self.links, p)?;
                if l.progress().map_err(transport_error(p))? {
                    dirty = true;
                    // A peer closing is news, not progress: it must not restart the deadline
                    // of a run that waits on another peer.
                    moved |= l.closed().is_none();
                }
            }
            if moved {
                idle_rounds = 0;
                idle_since = None;
                slept = false;
                if reported {
                    reported = false;
                    if let Some(b) = self.cfg.board {
                        b.unstalled();
                    }
                }
                continue;
            }
            idle_rounds += 1;
            if slept || idle_rounds % CHECK_EVERY == 0 {
                // Now and then the channels look again whatever the connections said (a change
                // one of them did not report is never missed for long).
                dirty = true;
                if self.cfg.abort.load(Ordering::Relaxed) {
                    return Err(Error::Aborted);
                }
                // Another rank found the job broken and said why: waiting on is pointless.
                if let Some(v) = self.cfg.board.and_then(Board::told) {
                    return Err(Error::PeerFailed { peer: v.found_by, reason: "it found the job broken".into() });
                }
                let now = Instant::now();
                let idle = now.duration_since(*idle_since.get_or_insert(now));
                if let (Some(b), false) = (self.cfg.board, reported) {
                    if idle >= STALL_REPORT {
                        reported = true;
                        b.stalled(now - idle, self.waits());
                    }
                }
                if idle >= self.cfg.timeout {
                    return Err(Error::Timeout {
                        rank: self.cfg.rank,
                        secs: idle.as_secs_f64(),
                        call: self.cfg.what(),
                        waiting: self.blocked(),
                    });
                }
            }
            slept = self.idle_wait(idle_rounds, &mut fds)?;
        }
    }

    /// Spin briefly, then yield, then sleep in `poll(2)` (shared memory: short naps, since
    /// its data comes without a descriptor becoming ready); whether it slept in `poll(2)`.
    fn idle_wait(&mut self, rounds: u32, fds: &mut Vec<WaitFd>) -> Result<bool> {
        // Staged sends wait for local operations, which no descriptor announces.
        let mut spin = self.inflight.staging();
        for &p in &self.prog.peers {
            spin |= link(self.links, p)?.needs_spin();
        }
        let nap = match (spin, rounds) {
            (true, r) if r < SPIN_ROUNDS && !self.cfg.oversubscribed => {
                std::hint::spin_loop();
                return Ok(false);
            }
            (true, r) if r < YIELD_ROUNDS => None,
            (true, _) => Some(Duration::from_micros(500)),
            (false, r) if r < 8 => None,
            (false, _) => Some(Duration::from_millis(20)),
        };
        let Some(nap) = nap else {
            std::thread::yield_now();
            return Ok(false);
        };
        fds.clear();
        for &p in &self.prog.peers {
            link(self.links, p)?.wait_fds(fds);
        }
        wait::wait(fds, nap).map_err(|e| Error::Transport { peer: self.cfg.rank, source: e })?;
        Ok(true)
    }

    fn flushed(&mut self) -> Result<bool> {
        if self.inflight.staging() {
            return Ok(false);
        }
        for &p in &self.prog.peers {
            let l = link(self.links, p)?;
            if l.backlog() > 0 {
                if let Some(why) = l.closed() {
                    return Err(Error::PeerFailed { peer: p, reason: why.to_string() });
                }
                return Ok(false);
            }
        }
        Ok(self.inflight.all_sent(self.links))
    }

    /// Whether slice `slice` of step `step` of channel `c` may run: every step it depends on is
    /// done, or has done that slice where the dependency holds slice by slice.
    fn deps_done(&self, c: usize, step: usize, slice: usize) -> bool {
        self.prog.channels[c].deps_of(step as u32).all(|(d, slicewise)| {
            self.state.get(d.on.channel as usize).is_some_and(|s| s.done(d.on.step as usize, slice, slicewise))
        })
    }

    /// Runs channel `c` until it blocks or ends; true when anything ran.
    fn advance(&mut self, c: usize) -> Result<bool> {
        let ch = &self.prog.channels[c];
        let mut moved = false;
        let sb = self.cfg.slice_bytes;
        loop {
            let ChannelState { step, slice, trail, mut offered } = self.state[c];
            let Some(st) = ch.steps.get(step) else { return Ok(moved) };
            let slices = st.len.div_ceil(sb).max(1);
            if self.deps_done(c, step, slice)
                && self.slice(st, ch.tag, slice * sb, sb.min(st.len - slice * sb), &mut offered)?
            {
                moved = true;
                self.state[c] = if slice + 1 == slices {
                    // The trailing step carries on from where it got to.
                    ChannelState { step: step + 1, slice: trail, trail: 0, offered: false }
                } else {
                    ChannelState { step, slice: slice + 1, trail, offered: false }
                };
                continue;
            }
            self.state[c].offered = offered;
            // The step waits: the next one may still do the slices this one has done.
            let next = step + 1;
            if trail < slice
                && ch.trails.get(next).copied().unwrap_or(false)
                && self.deps_done(c, next, trail)
                && self.slice(
                    &ch.steps[next],
                    ch.tag,
                    trail * sb,
                    sb.min(ch.steps[next].len - trail * sb),
                    &mut true,
                )?
            {
                moved = true;
                self.state[c].trail = trail + 1;
                continue;
            }
            return Ok(moved);
        }
    }

    /// Does bytes `[off, off + n)` of step `st`; false when it must wait. A receive that only
    /// copies, whose message has not come yet, offers its destination to the sender first
    /// (once: `offered` records it), so a one-sided connection can put the payload there.
    fn slice(&mut self, st: &ProgramStep, tag: u32, off: usize, n: usize, offered: &mut bool) -> Result<bool> {
        let (dtype, op) = (self.cfg.dtype, self.cfg.op);
        if st.action.sends() {
            let l = link(self.links, st.to)?;
            let limit = l.backlog_limit().map_or(self.cfg.max_backlog, |b| b.min(self.cfg.max_backlog));
            if l.backlog() >= limit {
                // A peer that died stops reading: its backlog never drains, so say so now
                // rather than at the timeout.
                if let Some(why) = l.closed() {
                    return Err(Error::PeerFailed { peer: st.to, reason: why.to_string() });
                }
                return Ok(false);
            }
        }
        let meta = match self.metas.get(st.meta as usize) {
            Some(m) => m,
            None if !st.action.sends() && !st.action.receives() => &NO_META,
            None => return Err(Error::Internal("a step without its call header".into())),
        };
        let action = st.action;
        if !self.inflight.is_empty() && !self.inflight.clear_to_write(self.links, spans(self.mem, st, off, n)?.1) {
            return Ok(false);
        }
        let tmp = if action == Action::RecvReduceSend {
            let ops = &mut *self.ops;
            match self.inflight.free_slice(self.links, self.forward, &mut |b| ops.alloc(b), n, self.cfg.slice_bytes)? {
                Some(t) => t,
                None => return Ok(false),
            }
        } else {
            Region::EMPTY
        };
        // A payload the connection cannot read goes through a host staging slice, taken now:
        // once the message is received there is no waiting for one.
        let stage = if action.sends() && !self.sends_itself(st, off, n, tmp, tag)? {
            let ops = &mut *self.ops;
            match self.inflight.free_slice(
                self.links,
                self.staging,
                &mut |b| ops.alloc_host(b),
                n,
                self.cfg.slice_bytes,
            )? {
                Some(s) => Some(s),
                None => return Ok(false),
            }
        } else {
            None
        };
        let (src, dst) = if action.receives() {
            let from = self.source(st);
            if from == ANY_SOURCE {
                match self.receive_any(st, meta, tag, off, n, tmp)? {
                    Some(spans) => spans,
                    None => return Ok(false),
                }
            } else if let Some(spans) = self.receive_from(st, from, meta, tag, off, n, tmp)? {
                spans
            } else {
                let l = link(self.links, from)?;
                if let Some(why) = l.closed() {
                    return Err(Error::PeerFailed { peer: from, reason: why.to_string() });
                }
                if !*offered && matches!(action, Action::Recv | Action::RecvCopySend) {
                    let dst = spans(self.mem, st, off, n)?.1;
                    if l.one_sided() && l.offers_into(dst.space) {
                        // The peer's device writes it unordered with this rank's operations:
                        // all must be done (they run in order), else offer on a later poll.
                        if dst.space != MemSpace::Host && !self.ops.done(self.last)? {
                            return Ok(false);
                        }
                        // SAFETY: the destination is this step's slice of the run's buffers,
                        // valid for the run (`run`'s contract); no other step reads or writes it
                        // before this receive completes (the schedule orders them; sends still
                        // reading it were waited for above, local operations just now), and a
                        // run that ends early closes its connections, which revokes the offer.
                        unsafe { l.offer(tag, dst) }.map_err(transport_error(from))?;
                    }
                    *offered = true;
                }
                return Ok(false);
            }
        } else {
            spans(self.mem, st, off, n)?
        };
        let payload = match st.action {
            Action::Send => Some(src),
            Action::RecvCopySend | Action::RecvReduceCopySend => Some(dst),
            Action::RecvReduceSend => Some(tmp),
            Action::Copy => {
                // SAFETY: spans of this run's buffers, valid and ours for the run (`run`'s
                // contract), bounds-checked by `Memory::span`.
                self.last = unsafe { self.ops.copy(dst, src)? };
                None
            }
            Action::Reduce => {
                // SAFETY: as for `Copy`.
                self.last = unsafe { self.ops.reduce(dtype, op, dst, dst, src)? };
                None
            }
            Action::Recv | Action::RecvReduce => None,
        };
        if let Some(bytes) = payload {
            let (data, fence) = match stage {
                // SAFETY: `bytes` is a span of this run's buffers or a forwarding slice, `s` a
                // staging slice no send reads (taken above); both valid for the run.
                Some(s) => (s, unsafe { self.ops.copy(s, bytes)? }),
                // Memory the connection reads itself, on its own stream (CUDA IPC): it may
                // read only once everything the run wrote so far is written.
                None if bytes.space != MemSpace::Host => (bytes, self.last),
                None => (bytes, Fence::DONE),
            };
            if stage.is_some() {
                self.last = fence;
            }
            // SAFETY: a span of this run's buffers or a forwarding or staging slice, which stay
            // valid and unchanged until the send is done: the run waits for every send before
            // it ends, and no step writes bytes a send, staged or in flight, still reads.
            unsafe { self.inflight.send(self.links, st.to, tag, (st.meta, meta), data, fence) }?;
        }
        Ok(true)
    }

    /// Whether the connection to `st.to` reads what step `st` sends of bytes `[off, off + n)`
    /// itself: memory it reaches, or memory it reads for this one send (RDMA verbs, from
    /// device memory straight into the peer's offer for this very message, which is the tag's
    /// next after those waiting here).
    fn sends_itself(&mut self, st: &ProgramStep, off: usize, n: usize, tmp: Region, tag: u32) -> Result<bool> {
        let data = match st.action {
            Action::RecvReduceSend => tmp,
            Action::Send => self.mem.span(st.src.slice(off, n), false)?,
            _ => self.mem.span(st.dst.slice(off, n), true)?,
        };
        let ahead = self.inflight.queued(st.to, tag);
        let l = link(self.links, st.to)?;
        Ok(l.reaches(data.space) || l.sends_from(tag, data, ahead))
    }
}

/// The regions of bytes `[off, off + n)` of the spans `st` uses (the others are placeholders,
/// left empty).
#[inline]
fn spans(mem: &Memory, st: &ProgramStep, off: usize, n: usize) -> Result<(Region, Region)> {
    let src = if st.action.reads_src() { mem.span(st.src.slice(off, n), false)? } else { Region::EMPTY };
    let dst = if st.action.writes_dst() { mem.span(st.dst.slice(off, n), true)? } else { Region::EMPTY };
    Ok((src, dst))
}

#[cfg(test)]
mod tests;

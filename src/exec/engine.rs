//! The one executor: runs a [`Program`] (any schedule of the IR, or grouped point-to-point
//! transfers) over the rank's connections.
//!
//! A single thread drives everything, as an event loop: it moves bytes on every connection
//! the program uses, then advances every channel as far as it can. Each step is cut into
//! slices of `slice_bytes`, so that a forwarding step (receive-reduce-send, …) passes on the
//! first slice while the next is still on the wire, which pipelines a chunk across the hops of
//! a ring or tree. Sends are eager (the transport copies or queues them) but held back while a
//! connection's backlog is above `max_backlog`, so memory stays bounded without ever making a
//! sender wait on a receiver that is itself waiting (receivers always drain).
//!
//! Nothing here waits without a deadline: when no byte and no step moves for `timeout`, the
//! call fails with what each channel is stuck on; a closed peer fails it at once; `abort`
//! ends it within milliseconds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use topoccl_transports::{wait, Connection, Meta, WaitFd};

use super::memory::{Memory, Pair, Span};
use super::program::{Action, Program, XStep};
use super::reduce::{reduce_in_place, reduce_into};
use super::wire::CallHeader;
use crate::error::{Error, Result};
use crate::types::{Dtype, ReduceOp};

/// Idle rounds spent spinning, then yielding, before sleeping (shared memory).
const SPIN_ROUNDS: u32 = 256;
const YIELD_ROUNDS: u32 = 2048;
/// Channel states kept on the stack.
const INLINE_CHANNELS: usize = 16;
/// Idle rounds between two checks of the clock and the abort flag.
const CHECK_EVERY: u32 = 64;

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
}

impl RunConfig<'_> {
    fn what(&self) -> String {
        self.call.map_or_else(|| "grouped send/recv".to_string(), |c| c.describe())
    }
}

/// How far a channel is: slices `< slice` of `step` are done, and slices `< trail` of the step
/// after it, where that step trails `step` slice by slice (`XChannel::trails`).
#[derive(Debug, Clone, Copy, Default)]
struct ChannelState {
    step: usize,
    slice: usize,
    trail: usize,
}

impl ChannelState {
    /// Whether slice `slice` of step `step` of this channel is done.
    fn done(&self, step: usize, slice: usize, slicewise: bool) -> bool {
        self.step > step
            || (slicewise && self.step == step && self.slice > slice)
            || (slicewise && self.step + 1 == step && self.trail > slice)
    }
}

struct Run<'r, 'm> {
    prog: &'r Program,
    mem: &'r mut Memory<'m>,
    links: &'r mut Links,
    cfg: &'r RunConfig<'r>,
    state: &'r mut [ChannelState],
    /// Where a receive-reduce-send step reduces before sending.
    tmp: &'r mut Vec<u64>,
}

fn link(links: &mut Links, peer: u32) -> Result<&mut Box<dyn Connection>> {
    links
        .get_mut(peer as usize)
        .and_then(Option::as_mut)
        .ok_or_else(|| Error::Internal(format!("no connection to rank {peer}")))
}

fn transport_error(peer: u32) -> impl FnOnce(topoccl_transports::Error) -> Error {
    move |e| match e {
        topoccl_transports::Error::PeerClosed(reason) => Error::PeerFailed { peer, reason },
        other => Error::Transport { peer, source: other },
    }
}

/// Runs `prog` to completion: every step done and every byte handed to the transports.
/// `tmp` is scratch space kept between calls by the caller (grown to one slice on first use).
pub(crate) fn run(
    prog: &Program,
    mem: &mut Memory<'_>,
    links: &mut Links,
    cfg: &RunConfig<'_>,
    tmp: &mut Vec<u64>,
) -> Result<()> {
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
    let mut run = Run { prog, mem, links, cfg, state, tmp };
    run.run()
}

impl Run<'_, '_> {
    fn run(&mut self) -> Result<()> {
        // Clock reads cost as much as a spin round and most idle episodes last a few rounds,
        // so the clock is first read after CHECK_EVERY idle rounds (the deadline is late by
        // those few microseconds), then every CHECK_EVERY rounds.
        let mut idle_since: Option<Instant> = None;
        let mut idle_rounds = 0u32;
        let mut fds: Vec<WaitFd> = Vec::new();
        let mut round = 0usize;
        loop {
            let mut moved = false;
            for &p in &self.prog.peers {
                moved |= link(self.links, p)?.progress().map_err(transport_error(p))?;
            }
            // Channels take turns at going first: room freed on a connection goes to the
            // first channel that asks, and a fixed order let low channels (one tree's lanes)
            // keep a shared connection's backlog to themselves while later ones (another
            // tree's, whose data the next hop is waiting for) starved.
            let nch = self.prog.channels.len();
            let first = if nch == 0 { 0 } else { round % nch };
            round = round.wrapping_add(1);
            let mut done = true;
            for c in (first..nch).chain(0..first) {
                moved |= self.advance(c)?;
                done &= self.state[c].step == self.prog.channels[c].steps.len();
            }
            if done && self.flushed()? {
                return Ok(());
            }
            if moved {
                idle_rounds = 0;
                continue;
            }
            idle_rounds += 1;
            if idle_rounds == CHECK_EVERY {
                idle_since = Some(Instant::now());
            } else if idle_rounds % CHECK_EVERY == 0 {
                if self.cfg.abort.load(Ordering::Relaxed) {
                    return Err(Error::Aborted);
                }
                if idle_since.is_some_and(|t| t.elapsed() >= self.cfg.timeout) {
                    return Err(Error::Timeout {
                        rank: self.cfg.rank,
                        secs: self.cfg.timeout.as_secs_f64(),
                        call: self.cfg.what(),
                        waiting: self.blocked(),
                    });
                }
            }
            self.idle_wait(idle_rounds, &mut fds)?;
        }
    }

    /// Spin briefly, then yield, then sleep in `poll(2)` (shared memory: short naps, since
    /// its data comes without a descriptor becoming ready).
    fn idle_wait(&mut self, rounds: u32, fds: &mut Vec<WaitFd>) -> Result<()> {
        fds.clear();
        let mut spin = false;
        for &p in &self.prog.peers {
            let l = link(self.links, p)?;
            l.wait_fds(fds);
            spin |= l.needs_spin();
        }
        if spin {
            if rounds < SPIN_ROUNDS && !self.cfg.oversubscribed {
                std::hint::spin_loop();
            } else if rounds < YIELD_ROUNDS {
                std::thread::yield_now();
            } else {
                wait::wait(fds, Duration::from_micros(500))
                    .map_err(|e| Error::Transport { peer: self.cfg.rank, source: e })?;
            }
        } else if rounds < 8 {
            std::thread::yield_now();
        } else {
            wait::wait(fds, Duration::from_millis(20))
                .map_err(|e| Error::Transport { peer: self.cfg.rank, source: e })?;
        }
        Ok(())
    }

    fn flushed(&mut self) -> Result<bool> {
        for &p in &self.prog.peers {
            let l = link(self.links, p)?;
            if l.backlog() > 0 {
                if let Some(why) = l.closed() {
                    return Err(Error::PeerFailed { peer: p, reason: why.to_string() });
                }
                return Ok(false);
            }
        }
        Ok(true)
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
            let ChannelState { step, slice, trail } = self.state[c];
            let Some(st) = ch.steps.get(step) else { return Ok(moved) };
            let slices = st.len.div_ceil(sb).max(1);
            if self.deps_done(c, step, slice) && self.slice(st, ch.tag, slice * sb, sb.min(st.len - slice * sb))? {
                moved = true;
                self.state[c] = if slice + 1 == slices {
                    // The trailing step carries on from where it got to.
                    ChannelState { step: step + 1, slice: trail, trail: 0 }
                } else {
                    ChannelState { step, slice: slice + 1, trail }
                };
                continue;
            }
            // The step waits: the next one may still do the slices this one has done.
            let next = step + 1;
            if trail < slice
                && ch.trails.get(next).copied().unwrap_or(false)
                && self.deps_done(c, next, trail)
                && self.slice(&ch.steps[next], ch.tag, trail * sb, sb.min(ch.steps[next].len - trail * sb))?
            {
                moved = true;
                self.state[c].trail = trail + 1;
                continue;
            }
            return Ok(moved);
        }
    }

    /// Does bytes `[off, off + n)` of step `st`; false when it must wait.
    fn slice(&mut self, st: &XStep, tag: u32, off: usize, n: usize) -> Result<bool> {
        let (dtype, op) = (self.cfg.dtype, self.cfg.op);
        if st.action.sends() {
            let l = link(self.links, st.to)?;
            let limit = l.backlog_limit().map_or(self.cfg.max_backlog, |b| b.min(self.cfg.max_backlog));
            if l.backlog() >= limit {
                return Ok(false);
            }
        }
        let meta = &self.prog.metas[st.meta as usize];
        let src = st.src.slice(off, n);
        let dst = st.dst.slice(off, n);
        if st.action.receives() {
            // The receiving half runs on the message where the transport holds it (in the
            // shared ring, for large shared-memory messages); the sending half follows.
            let mut done = Ok(());
            let (cfg, mem, tmp) = (self.cfg, &mut *self.mem, &mut *self.tmp);
            let got = link(self.links, st.from)?
                .recv_with(tag, &mut |m, data| {
                    done = check(cfg, st.from, meta, m, data.len(), n)
                        .and_then(|()| receive(st.action, dtype, op, mem, tmp, src, dst, data));
                })
                .map_err(transport_error(st.from))?;
            if !got {
                if let Some(why) = link(self.links, st.from)?.closed() {
                    return Err(Error::PeerFailed { peer: st.from, reason: why.to_string() });
                }
                return Ok(false);
            }
            done?;
        }
        match st.action {
            Action::Send => {
                let bytes = self.mem.read(src)?;
                link(self.links, st.to)?.send(tag, meta, bytes).map_err(transport_error(st.to))?;
            }
            Action::RecvCopySend | Action::RecvReduceCopySend => {
                let bytes = self.mem.read(dst)?;
                link(self.links, st.to)?.send(tag, meta, bytes).map_err(transport_error(st.to))?;
            }
            Action::RecvReduceSend => {
                let bytes = &bytemuck::cast_slice::<u64, u8>(self.tmp)[..n];
                link(self.links, st.to)?.send(tag, meta, bytes).map_err(transport_error(st.to))?;
            }
            Action::Copy => {
                if let Pair::Distinct(s, d) = self.mem.pair(src, dst)? {
                    d.copy_from_slice(s);
                }
            }
            Action::Reduce => match self.mem.pair(src, dst)? {
                Pair::Distinct(s, d) => reduce_in_place(dtype, op, d, s),
                // Two empty chunks (fewer elements than chunks) lie at one address.
                Pair::Same([]) => {}
                Pair::Same(_) => return Err(Error::Internal("a step reduces a chunk with itself".into())),
            },
            Action::Recv | Action::RecvReduce => {}
        }
        Ok(true)
    }

    /// What every unfinished channel waits for.
    fn blocked(&self) -> String {
        let mut out = Vec::new();
        for (c, ch) in self.prog.channels.iter().enumerate() {
            let s = self.state[c];
            let Some(st) = ch.steps.get(s.step) else { continue };
            let what = if !self.deps_done(c, s.step, s.slice) {
                "another channel".to_string()
            } else if st.action.receives() {
                format!("a message from rank {}", st.from)
            } else {
                format!("room to send to rank {}", st.to)
            };
            out.push(format!("channel {c} step {}/{} waits for {what}", s.step + 1, ch.steps.len()));
        }
        if out.is_empty() {
            return "all steps are done; data to send is still queued (a peer stopped reading)".to_string();
        }
        let more = out.len().saturating_sub(4);
        out.truncate(4);
        let mut s = out.join("; ");
        if more > 0 {
            s += &format!("; and {more} more channels");
        }
        s
    }
}

/// The receiving half of a step: `data` is the message (possibly in the transport's memory).
/// A receive-reduce-send reduces into `tmp`, which the sending half then sends.
#[allow(clippy::too_many_arguments)]
fn receive(
    action: Action,
    dtype: Dtype,
    op: ReduceOp,
    mem: &mut Memory<'_>,
    tmp: &mut Vec<u64>,
    src: Span,
    dst: Span,
    data: &[u8],
) -> Result<()> {
    match action {
        Action::Recv | Action::RecvCopySend => mem.write(dst)?.copy_from_slice(data),
        Action::RecvReduce | Action::RecvReduceCopySend => match mem.pair(src, dst)? {
            Pair::Same(d) => reduce_in_place(dtype, op, d, data),
            Pair::Distinct(s, d) => reduce_into(dtype, op, d, s, data),
        },
        Action::RecvReduceSend => {
            if tmp.len() * 8 < data.len() {
                tmp.resize(data.len().div_ceil(8), 0);
            }
            let out = &mut bytemuck::cast_slice_mut::<u64, u8>(tmp)[..data.len()];
            reduce_into(dtype, op, out, mem.read(src)?, data);
        }
        Action::Send | Action::Copy | Action::Reduce => {}
    }
    Ok(())
}

/// A message must belong to this very call and have the expected length.
fn check(cfg: &RunConfig<'_>, from: u32, expected: &Meta, meta: &Meta, got: usize, want: usize) -> Result<()> {
    if meta != expected {
        let ours = CallHeader::decode(expected).map(|h| h.describe()).unwrap_or_default();
        let theirs = CallHeader::decode(expected).map(|h| h.mismatch(meta)).unwrap_or_default();
        return Err(Error::Mismatch { rank: cfg.rank, peer: from, theirs, ours });
    }
    if got != want {
        return Err(Error::Mismatch {
            rank: cfg.rank,
            peer: from,
            theirs: format!("a message of {got} bytes"),
            ours: format!("{} expecting {want} bytes (is TOPOCCL_SLICE_BYTES set alike everywhere?)", cfg.what()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::memory::INPUT;
    use crate::exec::program::XChannel;
    use topoccl_transports::{Message, Result as TransportResult};

    /// A connection that takes one queued message off its backlog per `progress` and records
    /// the tags in the order they were sent.
    #[derive(Default)]
    struct Drip {
        queued: std::collections::VecDeque<usize>,
        sent: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
    }

    impl Connection for Drip {
        fn transport(&self) -> &'static str {
            "drip"
        }
        fn send(&mut self, tag: u32, _: &Meta, data: &[u8]) -> TransportResult<()> {
            self.queued.push_back(data.len());
            self.sent.lock().unwrap().push(tag);
            Ok(())
        }
        fn backlog(&self) -> usize {
            self.queued.iter().sum()
        }
        fn progress(&mut self) -> TransportResult<bool> {
            Ok(self.queued.pop_front().is_some())
        }
        fn recv(&mut self, _: u32) -> Option<Message> {
            None
        }
        fn recycle(&mut self, _: Vec<u8>) {}
        fn closed(&self) -> Option<&str> {
            None
        }
        fn wait_fds(&self, _: &mut Vec<WaitFd>) {}
        fn needs_spin(&self) -> bool {
            true
        }
        fn close(&mut self) {}
    }

    #[test]
    fn channels_sharing_a_connection_take_turns() {
        // Three channels each send four slices to rank 1, whose connection holds one slice at
        // a time. Channel 0 going first in every round would send all of its slices before
        // the others sent any (what starved one Blink tree's lanes behind another's).
        let slice = 8;
        let data = [0u8; 32];
        let channel = |tag| XChannel {
            tag,
            steps: vec![XStep {
                action: Action::Send,
                from: 0,
                to: 1,
                src: Span::new(INPUT, 0, 32),
                dst: Span::new(INPUT, 0, 0),
                len: 32,
                meta: 0,
            }],
            trails: vec![false],
            ..XChannel::default()
        };
        let prog = Program { channels: (0..3).map(channel).collect(), peers: vec![1], metas: vec![[0; 24]] };
        let mut mem = Memory::new();
        mem.readable(INPUT, &data);
        let drip = Drip::default();
        let sent = drip.sent.clone();
        let mut links: Vec<Option<Box<dyn Connection>>> = vec![None, Some(Box::new(drip))];
        let abort = AtomicBool::new(false);
        let cfg = RunConfig {
            rank: 0,
            dtype: Dtype::Uint8,
            op: ReduceOp::Sum,
            slice_bytes: slice,
            max_backlog: slice,
            timeout: Duration::from_secs(5),
            abort: &abort,
            call: None,
            oversubscribed: false,
        };
        run(&prog, &mut mem, &mut links, &cfg, &mut Vec::new()).unwrap();
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 12);
        // Every run of three consecutive sends has one slice of each channel.
        for turn in sent.chunks(3) {
            let mut tags = turn.to_vec();
            tags.sort_unstable();
            assert_eq!(tags, [0, 1, 2], "sends in order {sent:?}");
        }
    }
}

//! The executor's form of one rank's work: the schedule IR of that rank with chunk indices
//! turned into byte spans of the call's buffers, or a set of grouped point-to-point transfers in
//! the same shape. The engine runs only this.

use super::layout::ChunkLayout;
use super::memory::{MemId, Span, INPUT, OUTPUT, SCRATCH};
use topoccl_synth::schedule::{BufferKind, Dep, Op, Schedule, Slot};

/// Message tag of grouped point-to-point transfers (collective channels use their index).
pub(crate) const P2P_TAG: u32 = 1 << 30;
/// Message tag of one-sided puts: a stream of their own, so they never pair with a send/recv.
pub(crate) const PUT_TAG: u32 = P2P_TAG + 1;

/// What a step does with the message it receives (if any) and its spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Send,
    Recv,
    RecvReduce,
    RecvCopySend,
    RecvReduceSend,
    RecvReduceCopySend,
    Copy,
    Reduce,
}

impl Action {
    pub(crate) fn receives(self) -> bool {
        !matches!(self, Action::Send | Action::Copy | Action::Reduce)
    }
    pub(crate) fn sends(self) -> bool {
        matches!(self, Action::Send | Action::RecvCopySend | Action::RecvReduceSend | Action::RecvReduceCopySend)
    }
    pub(crate) fn reads_src(self) -> bool {
        !matches!(self, Action::Recv | Action::RecvCopySend)
    }
    pub(crate) fn writes_dst(self) -> bool {
        !matches!(self, Action::Send | Action::RecvReduceSend)
    }
}

/// One step, over `len` bytes. Unused spans and peers are left at their defaults.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProgramStep {
    pub action: Action,
    pub from: u32,
    pub to: u32,
    pub src: Span,
    pub dst: Span,
    pub len: usize,
    /// Index of the call header this step's messages carry (and must arrive with) among those
    /// the run is given: 0 for a collective (its one header), one per transfer for grouped
    /// point-to-point calls.
    pub meta: u32,
}

impl ProgramStep {
    /// The spans the step touches.
    fn spans(&self) -> impl Iterator<Item = Span> {
        let src = self.action.reads_src().then_some(self.src);
        let dst = self.action.writes_dst().then_some(self.dst);
        src.into_iter().chain(dst)
    }

    /// True when slice `i` of this step only touches bytes that slice `i` of `on` touched, so
    /// it may run as soon as that slice of `on` has (cut-through), instead of after all of it.
    fn follows_slicewise(&self, on: &ProgramStep) -> bool {
        self.len == on.len && self.spans().all(|s| on.spans().any(|o| o == s))
    }

    /// True when this step may run slice by slice behind `prev`, the step before it on its
    /// channel: it follows `prev` slicewise, and the two never use the channel's tag the same
    /// way with the same peer (both sending to one rank, or both receiving from one), so every
    /// message still meets the step that expects it. A chunk received on one link and sent on
    /// along the next then moves cut-through, as in a ring, though the IR keeps both on one
    /// channel.
    fn may_trail(&self, prev: &ProgramStep) -> bool {
        let clash = (self.action.sends() && prev.action.sends() && self.to == prev.to)
            || (self.action.receives() && prev.action.receives() && self.from == prev.from);
        !clash && self.follows_slicewise(prev)
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ProgramChannel {
    pub tag: u32,
    pub steps: Vec<ProgramStep>,
    /// Cross-channel dependencies, as in the IR (sorted by step).
    pub deps: Vec<Dep>,
    /// Per dependency: whether it holds slice by slice ([`ProgramStep::follows_slicewise`]).
    pub slicewise: Vec<bool>,
    /// Per step: whether it may run slice by slice behind the step before it (see
    /// [`ProgramStep::may_trail`]); the first step's flag is false.
    pub trails: Vec<bool>,
}

impl ProgramChannel {
    /// The dependencies of `step`, each with whether it holds slice by slice.
    pub(crate) fn deps_of(&self, step: u32) -> impl Iterator<Item = (&Dep, bool)> + '_ {
        let start = self.deps.partition_point(|d| d.step < step);
        self.deps[start..]
            .iter()
            .zip(&self.slicewise[start..])
            .take_while(move |(d, _)| d.step == step)
            .map(|(d, &s)| (d, s))
    }
}

/// One rank's program for one call.
#[derive(Debug, Clone, Default)]
pub(crate) struct Program {
    pub channels: Vec<ProgramChannel>,
    /// Every rank this program exchanges messages with.
    pub peers: Vec<u32>,
}

impl Program {
    fn note_peer(&mut self, p: u32) {
        // A receive from any source is no peer of its own: its run listens to them all.
        if p != super::p2p::ANY_SOURCE && !self.peers.contains(&p) {
            self.peers.push(p);
        }
    }

    /// Rank `rank`'s part of `schedule`, with chunks laid out by `layout` (which must
    /// [fit](ChunkLayout::fits) the schedule).
    pub(crate) fn from_schedule(schedule: &Schedule, rank: u32, layout: &ChunkLayout) -> Program {
        let mut prog = Program::default();
        let Some(mine) = schedule.ranks.get(rank as usize) else { return prog };
        let span = |slot: Slot, count: u32| {
            let mem: MemId = match slot.buffer {
                BufferKind::Input => INPUT,
                BufferKind::Output => OUTPUT,
                BufferKind::Scratch => SCRATCH,
            };
            let (off, len) = layout.range(slot.index as usize, count as usize);
            Span::new(mem, off, len)
        };
        let none = Span::new(INPUT, 0, 0);
        for (c, ch) in mine.channels.iter().enumerate() {
            let mut steps = Vec::with_capacity(ch.steps.len());
            for st in &ch.steps {
                let sp = |s: Slot| span(s, st.count);
                // Every slot of a step has one size (the layout fits the schedule).
                let len = st.op.src().or(st.op.dst()).map_or(0, |s| sp(s).len);
                let (action, from, to, src, dst) = match st.op {
                    Op::Send { to, src } => (Action::Send, 0, to, sp(src), none),
                    Op::Recv { from, dst } => (Action::Recv, from, 0, none, sp(dst)),
                    Op::RecvReduce { from, src, dst } => (Action::RecvReduce, from, 0, sp(src), sp(dst)),
                    Op::RecvCopySend { from, to, dst } => (Action::RecvCopySend, from, to, none, sp(dst)),
                    Op::RecvReduceSend { from, to, src } => (Action::RecvReduceSend, from, to, sp(src), none),
                    Op::RecvReduceCopySend { from, to, src, dst } => {
                        (Action::RecvReduceCopySend, from, to, sp(src), sp(dst))
                    }
                    Op::Copy { src, dst } => (Action::Copy, 0, 0, sp(src), sp(dst)),
                    Op::Reduce { src, dst } => (Action::Reduce, 0, 0, sp(src), sp(dst)),
                };
                if action.receives() {
                    prog.note_peer(from);
                }
                if action.sends() {
                    prog.note_peer(to);
                }
                steps.push(ProgramStep { action, from, to, src, dst, len, meta: 0 });
            }
            prog.channels.push(ProgramChannel {
                tag: c as u32,
                steps,
                deps: ch.deps.clone(),
                slicewise: Vec::new(),
                trails: Vec::new(),
            });
        }
        // A step that forwards what another channel's step received (a synthesized schedule's
        // store-and-forward hops) starts on its first slice, so a late chunk delays the next
        // hop by a slice, not by the whole chunk.
        let slicewise: Vec<Vec<bool>> = prog
            .channels
            .iter()
            .map(|ch| {
                ch.deps
                    .iter()
                    .map(|d| {
                        let on = prog.channels.get(d.on.channel as usize).and_then(|c| c.steps.get(d.on.step as usize));
                        let me = ch.steps.get(d.step as usize);
                        matches!((me, on), (Some(me), Some(on)) if me.follows_slicewise(on))
                    })
                    .collect()
            })
            .collect();
        for (ch, s) in prog.channels.iter_mut().zip(slicewise) {
            ch.slicewise = s;
            ch.trails = (0..ch.steps.len()).map(|i| i > 0 && ch.steps[i].may_trail(&ch.steps[i - 1])).collect();
        }
        prog
    }

    /// Adds a point-to-point transfer whose messages carry header `meta`: sends to one peer run
    /// in order on one channel, receives from one peer on another, and different peers run
    /// concurrently.
    pub(crate) fn add_p2p(&mut self, send: bool, peer: u32, span: Span, meta: u32, tag: u32) {
        self.note_peer(peer);
        let action = if send { Action::Send } else { Action::Recv };
        let none = Span::new(INPUT, 0, 0);
        let step = if send {
            ProgramStep { action, from: 0, to: peer, src: span, dst: none, len: span.len, meta }
        } else {
            ProgramStep { action, from: peer, to: 0, src: none, dst: span, len: span.len, meta }
        };
        let key = |s: &ProgramStep| (s.action, if send { s.to } else { s.from });
        match self.channels.iter_mut().find(|c| c.tag == tag && c.steps.first().map(key) == Some((action, peer))) {
            Some(ch) => ch.steps.push(step),
            None => self.channels.push(ProgramChannel { tag, steps: vec![step], ..ProgramChannel::default() }),
        }
    }

    /// Adds a local copy (a send of this rank to itself met by its receive), on a channel of
    /// its own.
    pub(crate) fn add_copy(&mut self, dst: Span, src: Span) {
        let step = ProgramStep { action: Action::Copy, from: 0, to: 0, src, dst, len: dst.len, meta: 0 };
        self.channels.push(ProgramChannel { tag: P2P_TAG, steps: vec![step], ..ProgramChannel::default() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topoccl_synth::schedule::{Collective, Op, ScheduleBuilder};

    fn lowered(build: impl FnOnce(&mut ScheduleBuilder)) -> Program {
        let mut b = ScheduleBuilder::new("t", Collective::AllReduce, 3, 2);
        build(&mut b);
        Program::from_schedule(&b.build(), 1, &ChunkLayout::new(2, 8, 4))
    }

    #[test]
    fn forwarding_what_was_received_runs_slice_by_slice() {
        // Rank 1 receives chunk 0 on channel 0, then forwards it on channel 1.
        let p = lowered(|b| {
            let r = b.push(1, 0, Op::RecvReduce { from: 0, src: Slot::input(0), dst: Slot::output(0) }, 1);
            b.push_after(1, 1, Op::Send { to: 2, src: Slot::output(0) }, 1, &[r]);
        });
        assert_eq!(p.channels[1].slicewise, [true]);
    }

    #[test]
    fn other_bytes_or_lengths_wait_for_the_whole_step() {
        // The forward reads more than was received, or other bytes: it needs the whole step.
        let p = lowered(|b| {
            let r = b.push(1, 0, Op::Recv { from: 0, dst: Slot::output(0) }, 1);
            b.push_after(1, 1, Op::Send { to: 2, src: Slot::output(0) }, 2, &[r]);
            b.push_after(1, 2, Op::Send { to: 2, src: Slot::output(1) }, 1, &[r]);
            // Overwriting a slot another channel sends from: the send's spans do not cover the
            // copy's source.
            let s = b.push(1, 3, Op::Send { to: 0, src: Slot::output(1) }, 1);
            b.push_after(1, 4, Op::Copy { src: Slot::input(0), dst: Slot::output(1) }, 1, &[s]);
        });
        assert_eq!(p.channels[1].slicewise, [false]);
        assert_eq!(p.channels[2].slicewise, [false]);
        assert_eq!(p.channels[4].slicewise, [false]);
    }
}

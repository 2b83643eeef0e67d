//! The executor's form of one rank's work: the schedule IR of that rank with chunk indices
//! turned into byte spans of the call's buffers, or a set of grouped point-to-point transfers in
//! the same shape. The engine runs only this.

use topoccl_synth::schedule::{Buffer, Dep, Op, Schedule, Slot};
use topoccl_transports::Meta;

use super::memory::{MemId, Span, INPUT, OUTPUT, SCRATCH};

/// Message tag of grouped point-to-point transfers (collective channels use their index).
pub(crate) const P2P_TAG: u32 = 1 << 30;

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
}

/// One step, over `len` bytes. Unused spans and peers are left at their defaults.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XStep {
    pub action: Action,
    pub from: u32,
    pub to: u32,
    pub src: Span,
    pub dst: Span,
    pub len: usize,
    /// Index in [`Program::metas`] of the call header this step's messages carry (and must
    /// arrive with).
    pub meta: u32,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct XChannel {
    pub tag: u32,
    pub steps: Vec<XStep>,
    /// Cross-channel dependencies, as in the IR (sorted by step).
    pub deps: Vec<Dep>,
}

impl XChannel {
    pub(crate) fn deps_of(&self, step: u32) -> impl Iterator<Item = &Dep> + '_ {
        let start = self.deps.partition_point(|d| d.step < step);
        self.deps[start..].iter().take_while(move |d| d.step == step)
    }
}

/// One rank's program for one call.
#[derive(Debug, Clone, Default)]
pub(crate) struct Program {
    pub channels: Vec<XChannel>,
    /// Every rank this program exchanges messages with.
    pub peers: Vec<u32>,
    /// Call headers; a collective has one, updated for each call, so a program can be reused.
    pub metas: Vec<Meta>,
}

impl Program {
    fn note_peer(&mut self, p: u32) {
        if !self.peers.contains(&p) {
            self.peers.push(p);
        }
    }

    /// Rank `rank`'s part of `schedule`, with chunks of `chunk_bytes` bytes.
    pub(crate) fn from_schedule(schedule: &Schedule, rank: u32, chunk_bytes: usize, meta: Meta) -> Program {
        let mut prog = Program { metas: vec![meta], ..Program::default() };
        let Some(mine) = schedule.ranks.get(rank as usize) else { return prog };
        let span = |slot: Slot, count: u32| {
            let mem: MemId = match slot.buffer {
                Buffer::Input => INPUT,
                Buffer::Output => OUTPUT,
                Buffer::Scratch => SCRATCH,
            };
            Span::new(mem, slot.index as usize * chunk_bytes, count as usize * chunk_bytes)
        };
        let none = Span::new(INPUT, 0, 0);
        for (c, ch) in mine.channels.iter().enumerate() {
            let mut steps = Vec::with_capacity(ch.steps.len());
            for st in &ch.steps {
                let len = st.count as usize * chunk_bytes;
                let sp = |s: Slot| span(s, st.count);
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
                steps.push(XStep { action, from, to, src, dst, len, meta: 0 });
            }
            prog.channels.push(XChannel { tag: c as u32, steps, deps: ch.deps.clone() });
        }
        prog
    }

    /// Adds a point-to-point transfer: sends to one peer run in order on one channel,
    /// receives from one peer on another, and different peers run concurrently.
    pub(crate) fn add_p2p(&mut self, send: bool, peer: u32, span: Span, meta: Meta) {
        self.note_peer(peer);
        self.metas.push(meta);
        let meta = (self.metas.len() - 1) as u32;
        let action = if send { Action::Send } else { Action::Recv };
        let none = Span::new(INPUT, 0, 0);
        let step = if send {
            XStep { action, from: 0, to: peer, src: span, dst: none, len: span.len, meta }
        } else {
            XStep { action, from: peer, to: 0, src: none, dst: span, len: span.len, meta }
        };
        let key = |s: &XStep| (s.action, if send { s.to } else { s.from });
        match self.channels.iter_mut().find(|c| c.steps.first().map(key) == Some((action, peer))) {
            Some(ch) => ch.steps.push(step),
            None => self.channels.push(XChannel { tag: P2P_TAG, steps: vec![step], deps: Vec::new() }),
        }
    }
}

//! The schedule IR: the one language every algorithm emits and every consumer (verifier,
//! simulator, executor, MSCCL export) reads.
//!
//! A schedule describes one collective on `nranks` ranks with the collective's full buffer cut
//! into `chunks` equal chunks. It is size-free: the same schedule serves any message size, a
//! chunk being `1/chunks` of the buffer.
//!
//! Each rank runs one or more ordered **channels** of [`Step`]s. Steps of one channel run in
//! order; steps of different channels run concurrently unless a step lists dependencies on steps
//! of other channels of the same rank. A send on rank `a`, channel `c`, to `b` is matched with the
//! receives on rank `b`, channel `c`, from `a`, in order (FIFO per `(from, to, channel)`).
//!
//! Sends are *eager*: a send completes once its data has left the sender, whether or not the
//! receiver has reached the matching receive. Executors buffer early arrivals; the verifier
//! proves a schedule free of deadlock under exactly these semantics.
//!
//! Buffers per rank, in chunks (C = `chunks`, n = `nranks`):
//!
//! | collective | input | output | meaning |
//! |---|---|---|---|
//! | all-reduce | C | C | output c = Σ over ranks of input c |
//! | reduce-scatter | C | C/n | rank r's output j = Σ input (r·C/n + j) |
//! | all-gather | C/n | C | output (s·C/n + j) = rank s's input j |
//! | broadcast(root) | C (root only) | C | output c = root's input c |
//! | reduce(root) | C | C (root only) | root's output c = Σ input c |
//! | all-to-all | C | C | rank r's output (s·C/n + j) = rank s's input (r·C/n + j) |
//!
//! plus `scratch_chunks` of scratch space per rank.

pub mod builder;
mod collective;
pub mod msccl;

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::topology::{Rank, MAX_RANKS};
pub use builder::ScheduleBuilder;
pub use collective::Collective;

/// The most chunks a schedule's buffers may be cut into (`chunks`, and `scratch_chunks`
/// apart). The largest generated schedules (TACOS on 4 096 ranks) use well under a million;
/// the bound keeps a loaded file's counts from overflowing the verifier's arithmetic or sizing
/// gigabytes (found by fuzzing: `"chunks": 3000000000`).
pub const MAX_CHUNKS: u32 = 1 << 22;

/// One of a rank's three buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufferKind {
    Input,
    Output,
    Scratch,
}

impl BufferKind {
    /// MSCCL's one-letter name (`i`, `o`, `s`).
    pub fn letter(self) -> char {
        match self {
            BufferKind::Input => 'i',
            BufferKind::Output => 'o',
            BufferKind::Scratch => 's',
        }
    }
}

/// A chunk position in one of a rank's buffers; a step covers `count` chunks from it.
/// Serialised as `"i3"`, `"o0"`, `"s12"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Slot {
    pub buffer: BufferKind,
    pub index: u32,
}

impl Slot {
    pub fn input(index: u32) -> Slot {
        Slot { buffer: BufferKind::Input, index }
    }
    pub fn output(index: u32) -> Slot {
        Slot { buffer: BufferKind::Output, index }
    }
    pub fn scratch(index: u32) -> Slot {
        Slot { buffer: BufferKind::Scratch, index }
    }
    /// The slot `k` chunks further in the same buffer.
    pub fn offset(self, k: u32) -> Slot {
        Slot { index: self.index + k, ..self }
    }
}

impl From<Slot> for String {
    fn from(s: Slot) -> String {
        format!("{}{}", s.buffer.letter(), s.index)
    }
}

impl TryFrom<String> for Slot {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Slot, String> {
        s.parse()
    }
}

impl FromStr for Slot {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Slot, String> {
        let buffer = match s.chars().next() {
            Some('i') => BufferKind::Input,
            Some('o') => BufferKind::Output,
            Some('s') => BufferKind::Scratch,
            _ => return Err(format!("slot `{s}` must start with i, o or s")),
        };
        let index = s[1..].parse().map_err(|_| format!("slot `{s}` has no chunk index"))?;
        Ok(Slot { buffer, index })
    }
}

/// What a step does. "in" is the data arriving from `from`; ⊕ is the collective's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Send `src` to `to`.
    Send { to: Rank, src: Slot },
    /// `dst` := in.
    Recv { from: Rank, dst: Slot },
    /// `dst` := `src` ⊕ in.
    RecvReduce { from: Rank, src: Slot, dst: Slot },
    /// `dst` := in, then send `dst` to `to`.
    RecvCopySend { from: Rank, to: Rank, dst: Slot },
    /// Send `src` ⊕ in to `to` without storing it.
    RecvReduceSend { from: Rank, to: Rank, src: Slot },
    /// `dst` := `src` ⊕ in, then send `dst` to `to`.
    RecvReduceCopySend { from: Rank, to: Rank, src: Slot, dst: Slot },
    /// `dst` := `src`.
    Copy { src: Slot, dst: Slot },
    /// `dst` := `dst` ⊕ `src`.
    Reduce { src: Slot, dst: Slot },
}

impl Op {
    pub fn recv_from(&self) -> Option<Rank> {
        match *self {
            Op::Recv { from, .. }
            | Op::RecvReduce { from, .. }
            | Op::RecvCopySend { from, .. }
            | Op::RecvReduceSend { from, .. }
            | Op::RecvReduceCopySend { from, .. } => Some(from),
            _ => None,
        }
    }

    pub fn send_to(&self) -> Option<Rank> {
        match *self {
            Op::Send { to, .. }
            | Op::RecvCopySend { to, .. }
            | Op::RecvReduceSend { to, .. }
            | Op::RecvReduceCopySend { to, .. } => Some(to),
            _ => None,
        }
    }

    /// The slot read (besides incoming data), if any.
    pub fn src(&self) -> Option<Slot> {
        match *self {
            Op::Send { src, .. }
            | Op::RecvReduce { src, .. }
            | Op::RecvReduceSend { src, .. }
            | Op::RecvReduceCopySend { src, .. }
            | Op::Copy { src, .. }
            | Op::Reduce { src, .. } => Some(src),
            _ => None,
        }
    }

    /// The slot written, if any.
    pub fn dst(&self) -> Option<Slot> {
        match *self {
            Op::Recv { dst, .. }
            | Op::RecvReduce { dst, .. }
            | Op::RecvCopySend { dst, .. }
            | Op::RecvReduceCopySend { dst, .. }
            | Op::Copy { dst, .. }
            | Op::Reduce { dst, .. } => Some(dst),
            _ => None,
        }
    }

    /// Whether the step applies the reduction operator.
    pub fn reduces(&self) -> bool {
        matches!(
            self,
            Op::RecvReduce { .. } | Op::RecvReduceSend { .. } | Op::RecvReduceCopySend { .. } | Op::Reduce { .. }
        )
    }

    /// MSCCL's step type name.
    pub fn msccl_type(&self) -> &'static str {
        match self {
            Op::Send { .. } => "s",
            Op::Recv { .. } => "r",
            Op::RecvReduce { .. } => "rrc",
            Op::RecvCopySend { .. } => "rcs",
            Op::RecvReduceSend { .. } => "rrs",
            Op::RecvReduceCopySend { .. } => "rrcs",
            Op::Copy { .. } => "cpy",
            Op::Reduce { .. } => "re",
        }
    }
}

/// One step: an operation over `count` consecutive chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    #[serde(flatten)]
    pub op: Op,
    pub count: u32,
}

/// A step of the same rank, named by channel and position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepRef {
    pub channel: u32,
    pub step: u32,
}

/// "Step `step` of this channel waits for `on`."
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dep {
    pub step: u32,
    pub on: StepRef,
}

/// An ordered list of steps; cross-channel dependencies are kept beside the steps, sorted by
/// step, because few steps have any (this keeps a step at 32 bytes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Channel {
    pub steps: Vec<Step>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<Dep>,
    /// Sending steps (sorted) whose message takes the *fabric* path to its peer: through
    /// switches, CPUs and NICs, not leaving by the link the router's path starts with (the PCIe
    /// beside a DGX-1 pair's NVLink or a DGX-A100's NVSwitch). A path is a hint to whatever moves
    /// the bytes — the simulator follows it, a GPU transport can — and never changes what a
    /// schedule computes; transports with one path per peer ignore it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub via_fabric: Vec<u32>,
}

impl Channel {
    /// The steps `step` waits for.
    pub fn deps_of(&self, step: u32) -> impl Iterator<Item = StepRef> + '_ {
        let start = self.deps.partition_point(|d| d.step < step);
        self.deps[start..].iter().take_while(move |d| d.step == step).map(|d| d.on)
    }

    /// Whether step `step`'s message takes the fabric path ([`Channel::via_fabric`]).
    pub fn sends_via_fabric(&self, step: u32) -> bool {
        !self.via_fabric.is_empty() && self.via_fabric.binary_search(&step).is_ok()
    }
}

/// What one rank runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankProgram {
    pub channels: Vec<Channel>,
}

/// A complete schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// The generator's name (`ring`, `tree`, …), for reports.
    pub name: String,
    pub collective: Collective,
    pub nranks: u32,
    pub chunks: u32,
    #[serde(default)]
    pub scratch_chunks: u32,
    /// True when the schedule is also correct with input and output aliased (in-place call:
    /// the same buffer, or for all-gather / reduce-scatter the rank's block of the larger one).
    #[serde(default)]
    pub in_place: bool,
    pub ranks: Vec<RankProgram>,
}

/// Counts for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    pub steps: u64,
    pub sends: u64,
    /// Chunks sent in total, over all ranks.
    pub chunks_sent: u64,
    pub max_channels: u32,
}

impl Schedule {
    /// Marks, on every rank's `channels`, the sends from `from` to `to` for which
    /// `takes_fabric(from, to)` holds as taking the fabric path ([`Channel::via_fabric`]).
    /// Generators give each tree channels of its own, so a channel is marked once, in step order.
    pub fn mark_via_fabric(&mut self, channels: std::ops::Range<u32>, takes_fabric: impl Fn(Rank, Rank) -> bool) {
        for (r, prog) in self.ranks.iter_mut().enumerate() {
            for ch in prog.channels.iter_mut().take(channels.end as usize).skip(channels.start as usize) {
                for (s, step) in ch.steps.iter().enumerate() {
                    if step.op.send_to().is_some_and(|to| takes_fabric(r as Rank, to)) {
                        ch.via_fabric.push(s as u32);
                    }
                }
            }
        }
    }

    pub fn input_chunks(&self) -> u32 {
        self.collective.input_chunks(self.nranks, self.chunks)
    }
    pub fn output_chunks(&self) -> u32 {
        self.collective.output_chunks(self.nranks, self.chunks)
    }

    /// Size of one buffer in chunks.
    pub fn buffer_chunks(&self, buffer: BufferKind) -> u32 {
        match buffer {
            BufferKind::Input => self.input_chunks(),
            BufferKind::Output => self.output_chunks(),
            BufferKind::Scratch => self.scratch_chunks,
        }
    }

    pub fn stats(&self) -> ScheduleStats {
        let mut s = ScheduleStats::default();
        for r in &self.ranks {
            s.max_channels = s.max_channels.max(r.channels.len() as u32);
            for ch in &r.channels {
                s.steps += ch.steps.len() as u64;
                for st in &ch.steps {
                    if st.op.send_to().is_some() {
                        s.sends += 1;
                        s.chunks_sent += u64::from(st.count);
                    }
                }
            }
        }
        s
    }

    /// Checks structure (not meaning): ranks, peers, slots and dependencies in range, chunk
    /// counts within [`MAX_CHUNKS`] and ranks within [`MAX_RANKS`]. The
    /// verifier and simulator call this first, so a hand-written or loaded schedule gets a
    /// clear message instead of an index panic.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::MalformedSchedule(m));
        if self.nranks == 0 {
            return bad("nranks is 0".into());
        }
        if self.ranks.len() != self.nranks as usize {
            return bad(format!("nranks is {} but {} rank programs are given", self.nranks, self.ranks.len()));
        }
        if self.nranks as usize > MAX_RANKS {
            return bad(format!("{} ranks is more than the {MAX_RANKS} a schedule may have", self.nranks));
        }
        for (what, n) in [("chunks", self.chunks), ("scratch_chunks", self.scratch_chunks)] {
            if n > MAX_CHUNKS {
                return bad(format!("{what} is {n}, more than the {MAX_CHUNKS} a schedule may have"));
            }
        }
        let multiple = self.collective.chunk_multiple(self.nranks);
        if self.chunks == 0 || self.chunks % multiple != 0 {
            return bad(format!(
                "{} needs a chunk count that is a positive multiple of {multiple}, got {}",
                self.collective, self.chunks
            ));
        }
        if let Err(why) = self.collective.check_root(self.nranks as usize) {
            return bad(why);
        }
        for (r, prog) in self.ranks.iter().enumerate() {
            for (c, ch) in prog.channels.iter().enumerate() {
                let at = |s: usize| format!("rank {r} channel {c} step {s}");
                for (s, st) in ch.steps.iter().enumerate() {
                    if st.count == 0 {
                        return bad(format!("{}: count is 0", at(s)));
                    }
                    for peer in [st.op.recv_from(), st.op.send_to()].into_iter().flatten() {
                        if peer >= self.nranks || peer as usize == r {
                            return bad(format!("{}: peer {peer} is not another rank of {}", at(s), self.nranks));
                        }
                    }
                    for slot in [st.op.src(), st.op.dst()].into_iter().flatten() {
                        let size = self.buffer_chunks(slot.buffer);
                        if u64::from(slot.index) + u64::from(st.count) > u64::from(size) {
                            return bad(format!(
                                "{}: chunks {}..{} of {:?} but that buffer has {size}",
                                at(s),
                                slot.index,
                                u64::from(slot.index) + u64::from(st.count),
                                slot.buffer
                            ));
                        }
                    }
                }
                for (i, &v) in ch.via_fabric.iter().enumerate() {
                    if i > 0 && v <= ch.via_fabric[i - 1] {
                        return bad(format!("rank {r} channel {c}: fabric paths not sorted by step"));
                    }
                    if ch.steps.get(v as usize).and_then(|st| st.op.send_to()).is_none() {
                        return bad(format!("{}: a fabric path on a step that sends nothing", at(v as usize)));
                    }
                }
                let mut last = 0;
                for d in &ch.deps {
                    if d.step < last {
                        return bad(format!("rank {r} channel {c}: dependencies not sorted by step"));
                    }
                    last = d.step;
                    if d.step as usize >= ch.steps.len() {
                        return bad(format!("rank {r} channel {c}: dependency of missing step {}", d.step));
                    }
                    let target = prog.channels.get(d.on.channel as usize).and_then(|t| t.steps.get(d.on.step as usize));
                    if target.is_none() || (d.on.channel as usize == c && d.on.step >= d.step) {
                        return bad(format!(
                            "{}: depends on channel {} step {}, which {}",
                            at(d.step as usize),
                            d.on.channel,
                            d.on.step,
                            if target.is_none() { "does not exist" } else { "comes later in the same channel" }
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// JSON text (the format `from_json` reads back).
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| Error::Format(e.to_string()))
    }

    /// Reads a schedule from JSON and validates its structure.
    pub fn from_json(text: &str) -> Result<Schedule> {
        let s: Schedule = serde_json::from_str(text).map_err(|e| Error::Format(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_stay_small() {
        assert!(std::mem::size_of::<Step>() <= 32, "{}", std::mem::size_of::<Step>());
    }

    #[test]
    fn slots_round_trip_as_strings() {
        for s in [Slot::input(0), Slot::output(17), Slot::scratch(3)] {
            let text: String = s.into();
            assert_eq!(text.parse::<Slot>().unwrap(), s);
        }
        assert!("x1".parse::<Slot>().is_err());
        assert!("i".parse::<Slot>().is_err());
    }

    #[test]
    fn validate_catches_bad_references() {
        let mut b = ScheduleBuilder::new("t", Collective::AllReduce, 2, 2);
        b.push(0, 0, Op::Send { to: 1, src: Slot::input(1) }, 2);
        let err = b.build().validate().unwrap_err().to_string();
        assert!(err.contains("chunks 1..3"), "{err}");
        let mut b = ScheduleBuilder::new("t", Collective::AllReduce, 2, 2);
        b.push(0, 0, Op::Send { to: 0, src: Slot::input(0) }, 1);
        assert!(b.build().validate().unwrap_err().to_string().contains("peer 0"));
        let mut b = ScheduleBuilder::new("t", Collective::AllGather, 2, 3);
        b.push(0, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(0) }, 1);
        assert!(b.build().validate().unwrap_err().to_string().contains("multiple of 2"));
    }

    #[test]
    fn chunk_counts_are_bounded() {
        // Found by fuzzing: these loaded, then overflowed the verifier's arithmetic or sized
        // gigabytes in it.
        let mut s = ScheduleBuilder::new("t", Collective::AllReduce, 2, 2).build();
        s.chunks = 3_000_000_000;
        assert!(s.validate().unwrap_err().to_string().contains("chunks is 3000000000"));
        s.chunks = 2;
        s.scratch_chunks = 4_000_000_000;
        assert!(s.validate().unwrap_err().to_string().contains("scratch_chunks is 4000000000"));
        s.scratch_chunks = MAX_CHUNKS;
        s.validate().unwrap();
    }
}

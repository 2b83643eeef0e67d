//! The verifier: executes a schedule symbolically and proves it computes its collective.
//!
//! Every chunk value is tracked as (origin chunk, set of ranks whose contributions it sums).
//! A reduction of two values must be of the same origin chunk and of disjoint rank sets (or a
//! contribution would be counted twice); reading a slot that holds nothing is reading data that
//! has not arrived; when no step can run and some remain, the schedule deadlocks (under the IR's
//! eager-send, FIFO-per-connection semantics). Steps of different channels of one rank that
//! touch the same slot must be ordered by happens-before (vector clocks over channels, messages
//! and dependencies), otherwise the result would depend on timing. At the end every output
//! chunk of every rank must hold exactly the expected value.

use std::collections::{HashMap, HashSet, VecDeque};

use fixedbitset::FixedBitSet;

use crate::error::{Error, Result};
use crate::schedule::{BufferKind, Collective, Op, Rank, Schedule, Slot};

/// Above this many channels in total, the (quadratic) race check is skipped.
const RACE_CHECK_MAX_CHANNELS: usize = 2048;

/// What to check.
#[derive(Debug, Clone, Copy)]
pub struct VerifyOptions {
    /// Alias input and output as an in-place call does.
    pub in_place: bool,
    /// Check cross-channel ordering of accesses to one slot.
    pub races: bool,
}

/// What was executed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub steps: u64,
    pub messages: u64,
    pub races_checked: bool,
}

/// Verifies out of place, and in place too when the schedule claims to support it.
pub fn verify(schedule: &Schedule) -> Result<VerifyReport> {
    let report = verify_with(schedule, VerifyOptions { in_place: false, races: true })?;
    if schedule.in_place {
        verify_with(schedule, VerifyOptions { in_place: true, races: true }).map_err(|e| match e {
            Error::Verification { schedule, message } => {
                Error::Verification { schedule, message: format!("in place: {message}") }
            }
            other => other,
        })?;
    }
    Ok(report)
}

#[derive(Clone, Debug, PartialEq)]
struct Value {
    origin: u32,
    ranks: FixedBitSet,
}

struct Message {
    values: Vec<Value>,
    clock: Option<Vec<u32>>,
    sent_at: (Rank, u32, u32),
}

/// One rank's memory: every slot of every buffer mapped to a storage cell.
struct Memory {
    cells: Vec<Option<Value>>,
    /// Race bookkeeping per cell: last writer (global channel, its step count) and readers since.
    last_write: Vec<Option<(usize, u32)>>,
    reads: Vec<Vec<(usize, u32)>>,
}

struct Machine<'s> {
    s: &'s Schedule,
    opts: VerifyOptions,
    n: u32,
    /// Chunks per rank block (C / n) for the collectives that have blocks.
    k: u32,
    mem: Vec<Memory>,
    /// Global channel id of (rank, channel) = offset[rank] + channel.
    offset: Vec<usize>,
    clocks: Vec<Vec<u32>>,
    snapshots: HashMap<(Rank, u32, u32), Vec<u32>>,
    snapshot_wanted: HashSet<(Rank, u32, u32)>,
}

impl<'s> Machine<'s> {
    fn fail(&self, message: String) -> Error {
        Error::Verification { schedule: self.s.name.clone(), message }
    }

    /// Storage cell of `slot` on `rank`.
    fn cell(&self, rank: Rank, slot: Slot) -> usize {
        let (c, i) = (self.s.chunks, slot.index);
        let inp = self.s.input_chunks();
        let out = self.s.output_chunks();
        if !self.opts.in_place {
            return match slot.buffer {
                BufferKind::Input => i as usize,
                BufferKind::Output => (inp + i) as usize,
                BufferKind::Scratch => (inp + out + i) as usize,
            };
        }
        // In place: one main buffer of C chunks, then scratch.
        match (slot.buffer, self.s.collective) {
            (BufferKind::Scratch, _) => (c + i) as usize,
            (BufferKind::Input, Collective::AllGather) => (rank * self.k + i) as usize,
            (BufferKind::Output, Collective::ReduceScatter) => (rank * self.k + i) as usize,
            _ => i as usize,
        }
    }

    fn read(&mut self, rank: Rank, g: usize, at: &str, slot: Slot, count: u32) -> Result<Vec<Value>> {
        let mut out = Vec::with_capacity(count as usize);
        for t in 0..count {
            let cell = self.cell(rank, slot.offset(t));
            self.check_race(rank, g, at, cell, slot.offset(t), false)?;
            match &self.mem[rank as usize].cells[cell] {
                Some(v) => out.push(v.clone()),
                None => {
                    return Err(
                        self.fail(format!("{at} reads {} before it holds any data", String::from(slot.offset(t))))
                    );
                }
            }
        }
        Ok(out)
    }

    fn write(&mut self, rank: Rank, g: usize, at: &str, slot: Slot, values: Vec<Value>) -> Result<()> {
        if let Collective::Reduce { root } = self.s.collective {
            if slot.buffer == BufferKind::Output && rank != root {
                return Err(self.fail(format!("{at} writes the output buffer, which reduce only has at the root")));
            }
        }
        for (t, v) in values.into_iter().enumerate() {
            let cell = self.cell(rank, slot.offset(t as u32));
            self.check_race(rank, g, at, cell, slot.offset(t as u32), true)?;
            self.mem[rank as usize].cells[cell] = Some(v);
        }
        Ok(())
    }

    fn check_race(&mut self, rank: Rank, g: usize, at: &str, cell: usize, slot: Slot, write: bool) -> Result<()> {
        if !self.opts.races {
            return Ok(());
        }
        let now = self.clocks[g][g];
        let clock = &self.clocks[g];
        let mem = &mut self.mem[rank as usize];
        let ordered = |(h, t): (usize, u32)| h == g || clock[h] >= t;
        if let Some(w) = mem.last_write[cell] {
            if !ordered(w) {
                return Err(self.fail(format!(
                    "{at} {} {} while another channel's write of it (channel-global step {}) is unordered with it: a data race",
                    if write { "writes" } else { "reads" },
                    String::from(slot),
                    w.1
                )));
            }
        }
        if write {
            if let Some(&r) = mem.reads[cell].iter().find(|&&r| !ordered(r)) {
                return Err(self.fail(format!(
                    "{at} overwrites {} while another channel may still be reading it (step {}): a data race",
                    String::from(slot),
                    r.1
                )));
            }
            mem.last_write[cell] = Some((g, now));
            mem.reads[cell].clear();
        } else {
            match mem.reads[cell].iter_mut().find(|r| r.0 == g) {
                Some(r) => r.1 = now,
                None => mem.reads[cell].push((g, now)),
            }
        }
        Ok(())
    }

    fn combine(&self, at: &str, a: &[Value], b: &[Value]) -> Result<Vec<Value>> {
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                if x.origin != y.origin {
                    return Err(self.fail(format!("{at} reduces chunk {} with chunk {}", x.origin, y.origin)));
                }
                if let Some(r) = x.ranks.intersection(&y.ranks).next() {
                    return Err(self.fail(format!("{at} counts rank {r}'s contribution to chunk {} twice", x.origin)));
                }
                let mut ranks = x.ranks.clone();
                ranks.union_with(&y.ranks);
                Ok(Value { origin: x.origin, ranks })
            })
            .collect()
    }

    fn single(&self, rank: Rank, origin: u32) -> Value {
        let mut ranks = FixedBitSet::with_capacity(self.n as usize);
        ranks.insert(rank as usize);
        Value { origin, ranks }
    }

    fn all(&self, origin: u32) -> Value {
        let mut ranks = FixedBitSet::with_capacity(self.n as usize);
        ranks.insert_range(..);
        Value { origin, ranks }
    }

    fn describe(v: &Option<Value>) -> String {
        match v {
            None => "nothing".into(),
            Some(v) => format!("chunk {} from ranks {:?}", v.origin, v.ranks.ones().collect::<Vec<_>>()),
        }
    }
}

/// Verifies with explicit options.
pub fn verify_with(s: &Schedule, opts: VerifyOptions) -> Result<VerifyReport> {
    s.validate()?;
    let n = s.nranks;
    let k = s.chunks / n;
    // At most 3 × MAX_CHUNKS (validated), so neither the sum nor the index overflows.
    let cells = if opts.in_place {
        s.chunks as usize + s.scratch_chunks as usize
    } else {
        s.input_chunks() as usize + s.output_chunks() as usize + s.scratch_chunks as usize
    };
    let mut offset = Vec::with_capacity(n as usize);
    let mut total_channels = 0;
    for p in &s.ranks {
        offset.push(total_channels);
        total_channels += p.channels.len();
    }
    let opts = VerifyOptions { races: opts.races && total_channels <= RACE_CHECK_MAX_CHANNELS, ..opts };
    let mut snapshot_wanted = HashSet::new();
    for (r, p) in s.ranks.iter().enumerate() {
        for ch in &p.channels {
            for d in &ch.deps {
                snapshot_wanted.insert((r as Rank, d.on.channel, d.on.step));
            }
        }
    }
    let mut m = Machine {
        s,
        opts,
        n,
        k,
        mem: (0..n)
            .map(|_| Memory { cells: vec![None; cells], last_write: vec![None; cells], reads: vec![Vec::new(); cells] })
            .collect(),
        offset,
        clocks: if opts.races { vec![vec![0; total_channels]; total_channels] } else { Vec::new() },
        snapshots: HashMap::new(),
        snapshot_wanted,
    };

    // Inputs.
    for r in 0..n {
        for i in 0..s.input_chunks() {
            let origin = match s.collective {
                Collective::AllGather => r * k + i,
                Collective::Broadcast { root } if r != root => continue,
                _ => i,
            };
            let cell = m.cell(r, Slot::input(i));
            m.mem[r as usize].cells[cell] = Some(m.single(r, origin));
        }
    }

    // Execution.
    let mut pc: Vec<u32> = vec![0; total_channels];
    let mut owner: Vec<(Rank, u32)> = Vec::with_capacity(total_channels);
    for (r, p) in s.ranks.iter().enumerate() {
        for c in 0..p.channels.len() {
            owner.push((r as Rank, c as u32));
        }
    }
    let mut queues: HashMap<(Rank, Rank, u32), VecDeque<Message>> = HashMap::new();
    let mut waiting_conn: HashMap<(Rank, Rank, u32), usize> = HashMap::new();
    let mut waiting_dep: Vec<Vec<usize>> = vec![Vec::new(); total_channels];
    let mut ready: VecDeque<usize> = (0..total_channels).collect();
    let mut report = VerifyReport { races_checked: opts.races, ..Default::default() };

    while let Some(g) = ready.pop_front() {
        let (rank, c) = owner[g];
        let channel = &s.ranks[rank as usize].channels[c as usize];
        'steps: while (pc[g] as usize) < channel.steps.len() {
            let si = pc[g];
            let step = channel.steps[si as usize];
            for d in channel.deps_of(si) {
                let dg = m.offset[rank as usize] + d.channel as usize;
                if pc[dg] <= d.step {
                    waiting_dep[dg].push(g);
                    break 'steps;
                }
            }
            let incoming = match step.op.recv_from() {
                Some(from) => {
                    let key = (from, rank, c);
                    match queues.get_mut(&key).and_then(|q| q.pop_front()) {
                        Some(msg) => Some(msg),
                        None => {
                            waiting_conn.insert(key, g);
                            break 'steps;
                        }
                    }
                }
                None => None,
            };
            // Run the step.
            let at = format!("rank {rank} channel {c} step {si} ({})", step.op.msccl_type());
            if opts.races {
                m.clocks[g][g] = si + 1;
                for d in channel.deps_of(si) {
                    if let Some(snap) = m.snapshots.get(&(rank, d.channel, d.step)) {
                        let snap = snap.clone();
                        merge(&mut m.clocks[g], &snap);
                    }
                }
                if let Some(clock) = incoming.as_ref().and_then(|msg| msg.clock.as_ref()) {
                    merge(&mut m.clocks[g], clock);
                }
            }
            let incoming = match incoming {
                Some(msg) => {
                    if msg.values.len() != step.count as usize {
                        let (fr, fc, fs) = msg.sent_at;
                        return Err(m.fail(format!(
                            "{at} receives {} chunks but the matching send (rank {fr} channel {fc} step {fs}) sent {}",
                            step.count,
                            msg.values.len()
                        )));
                    }
                    Some(msg.values)
                }
                None => None,
            };
            let src = match step.op.src() {
                Some(slot) => Some(m.read(rank, g, &at, slot, step.count)?),
                None => None,
            };
            let result = match (step.op, incoming, src) {
                (Op::Reduce { dst, .. }, _, Some(src)) => {
                    let cur = m.read(rank, g, &at, dst, step.count)?;
                    m.combine(&at, &cur, &src)?
                }
                (_, Some(inc), Some(src)) if step.op.reduces() => m.combine(&at, &src, &inc)?,
                (_, Some(inc), _) => inc,
                (_, None, Some(src)) => src,
                _ => return Err(m.fail(format!("{at} has nothing to work on"))),
            };
            if let Some(dst) = step.op.dst() {
                m.write(rank, g, &at, dst, result.clone())?;
            }
            if let Some(to) = step.op.send_to() {
                let key = (rank, to, c);
                queues.entry(key).or_default().push_back(Message {
                    values: result,
                    clock: opts.races.then(|| m.clocks[g].clone()),
                    sent_at: (rank, c, si),
                });
                report.messages += 1;
                if let Some(w) = waiting_conn.remove(&key) {
                    ready.push_back(w);
                }
            }
            if opts.races && m.snapshot_wanted.contains(&(rank, c, si)) {
                let snap = m.clocks[g].clone();
                m.snapshots.insert((rank, c, si), snap);
            }
            pc[g] += 1;
            report.steps += 1;
            for w in std::mem::take(&mut waiting_dep[g]) {
                ready.push_back(w);
            }
        }
    }

    // Everything ran?
    let stuck: Vec<String> = (0..total_channels)
        .filter(|&g| (pc[g] as usize) < s.ranks[owner[g].0 as usize].channels[owner[g].1 as usize].steps.len())
        .take(6)
        .map(|g| {
            let (r, c) = owner[g];
            let st = s.ranks[r as usize].channels[c as usize].steps[pc[g] as usize];
            let why = match st.op.recv_from() {
                Some(f) => format!("waits for a message from rank {f}"),
                None => "waits for a dependency".to_string(),
            };
            format!("rank {r} channel {c} step {} ({}) {why}", pc[g], st.op.msccl_type())
        })
        .collect();
    if !stuck.is_empty() {
        return Err(Error::Deadlock { schedule: s.name.clone(), message: stuck.join("; ") });
    }
    if let Some(((from, to, c), q)) = queues.iter().find(|(_, q)| !q.is_empty()) {
        let (_, _, step) = q[0].sent_at;
        return Err(m.fail(format!("rank {from} channel {c} step {step} sends to rank {to}, which never receives it")));
    }

    // Outputs.
    for r in 0..n {
        let expected: Vec<(u32, Option<Value>)> = match s.collective {
            Collective::AllReduce => (0..s.chunks).map(|c| (c, Some(m.all(c)))).collect(),
            Collective::ReduceScatter => (0..k).map(|j| (j, Some(m.all(r * k + j)))).collect(),
            Collective::AllGather => (0..s.chunks).map(|c| (c, Some(m.single(c / k, c)))).collect(),
            Collective::Broadcast { root } => (0..s.chunks).map(|c| (c, Some(m.single(root, c)))).collect(),
            Collective::Reduce { root } if r == root => (0..s.chunks).map(|c| (c, Some(m.all(c)))).collect(),
            Collective::Reduce { .. } => Vec::new(),
            Collective::AllToAll => (0..s.chunks).map(|c| (c, Some(m.single(c / k, r * k + c % k)))).collect(),
        };
        for (i, want) in expected {
            let got = &m.mem[r as usize].cells[m.cell(r, Slot::output(i))];
            if *got != want {
                return Err(m.fail(format!(
                    "rank {r} output chunk {i} holds {} but should hold {}",
                    Machine::describe(got),
                    Machine::describe(&want)
                )));
            }
        }
    }
    Ok(report)
}

fn merge(into: &mut [u32], from: &[u32]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a = (*a).max(*b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::ScheduleBuilder;

    fn two_rank_allreduce(mutate: impl Fn(&mut ScheduleBuilder)) -> Result<VerifyReport> {
        let mut b = ScheduleBuilder::new("t", Collective::AllReduce, 2, 1);
        mutate(&mut b);
        verify(&b.build())
    }

    #[test]
    fn a_correct_exchange_passes() {
        let r = two_rank_allreduce(|b| {
            for (me, peer) in [(0, 1), (1, 0)] {
                b.push(me, 0, Op::Send { to: peer, src: Slot::input(0) }, 1);
                b.push(me, 0, Op::RecvReduce { from: peer, src: Slot::input(0), dst: Slot::output(0) }, 1);
            }
        })
        .unwrap();
        assert_eq!(r.messages, 2);
    }

    #[test]
    fn double_counting_is_caught() {
        let err = two_rank_allreduce(|b| {
            b.push(0, 0, Op::Send { to: 1, src: Slot::input(0) }, 1);
            b.push(1, 0, Op::RecvReduce { from: 0, src: Slot::input(0), dst: Slot::output(0) }, 1);
            b.push(1, 0, Op::Send { to: 0, src: Slot::output(0) }, 1);
            b.push(0, 0, Op::RecvReduce { from: 1, src: Slot::input(0), dst: Slot::output(0) }, 1);
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("twice"), "{err}");
    }

    #[test]
    fn missing_data_deadlock_and_unreceived_sends_are_caught() {
        let err = two_rank_allreduce(|b| {
            b.push(0, 0, Op::Send { to: 1, src: Slot::output(0) }, 1);
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("before it holds any data"), "{err}");
        let err = two_rank_allreduce(|b| {
            b.push(0, 0, Op::Recv { from: 1, dst: Slot::output(0) }, 1);
            b.push(1, 0, Op::Recv { from: 0, dst: Slot::output(0) }, 1);
        })
        .unwrap_err();
        assert!(matches!(err, Error::Deadlock { .. }), "{err}");
        let err = two_rank_allreduce(|b| {
            b.push(0, 0, Op::Send { to: 1, src: Slot::input(0) }, 1);
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("never receives"), "{err}");
    }

    #[test]
    fn unordered_channels_touching_one_slot_are_a_race() {
        let err = two_rank_allreduce(|b| {
            for (me, peer) in [(0, 1), (1, 0)] {
                b.push(me, 0, Op::Send { to: peer, src: Slot::input(0) }, 1);
                b.push(me, 0, Op::RecvReduce { from: peer, src: Slot::input(0), dst: Slot::output(0) }, 1);
                // A second channel copies into the same output slot with no ordering.
                b.push(me, 1, Op::Copy { src: Slot::input(0), dst: Slot::output(0) }, 1);
            }
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("race"), "{err}");
    }

    #[test]
    fn wrong_result_is_reported_with_the_chunk() {
        let err = two_rank_allreduce(|b| {
            b.push(0, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(0) }, 1);
            b.push(1, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(0) }, 1);
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("rank 0 output chunk 0"), "{err}");
    }
}

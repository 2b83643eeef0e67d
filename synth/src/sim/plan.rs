//! The schedule as the simulator walks it: each step reduced to 12 bytes (its connections
//! resolved, its flags precomputed), stored *round-major* — step `k` of every channel side by
//! side, then step `k + 1`.
//!
//! Why: a schedule of N ranks holds O(N²) steps (a 4096-rank ring all-reduce at two channels,
//! 67 M of them, 1.9 GB), far beyond any cache, and its channels mostly run in lock step. Walked
//! in the schedule's own layout (one array per channel) every step is a cache and TLB miss; in
//! rounds, consecutive events touch neighbouring steps. Channels are placed longest first, so
//! the channels that have a step `k` are a prefix of round `k` and no round is padded.

use crate::error::Result;
use crate::schedule::{Op, Rank, Schedule};

/// The step copies or reduces locally (priced with `SimConfig::local_gbps`).
pub(super) const TOUCHES: u32 = 1;
/// The step's message takes the fabric path.
pub(super) const VIA_FABRIC: u32 = 2;
/// The step waits for steps of other channels.
pub(super) const HAS_DEPS: u32 = 4;

/// No connection: the step does not receive (or send).
const NONE: u32 = u32::MAX;
/// Bits of a packed step's count (`MAX_CHUNKS` is 2^22); the flags sit above.
const COUNT_BITS: u32 = 24;

#[derive(Clone, Copy)]
pub(super) struct PlanStep {
    /// Connection the step receives on, if it receives.
    pub recv: Option<u32>,
    /// Connection the step sends on, if it sends.
    pub send: Option<u32>,
    pub count: u32,
    pub flags: u32,
}

pub(super) struct Plan {
    /// Steps as (receive connection, send connection, count | flags << COUNT_BITS). Plain words,
    /// so the allocation is zeroed by the allocator (fresh pages from the kernel) instead of
    /// written twice.
    steps: Vec<[u32; 3]>,
    /// Index of round `k`'s first step.
    round: Vec<usize>,
    /// Each channel's place within a round, and its length.
    place: Vec<u32>,
    len: Vec<u32>,
}

/// Channels and steps copied per block: the copy reads each channel sequentially and writes each
/// round in runs of `BLOCK_CHANNELS` steps, so it stays in cache too.
const BLOCK_CHANNELS: usize = 64;
const BLOCK_STEPS: usize = 256;

impl Plan {
    /// Compiles `sched`, whose channel `g` is channel `index` of rank `rank` in `channels`
    /// (global order). `conn(from, to, channel)` names the connection a message takes.
    pub fn build(
        sched: &Schedule,
        channels: &[(Rank, u32)],
        mut conn: impl FnMut(Rank, Rank, u32) -> Result<u32>,
    ) -> Result<Plan> {
        let of = |g: usize| {
            let (rank, index) = channels[g];
            &sched.ranks[rank as usize].channels[index as usize]
        };
        let len: Vec<u32> = (0..channels.len()).map(|g| of(g).steps.len() as u32).collect();
        let mut order: Vec<u32> = (0..channels.len() as u32).collect();
        order.sort_by_key(|&g| std::cmp::Reverse(len[g as usize]));
        let mut place = vec![0u32; channels.len()];
        for (p, &g) in order.iter().enumerate() {
            place[g as usize] = p as u32;
        }
        let rounds = len.iter().copied().max().unwrap_or(0) as usize;
        // Channels with a step k: those longer than k.
        let mut ending = vec![0usize; rounds + 1];
        for &l in &len {
            ending[l as usize] += 1;
        }
        let mut round = Vec::with_capacity(rounds + 1);
        let (mut at, mut alive) = (0usize, channels.len());
        for ends in ending {
            round.push(at);
            alive -= ends;
            at += alive;
        }
        let mut steps = vec![[0u32; 3]; at];
        // Per channel, the last peer received from and sent to and their connections: most
        // channels keep one peer throughout.
        let mut last = vec![[(Rank::MAX, NONE); 2]; channels.len()];
        for block in order.chunks(BLOCK_CHANNELS) {
            let most = len[block[0] as usize] as usize;
            for first in (0..most).step_by(BLOCK_STEPS) {
                for &g in block {
                    let (rank, index) = channels[g as usize];
                    let ch = of(g as usize);
                    let [last_recv, last_send] = &mut last[g as usize];
                    for (k, step) in ch.steps.iter().enumerate().take(first + BLOCK_STEPS).skip(first) {
                        let recv = match step.op.recv_from() {
                            None => NONE,
                            Some(from) if from == last_recv.0 => last_recv.1,
                            Some(from) => {
                                *last_recv = (from, conn(from, rank, index)?);
                                last_recv.1
                            }
                        };
                        let send = match step.op.send_to() {
                            None => NONE,
                            Some(to) if to == last_send.0 => last_send.1,
                            Some(to) => {
                                *last_send = (to, conn(rank, to, index)?);
                                last_send.1
                            }
                        };
                        let touches = step.op.reduces()
                            || matches!(step.op, Op::Copy { .. } | Op::Recv { .. } | Op::RecvCopySend { .. });
                        let flags = if touches { TOUCHES } else { 0 };
                        steps[round[k] + place[g as usize] as usize] = [recv, send, step.count | flags << COUNT_BITS];
                    }
                }
            }
        }
        let mut plan = Plan { steps, round, place, len };
        for g in 0..channels.len() {
            let ch = of(g);
            for d in &ch.deps {
                plan.flag(g as u32, d.step, HAS_DEPS);
            }
            for &s in &ch.via_fabric {
                plan.flag(g as u32, s, VIA_FABRIC);
            }
        }
        Ok(plan)
    }

    fn flag(&mut self, g: u32, k: u32, flag: u32) {
        if let Some(i) = self.index(g, k) {
            self.steps[i][2] |= flag << COUNT_BITS;
        }
    }

    fn index(&self, g: u32, k: u32) -> Option<usize> {
        (k < self.len[g as usize]).then(|| self.round[k as usize] + self.place[g as usize] as usize)
    }

    /// Step `k` of channel `g`, if it has one.
    pub fn step(&self, g: u32, k: u32) -> Option<PlanStep> {
        let [recv, send, word] = self.steps[self.index(g, k)?];
        Some(PlanStep {
            recv: (recv != NONE).then_some(recv),
            send: (send != NONE).then_some(send),
            count: word & ((1 << COUNT_BITS) - 1),
            flags: word >> COUNT_BITS,
        })
    }
}

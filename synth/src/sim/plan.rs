//! The schedule as the simulator walks it: each channel's steps reduced to what the cost model
//! reads (the connections they receive and send on, the chunks they move, their flags) and
//! stored as *runs* of consecutive steps that are alike.
//!
//! Why: a schedule of N ranks holds O(N²) steps (a 4096-rank ring all-reduce at two channels,
//! 67 M of them, 2.1 GB), far beyond any cache, yet its channels repeat one step shape: a ring
//! channel keeps its two peers and its chunk count, and changes only its operation, a handful of
//! times. The model cannot tell those steps apart, so the plan keeps one run for them. A
//! channel's run cursor moves forward with its program counter, so finding a step is a compare,
//! and the whole plan stays in cache. A schedule whose every step differs from the last costs one
//! run per step (16 bytes), no more than a table of steps.

use crate::error::{Error, Result};
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

/// Steps `first..` (up to the next run's first) of one channel, all alike: (first step, receive
/// connection, send connection, count | flags << COUNT_BITS).
type StepRun = [u32; 4];

pub(super) struct Plan {
    /// Every channel's runs, channel after channel.
    runs: Vec<StepRun>,
    /// Channel `g`'s runs are `runs[start[g]..walks[g].end]`.
    start: Vec<u32>,
    /// Where each channel is in its runs: steps are asked for in order, so this only moves on.
    walks: Vec<Walk>,
}

/// A channel's place in its runs, in one place: finding its next step reads this and the run.
#[derive(Clone, Copy)]
struct Walk {
    /// The current run.
    at: u32,
    /// The first step after the current run.
    until: u32,
    /// Past the channel's last run.
    end: u32,
    /// The channel's step count.
    len: u32,
}

impl Walk {
    /// Sets `until` for the current run.
    fn settle(&mut self, runs: &[StepRun]) {
        self.until = if self.at + 1 < self.end { runs[self.at as usize + 1][0] } else { self.len };
    }
}

/// The peer a channel last received from (or sent to) and the connection to it: most channels
/// keep one peer throughout, so the connection is looked up once.
struct LastPeer {
    peer: Rank,
    conn: u32,
}

impl Default for LastPeer {
    fn default() -> LastPeer {
        LastPeer { peer: Rank::MAX, conn: NONE }
    }
}

impl LastPeer {
    /// The connection to `peer` ([`NONE`] without one), named by `lookup` when the peer changes.
    fn conn(&mut self, peer: Option<Rank>, lookup: impl FnOnce(Rank) -> Result<u32>) -> Result<u32> {
        let Some(peer) = peer else { return Ok(NONE) };
        if peer != self.peer {
            *self = LastPeer { peer, conn: lookup(peer)? };
        }
        Ok(self.conn)
    }
}

impl Plan {
    /// Compiles `sched`, whose channel `g` is channel `index` of rank `rank` in `channels`
    /// (global order). `conn(from, to, channel)` names the connection a message takes.
    pub fn build(
        sched: &Schedule,
        channels: &[(Rank, u32)],
        mut conn: impl FnMut(Rank, Rank, u32) -> Result<u32>,
    ) -> Result<Plan> {
        let mut runs: Vec<StepRun> = Vec::new();
        let mut start = Vec::with_capacity(channels.len());
        let mut walks = Vec::with_capacity(channels.len());
        let index_of = |n: usize| {
            u32::try_from(n).map_err(|_| Error::MalformedSchedule(format!("more than {} runs of steps", u32::MAX)))
        };
        // Steps with flags of their own, per channel: (step, flag), sorted.
        let mut flagged: Vec<(u32, u32)> = Vec::new();
        for &(rank, index) in channels {
            let prog = &sched.ranks[rank as usize];
            let ch = &prog.channels[index as usize];
            let first = index_of(runs.len())?;
            start.push(first);
            flagged.clear();
            for d in &ch.deps {
                if d.on.channel as usize >= prog.channels.len() {
                    // Checked before the run walks the dependency (validation names it too).
                    return Err(Error::MalformedSchedule(format!(
                        "rank {rank} channel {index} step {}: depends on channel {} of {}",
                        d.step,
                        d.on.channel,
                        prog.channels.len()
                    )));
                }
                flagged.push((d.step, HAS_DEPS));
            }
            flagged.extend(ch.via_fabric.iter().map(|&s| (s, VIA_FABRIC)));
            flagged.sort_unstable();
            let mut flags_at = flagged.iter().peekable();
            let (mut last_recv, mut last_send) = (LastPeer::default(), LastPeer::default());
            let mut previous: Option<[u32; 3]> = None;
            for (k, step) in ch.steps.iter().enumerate() {
                let k = k as u32;
                let recv = last_recv.conn(step.op.recv_from(), |from| conn(from, rank, index))?;
                let send = last_send.conn(step.op.send_to(), |to| conn(rank, to, index))?;
                let touches =
                    step.op.reduces() || matches!(step.op, Op::Copy { .. } | Op::Recv { .. } | Op::RecvCopySend { .. });
                let mut flags = if touches { TOUCHES } else { 0 };
                while let Some(&&(s, flag)) = flags_at.peek() {
                    if s > k {
                        break;
                    }
                    if s == k {
                        flags |= flag;
                    }
                    flags_at.next();
                }
                let shape = [recv, send, step.count | flags << COUNT_BITS];
                if previous != Some(shape) {
                    runs.push([k, shape[0], shape[1], shape[2]]);
                    previous = Some(shape);
                }
            }
            let mut walk = Walk { at: first, until: 0, end: index_of(runs.len())?, len: ch.steps.len() as u32 };
            walk.settle(&runs);
            walks.push(walk);
        }
        Ok(Plan { runs, start, walks })
    }

    /// Step `k` of channel `g`, if it has one. Cheapest when each channel's steps are asked
    /// for in order.
    pub fn step(&mut self, g: u32, k: u32) -> Option<PlanStep> {
        let w = self.walks.get_mut(g as usize)?;
        if k >= w.len {
            return None;
        }
        if k >= w.until || k < self.runs[w.at as usize][0] {
            // Past the current run, or (rarely) before it: find the step's run.
            let from = if k >= w.until { w.at as usize + 1 } else { self.start[g as usize] as usize };
            let found = self.runs[from..w.end as usize].partition_point(|r| r[0] <= k);
            w.at = (from + found - 1) as u32;
            w.settle(&self.runs);
        }
        let [_, recv, send, word] = self.runs[w.at as usize];
        Some(PlanStep {
            recv: (recv != NONE).then_some(recv),
            send: (send != NONE).then_some(send),
            count: word & ((1 << COUNT_BITS) - 1),
            flags: word >> COUNT_BITS,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::Request;
    use crate::registry::Registry;
    use crate::schedule::Collective;
    use crate::topology::resolve;

    /// Every channel of `sched` as (rank, index), in global order.
    fn placed(sched: &Schedule) -> Vec<(Rank, u32)> {
        sched
            .ranks
            .iter()
            .enumerate()
            .flat_map(|(r, p)| (0..p.channels.len() as u32).map(move |c| (r as Rank, c)))
            .collect()
    }

    /// The runs give back every step of the schedule, in order and out of order.
    #[test]
    fn runs_give_back_every_step() {
        let topo = resolve("dgx1").expect("dgx1");
        // Steps seen with dependencies and with fabric paths: the flags must be covered too.
        let (mut with_deps, mut via_fabric) = (0, 0);
        for algo in ["ring", "tree", "rhd", "blink", "hier-rhd"] {
            let sched =
                Registry::builtin().generate(algo, &Request::new(&topo, Collective::AllReduce)).expect("generates");
            let channels = placed(&sched);
            // Connections named by their ends, so a step can be checked against its op.
            let mut plan = Plan::build(&sched, &channels, |from, to, _| Ok(from * 1000 + to)).expect("builds");
            let expected = |g: usize, k: usize| {
                let (rank, index) = channels[g];
                let ch = &sched.ranks[rank as usize].channels[index as usize];
                let step = &ch.steps[k];
                let recv = step.op.recv_from().map(|f| f * 1000 + rank);
                let send = step.op.send_to().map(|t| rank * 1000 + t);
                let deps = ch.deps.iter().any(|d| d.step as usize == k);
                (recv, send, step.count, deps, ch.sends_via_fabric(k as u32))
            };
            let got = |s: PlanStep| (s.recv, s.send, s.count, s.flags & HAS_DEPS != 0, s.flags & VIA_FABRIC != 0);
            let mut steps = 0usize;
            for (g, &(rank, index)) in channels.iter().enumerate() {
                let n = sched.ranks[rank as usize].channels[index as usize].steps.len();
                for k in 0..n {
                    let s = plan.step(g as u32, k as u32).expect("a step");
                    assert_eq!(got(s), expected(g, k), "{algo}: channel {g} step {k}");
                    with_deps += usize::from(s.flags & HAS_DEPS != 0);
                    via_fabric += usize::from(s.flags & VIA_FABRIC != 0);
                }
                assert!(plan.step(g as u32, n as u32).is_none());
                // Backwards too.
                for k in (0..n).rev().step_by(3) {
                    let s = plan.step(g as u32, k as u32).expect("a step");
                    assert_eq!(got(s), expected(g, k), "{algo}: channel {g} step {k}, backwards");
                }
                steps += n;
            }
            assert!(plan.runs.len() <= steps, "{algo}: {} runs for {steps} steps", plan.runs.len());
        }
        assert!(with_deps > 0 && via_fabric > 0, "{with_deps} steps with dependencies, {via_fabric} via the fabric");
    }

    /// A ring channel is a few runs however many ranks it spans.
    #[test]
    fn a_ring_channel_is_a_few_runs() {
        let topo = resolve("ring:256").expect("ring");
        let sched = Registry::builtin().generate("ring", &Request::new(&topo, Collective::AllReduce)).expect("ring");
        let channels = placed(&sched);
        let plan = Plan::build(&sched, &channels, |from, to, _| Ok(from * 1000 + to)).expect("builds");
        let steps: usize = sched.ranks.iter().flat_map(|p| &p.channels).map(|c| c.steps.len()).sum();
        assert!(steps >= 256 * 2 * 510, "{steps} steps");
        assert!(plan.runs.len() <= channels.len() * 8, "{} runs for {} channels", plan.runs.len(), channels.len());
    }
}

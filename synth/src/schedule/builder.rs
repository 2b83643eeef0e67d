//! Building schedules step by step. Generators append steps to (rank, channel) lists in the
//! order each rank runs them; phases composed one after another on the same channel are
//! therefore ordered without explicit dependencies, and matching sends and receives stay FIFO.

use super::{Channel, Collective, Dep, Op, Rank, RankProgram, Schedule, Step, StepRef};

/// Accumulates steps into a [`Schedule`].
pub struct ScheduleBuilder {
    schedule: Schedule,
}

impl ScheduleBuilder {
    pub fn new(name: impl Into<String>, collective: Collective, nranks: u32, chunks: u32) -> ScheduleBuilder {
        ScheduleBuilder {
            schedule: Schedule {
                name: name.into(),
                collective,
                nranks,
                chunks,
                scratch_chunks: 0,
                in_place: false,
                ranks: vec![RankProgram::default(); nranks as usize],
            },
        }
    }

    pub fn nranks(&self) -> u32 {
        self.schedule.nranks
    }

    /// Makes sure every rank has at least `chunks` chunks of scratch.
    pub fn reserve_scratch(&mut self, chunks: u32) {
        self.schedule.scratch_chunks = self.schedule.scratch_chunks.max(chunks);
    }

    /// Declares the schedule safe with input and output aliased (the verifier checks it).
    pub fn in_place(&mut self, yes: bool) {
        self.schedule.in_place = yes;
    }

    fn channel(&mut self, rank: Rank, channel: u32) -> &mut Channel {
        let chans = &mut self.schedule.ranks[rank as usize].channels;
        if chans.len() <= channel as usize {
            chans.resize_with(channel as usize + 1, Channel::default);
        }
        &mut chans[channel as usize]
    }

    /// Appends a step; returns its reference for later dependencies.
    pub fn push(&mut self, rank: Rank, channel: u32, op: Op, count: u32) -> StepRef {
        let ch = self.channel(rank, channel);
        ch.steps.push(Step { op, count });
        StepRef { channel, step: ch.steps.len() as u32 - 1 }
    }

    /// Appends a step that also waits for `deps` (steps of the same rank).
    pub fn push_after(&mut self, rank: Rank, channel: u32, op: Op, count: u32, deps: &[StepRef]) -> StepRef {
        let at = self.push(rank, channel, op, count);
        for &on in deps {
            self.depend(rank, at, on);
        }
        at
    }

    /// Makes step `at` of `rank` (already pushed) also wait for `on`, a step of another channel
    /// of the same rank: for phases whose rounds were pushed by functions that know nothing of
    /// what they follow.
    pub fn depend(&mut self, rank: Rank, at: StepRef, on: StepRef) {
        // Earlier steps of the same channel are ordered already.
        if at.channel == on.channel {
            return;
        }
        let deps = &mut self.channel(rank, at.channel).deps;
        let pos = deps.partition_point(|d| d.step <= at.step);
        deps.insert(pos, Dep { step: at.step, on });
    }

    /// The last step pushed to (rank, channel), if any.
    pub fn last_step(&mut self, rank: Rank, channel: u32) -> Option<StepRef> {
        let steps = self.channel(rank, channel).steps.len() as u32;
        steps.checked_sub(1).map(|step| StepRef { channel, step })
    }

    /// The position the next step of (rank, channel) will take.
    pub fn next_step(&mut self, rank: Rank, channel: u32) -> StepRef {
        let step = self.channel(rank, channel).steps.len() as u32;
        StepRef { channel, step }
    }

    pub fn build(self) -> Schedule {
        self.schedule
    }
}

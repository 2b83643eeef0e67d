//! What the executor runs a collective from: the schedule, the chunk layout on the call's
//! element count, and this rank's program. The communicator's planner decides which schedule
//! and keeps plans (`crate::comm::plan`); a plan itself is the executor's input.

use std::sync::{Arc, OnceLock};

use topoccl_synth::schedule::Schedule;

use super::layout::ChunkLayout;
use super::program::Program;
use super::resident::ll::{ll_capable, LlProgram};
use super::resident::ResidentProgram;

/// Everything the executor needs to run one collective of one size on this rank.
#[derive(Debug)]
pub(crate) struct Plan {
    pub schedule: Arc<Schedule>,
    /// The schedule's identity on the wire.
    pub hash: u32,
    /// Chunks per block.
    pub k: usize,
    /// Where the chunks lie: uneven chunks on the caller's buffers, or, for a schedule that
    /// moves chunks between slots of unequal size, equal chunks on padded staging copies.
    pub layout: ChunkLayout,
    pub padded: bool,
    pub program: Program,
    /// Bytes of the schedule's scratch chunks.
    pub scratch_bytes: usize,
    rank: u32,
    /// The program as one stream's work, made the first time a call runs device-resident.
    resident: OnceLock<Result<ResidentProgram, String>>,
    /// The program as one kernel's steps (without, with an average's division), where every
    /// rank's runs so (`resident::ll::ll_capable`); made the first time a call asks.
    ll: OnceLock<Option<(LlProgram, LlProgram)>>,
}

impl Plan {
    /// The plan that runs `schedule`, whose identity on the wire is `hash`, on `count`
    /// elements of `esize` bytes as `rank`.
    pub(crate) fn new(rank: u32, schedule: Arc<Schedule>, hash: u32, esize: usize, count: usize) -> Plan {
        let k = (schedule.chunks / schedule.collective.chunk_multiple(schedule.nranks)).max(1) as usize;
        let uneven = ChunkLayout::new(k, count, esize);
        let padded = !uneven.fits(&schedule);
        let layout = if padded { ChunkLayout::padded(k, count.div_ceil(k), esize) } else { uneven };
        let program = Program::from_schedule(&schedule, rank, &layout);
        let scratch_bytes = layout.offset(schedule.scratch_chunks as usize);
        Plan {
            hash,
            schedule,
            k,
            layout,
            padded,
            program,
            scratch_bytes,
            rank,
            resident: OnceLock::new(),
            ll: OnceLock::new(),
        }
    }

    /// This rank's program as one stream's work, or why it cannot be.
    pub(crate) fn resident(&self) -> Result<&ResidentProgram, &str> {
        self.resident
            .get_or_init(|| ResidentProgram::lower(&self.schedule, &self.layout, &self.program, self.rank))
            .as_ref()
            .map_err(String::as_str)
    }

    /// This rank's program as one kernel's steps (`avg`: with the average's division), where
    /// every rank's part of the schedule runs so.
    pub(crate) fn ll(&self, avg: bool) -> Option<&LlProgram> {
        let both = self.ll.get_or_init(|| {
            let prog = self.resident().ok()?;
            if !ll_capable(&self.schedule, prog.peak) {
                return None;
            }
            Some((LlProgram::lower(prog, false)?, LlProgram::lower(prog, true)?))
        });
        both.as_ref().map(|(plain, with)| if avg { with } else { plain })
    }
}

//! The host's part of a staged device call (`crate::comm::staged`): the caller's stream copies
//! each piece of the call's device data into a slot of pinned host memory and writes the
//! slot's input word; this side waits for that word with plain loads, runs the piece as a host
//! call over the connections (no driver call at all: the piece lies in host memory), and
//! stores the slot's output word, which the stream (or, where ranks share a CUDA context, the
//! caller's thread) waits on before copying the piece's output back. When the call cannot end
//! (a peer gone, a timeout, an abort) the output words are stored anyway, so the stream goes on
//! (with the call's output undefined and the communicator broken) rather than hanging.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::job::Job;
use super::Executor;
use crate::diag::Board;
use crate::error::{Error, Result};
use crate::wire::CallHeader;

/// One piece: the host job over its slot, and its number (its slot's words reach it).
pub(crate) struct StagedPiece {
    pub number: u32,
    pub job: Job,
}

/// A staged call (see the module documentation).
pub(crate) struct StagedJob {
    pub binding: Arc<crate::cuda::Binding>,
    pub pieces: Vec<StagedPiece>,
    /// The ticket the caller's stream writes after the call's last copy.
    pub ticket: u32,
    /// Set by the caller when queueing the stream's part failed: no input will land.
    pub abandoned: Arc<AtomicBool>,
    pub header: CallHeader,
    pub outstanding: crate::cuda::Outstanding,
}

impl StagedJob {
    /// Lets the caller's stream go past every wait of the call.
    pub(crate) fn release(&self) {
        let n = self.pieces.len();
        for p in &self.pieces[n.saturating_sub(crate::cuda::STAGED_SLOTS as usize)..] {
            self.binding.staged_output_done(p.number);
        }
        self.binding.complete_from_host(self.ticket);
    }
}

/// Polls between two looks at the clock and the abort flag.
const CHECK_EVERY: u32 = 64;

impl Executor {
    /// Runs a staged call's pieces as they land; releases its stream if it fails.
    ///
    /// # Safety
    /// The pieces' jobs' regions are the binding's slots (valid while it lives) and, for a
    /// receive's source, the caller's memory under [`Executor::run`]'s contract.
    pub(crate) unsafe fn run_staged(&mut self, job: &StagedJob) -> Result<()> {
        // SAFETY: this fn's contract.
        let r = unsafe { self.run_pieces(job) };
        if r.is_err() {
            job.release();
        }
        job.outstanding.end();
        r
    }

    /// # Safety
    /// As for [`Executor::run_staged`].
    unsafe fn run_pieces(&mut self, job: &StagedJob) -> Result<()> {
        for p in &job.pieces {
            self.wait_for(
                job,
                "the call's input to reach host memory (its CUDA stream has not run its copies)",
                || job.binding.staged_input_landed(p.number),
            )?;
            // SAFETY: a host job over the binding's slot (this fn's contract).
            unsafe { self.run(&p.job)? };
            job.binding.staged_output_done(p.number);
        }
        // The stream copies the last output back and writes the ticket: only then are the
        // slots free for the next call's host part, and the call over.
        self.wait_for(job, "the call's output to be copied back by its CUDA stream", || {
            job.binding.completed(job.ticket)
        })
    }

    /// Waits with plain loads until `ready`, failing on an abort, a broken job, the caller
    /// giving the call up, or the timeout.
    fn wait_for(&self, job: &StagedJob, waiting: &str, ready: impl Fn() -> bool) -> Result<()> {
        let begun = Instant::now();
        let mut rounds = 0u32;
        while !ready() {
            rounds = rounds.wrapping_add(1);
            if rounds % CHECK_EVERY == 0 {
                if self.abort.load(Ordering::Relaxed) {
                    return Err(Error::Aborted);
                }
                if job.abandoned.load(Ordering::Acquire) {
                    return Err(Error::Internal("the call's stream work could not be queued".into()));
                }
                if let Some(v) = self.board.as_deref().and_then(Board::told) {
                    return Err(Error::PeerFailed { peer: v.found_by, reason: "it found the job broken".into() });
                }
                if begun.elapsed() >= self.settings.timeout {
                    return Err(Error::Timeout {
                        rank: self.rank,
                        secs: begun.elapsed().as_secs_f64(),
                        call: job.header.describe(),
                        waiting: waiting.into(),
                    });
                }
            }
            if rounds < 1024 && !self.settings.oversubscribed {
                std::hint::spin_loop();
            } else if rounds < 8192 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        Ok(())
    }
}

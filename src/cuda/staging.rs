//! The pinned host memory staged device calls go through (`crate::comm::staged`): two slots,
//! each an input half and an output half, and per slot a word the caller's stream writes when
//! the slot's input has landed and a word the host writes when its output is ready. Made with
//! the binding, because nothing may be allocated once a call can be waited for.
//!
//! Pieces are numbered in call order; piece `n` uses slot `n % 2`, so the stream copies the
//! next piece in while the host runs the current one. Words only grow (modulo wrapping), and
//! stream waits are GEQ, so a host write that releases every later wait (a failed call) is
//! one store.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use topoccl_transports::{MemSpace, Region};

use super::context::Context;
use super::memory::Pinned;
use crate::error::Result;

/// Bytes of each half (input, output) of a slot: a larger call goes through in pieces.
pub const STAGED_BYTES: usize = 2 << 20;

/// Slots: one being run by the host while the stream fills or drains the other.
pub const STAGED_SLOTS: u32 = 2;

/// Where the words lie in their page: slot `s`'s input word at `IN_AT + 4s`, its output word
/// at `OUT_AT + 4s`, its PreMulSum scalar (copied from device memory with its input) at
/// `SCALAR_AT + 16s`.
const IN_AT: usize = 0;
const OUT_AT: usize = 64;
const SCALAR_AT: usize = 128;
const WORDS_BYTES: usize = 4096;

/// The binding's staging memory (see the module documentation).
#[derive(Debug)]
pub(crate) struct Staging {
    data: Pinned,
    words: Pinned,
    /// The last piece number handed out.
    issued: AtomicU32,
}

/// One slot as a piece sees it.
#[derive(Debug, Clone, Copy)]
pub struct StagedSlot {
    pub input: Region,
    pub output: Region,
    /// Room for one PreMulSum scalar (host memory).
    pub scalar: Region,
}

impl Staging {
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Staging> {
        Ok(Staging {
            data: Pinned::new(ctx, STAGED_SLOTS as usize * 2 * STAGED_BYTES)?,
            words: Pinned::new(ctx, WORDS_BYTES)?,
            issued: AtomicU32::new(0),
        })
    }

    /// A number for the next piece (must be taken in call order, under the call lock).
    pub(crate) fn next_piece(&self) -> u32 {
        self.issued.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    pub(crate) fn slot(&self, piece: u32) -> StagedSlot {
        let s = (piece % STAGED_SLOTS) as usize;
        let base = self.data.addr() + s * 2 * STAGED_BYTES;
        StagedSlot {
            input: Region::new(MemSpace::Host, base, STAGED_BYTES),
            output: Region::new(MemSpace::Host, base + STAGED_BYTES, STAGED_BYTES),
            scalar: Region::new(MemSpace::Host, self.words.addr() + SCALAR_AT + 16 * s, 16),
        }
    }

    fn word(&self, at: usize, piece: u32) -> (&AtomicU32, u64) {
        let at = at + 4 * (piece % STAGED_SLOTS) as usize;
        // SAFETY: the page holds the words at these offsets (module constants), is page
        // aligned, lives as long as `self`, and is only accessed as atomic words by the host
        // and by the device's 32-bit stream memory operations.
        let word = unsafe { &*((self.words.addr() + at) as *const AtomicU32) };
        (word, self.words.device_addr() + at as u64)
    }

    /// The device address of the word the stream writes once `piece`'s input is in its slot.
    pub(crate) fn input_word(&self, piece: u32) -> u64 {
        self.word(IN_AT, piece).1
    }

    /// The device address of the word the stream waits on for `piece`'s output.
    pub(crate) fn output_word(&self, piece: u32) -> u64 {
        self.word(OUT_AT, piece).1
    }

    /// Whether `piece`'s input has landed in its slot.
    pub(crate) fn input_landed(&self, piece: u32) -> bool {
        reached(self.word(IN_AT, piece).0.load(Ordering::Acquire), piece)
    }

    /// Whether `piece`'s output is ready (the host wrote its word).
    pub(crate) fn output_ready(&self, piece: u32) -> bool {
        reached(self.word(OUT_AT, piece).0.load(Ordering::Acquire), piece)
    }

    /// Says `piece`'s output is ready (and, for every later piece of its slot up to `piece`,
    /// releases the stream's waits).
    pub(crate) fn output_done(&self, piece: u32) {
        self.word(OUT_AT, piece).0.store(piece, Ordering::Release);
    }
}

fn reached(now: u32, value: u32) -> bool {
    (now.wrapping_sub(value) as i32) >= 0
}

impl super::Binding {
    /// A number for the next staged piece (in call order, under the call lock).
    pub fn next_piece(&self) -> u32 {
        self.staging.next_piece()
    }

    /// Piece `piece`'s slot.
    pub fn staged_slot(&self, piece: u32) -> StagedSlot {
        self.staging.slot(piece)
    }

    /// Whether the stream has put `piece`'s input in its slot.
    pub fn staged_input_landed(&self, piece: u32) -> bool {
        self.staging.input_landed(piece)
    }

    /// Whether `piece`'s output is ready for the stream.
    pub fn staged_output_ready(&self, piece: u32) -> bool {
        self.staging.output_ready(piece)
    }

    /// Tells the stream that `piece`'s output is ready (or that it need wait no longer).
    pub fn staged_output_done(&self, piece: u32) {
        self.staging.output_done(piece)
    }
}

impl super::CallerStream<'_> {
    /// The stream says `piece`'s input is in its slot (after the copies queued so far).
    pub fn staged_input_done(&mut self, piece: u32) -> Result<()> {
        let word = self.binding().staging.input_word(piece);
        // SAFETY: a word of the binding's pinned page, alive as long as the binding.
        unsafe { self.stream_ref().write_value(word, piece) }
    }

    /// The stream waits until the host has `piece`'s output ready.
    pub fn staged_output_wait(&mut self, piece: u32) -> Result<()> {
        let word = self.binding().staging.output_word(piece);
        // SAFETY: as above.
        unsafe { self.stream_ref().wait_value(word, piece) }
    }
}

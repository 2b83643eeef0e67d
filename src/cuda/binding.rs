//! A communicator's device, and how its calls keep NCCL's stream semantics although a host
//! thread runs them.
//!
//! `ncclAllReduce(..., stream)` enqueues and returns: the collective must start after the work
//! already on the caller's stream, and the caller's stream must wait for its end. The
//! communicator does both with words of pinned, device-mapped host memory that say which
//! calls have completed ([`Binding`]):
//!
//! - at the call, an event is recorded on the caller's stream (the work before the call), and a
//!   stream memory operation makes the caller's stream wait until the call's word reaches the
//!   call's ticket (`cuStreamWaitValue32`, GEQ, so tickets may wrap);
//! - the executor's own stream waits for that event before its first operation of the call;
//! - when the call succeeds, the executor's stream writes the ticket into the word after its
//!   last operation (`cuStreamWriteValue32`), so the GPU itself releases the caller's stream the
//!   moment the work is done, without a round trip through the host;
//! - when it fails (a peer died, a timeout, an abort) or never runs (the communicator broke
//!   before it), the host writes the ticket at once, so the caller's stream never hangs; the
//!   error is the communicator's (`ncclCommGetAsyncError`).
//!
//! Each call has its own word (ticket modulo [`SLOTS`]), so a host write can never be undone
//! by the device's late write of an earlier call's ticket, whatever order they land in.
//!
//! **Nothing is created while a call may be waited for.** A copy into pageable host memory
//! (`cudaMemcpy` to a `std::vector`, `tensor.cpu()` on some paths) waits for its stream inside
//! the driver holding a lock of the context that `cuStreamCreate` and `cuEventCreate` also
//! take (seen on an H200, driver 580: a rank thread in `cuMemcpyDtoHAsync` waiting for its
//! call, the executor in `cuStreamCreate`, the other rank thread in `cuEventCreate`, for
//! ever). A caller may well be in such a copy, waiting for a call, while that call's executor
//! or another rank's thread has yet to do its part. So the binding makes, before any call can
//! be waited for, the kernels ([`Kernels::of`]), the executor's device operations with their
//! stream and events ([`Binding::take_ops`]) and a pool of events the calls draw from and
//! give back ([`EVENTS`]); a call creates nothing while the pool lasts.
//!
//! Why not the alternatives: a host function (`cuLaunchHostFunc`) that blocks until the call
//! ends ties up the driver's callback thread, which serialises every host function of the
//! process, and may not call the driver; a kernel spinning on a flag holds a multiprocessor
//! for the whole call and can starve the very kernels the call launches when several ranks
//! share a GPU. Stream memory operations cost nothing while waiting, are ordered like any
//! other stream work, and every GPU this library's kernels run on (sm_80 and newer, driver 11.7
//! and newer) supports them.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::context::Context;
use super::kernels::Kernels;
use super::memory::{DeviceMemory, Pinned};
use super::ops::CudaOps;
use super::stream::{Event, StreamRef};
use crate::error::{Error, Result};

/// Completion words per communicator: calls more than this many apart share a word.
pub const SLOTS: u32 = 4096;

/// Events made with the binding: one per call in flight and one per caller stream. Beyond
/// that a call makes one (which may wait for a caller's blocking copy: module documentation).
pub const EVENTS: usize = 32;

/// Bytes of each of a device-resident call's two workspaces (scratch chunks; an input staged
/// apart from an overlapping output): a call that needs more runs host-driven.
pub const RESIDENT_WORKSPACE: usize = 4 << 20;

/// Bytes after the completion words: the abort word of the one-launch kernels.
const ABORT_BYTES: usize = 64;

/// A communicator's device context and the words its calls' completions are written to.
#[derive(Debug)]
pub struct Binding {
    ctx: Arc<Context>,
    /// The context's kernels, loaded before any stream can wait on this binding (loading may
    /// synchronise the context: [`Kernels::of`]) and kept loaded while it lives.
    pub(super) kernels: Arc<Kernels>,
    /// Device-resident calls' scratch and staging, made here because nothing may be allocated
    /// once a call can be waited for ([`RESIDENT_WORKSPACE`] bytes each).
    pub(super) workspace: DeviceMemory,
    /// Staged calls' pinned slots and words (`super::staging`), made here for the same reason.
    pub(super) staging: super::staging::Staging,
    /// The words (freed by `drop` only once no stream can still read them).
    flag: ManuallyDrop<Pinned>,
    /// The last ticket handed out (the front of the queue); tickets go out in call order.
    issued: AtomicU32,
    /// Per caller stream, an event recorded just after its latest wait on the word: the word
    /// is freed only once every stream is past its waits.
    passed: Mutex<Vec<(StreamRef, Event)>>,
    /// Events no call holds (the module documentation says why they are made in advance).
    spare: Mutex<Vec<Event>>,
    /// The executor's device operations, made with the binding, until the executor takes them.
    ops: Mutex<Option<CudaOps>>,
}

impl Binding {
    /// Binds to `ctx`. Loading the kernels may wait for all of the context's work: call it
    /// before this process can have a call of the communicator waited for.
    pub fn new(ctx: Arc<Context>) -> Result<Arc<Binding>> {
        let kernels = Kernels::of(&ctx)?;
        let ops = CudaOps::new(&ctx)?;
        let spare = (0..EVENTS).map(|_| Event::new(&ctx)).collect::<Result<Vec<_>>>()?;
        let flag = ManuallyDrop::new(Pinned::new(&ctx, SLOTS as usize * 4 + ABORT_BYTES)?);
        let workspace = DeviceMemory::new(&ctx, 2 * RESIDENT_WORKSPACE)?;
        let staging = super::staging::Staging::new(&ctx)?;
        let b = Arc::new(Binding {
            ctx,
            kernels,
            workspace,
            staging,
            flag,
            issued: AtomicU32::new(0),
            passed: Mutex::new(Vec::new()),
            spare: Mutex::new(spare),
            ops: Mutex::new(Some(ops)),
        });
        // Pinned memory comes uninitialised.
        b.abort_word().0.store(0, Ordering::Release);
        Ok(b)
    }

    /// The executor's device operations: those made with the binding, the first time (later,
    /// should an executor need them again, made now).
    pub fn take_ops(&self) -> Result<CudaOps> {
        match self.ops.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(ops) => Ok(ops),
            None => CudaOps::new(&self.ctx),
        }
    }

    /// An event from the pool, or a new one when it is empty.
    fn event(&self) -> Result<Event> {
        match self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            Some(e) => Ok(e),
            None => Event::new(&self.ctx),
        }
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Ticket `ticket`'s word: on the host, and the address the device uses.
    fn word(&self, ticket: u32) -> (&AtomicU32, u64) {
        let at = (ticket % SLOTS) as usize * 4;
        // SAFETY: the pinned allocation holds SLOTS 4-byte words, is page-aligned, lives as
        // long as `self`, and is only ever accessed as atomic words (by the host) or by the
        // device's 32-bit stream memory operations.
        let word = unsafe { &*((self.flag.addr() + at) as *const AtomicU32) };
        (word, self.flag.device_addr() + at as u64)
    }

    /// Ties a call to the caller's `stream`: the call starts after the stream's work so far,
    /// and the stream's later work waits for the call's end. Must be called in call order.
    pub fn attach(self: &Arc<Binding>, stream: StreamRef) -> Result<StreamSync> {
        let _current = self.ctx.enter()?;
        let start = self.event()?;
        start.record(stream)?;
        let ticket = self.issued.load(Ordering::Relaxed).wrapping_add(1);
        // SAFETY: the word is device-mapped pinned memory that lives until every stream has
        // passed its waits on it (`passed`, checked when the binding drops).
        unsafe { stream.wait_value(self.word(ticket).1, ticket)? };
        self.issued.store(ticket, Ordering::Relaxed);
        let mut passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
        let i = match passed.iter().position(|(s, _)| *s == stream) {
            Some(i) => i,
            // A stream past all its waits needs no entry: its event serves the new stream (so
            // a caller making a stream per call keeps a few entries, not one per stream ever).
            None => match passed.iter().position(|(_, ev)| ev.done().unwrap_or(false)) {
                Some(i) => {
                    passed[i].0 = stream;
                    i
                }
                None => {
                    passed.push((stream, self.event()?));
                    passed.len() - 1
                }
            },
        };
        passed[i].1.record(stream)?;
        drop(passed);
        Ok(StreamSync {
            binding: self.clone(),
            start: ManuallyDrop::new(start),
            ticket,
            outstanding: super::Outstanding::begin(),
        })
    }

    /// A ticket for a device-resident call: its caller's stream writes it at the call's end
    /// ([`Binding::complete_on`]) and the host watches for it ([`Binding::completed`]); no
    /// stream waits on it. Must be taken in call order, as `attach`'s.
    pub fn next_ticket(&self) -> u32 {
        let ticket = self.issued.load(Ordering::Relaxed).wrapping_add(1);
        self.issued.store(ticket, Ordering::Relaxed);
        ticket
    }

    /// The device address of ticket `ticket`'s word (a stream may wait on it).
    pub fn word_device_addr(&self, ticket: u32) -> u64 {
        self.word(ticket).1
    }

    /// The abort word the one-launch kernels poll, past the completion words: on the host,
    /// and the address the device uses.
    fn abort_word(&self) -> (&AtomicU32, u64) {
        let at = SLOTS as usize * 4;
        // SAFETY: within the pinned allocation (`ABORT_BYTES` past the words), aligned, alive
        // with `self`; the host uses it atomically, the devices only read it.
        let word = unsafe { &*((self.flag.addr() + at) as *const AtomicU32) };
        (word, self.flag.device_addr() + at as u64)
    }

    /// The device address of the abort word the one-launch kernels poll (pinned memory).
    pub fn ll_abort_word(&self) -> u64 {
        self.abort_word().1
    }

    /// Makes every one-launch kernel of this binding, running or to come, return at its next
    /// wait: a call failed (a peer died, a timeout, an abort) and its kernel may wait for ever.
    pub fn abort_device_calls(&self) {
        self.abort_word().0.store(1, Ordering::Release);
    }

    /// Whether ticket `ticket`'s word has been written (by the device or the host).
    pub fn completed(&self, ticket: u32) -> bool {
        let now = self.word(ticket).0.load(Ordering::Acquire);
        (now.wrapping_sub(ticket) as i32) >= 0
    }

    /// Marks a call done from the host (a failed call, one never run, or one on host memory).
    pub fn complete_from_host(&self, ticket: u32) {
        self.word(ticket).0.store(ticket, Ordering::Release);
    }

    /// Makes `stream` write the ticket once its work so far is done.
    ///
    /// # Safety
    /// `stream` must belong to this binding's context.
    pub unsafe fn complete_on(&self, stream: StreamRef, ticket: u32) -> Result<()> {
        // SAFETY: as in `attach`; the stream is this context's (this fn's contract).
        unsafe { stream.write_value(self.word(ticket).1, ticket) }
    }

    /// Checks that a caller's stream belongs to this communicator's context.
    pub fn check_stream(&self, stream: StreamRef) -> Result<()> {
        let _current = self.ctx.enter()?;
        match stream.context()? {
            Some(c) if c != self.ctx.raw() => Err(Error::InvalidArgument(format!(
                "the stream belongs to another CUDA context than this communicator's (device {})",
                self.ctx.ordinal()
            ))),
            _ => Ok(()),
        }
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        // A caller's stream may reach its wait on a word after the last call was written
        // (its own earlier work ran long): the word must outlive that read. A stream that does
        // not get there within a minute (its own work hangs) keeps the word: leaked, not freed
        // under the device.
        let deadline = Instant::now() + Duration::from_secs(60);
        let _current = self.ctx.enter();
        let passed = self.passed.get_mut().unwrap_or_else(|p| p.into_inner());
        let all_passed = passed.iter().all(|(_, ev)| loop {
            match ev.done() {
                Ok(true) | Err(_) => break true,
                Ok(false) if Instant::now() >= deadline => break false,
                Ok(false) => std::thread::sleep(Duration::from_micros(200)),
            }
        });
        if all_passed {
            // SAFETY: dropped once, here, and never used again (the binding is going away).
            unsafe { ManuallyDrop::drop(&mut self.flag) };
        }
    }
}

/// One call's ties to its caller's stream (see the module documentation).
#[derive(Debug)]
pub struct StreamSync {
    pub binding: Arc<Binding>,
    /// Recorded on the caller's stream at the call; back to the binding's pool when the call
    /// is over (the executor's stream waited for it, or the host saw it complete, by then).
    pub start: ManuallyDrop<Event>,
    /// Written into the binding's word when the call has ended.
    pub ticket: u32,
    /// A host-driven call is outstanding too: the executor's driver calls during it are what
    /// [`super::foreign_driver_calls`] counts (and what can deadlock a real driver).
    pub outstanding: super::Outstanding,
}

impl Drop for StreamSync {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is never used again.
        let start = unsafe { ManuallyDrop::take(&mut self.start) };
        self.binding.spare.lock().unwrap_or_else(|p| p.into_inner()).push(start);
    }
}

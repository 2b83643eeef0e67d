//! Streams and events: the executor's own stream, a caller's stream (borrowed), and the events
//! and stream memory operations that order work between them.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUevent, CUevent_flags, CUresult, CUstream};

use super::context::Context;
use super::driver::check;
use crate::error::{Error, Result};

/// A caller's stream (NCCL's `cudaStream_t`), borrowed for a call: NULL is the legacy default
/// stream of the current context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRef(pub CUstream);

// SAFETY: a stream handle is a driver handle, usable from any thread whose current context is
// the stream's.
unsafe impl Send for StreamRef {}
// SAFETY: as above; the value is only read.
unsafe impl Sync for StreamRef {}

impl StreamRef {
    /// The legacy default stream.
    pub const LEGACY: StreamRef = StreamRef(std::ptr::null_mut());

    /// The stream behind a raw handle (`cudaStream_t`, or cudarc's `CudaStream::cu_stream`).
    pub fn from_raw(raw: *mut std::ffi::c_void) -> StreamRef {
        StreamRef(raw.cast())
    }

    /// The context the stream belongs to (for the legacy stream: the thread's current one).
    pub fn context(self) -> Result<Option<sys::CUcontext>> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the driver is loaded (a stream exists); the out-pointer is a local.
        let r = unsafe { sys::cuStreamGetCtx(self.0, &mut ctx) };
        if r == CUresult::CUDA_ERROR_INVALID_CONTEXT && self.0.is_null() {
            return Ok(None);
        }
        check(r, "cuStreamGetCtx")?;
        Ok((!ctx.is_null()).then_some(ctx))
    }

    /// Refuses a stream being captured into a CUDA graph: the executor runs on the host, so a
    /// captured call would never run.
    pub fn not_capturing(self) -> Result<()> {
        if self.capturing()? {
            return Err(Error::InvalidArgument(
                "the stream is being captured into a CUDA graph, which topoccl's host-driven executor \
                 cannot run"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether the stream is being captured into a CUDA graph; a capture an earlier call
    /// invalidated is an error (the graph could not be made anyway).
    pub fn capturing(self) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: as in `context`.
        check(unsafe { sys::cuStreamIsCapturing(self.0, &mut status) }, "cuStreamIsCapturing")?;
        match status {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(false),
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(true),
            _ => Err(Error::InvalidArgument(
                "the stream's capture into a CUDA graph was invalidated by an earlier call on it".into(),
            )),
        }
    }
}

/// While it lives, this thread's stream-capture mode is `RELAXED`: the driver then allows the
/// calls a capture elsewhere would forbid (allocating, registering, loading), which a
/// communicator makes when its first call binds it, perhaps inside the caller's capture (NCCL
/// does the same for its own allocations).
pub struct RelaxedCapture {
    previous: sys::CUstreamCaptureMode,
}

impl RelaxedCapture {
    pub fn enter() -> Result<RelaxedCapture> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: the out-pointer is a local the driver reads and writes.
        check(unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }, "cuThreadExchangeStreamCaptureMode")?;
        Ok(RelaxedCapture { previous: mode })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let mut mode = self.previous;
        // SAFETY: as in `enter`. Nothing can be reported from a drop.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
}

impl StreamRef {
    /// Makes the stream's later work wait until the 32-bit word at device address `addr`
    /// reaches `value` (`(int32)(*addr - value) >= 0`, so the count may wrap).
    ///
    /// # Safety
    /// `addr` must be device-accessible memory (device, or host-mapped pinned) that stays valid
    /// until the stream has passed the wait.
    pub unsafe fn wait_value(self, addr: u64, value: u32) -> Result<()> {
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: this fn's contract.
        check(unsafe { sys::cuStreamWaitValue32_v2(self.0, addr, value, geq) }, "cuStreamWaitValue32")
    }

    /// Writes `value` to the word at device address `addr` once the stream's earlier work is
    /// done.
    ///
    /// # Safety
    /// As for [`StreamRef::wait_value`].
    pub unsafe fn write_value(self, addr: u64, value: u32) -> Result<()> {
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: this fn's contract.
        check(unsafe { sys::cuStreamWriteValue32_v2(self.0, addr, value, flags) }, "cuStreamWriteValue32")
    }

    /// Makes the stream's later work wait for `event`'s last record.
    pub fn wait(self, event: &Event) -> Result<()> {
        // SAFETY: both handles are live (the event by its owner, the stream by the caller).
        check(unsafe { sys::cuStreamWaitEvent(self.0, event.raw, 0) }, "cuStreamWaitEvent")
    }
}

/// A stream of this crate's own, non-blocking (it never waits for the legacy default stream
/// implicitly), destroyed when dropped.
#[derive(Debug)]
pub struct Stream {
    raw: StreamRef,
    ctx: Arc<Context>,
}

// SAFETY: see `StreamRef`; the context is Send + Sync.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        let _current = ctx.enter()?;
        let mut raw: CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current; the out-pointer is a local.
        check(unsafe { sys::cuStreamCreate(&mut raw, flags) }, "cuStreamCreate")?;
        Ok(Stream { raw: StreamRef(raw), ctx: ctx.clone() })
    }

    pub fn handle(&self) -> StreamRef {
        self.raw
    }

    /// Whether all work submitted so far has completed.
    pub fn idle(&self) -> Result<bool> {
        // SAFETY: a live stream of ours.
        match unsafe { sys::cuStreamQuery(self.raw.0) } {
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuStreamQuery").map(|()| true),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _current = self.ctx.enter();
        // SAFETY: created by `new` and destroyed once; the driver finishes its pending work
        // first. Nothing can be reported from a drop.
        let _ = unsafe { sys::cuStreamDestroy_v2(self.raw.0) };
    }
}

/// An event without timing (the cheap kind; also the only kind that crosses processes).
#[derive(Debug)]
pub struct Event {
    raw: CUevent,
    ctx: Arc<Context>,
}

// SAFETY: an event handle is usable from any thread of its context.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    pub fn new(ctx: &Arc<Context>) -> Result<Event> {
        let _current = ctx.enter()?;
        let mut raw: CUevent = std::ptr::null_mut();
        let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the context is current; the out-pointer is a local.
        check(unsafe { sys::cuEventCreate(&mut raw, flags) }, "cuEventCreate")?;
        Ok(Event { raw, ctx: ctx.clone() })
    }

    /// Captures the work submitted to `stream` so far.
    pub fn record(&self, stream: StreamRef) -> Result<()> {
        // SAFETY: both handles are live.
        check(unsafe { sys::cuEventRecord(self.raw, stream.0) }, "cuEventRecord")
    }

    /// Whether the captured work has completed (an event never recorded has).
    pub fn done(&self) -> Result<bool> {
        // SAFETY: a live event.
        match unsafe { sys::cuEventQuery(self.raw) } {
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuEventQuery").map(|()| true),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _current = self.ctx.enter();
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

//! [`CudaOps`]: the executor's local operations on device memory — kernels and copies submitted
//! to the executor's own stream, in order, never waited for one by one.
//!
//! Operands in host memory (messages a connection received) are first copied to a device
//! staging ring: the driver reads pageable memory before the copy call returns, so the message
//! may go back to the connection at once, and stream order keeps every later use of a ring slot
//! behind the kernel that read it. Results the host needs (payloads staged for sending) are
//! copied into pinned memory from [`LocalOps::alloc_host`]; a [`Fence`] says when they landed.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use topoccl_transports::{MemSpace, Region};

use super::context::Context;
use super::kernels::{Kernel, KernelArgs, Kernels};
use super::memory::{aligned, copy_async, DeviceMemory, Pinned};
use super::stream::{Event, Stream, StreamRef};
use crate::error::{Error, Result};
use crate::ops::{Fence, LocalOps, Workspace};
use crate::types::{Dtype, ReduceOp};

/// Events made with the operations. A fence with no event left re-records the newest one
/// (a later point covers every earlier fence) rather than make one: making an event may wait
/// for a caller's blocking copy, itself waiting for this executor ([`super::Binding`]).
const EVENTS: usize = 16;

/// Bytes of the device staging ring at least (it grows to four times the largest operand
/// asked, so the two operands of one kernel never share a slot).
const RING_BYTES: usize = 4 << 20;

/// Memory given up while the operations live: kept until they are dropped. Work submitted
/// before may still use it, and freeing device or pinned memory synchronises the whole
/// context — including callers' streams waiting for calls this executor has yet to run, which
/// would never finish (a deadlock the stand-in driver showed). The executor keeps its
/// workspaces and grows them rarely, so little lands here.
type Graveyard = Arc<Mutex<Vec<Box<dyn Any + Send>>>>;

/// What a workspace of [`CudaOps`] owns: its memory goes to the graveyard when dropped.
struct Retired {
    mem: Option<Box<dyn Any + Send>>,
    grave: Graveyard,
}

impl Drop for Retired {
    fn drop(&mut self) {
        if let Some(m) = self.mem.take() {
            self.grave.lock().unwrap_or_else(|p| p.into_inner()).push(m);
        }
    }
}

/// Device operations of one executor: its stream, its kernels, its staging ring.
pub struct CudaOps {
    ctx: Arc<Context>,
    stream: Stream,
    kernels: Arc<Kernels>,
    ring: Option<DeviceMemory>,
    ring_at: usize,
    /// Operations submitted so far (the last one's fence).
    submitted: u64,
    /// Operations known to have completed.
    completed: u64,
    /// Events recorded after the operation each names, oldest first.
    events: VecDeque<(u64, Event)>,
    spare: Vec<Event>,
    grave: Graveyard,
}

impl std::fmt::Debug for CudaOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaOps").field("device", &self.ctx.ordinal()).finish_non_exhaustive()
    }
}

impl CudaOps {
    /// Operations on `ctx`'s device: a stream of their own and the context's kernels (loaded
    /// by the communicator's binding already, so nothing loads here: see [`Kernels::of`]).
    pub fn new(ctx: &Arc<Context>) -> Result<CudaOps> {
        Ok(CudaOps {
            ctx: ctx.clone(),
            stream: Stream::new(ctx)?,
            kernels: Kernels::of(ctx)?,
            ring: None,
            ring_at: 0,
            submitted: 0,
            completed: 0,
            events: VecDeque::new(),
            spare: (0..EVENTS).map(|_| Event::new(ctx)).collect::<Result<Vec<_>>>()?,
            grave: Graveyard::default(),
        })
    }

    /// A workspace over `mem`, freed when these operations are.
    fn workspace(&self, region: Region, mem: Box<dyn Any + Send>) -> Workspace {
        Workspace::new(region, Box::new(Retired { mem: Some(mem), grave: self.grave.clone() }))
    }

    /// The stream every operation runs on, in submission order.
    pub fn stream(&self) -> StreamRef {
        self.stream.handle()
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Counts one more submitted operation; its fence.
    fn submitted(&mut self) -> Fence {
        self.submitted += 1;
        Fence(self.submitted)
    }

    fn device(&self, r: &Region, what: &str) -> Result<()> {
        match r.space {
            MemSpace::Device(d) if d == self.ctx.ordinal() => Ok(()),
            s => Err(Error::InvalidArgument(format!(
                "the {what} lies in {s}, which device {}'s kernels do not write",
                self.ctx.ordinal()
            ))),
        }
    }

    /// `r` itself if it is device memory, else a copy of it in the staging ring.
    fn on_device(&mut self, r: Region) -> Result<Region> {
        if matches!(r.space, MemSpace::Device(_)) || r.is_empty() {
            return Ok(r);
        }
        let need = r.len.next_multiple_of(256);
        if self.ring.as_ref().map_or(true, |g| g.len() < 4 * need) {
            let bigger = DeviceMemory::new(&self.ctx, (4 * need).max(RING_BYTES))?;
            if let Some(old) = self.ring.replace(bigger) {
                self.grave.lock().unwrap_or_else(|p| p.into_inner()).push(Box::new(old));
            }
            self.ring_at = 0;
        }
        let ring = self.ring.as_ref().ok_or_else(|| Error::Internal("no staging ring".into()))?;
        if self.ring_at + need > ring.len() {
            self.ring_at = 0;
        }
        let slot = Region::new(MemSpace::Device(self.ctx.ordinal()), ring.addr() + self.ring_at, r.len);
        self.ring_at += need;
        // SAFETY: the slot lies in the ring (sized above); the source is host memory the caller
        // vouches for, read before this returns (pageable) — stream order keeps the slot's next
        // use behind every kernel that reads this copy.
        unsafe { copy_async(slot.addr, r.addr, r.len, self.stream.handle())? };
        Ok(slot)
    }

    /// Records an event after every operation submitted so far: a spare one, else the newest
    /// one again (see [`EVENTS`]).
    fn record_now(&mut self) -> Result<()> {
        let _current = self.ctx.enter()?;
        let stream = self.stream.handle();
        if let Some(ev) = self.spare.pop() {
            ev.record(stream)?;
            self.events.push_back((self.submitted, ev));
        } else if let Some((at, ev)) = self.events.back_mut() {
            ev.record(stream)?;
            *at = self.submitted;
        } else {
            return Err(Error::Internal("no event to record".into()));
        }
        Ok(())
    }

    /// Launches `k` with the arguments, counting it as one operation.
    ///
    /// # Safety
    /// The regions in `args` must be valid device-reachable memory until the kernel has run.
    unsafe fn launch(&mut self, k: Kernel, args: KernelArgs) -> Result<Fence> {
        let stream = self.stream.handle();
        // SAFETY: this fn's contract; the context is current (every caller entered it).
        unsafe { self.kernels.launch(k, args, stream)? };
        Ok(self.submitted())
    }
}

fn same_len(a: &Region, b: &Region) -> Result<()> {
    if a.len == b.len {
        Ok(())
    } else {
        Err(Error::Internal(format!("device operation on regions of {} and {} bytes", a.len, b.len)))
    }
}

fn elements(r: &Region, dtype: Dtype) -> u64 {
    (r.len / dtype.size()) as u64
}

impl LocalOps for CudaOps {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn reaches(&self, space: MemSpace) -> bool {
        space == MemSpace::Device(self.ctx.ordinal())
    }

    unsafe fn copy(&mut self, dst: Region, src: Region) -> Result<Fence> {
        same_len(&dst, &src)?;
        if dst.len == 0 || dst.addr == src.addr {
            return Ok(Fence::DONE);
        }
        let _current = self.ctx.enter()?;
        // SAFETY: both regions are valid for the copy (this fn's contract); a host destination
        // is pinned memory of `alloc_host`, a host source is read before this returns.
        unsafe { copy_async(dst.addr, src.addr, dst.len, self.stream.handle())? };
        Ok(self.submitted())
    }

    unsafe fn reduce(&mut self, dtype: Dtype, op: ReduceOp, dst: Region, a: Region, b: Region) -> Result<Fence> {
        same_len(&dst, &a)?;
        same_len(&dst, &b)?;
        if dst.len == 0 {
            return Ok(Fence::DONE);
        }
        self.device(&dst, "destination")?;
        for (r, what) in [(&dst, "destination"), (&a, "operand"), (&b, "operand")] {
            aligned(r.addr, dtype.size(), what)?;
        }
        let _current = self.ctx.enter()?;
        let (a, b) = (self.on_device(a)?, self.on_device(b)?);
        let args = KernelArgs {
            dst: dst.addr as u64,
            a: a.addr as u64,
            b: b.addr as u64,
            count: elements(&dst, dtype),
            ..KernelArgs::default()
        };
        // SAFETY: device regions of equal length, valid until the kernel runs (this fn's
        // contract; staged operands live in the ring, which stream order protects).
        unsafe { self.launch(Kernel::Reduce(dtype, op), args) }
    }

    unsafe fn scale(&mut self, dtype: Dtype, dst: Region, src: Region, scalar: &[u8]) -> Result<Fence> {
        same_len(&dst, &src)?;
        if scalar.len() != dtype.size() || dst.len % dtype.size() != 0 {
            return Err(Error::InvalidArgument(format!(
                "PreMulSum: {} bytes of data and a {}-byte scalar are not {} elements",
                dst.len,
                scalar.len(),
                dtype.name()
            )));
        }
        if dst.len == 0 {
            return Ok(Fence::DONE);
        }
        self.device(&dst, "destination")?;
        aligned(dst.addr, dtype.size(), "destination")?;
        aligned(src.addr, dtype.size(), "source")?;
        let _current = self.ctx.enter()?;
        let src = self.on_device(src)?;
        let mut bits = [0u8; 8];
        bits[..scalar.len()].copy_from_slice(scalar);
        let args = KernelArgs {
            dst: dst.addr as u64,
            a: src.addr as u64,
            count: elements(&dst, dtype),
            scalar: u64::from_le_bytes(bits),
            ..KernelArgs::default()
        };
        // SAFETY: as in `reduce`.
        unsafe { self.launch(Kernel::Scale(dtype), args) }
    }

    unsafe fn divide(&mut self, dtype: Dtype, data: Region, n: u32) -> Result<Fence> {
        if data.len == 0 {
            return Ok(Fence::DONE);
        }
        self.device(&data, "buffer")?;
        aligned(data.addr, dtype.size(), "buffer")?;
        let _current = self.ctx.enter()?;
        let args = KernelArgs {
            dst: data.addr as u64,
            a: data.addr as u64,
            count: elements(&data, dtype),
            scalar: u64::from(n),
            ..KernelArgs::default()
        };
        // SAFETY: as in `reduce`.
        unsafe { self.launch(Kernel::Divide(dtype), args) }
    }

    unsafe fn read(&mut self, out: &mut [u8], src: Region) -> Result<()> {
        if src.len != out.len() {
            return Err(Error::Internal(format!("reading {} bytes into {}", src.len, out.len())));
        }
        let _current = self.ctx.enter()?;
        // SAFETY: `src` is valid (this fn's contract) and `out` a live buffer; a copy into
        // pageable memory returns once the stream has run up to it, so `out` holds the bytes.
        unsafe { copy_async(out.as_mut_ptr() as usize, src.addr, src.len, self.stream.handle()) }
    }

    fn mark(&mut self) -> Result<Fence> {
        let fence = self.submitted();
        self.record_now()?;
        Ok(fence)
    }

    fn done(&mut self, fence: Fence) -> Result<bool> {
        if fence.0 <= self.completed {
            return Ok(true);
        }
        if self.events.back().map_or(true, |(at, _)| *at < fence.0) {
            // No event covers the fence yet: record one after everything submitted so far.
            self.record_now()?;
        }
        while let Some((at, ev)) = self.events.front() {
            let _current = self.ctx.enter()?;
            if !ev.done()? {
                break;
            }
            self.completed = *at;
            if let Some((_, ev)) = self.events.pop_front() {
                self.spare.push(ev);
            }
        }
        Ok(fence.0 <= self.completed)
    }

    fn alloc(&mut self, bytes: usize) -> Result<Workspace> {
        let m = DeviceMemory::new(&self.ctx, bytes)?;
        let region = Region::new(MemSpace::Device(self.ctx.ordinal()), m.addr(), bytes);
        Ok(self.workspace(region, Box::new(m)))
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<Workspace> {
        let m = Pinned::new(&self.ctx, bytes)?;
        let region = Region::host(m.addr(), bytes);
        Ok(self.workspace(region, Box::new(m)))
    }
}

impl Drop for CudaOps {
    fn drop(&mut self) {
        // Everything submitted finishes before the memory it uses goes back to the driver (a
        // device that never finishes keeps the memory: nothing else is safe).
        let _current = self.ctx.enter();
        while matches!(self.stream.idle(), Ok(false)) {
            std::thread::yield_now();
        }
        self.grave.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

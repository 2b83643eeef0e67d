//! The GPU door of a build without the `cuda` feature: the same names as the real one, none of
//! which can be made (the types are empty), and every call that would need a driver an error
//! that says so. Every buffer is host memory.

use std::sync::Arc;

use topoccl_transports::{MemSpace, Region};

use crate::error::{Error, Result};
use crate::ops::{Fence, LocalOps, Workspace};
use crate::types::{Dtype, ReduceOp};

fn off() -> Error {
    Error::Cuda("topoccl was built without the `cuda` feature: buffers are host memory and there are no streams".into())
}

/// Never found.
#[derive(Debug)]
pub struct Driver {
    pub version: i32,
}

pub fn present() -> bool {
    false
}

pub fn driver() -> Result<&'static Driver> {
    Err(off())
}

pub fn device_count() -> Result<u32> {
    Err(off())
}

/// Every buffer is host memory.
pub fn space_of(_addr: usize) -> MemSpace {
    MemSpace::Host
}

/// A caller's stream handle (only NULL, the legacy default stream, means "no stream" here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRef(pub *mut std::ffi::c_void);

// SAFETY: only compared and carried, never dereferenced.
unsafe impl Send for StreamRef {}
// SAFETY: as above.
unsafe impl Sync for StreamRef {}

impl StreamRef {
    pub const LEGACY: StreamRef = StreamRef(std::ptr::null_mut());

    pub fn from_raw(raw: *mut std::ffi::c_void) -> StreamRef {
        StreamRef(raw)
    }

    pub fn context(self) -> Result<Option<*mut std::ffi::c_void>> {
        Err(off())
    }

    pub fn not_capturing(self) -> Result<()> {
        Err(off())
    }

    pub fn capturing(self) -> Result<bool> {
        Err(off())
    }

    pub fn wait(self, event: &Event) -> Result<()> {
        match *event {}
    }
}

pub struct RelaxedCapture;

impl RelaxedCapture {
    pub fn enter() -> Result<RelaxedCapture> {
        Err(off())
    }
}

#[derive(Debug)]
pub enum Context {}

impl Context {
    pub fn primary(_ordinal: u32) -> Result<Arc<Context>> {
        Err(off())
    }

    /// # Safety
    /// Nothing is dereferenced; kept `unsafe` to match the real build.
    pub unsafe fn adopt(_raw: *mut std::ffi::c_void) -> Result<Arc<Context>> {
        Err(off())
    }

    /// # Safety
    /// As for [`Context::adopt`].
    pub unsafe fn borrowed(_raw: *mut std::ffi::c_void) -> Result<Arc<Context>> {
        Err(off())
    }

    pub fn current() -> Result<Option<*mut std::ffi::c_void>> {
        Err(off())
    }

    pub fn ordinal(&self) -> u32 {
        match *self {}
    }

    pub fn enter(&self) -> Result<Entered> {
        match *self {}
    }
}

pub struct Entered;

#[derive(Debug)]
pub enum Event {}

impl Event {
    pub fn done(&self) -> Result<bool> {
        match *self {}
    }
}

#[derive(Debug)]
pub enum DeviceMemory {}

impl DeviceMemory {
    pub fn new(_ctx: &Arc<Context>, _len: usize) -> Result<DeviceMemory> {
        Err(off())
    }

    pub fn addr(&self) -> usize {
        match *self {}
    }

    pub fn len(&self) -> usize {
        match *self {}
    }

    pub fn is_empty(&self) -> bool {
        match *self {}
    }
}

#[derive(Debug)]
pub enum Binding {}

impl Binding {
    pub fn new(_ctx: Arc<Context>) -> Result<Arc<Binding>> {
        Err(off())
    }

    pub fn context(&self) -> &Arc<Context> {
        match *self {}
    }

    pub fn take_ops(&self) -> Result<CudaOps> {
        match *self {}
    }

    pub fn attach(self: &Arc<Binding>, _stream: StreamRef) -> Result<StreamSync> {
        match **self {}
    }

    pub fn check_stream(&self, _stream: StreamRef) -> Result<()> {
        match *self {}
    }

    pub fn complete_from_host(&self, _ticket: u32) {
        match *self {}
    }

    pub fn next_ticket(&self) -> u32 {
        match *self {}
    }

    pub fn completed(&self, _ticket: u32) -> bool {
        match *self {}
    }

    pub fn ll_abort_word(&self) -> u64 {
        match *self {}
    }

    pub fn abort_device_calls(&self) {
        match *self {}
    }

    pub fn word_device_addr(&self, _ticket: u32) -> u64 {
        match *self {}
    }

    pub fn resident_workspaces(&self) -> (Region, Region) {
        match *self {}
    }

    pub fn next_piece(&self) -> u32 {
        match *self {}
    }

    pub fn staged_slot(&self, _piece: u32) -> StagedSlot {
        match *self {}
    }

    pub fn staged_input_landed(&self, _piece: u32) -> bool {
        match *self {}
    }

    pub fn staged_output_ready(&self, _piece: u32) -> bool {
        match *self {}
    }

    pub fn staged_output_done(&self, _piece: u32) {
        match *self {}
    }

    pub fn caller_stream(&self, _stream: StreamRef, _dtype: Dtype, _op: ReduceOp) -> CallerStream<'_> {
        match *self {}
    }

    /// # Safety
    /// Never callable (the type is empty).
    pub unsafe fn complete_on(&self, _stream: StreamRef, _ticket: u32) -> Result<()> {
        match *self {}
    }
}

/// Bytes of each half of a staged slot (as with the driver).
pub const STAGED_BYTES: usize = 2 << 20;
pub const STAGED_SLOTS: u32 = 2;

#[derive(Debug, Clone, Copy)]
pub struct StagedSlot {
    pub input: Region,
    pub output: Region,
    pub scalar: Region,
}

#[derive(Debug)]
pub struct StreamSync {
    pub binding: Arc<Binding>,
    pub start: Event,
    pub ticket: u32,
}

#[derive(Debug)]
pub enum CudaOps {}

impl CudaOps {
    pub fn new(_ctx: &Arc<Context>) -> Result<CudaOps> {
        Err(off())
    }

    pub fn stream(&self) -> StreamRef {
        match *self {}
    }
}

impl LocalOps for CudaOps {
    fn name(&self) -> &'static str {
        match *self {}
    }
    fn reaches(&self, _space: MemSpace) -> bool {
        match *self {}
    }
    unsafe fn copy(&mut self, _dst: Region, _src: Region) -> Result<Fence> {
        match *self {}
    }
    unsafe fn reduce(&mut self, _: Dtype, _: ReduceOp, _: Region, _: Region, _: Region) -> Result<Fence> {
        match *self {}
    }
    unsafe fn scale(&mut self, _: Dtype, _: Region, _: Region, _: &[u8]) -> Result<Fence> {
        match *self {}
    }
    unsafe fn divide(&mut self, _: Dtype, _: Region, _: u32) -> Result<Fence> {
        match *self {}
    }
    unsafe fn read(&mut self, _out: &mut [u8], _src: Region) -> Result<()> {
        match *self {}
    }
    fn done(&mut self, _fence: Fence) -> Result<bool> {
        match *self {}
    }
    fn alloc(&mut self, _bytes: usize) -> Result<Workspace> {
        match *self {}
    }
}

/// Without CUDA no rank drives a device.
pub fn current_primary_device() -> Option<u32> {
    None
}

pub fn device_at_init(_requested: Option<u32>) -> Option<topoccl_transports::ipc::DeviceId> {
    None
}

pub fn device_id(_ordinal: u32) -> Result<topoccl_transports::ipc::DeviceId> {
    Err(off())
}

pub fn ipc_access(_id: topoccl_transports::ipc::DeviceId) -> Result<Arc<dyn topoccl_transports::ipc::DeviceAccess>> {
    Err(off())
}

/// Never made (there is no binding).
pub struct CallerStream<'b>(&'b Binding);

impl CallerStream<'_> {
    pub fn ops(&self) -> u64 {
        match *self.0 {}
    }

    /// # Safety
    /// Never callable.
    pub(crate) unsafe fn launch_ll(&mut self, _args: &crate::exec::resident::ll::LlArgs, _threads: u32) -> Result<()> {
        match *self.0 {}
    }

    /// # Safety
    /// Never callable.
    pub unsafe fn divide(&mut self, _data: Region, _n: u32) -> Result<()> {
        match *self.0 {}
    }

    pub fn finish(&mut self, _ticket: u32) -> Result<()> {
        match *self.0 {}
    }

    pub fn after(&mut self, _ticket: u32) -> Result<()> {
        match *self.0 {}
    }

    pub fn staged_input_done(&mut self, _piece: u32) -> Result<()> {
        match *self.0 {}
    }

    pub fn staged_output_wait(&mut self, _piece: u32) -> Result<()> {
        match *self.0 {}
    }

    /// # Safety
    /// Never callable.
    pub unsafe fn scale(&mut self, _dst: Region, _src: Region, _scalar: &[u8]) -> Result<()> {
        match *self.0 {}
    }
}

impl crate::exec::resident::DeviceStream for CallerStream<'_> {
    unsafe fn copy(&mut self, _dst: u64, _src: u64, _len: usize) -> Result<()> {
        match *self.0 {}
    }
    unsafe fn reduce(&mut self, _dst: u64, _a: u64, _b: u64, _dst2: u64, _len: usize) -> Result<()> {
        match *self.0 {}
    }
    unsafe fn wait(&mut self, _word: u64, _value: u32) -> Result<()> {
        match *self.0 {}
    }
    unsafe fn signal(&mut self, _word: u64, _value: u32) -> Result<()> {
        match *self.0 {}
    }
}

/// A device-resident call outstanding (none can be, here).
#[derive(Debug)]
pub struct Outstanding(());

impl Outstanding {
    pub(crate) fn begin() -> Outstanding {
        Outstanding(())
    }

    pub fn end(&self) {}
}

/// No driver, so no driver calls.
pub fn foreign_driver_calls() -> u64 {
    0
}

/// No driver, so no driver calls.
pub fn driver_calls_on_this_thread() -> u64 {
    0
}

/// Nothing to mark without a driver.
pub(crate) struct OnExecutor;

impl OnExecutor {
    pub(crate) fn enter() -> OnExecutor {
        OnExecutor
    }
}

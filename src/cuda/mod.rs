//! The GPU door: the CUDA driver, loaded at run time (cudarc's `sys` bindings with dynamic
//! loading: nothing of CUDA is needed to build, and a process without a driver runs host
//! buffers as before), and what the executor needs of it — contexts, streams and events, device
//! and pinned memory, the kernels, [`CudaOps`] (the local operations on device memory) and
//! [`Binding`] (a communicator's device, and NCCL's stream semantics).
//!
//! Layers, as cudarc's own: `sys` (cudarc) → checked calls ([`driver::check`], here) → the safe
//! types of the other modules. Every `unsafe` block is in this module tree, and nothing calls
//! into `sys` before [`driver()`] has found the library and every symbol used (cudarc panics
//! on a missing one). Built without the `cuda` feature, the same names exist and every one that
//! needs the driver answers with [`crate::Error::Cuda`].

#[cfg(feature = "cuda")]
mod binding;
#[cfg(feature = "cuda")]
mod context;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
mod ipc;
#[cfg(feature = "cuda")]
mod kernels;
#[cfg(feature = "cuda")]
mod memory;
#[cfg(feature = "cuda")]
mod ops;
#[cfg(feature = "cuda")]
mod resident;
#[cfg(feature = "cuda")]
mod staging;
#[cfg(feature = "cuda")]
mod stream;

#[cfg(feature = "cuda")]
pub use binding::{Binding, StreamSync};
#[cfg(feature = "cuda")]
pub use context::{current_primary_device, device_count, Context, Entered};
#[cfg(feature = "cuda")]
pub(crate) use driver::OnExecutor;
#[cfg(feature = "cuda")]
pub use driver::{driver, driver_calls_on_this_thread, foreign_driver_calls, present, Driver, Outstanding};
#[cfg(feature = "cuda")]
pub use ipc::{device_at_init, device_id, ipc_access};
#[cfg(feature = "cuda")]
pub use kernels::{Kernel, KernelArgs};
#[cfg(feature = "cuda")]
pub use memory::{space_of, DeviceMemory, Pinned};
#[cfg(feature = "cuda")]
pub use ops::CudaOps;
#[cfg(feature = "cuda")]
pub use resident::CallerStream;
#[cfg(feature = "cuda")]
pub use staging::{StagedSlot, STAGED_BYTES, STAGED_SLOTS};
#[cfg(feature = "cuda")]
pub use stream::{Event, RelaxedCapture, Stream, StreamRef};

#[cfg(not(feature = "cuda"))]
mod disabled;
#[cfg(not(feature = "cuda"))]
pub use disabled::*;

impl crate::buffer::Buffer {
    /// The buffer at `ptr`, in the memory space the CUDA driver says it lies in (host memory
    /// when there is no driver, or the pointer is not CUDA's): what a C caller's pointer is.
    pub fn at<T>(ptr: *const T) -> crate::buffer::Buffer {
        let addr = ptr as usize;
        crate::buffer::Buffer { space: space_of(addr), addr }
    }
}

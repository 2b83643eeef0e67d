//! What the CUDA IPC backend needs of a GPU, as a small trait the core crate implements with the
//! CUDA driver ([`DeviceAccess`]): this crate never links or loads CUDA itself, and its own
//! tests run the backend's protocol on host memory through a stand-in implementation.
//!
//! Addresses are plain `u64`s in the device's (unified) address space. Every object is owned:
//! dropping it frees, closes or unregisters what it names, after the work that uses it.

use crate::error::Result;
use crate::registration::Allocation;

/// Bytes of an exported memory handle (`CUipcMemHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// Which GPU a rank drives, as ranks compare them (NCCL's peer info: the device's UUID and PCI
/// bus id; the ordinal only means something inside one process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId {
    /// `cuDeviceGetUuid`.
    pub uuid: [u8; 16],
    /// PCI domain, bus and device, as `domain << 16 | bus << 8 | device`.
    pub pci_bus: u64,
    /// The CUDA ordinal in the rank's own process (as `MemSpace::Device` names it).
    pub ordinal: u32,
}

/// Device memory this process allocated and can export to another process.
pub trait ExportedMemory: Send {
    /// Its device address here.
    fn addr(&self) -> u64;
    /// The handle another process opens it with.
    fn handle(&self) -> [u8; IPC_HANDLE_BYTES];
}

/// Another process's device memory, opened here. Closed on drop.
pub trait ImportedMemory: Send {
    /// Its device address in this process.
    fn addr(&self) -> u64;
}

/// Host memory made reachable by the device's stream memory operations. Unregistered on drop.
pub trait RegisteredHost: Send {
    /// The device address of the first byte.
    fn device_addr(&self) -> u64;
}

/// A stream of the device: copies and flag writes, run in order, asynchronously. Dropping it
/// waits for what it was given to finish (the memory it writes may be released right after).
pub trait DeviceQueue: Send {
    /// Queues a copy of `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// Both ranges must be device memory (or registered host memory) this device reaches,
    /// valid until the copy has run, and nothing else may write `dst` meanwhile.
    unsafe fn copy(&mut self, dst: u64, src: u64, len: usize) -> Result<()>;
    /// Queues a write of `value` to the 4-byte word at device address `addr`, after the work
    /// queued before it.
    ///
    /// # Safety
    /// `addr` must be 4-byte aligned, in registered host memory or device memory this device
    /// reaches, and valid until the write has run.
    unsafe fn write_value(&mut self, addr: u64, value: u32) -> Result<()>;
    /// Waits until everything queued so far has run (the connection closes: no memory of a
    /// send may be read after that).
    fn finish(&mut self) -> Result<()>;
}

/// A GPU as the IPC backend uses it.
pub trait DeviceAccess: Send + Sync {
    /// The device this process's rank drives.
    fn device(&self) -> DeviceId;
    /// Whether this device can read and write memory of `peer` (the same device, or peer
    /// access between the two). Both ranks of a pair ask, with the roles swapped.
    fn can_reach(&self, peer: &DeviceId) -> bool;
    /// Lets this device reach memory of device `ordinal` of this process (peer access), for
    /// two ranks of one process on different devices; nothing to do for the same device.
    fn enable_peer(&self, ordinal: u32) -> Result<()>;
    /// Allocates `len` bytes of exportable device memory, zero-filled (as every device and
    /// stream sees it) before this returns.
    fn alloc(&self, len: usize) -> Result<Box<dyn ExportedMemory>>;
    /// The allocation of this device's memory that `addr` lies in (base, length, the driver's
    /// buffer id); `None` for any other address.
    fn allocation(&self, addr: u64) -> Result<Option<Allocation>>;
    /// The handle another process opens the allocation at `base` with; `None` when it has none
    /// (pool memory).
    fn export(&self, base: u64) -> Result<Option<[u8; IPC_HANDLE_BYTES]>>;
    /// Opens memory another process exported. Opening one handle again while it is open gives
    /// the same mapping (the driver allows one per context).
    fn open(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Box<dyn ImportedMemory>>;
    /// Registers `len` bytes of host memory at `addr` for the device.
    ///
    /// # Safety
    /// The memory must stay mapped until the registration is dropped.
    unsafe fn register(&self, addr: usize, len: usize) -> Result<Box<dyn RegisteredHost>>;
    /// A new stream of the device.
    fn queue(&self) -> Result<Box<dyn DeviceQueue>>;
    /// A dma-buf descriptor for the page-aligned range `[base, base + len)` of this device's
    /// memory, for a NIC to register (RDMA straight into and out of device memory); `None`
    /// where the driver or the device exports none. The caller closes it.
    fn dmabuf(&self, _base: u64, _len: u64) -> Result<Option<std::os::fd::OwnedFd>> {
        Ok(None)
    }
    /// Makes the NIC's writes into this device's memory that have completed visible to work
    /// the device runs next, where the device does not order them itself (GPUDirect RDMA's
    /// flush); nothing to do where it does.
    fn flush_rdma_writes(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod host {
    //! A [`DeviceAccess`] on host memory, for this crate's tests: "device" addresses are host
    //! addresses, a copy runs when it is queued, and export/open work within one process only.

    use super::*;
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
    use std::sync::Mutex;

    pub(crate) struct HostDevice {
        pub(crate) id: DeviceId,
        /// The "allocations" `allocation` knows: tests add and replace them.
        pub(crate) allocations: Mutex<Vec<Allocation>>,
        /// Calls of `export`.
        pub(crate) exports: AtomicUsize,
    }

    impl HostDevice {
        pub(crate) fn new(id: DeviceId) -> HostDevice {
            HostDevice { id, allocations: Mutex::new(Vec::new()), exports: AtomicUsize::new(0) }
        }
    }

    struct Block(Box<[u64]>);

    impl ExportedMemory for Block {
        fn addr(&self) -> u64 {
            self.0.as_ptr() as u64
        }
        fn handle(&self) -> [u8; IPC_HANDLE_BYTES] {
            let mut h = [0u8; IPC_HANDLE_BYTES];
            h[..8].copy_from_slice(&self.addr().to_le_bytes());
            h
        }
    }

    struct Opened(u64);

    impl ImportedMemory for Opened {
        fn addr(&self) -> u64 {
            self.0
        }
    }

    struct Registered(u64);

    impl RegisteredHost for Registered {
        fn device_addr(&self) -> u64 {
            self.0
        }
    }

    struct Queue;

    impl DeviceQueue for Queue {
        unsafe fn copy(&mut self, dst: u64, src: u64, len: usize) -> Result<()> {
            // SAFETY: host memory valid for `len` bytes (this fn's contract).
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
            Ok(())
        }
        unsafe fn write_value(&mut self, addr: u64, value: u32) -> Result<()> {
            // SAFETY: an aligned word of live host memory (this fn's contract).
            unsafe { (*(addr as *const AtomicU32)).store(value, Ordering::Release) };
            Ok(())
        }
        fn finish(&mut self) -> Result<()> {
            Ok(())
        }
    }

    impl DeviceAccess for HostDevice {
        fn device(&self) -> DeviceId {
            self.id
        }
        fn can_reach(&self, peer: &DeviceId) -> bool {
            peer.uuid[0] == self.id.uuid[0]
        }
        fn enable_peer(&self, _ordinal: u32) -> Result<()> {
            Ok(())
        }
        fn alloc(&self, len: usize) -> Result<Box<dyn ExportedMemory>> {
            Ok(Box::new(Block(vec![0u64; len.div_ceil(8)].into_boxed_slice())))
        }
        fn allocation(&self, addr: u64) -> Result<Option<Allocation>> {
            let all = self.allocations.lock().unwrap();
            Ok(all.iter().find(|a| a.overlaps(addr, 1)).copied())
        }
        fn export(&self, base: u64) -> Result<Option<[u8; IPC_HANDLE_BYTES]>> {
            self.exports.fetch_add(1, Ordering::Relaxed);
            let mut h = [0u8; IPC_HANDLE_BYTES];
            h[..8].copy_from_slice(&base.to_le_bytes());
            Ok(Some(h))
        }
        fn open(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Box<dyn ImportedMemory>> {
            let mut a = [0u8; 8];
            a.copy_from_slice(&handle[..8]);
            Ok(Box::new(Opened(u64::from_le_bytes(a))))
        }
        unsafe fn register(&self, addr: usize, _len: usize) -> Result<Box<dyn RegisteredHost>> {
            Ok(Box::new(Registered(addr as u64)))
        }
        fn queue(&self) -> Result<Box<dyn DeviceQueue>> {
            Ok(Box::new(Queue))
        }
    }
}

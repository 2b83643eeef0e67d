//! Devices: `TOPOCCL_STANDIN_DEVICES` identical GPUs looking like H100s, with the compute
//! capability `TOPOCCL_STANDIN_SM` and distinct PCI addresses and UUIDs.

use crate::config;
use crate::sys::{CUresult, CUuuid, CuResult};

/// What `cuDeviceTotalMem_v2` reports: 80 GiB.
pub const TOTAL_MEM: usize = 80 << 30;

/// `Ok(number of devices)` when `device` is one of them.
pub fn check(device: i32) -> CuResult<i32> {
    let n = config::get()?.devices;
    if (0..n).contains(&device) {
        Ok(n)
    } else {
        Err(CUresult::INVALID_DEVICE)
    }
}

pub fn count() -> CuResult<i32> {
    Ok(config::get()?.devices)
}

/// `cuDeviceGet`.
pub fn get(ordinal: i32) -> CuResult<i32> {
    check(ordinal)?;
    Ok(ordinal)
}

pub fn name(device: i32) -> CuResult<String> {
    check(device)?;
    Ok(format!("topoccl stand-in GPU {device}"))
}

/// (domain, bus, device) of the device's PCI address.
pub fn pci(device: i32) -> (i32, i32, i32) {
    (0, 0x18 + device * 0x10, 0)
}

/// `cuDeviceGetPCIBusId`'s text, e.g. `0000:18:00.0`.
pub fn pci_bus_id(device: i32) -> CuResult<String> {
    check(device)?;
    let (domain, bus, dev) = pci(device);
    Ok(format!("{domain:04x}:{bus:02x}:{dev:02x}.0"))
}

pub fn uuid(device: i32) -> CuResult<CUuuid> {
    check(device)?;
    let mut bytes = *b"tcclSTANDINgpu\0\0";
    bytes[14..16].copy_from_slice(&(device as u16).to_be_bytes());
    Ok(CUuuid { bytes })
}

/// `cuDeviceCanAccessPeer`: every stand-in device reaches every other (not itself).
pub fn can_access_peer(device: i32, peer: i32) -> CuResult<bool> {
    check(device)?;
    check(peer)?;
    Ok(device != peer)
}

/// `cuDeviceGetAttribute`, by the attribute's number in `CUdevice_attribute`.
pub fn attribute(attr: u32, device: i32) -> CuResult<i32> {
    check(device)?;
    let sm = config::get()?.sm as i32;
    let pools = i32::from(config::get()?.pools);
    let dmabuf = i32::from(config::get()?.dmabuf);
    let (domain, bus, pci_dev) = pci(device);
    Ok(match attr {
        1 => 1024,       // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,   // MAX_BLOCK_DIM_X, _Y
        4 => 64,         // MAX_BLOCK_DIM_Z
        5 => i32::MAX,   // MAX_GRID_DIM_X
        6 | 7 => 65535,  // MAX_GRID_DIM_Y, _Z
        8 => 48 << 10,   // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 64 << 10,   // TOTAL_CONSTANT_MEMORY
        10 => 32,        // WARP_SIZE
        11 => i32::MAX,  // MAX_PITCH
        12 => 65536,     // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000, // CLOCK_RATE (kHz)
        14 => 512,       // TEXTURE_ALIGNMENT
        15 => 1,         // GPU_OVERLAP
        16 => 132,       // MULTIPROCESSOR_COUNT
        17 | 18 => 0,    // KERNEL_EXEC_TIMEOUT, INTEGRATED
        19 => 1,         // CAN_MAP_HOST_MEMORY
        20 => 0,         // COMPUTE_MODE (default)
        31 | 32 => 1,    // CONCURRENT_KERNELS, ECC_ENABLED
        33 => bus,       // PCI_BUS_ID
        34 => pci_dev,   // PCI_DEVICE_ID
        35 => 0,         // TCC_DRIVER
        36 => 2_619_000, // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,      // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,  // L2_CACHE_SIZE
        39 => 2048,      // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,         // ASYNC_ENGINE_COUNT
        41 => 1,         // UNIFIED_ADDRESSING
        50 => domain,    // PCI_DOMAIN_ID
        75 => sm / 10,   // COMPUTE_CAPABILITY_MAJOR
        76 => sm % 10,   // COMPUTE_CAPABILITY_MINOR
        78..=80 => 1,    // STREAM_PRIORITIES, GLOBAL_L1, LOCAL_L1 supported
        81 => 228 << 10, // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,     // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 0,         // MANAGED_MEMORY (the stand-in has none)
        84 => 0,         // MULTI_GPU_BOARD
        85 => device,    // MULTI_GPU_BOARD_GROUP_ID
        86 => 0,         // HOST_NATIVE_ATOMIC_SUPPORTED
        87 => 2,         // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        88 | 89 => 0,    // PAGEABLE_MEMORY_ACCESS, CONCURRENT_MANAGED_ACCESS
        90 => 1,         // COMPUTE_PREEMPTION_SUPPORTED
        91 => 1,         // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        92 => 1,         // CAN_USE_STREAM_MEM_OPS_V1 (32-bit wait/write value)
        93 => 0,         // CAN_USE_64_BIT_STREAM_MEM_OPS_V1
        94 => 1,         // CAN_USE_STREAM_WAIT_VALUE_NOR_V1
        95 | 96 => 0,    // COOPERATIVE_LAUNCH, COOPERATIVE_MULTI_DEVICE_LAUNCH
        97 => 227 << 10, // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        98 => 0,         // CAN_FLUSH_REMOTE_WRITES
        99 => 1,         // HOST_REGISTER_SUPPORTED
        100 | 101 => 0,  // PAGEABLE_..._HOST_PAGE_TABLES, DIRECT_MANAGED_MEM_ACCESS
        102..=105 => 0,  // VIRTUAL_ADDRESS_MANAGEMENT, handle types: not emulated
        106 => 32,       // MAX_BLOCKS_PER_MULTIPROCESSOR
        107 => 0,        // GENERIC_COMPRESSION_SUPPORTED
        108 | 109 => 0,  // persisting L2, access policy window
        110 => 0,        // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
        111 => 1024,     // RESERVED_SHARED_MEMORY_PER_BLOCK
        112 => 0,        // SPARSE_CUDA_ARRAY_SUPPORTED
        113 => 1,        // READ_ONLY_HOST_REGISTER_SUPPORTED
        114 => 0,        // TIMELINE_SEMAPHORE_INTEROP_SUPPORTED
        115 => pools,    // MEMORY_POOLS_SUPPORTED
        116 => dmabuf,   // GPU_DIRECT_RDMA_SUPPORTED
        117 => dmabuf,   // GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: HOST (cuFlushGPUDirectRDMAWrites)
        118 => 0,        // GPU_DIRECT_RDMA_WRITES_ORDERING: NONE (a flush is needed)
        119 => 0,        // MEMPOOL_SUPPORTED_HANDLE_TYPES (pools have no IPC)
        120 => 0,        // CLUSTER_LAUNCH
        121 => 0,        // DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED
        122 => 0,        // CAN_USE_64_BIT_STREAM_MEM_OPS
        123 => 1,        // CAN_USE_STREAM_WAIT_VALUE_NOR
        124 => dmabuf,   // DMA_BUF_SUPPORTED
        125 => 1,        // IPC_EVENT_SUPPORTED
        126 => 4,        // MEM_SYNC_DOMAIN_COUNT
        127..=129 => 0,  // TENSOR_MAP, FABRIC handles, UNIFIED_FUNCTION_POINTERS
        130 => 0,        // NUMA_CONFIG (not a NUMA node)
        131 => -1,       // NUMA_ID
        132 | 133 => 0,  // MULTICAST_SUPPORTED, MPS_ENABLED
        134 => 0,        // HOST_NUMA_ID
        _ => return Err(CUresult::INVALID_VALUE),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_are_distinct() {
        let ids: Vec<_> = (0..8).map(pci).collect();
        for (i, a) in ids.iter().enumerate() {
            assert!(ids[i + 1..].iter().all(|b| b != a));
        }
    }
}

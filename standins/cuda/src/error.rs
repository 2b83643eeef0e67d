//! `cuGetErrorName` / `cuGetErrorString`: a name and a description for every code the
//! stand-in returns (and the neighbours a caller is likely to print).

use std::ffi::CStr;

/// (code, name, description); the names are the header's, the descriptions the stand-in's.
const TABLE: &[(u32, &CStr, &CStr)] = &[
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error (cuInit has not been called)"),
    (4, c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
    (34, c"CUDA_ERROR_STUB_LIBRARY", c"CUDA driver is a stub library"),
    (100, c"CUDA_ERROR_NO_DEVICE", c"no CUDA-capable device is detected"),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (200, c"CUDA_ERROR_INVALID_IMAGE", c"device kernel image is invalid"),
    (201, c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
    (202, c"CUDA_ERROR_CONTEXT_ALREADY_CURRENT", c"context already current"),
    (205, c"CUDA_ERROR_MAP_FAILED", c"mapping of buffer object failed"),
    (206, c"CUDA_ERROR_UNMAP_FAILED", c"unmapping of buffer object failed"),
    (208, c"CUDA_ERROR_ALREADY_MAPPED", c"resource already mapped"),
    (209, c"CUDA_ERROR_NO_BINARY_FOR_GPU", c"no kernel image is available for execution on the device"),
    (211, c"CUDA_ERROR_NOT_MAPPED", c"resource not mapped"),
    (216, c"CUDA_ERROR_CONTEXT_ALREADY_IN_USE", c"exclusive-thread device already in use by a different thread"),
    (217, c"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", c"peer access is not supported between these two devices"),
    (218, c"CUDA_ERROR_INVALID_PTX", c"a PTX JIT compilation failed"),
    (222, c"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", c"the provided PTX was compiled with an unsupported toolchain"),
    (300, c"CUDA_ERROR_INVALID_SOURCE", c"device kernel image is invalid"),
    (301, c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
    (304, c"CUDA_ERROR_OPERATING_SYSTEM", c"OS call failed or operation not supported on this OS"),
    (400, c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
    (401, c"CUDA_ERROR_ILLEGAL_STATE", c"the operation cannot be performed in the present state"),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (600, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (700, c"CUDA_ERROR_ILLEGAL_ADDRESS", c"an illegal memory access was encountered"),
    (701, c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", c"too many resources requested for launch"),
    (702, c"CUDA_ERROR_LAUNCH_TIMEOUT", c"the launch timed out and was terminated"),
    (704, c"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", c"peer access is already enabled"),
    (705, c"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", c"peer access has not been enabled"),
    (708, c"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", c"cannot set while device is active in this process"),
    (709, c"CUDA_ERROR_CONTEXT_IS_DESTROYED", c"context is destroyed"),
    (712, c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", c"part or all of the requested memory range is already mapped"),
    (713, c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", c"pointer does not correspond to a registered memory region"),
    (716, c"CUDA_ERROR_MISALIGNED_ADDRESS", c"misaligned address"),
    (719, c"CUDA_ERROR_LAUNCH_FAILED", c"unspecified launch failure"),
    (800, c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
    (900, c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", c"operation not permitted when stream is capturing"),
    (901, c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", c"operation failed due to a previous error during capture"),
    (902, c"CUDA_ERROR_STREAM_CAPTURE_MERGE", c"operation would result in a merge of separate capture sequences"),
    (903, c"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", c"capture was not ended in the same stream as it began"),
    (904, c"CUDA_ERROR_STREAM_CAPTURE_UNJOINED", c"capturing stream has unjoined work"),
    (905, c"CUDA_ERROR_STREAM_CAPTURE_ISOLATION", c"dependency created on uncaptured work in another stream"),
    (
        906,
        c"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        c"operation would make the legacy stream depend on a capturing blocking stream",
    ),
    (907, c"CUDA_ERROR_CAPTURED_EVENT", c"operation not permitted on an event last recorded in a capturing stream"),
    (
        908,
        c"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        c"attempt to terminate a thread-local capture sequence from another thread",
    ),
    (909, c"CUDA_ERROR_TIMEOUT", c"wait operation timed out"),
    (999, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

fn entry(code: u32) -> Option<&'static (u32, &'static CStr, &'static CStr)> {
    TABLE.iter().find(|e| e.0 == code)
}

/// The header's name of `code` (`CUDA_ERROR_...`), if the stand-in knows it.
pub fn name(code: u32) -> Option<&'static CStr> {
    entry(code).map(|e| e.1)
}

/// A description of `code`, if the stand-in knows it.
pub fn description(code: u32) -> Option<&'static CStr> {
    entry(code).map(|e| e.2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::CUresult;

    #[test]
    fn every_code_the_stand_in_returns_has_a_name() {
        let returned = [
            CUresult::SUCCESS,
            CUresult::INVALID_VALUE,
            CUresult::OUT_OF_MEMORY,
            CUresult::NOT_INITIALIZED,
            CUresult::NO_DEVICE,
            CUresult::INVALID_DEVICE,
            CUresult::INVALID_IMAGE,
            CUresult::INVALID_CONTEXT,
            CUresult::MAP_FAILED,
            CUresult::ALREADY_MAPPED,
            CUresult::NO_BINARY_FOR_GPU,
            CUresult::INVALID_PTX,
            CUresult::UNSUPPORTED_PTX_VERSION,
            CUresult::INVALID_HANDLE,
            CUresult::NOT_FOUND,
            CUresult::NOT_READY,
            CUresult::ILLEGAL_ADDRESS,
            CUresult::PEER_ACCESS_ALREADY_ENABLED,
            CUresult::PEER_ACCESS_NOT_ENABLED,
            CUresult::LAUNCH_FAILED,
            CUresult::HOST_MEMORY_ALREADY_REGISTERED,
            CUresult::HOST_MEMORY_NOT_REGISTERED,
            CUresult::NOT_SUPPORTED,
            CUresult::UNKNOWN,
        ];
        for c in returned {
            let n = name(c.0).unwrap().to_str().unwrap();
            assert!(n.starts_with("CUDA_"), "{n}");
            assert!(description(c.0).is_some());
        }
        assert!(TABLE.windows(2).all(|w| w[0].0 < w[1].0), "sorted, no duplicates");
        assert!(name(12345).is_none());
    }
}

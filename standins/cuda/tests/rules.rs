//! The rules the stand-in enforces at call time and at run time: contexts per thread, bounds,
//! sticky errors, device ownership and peer access, modules, pointer attributes, and device
//! pointers that host code cannot dereference.

#[macro_use]
mod common;

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

use common::*;
use cuda_standin::sys::pointer_attribute as pa;
use topoccl_kernels_host::KernelArgs;

#[test]
fn a_thread_without_a_current_context_gets_invalid_context() {
    let ctx = Ctx::new(0);
    let p = alloc(64);
    std::thread::spawn(move || {
        let mut q = 0;
        assert_eq!(cu!(cuMemAlloc_v2(&mut q, 64)), CUresult::INVALID_CONTEXT);
        let mut s = null_mut();
        assert_eq!(cu!(cuStreamCreate(&mut s, 0)), CUresult::INVALID_CONTEXT);
        assert_eq!(cu!(cuCtxSynchronize()), CUresult::INVALID_CONTEXT);
        let v = [0u8; 8];
        assert_eq!(cu!(cuMemcpyHtoD_v2(p, v.as_ptr().cast(), 8)), CUresult::INVALID_CONTEXT);
        let mut c = 1 as *mut c_void;
        ok!(cuCtxGetCurrent(&mut c));
        assert!(c.is_null());
    })
    .join()
    .unwrap();
    // Binding it fixes the thread.
    let handle = ctx.0 as usize;
    std::thread::spawn(move || {
        ok!(cuCtxSetCurrent(handle as *mut c_void));
        let mut q = 0;
        ok!(cuMemAlloc_v2(&mut q, 64));
        ok!(cuMemFree_v2(q));
    })
    .join()
    .unwrap();
    ok!(cuMemFree_v2(p));
}

#[test]
fn the_context_stack_is_per_thread() {
    let a = Ctx::new(0);
    let _b = Ctx::new(1);
    ok!(cuCtxPushCurrent_v2(a.0));
    let mut dev = -1;
    ok!(cuCtxGetDevice(&mut dev));
    assert_eq!(dev, 0);
    let mut popped = null_mut();
    ok!(cuCtxPopCurrent_v2(&mut popped));
    assert_eq!(popped, a.0);
    ok!(cuCtxGetDevice(&mut dev));
    assert_eq!(dev, 1, "b is current again");
    // Primary contexts are one per device, reference counted.
    let (mut p1, mut p2) = (null_mut(), null_mut());
    ok!(cuDevicePrimaryCtxRetain(&mut p1, 1));
    ok!(cuDevicePrimaryCtxRetain(&mut p2, 1));
    assert_eq!(p1, p2);
    assert_eq!(cu!(cuCtxDestroy_v2(p1)), CUresult::INVALID_CONTEXT, "a primary context is not destroyed");
    ok!(cuDevicePrimaryCtxRelease_v2(1));
    ok!(cuDevicePrimaryCtxRelease_v2(1));
}

#[test]
fn copies_must_lie_inside_one_allocation() {
    let _ctx = Ctx::new(0);
    let p = alloc(1000);
    let q = alloc(1000);
    let host = vec![7u8; 2000];
    assert_eq!(cu!(cuMemcpyHtoD_v2(p, host.as_ptr().cast(), 1001)), CUresult::INVALID_VALUE);
    assert_eq!(cu!(cuMemcpyHtoD_v2(p + 500, host.as_ptr().cast(), 600)), CUresult::INVALID_VALUE);
    assert_eq!(cu!(cuMemcpyHtoDAsync_v2(p + 999, host.as_ptr().cast(), 2, null_mut())), CUresult::INVALID_VALUE);
    assert_eq!(cu!(cuMemcpyDtoDAsync_v2(q, p + 1, 1000, null_mut())), CUresult::INVALID_VALUE);
    assert_eq!(cu!(cuMemsetD8Async(p, 0, 1001, null_mut())), CUresult::INVALID_VALUE);
    // A device pointer is not host memory.
    assert_eq!(cu!(cuMemcpyHtoD_v2(p, q as *const c_void, 10)), CUresult::INVALID_VALUE);
    ok!(cuMemcpyHtoD_v2(p + 500, host.as_ptr().cast(), 500));
    assert_eq!(download(p + 500, 500), vec![7u8; 500]);
    // Freeing: only the base, only once.
    assert_eq!(cu!(cuMemFree_v2(p + 8)), CUresult::INVALID_VALUE);
    ok!(cuMemFree_v2(p));
    assert_eq!(cu!(cuMemFree_v2(p)), CUresult::INVALID_VALUE);
    assert_eq!(cu!(cuMemcpyHtoD_v2(p, host.as_ptr().cast(), 1)), CUresult::INVALID_VALUE, "freed");
    ok!(cuMemFree_v2(q));
}

fn sum_module() -> (*mut c_void, *mut c_void) {
    let m = load(&ptx("8.8", "sm_90", &["topoccl_reduce_sum_f32", "topoccl_copy"])).unwrap();
    (m, function(m, "topoccl_reduce_sum_f32").unwrap())
}

fn floats(p: u64, n: usize) -> Vec<f32> {
    download(p, n * 4).chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn upload_floats(v: &[f32]) -> u64 {
    upload(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

#[test]
fn kernels_run_on_device_memory() {
    let _ctx = Ctx::new(0);
    let (m, sum) = sum_module();
    let a = upload_floats(&(0..1000).map(|i| i as f32).collect::<Vec<_>>());
    let b = upload_floats(&[0.5; 1000]);
    let (d, d2) = (alloc(4000), alloc(4000));
    let s = stream(0);
    let args = KernelArgs { dst: d, dst2: d2, a, b, count: 1000, scalar: 0 };
    assert_eq!(launch(sum, 4, 128, s, &args), CUresult::SUCCESS);
    ok!(cuStreamSynchronize(s));
    let want: Vec<f32> = (0..1000).map(|i| i as f32 + 0.5).collect();
    assert_eq!(floats(d, 1000), want);
    assert_eq!(floats(d2, 1000), want);
    // Launch limits and ownership are checked at call time.
    let mut p = &args as *const KernelArgs as *mut c_void;
    let big = cu!(cuLaunchKernel(sum, 1, 1, 1, 1025, 1, 1, 0, s, &mut p, null_mut()));
    assert_eq!(big, CUresult::INVALID_VALUE);
    let other = Ctx::new(0);
    assert_eq!(launch(sum, 1, 32, null_mut(), &args), CUresult::INVALID_HANDLE, "function of another context");
    drop(other);
    ok!(cuModuleUnload(m));
    assert_eq!(launch(sum, 1, 32, s, &args), CUresult::INVALID_HANDLE, "unloaded");
}

#[test]
fn a_kernel_reading_past_an_allocation_faults_later_and_the_error_sticks() {
    let _ctx = Ctx::new(0);
    let (_, sum) = sum_module();
    let a = alloc(1024 * 4);
    let b = alloc(512 * 4);
    let d = upload(&[1u8; 4096]);
    let s = stream(0);
    let args = KernelArgs { dst: d, a, b, count: 1024, ..Default::default() };
    assert_eq!(launch(sum, 2, 256, s, &args), CUresult::SUCCESS, "the launch itself succeeds");
    assert_eq!(cu!(cuStreamSynchronize(s)), CUresult::ILLEGAL_ADDRESS);
    // Sticky: every later call using the context fails the same way.
    let mut q = 0;
    assert_eq!(cu!(cuMemAlloc_v2(&mut q, 64)), CUresult::ILLEGAL_ADDRESS);
    assert_eq!(cu!(cuCtxSynchronize()), CUresult::ILLEGAL_ADDRESS);
    assert_eq!(cu!(cuStreamQuery(null_mut())), CUresult::ILLEGAL_ADDRESS);
    assert_eq!(launch(sum, 1, 32, s, &KernelArgs { count: 0, ..args }), CUresult::ILLEGAL_ADDRESS);
    // Nothing ran: the destination kept its bytes (read through another context).
    let handle = d;
    let reader = Ctx::new(0);
    assert_eq!(download(handle, 4096), vec![1u8; 4096]);
    drop(reader);
}

#[test]
fn a_kernel_on_a_pointer_the_driver_does_not_know_faults() {
    let _ctx = Ctx::new(0);
    let (_, sum) = sum_module();
    let host = vec![0f32; 64];
    let d = alloc(256);
    let s = stream(1);
    let args = KernelArgs { dst: d, a: host.as_ptr() as u64, b: d, count: 64, ..Default::default() };
    assert_eq!(launch(sum, 1, 64, s, &args), CUresult::SUCCESS);
    assert_eq!(cu!(cuStreamSynchronize(s)), CUresult::ILLEGAL_ADDRESS, "pageable host memory");
}

#[test]
fn memory_of_another_device_needs_peer_access() {
    let c0 = Ctx::new(0);
    let p0 = upload(&[3u8; 256]);
    let c1 = Ctx::new(1);
    let p1 = alloc(256);
    assert_eq!(cu!(cuMemcpyDtoD_v2(p1, p0, 256)), CUresult::INVALID_VALUE, "copy across devices");
    let (_, copy) = {
        let m = load(&ptx("8.8", "sm_90", &["topoccl_copy"])).unwrap();
        (m, function(m, "topoccl_copy").unwrap())
    };
    let mut can = 0;
    ok!(cuDeviceCanAccessPeer(&mut can, 1, 0));
    assert_eq!(can, 1);
    ok!(cuDeviceCanAccessPeer(&mut can, 1, 1));
    assert_eq!(can, 0);
    ok!(cuCtxEnablePeerAccess(c0.0, 0));
    assert_eq!(cu!(cuCtxEnablePeerAccess(c0.0, 0)), CUresult::PEER_ACCESS_ALREADY_ENABLED);
    ok!(cuMemcpyDtoD_v2(p1, p0, 256));
    assert_eq!(
        launch(copy, 1, 64, null_mut(), &KernelArgs { dst: p1, a: p0, count: 256, ..Default::default() }),
        CUresult::SUCCESS
    );
    ok!(cuCtxSynchronize());
    assert_eq!(download(p1, 256), vec![3u8; 256]);
    // Without peer access, a kernel touching device 0's memory faults.
    let c1b = Ctx::new(1);
    let m = load(&ptx("8.8", "sm_90", &["topoccl_copy"])).unwrap();
    let copy_b = function(m, "topoccl_copy").unwrap();
    let q = alloc(256);
    assert_eq!(
        launch(copy_b, 1, 64, null_mut(), &KernelArgs { dst: q, a: p0, count: 256, ..Default::default() }),
        CUresult::SUCCESS
    );
    assert_eq!(cu!(cuCtxSynchronize()), CUresult::ILLEGAL_ADDRESS);
    drop(c1b);
    drop(c1);
    // Contexts of one device share its memory.
    let c0b = Ctx::new(0);
    assert_eq!(download(p0, 256), vec![3u8; 256]);
    drop(c0b);
    drop(c0);
}

#[test]
fn modules_name_their_kernels_and_target_the_device() {
    let _ctx = Ctx::new(0);
    let m = load(&cubin(90, &["topoccl_copy", "not_a_host_kernel"])).unwrap();
    assert!(function(m, "topoccl_copy").is_ok());
    assert_eq!(function(m, "topoccl_reduce_sum_f32"), Err(CUresult::NOT_FOUND), "not in the image");
    assert_eq!(function(m, "not_a_host_kernel"), Err(CUresult::NOT_FOUND), "no host-compiled kernel");
    ok!(cuModuleUnload(m));
    assert_eq!(load(&cubin(80, &["topoccl_copy"])), Err(CUresult::NO_BINARY_FOR_GPU), "sm_80 cubin on sm_90");
    assert_eq!(load(&cubin(100, &["topoccl_copy"])), Err(CUresult::NO_BINARY_FOR_GPU), "newer SM");
    assert!(load(&ptx("8.0", "sm_80", &["topoccl_copy"])).is_ok(), "older PTX is JIT-compiled");
    assert_eq!(load(&ptx("8.8", "sm_100", &["topoccl_copy"])), Err(CUresult::NO_BINARY_FOR_GPU));
    assert_eq!(
        load(&ptx("9.5", "sm_90", &["topoccl_copy"])),
        Err(CUresult::UNSUPPORTED_PTX_VERSION),
        "PTX ISA newer than 12.9"
    );
    assert_eq!(load(b"\x50\xed\x55\xba fatbin\0"), Err(CUresult::INVALID_IMAGE));
    assert_eq!(load(b"not ptx\0"), Err(CUresult::INVALID_PTX));
}

/// Real images built by NVRTC, when the kernels tree has them.
#[test]
fn real_images_load_when_present() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/images");
    let _ctx = Ctx::new(0);
    for (file, ok) in [("sm_90.cubin", true), ("sm_80.cubin", false), ("compute_90.ptx", true)] {
        let Ok(mut bytes) = std::fs::read(dir.join(file)) else {
            eprintln!("skipped: no {file} under {}", dir.display());
            continue;
        };
        bytes.push(0);
        match load(&bytes) {
            Ok(m) => {
                assert!(ok, "{file} should not load on sm_90");
                assert!(function(m, "topoccl_copy").is_ok(), "{file} has topoccl_copy");
            }
            Err(e) => assert!(!ok && e == CUresult::NO_BINARY_FOR_GPU, "{file}: {e:?}"),
        }
    }
}

#[test]
fn pointer_attributes() {
    let ctx = Ctx::new(1);
    let p = alloc(1000);
    let get = |attr: u32, ptr: u64| {
        let mut v = 0u64;
        match cu!(cuPointerGetAttribute((&mut v as *mut u64).cast(), attr, ptr)) {
            CUresult::SUCCESS => Ok(v),
            e => Err(e),
        }
    };
    assert_eq!(get(pa::MEMORY_TYPE, p + 10), Ok(2));
    assert_eq!(get(pa::DEVICE_ORDINAL, p), Ok(1));
    assert_eq!(get(pa::CONTEXT, p), Ok(ctx.0 as u64));
    assert_eq!(get(pa::RANGE_START_ADDR, p + 999), Ok(p));
    assert_eq!(get(pa::RANGE_SIZE, p + 999), Ok(1000));
    assert_eq!(get(pa::IS_LEGACY_CUDA_IPC_CAPABLE, p), Ok(1));
    assert_eq!(get(pa::MEMPOOL_HANDLE, p), Ok(0));
    assert_eq!(get(pa::IS_MANAGED, p), Ok(0));
    assert_eq!(get(pa::HOST_POINTER, p), Err(CUresult::INVALID_VALUE));
    assert_eq!(get(pa::MEMORY_TYPE, p + 1000), Err(CUresult::INVALID_VALUE), "one past the end");
    let mut pool = 0;
    ok!(cuMemAllocAsync(&mut pool, 100, null_mut()));
    assert_ne!(get(pa::MEMPOOL_HANDLE, pool), Ok(0));
    assert_eq!(get(pa::CONTEXT, pool), Ok(0), "pool memory belongs to no context");
    assert_eq!(get(pa::IS_LEGACY_CUDA_IPC_CAPABLE, pool), Ok(0));
    let h = pinned(100);
    let hp = h.as_ptr() as u64;
    assert_eq!(get(pa::MEMORY_TYPE, hp), Ok(1));
    assert_eq!(get(pa::HOST_POINTER, hp + 4), Ok(hp + 4));
    let mut dp = 0;
    ok!(cuMemHostGetDevicePointer_v2(&mut dp, h.as_mut_ptr().cast(), 0));
    assert_eq!(dp, hp, "UVA: the same address");
    // Unknown memory: an error for one attribute, zeros and success for several.
    let stack = 5u64;
    let sp = &stack as *const u64 as u64;
    assert_eq!(get(pa::MEMORY_TYPE, sp), Err(CUresult::INVALID_VALUE));
    let (mut ty, mut ordinal, mut start) = (9u32, 9i32, 9u64);
    let mut attrs = [pa::MEMORY_TYPE, pa::DEVICE_ORDINAL, pa::RANGE_START_ADDR];
    let mut data: [*mut c_void; 3] =
        [(&mut ty as *mut u32).cast(), (&mut ordinal as *mut i32).cast(), (&mut start as *mut u64).cast()];
    ok!(cuPointerGetAttributes(3, attrs.as_mut_ptr(), data.as_mut_ptr(), sp));
    assert_eq!((ty, ordinal, start), (0, 0, 0));
    ok!(cuPointerGetAttributes(3, attrs.as_mut_ptr(), data.as_mut_ptr(), p + 1));
    assert_eq!((ty, ordinal, start), (2, 1, p));
    let (mut base, mut size) = (0, 0);
    ok!(cuMemGetAddressRange_v2(&mut base, &mut size, p + 500));
    assert_eq!((base, size), (p, 1000));
    assert_eq!(cu!(cuMemGetAddressRange_v2(&mut base, &mut size, sp)), CUresult::NOT_FOUND);
}

#[test]
fn devices_and_errors() {
    init();
    let mut n = 0;
    ok!(cuDeviceGetCount(&mut n));
    assert_eq!(n, 2);
    let mut v = 0;
    ok!(cuDriverGetVersion(&mut v));
    assert_eq!(v, 12090);
    let mut buf = [0 as std::ffi::c_char; 64];
    ok!(cuDeviceGetName(buf.as_mut_ptr(), 64, 1));
    // SAFETY: NUL-terminated by the call.
    assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(), "topoccl stand-in GPU 1");
    let attr = |a: u32, d: i32| {
        let mut x = -1;
        ok!(cuDeviceGetAttribute(&mut x, a, d));
        x
    };
    assert_eq!((attr(75, 0), attr(76, 0)), (9, 0), "compute capability 9.0");
    assert_eq!(attr(16, 0), 132);
    assert_eq!(attr(41, 0), 1);
    assert_eq!(attr(115, 0), 1);
    assert_ne!(attr(33, 0), attr(33, 1), "distinct PCI buses");
    let mut x = 0;
    assert_eq!(cu!(cuDeviceGetAttribute(&mut x, 100_000, 0)), CUresult::INVALID_VALUE);
    let mut d = 0;
    assert_eq!(cu!(cuDeviceGet(&mut d, 2)), CUresult::INVALID_DEVICE);
    ok!(cuDeviceGetPCIBusId(buf.as_mut_ptr(), 64, 1));
    ok!(cuDeviceGetByPCIBusId(&mut d, buf.as_ptr()));
    assert_eq!(d, 1);
    let (mut u0, mut u1) = (cuda_standin::sys::CUuuid { bytes: [0; 16] }, cuda_standin::sys::CUuuid { bytes: [0; 16] });
    ok!(cuDeviceGetUuid_v2(&mut u0, 0));
    ok!(cuDeviceGetUuid_v2(&mut u1, 1));
    assert_ne!(u0, u1);
    let mut s = std::ptr::null();
    ok!(cuGetErrorName(700, &mut s));
    // SAFETY: a static C string from the stand-in.
    assert_eq!(unsafe { CStr::from_ptr(s) }.to_str().unwrap(), "CUDA_ERROR_ILLEGAL_ADDRESS");
    ok!(cuGetErrorString(201, &mut s));
    assert_eq!(cu!(cuGetErrorName(424242, &mut s)), CUresult::INVALID_VALUE);
    assert!(s.is_null());
}

#[test]
fn events_have_rules_too() {
    let _ctx = Ctx::new(0);
    let mut e = null_mut();
    assert_eq!(cu!(cuEventCreate(&mut e, 4)), CUresult::INVALID_VALUE, "INTERPROCESS needs DISABLE_TIMING");
    ok!(cuEventCreate(&mut e, 2));
    ok!(cuEventQuery(e));
    ok!(cuEventSynchronize(e));
    let s = stream(0);
    ok!(cuStreamWaitEvent(s, e, 0));
    ok!(cuStreamSynchronize(s));
    let other = Ctx::new(0);
    let s2 = stream(0);
    assert_eq!(cu!(cuEventRecord(e, s2)), CUresult::INVALID_HANDLE, "event and stream of different contexts");
    drop(other);
    ok!(cuEventDestroy_v2(e));
    assert_eq!(cu!(cuEventQuery(e)), CUresult::INVALID_HANDLE);
    ok!(cuStreamSynchronize(2 as *mut c_void));
}

#[test]
fn registered_host_memory_is_pinned_memory() {
    let _ctx = Ctx::new(0);
    let mut host = vec![5u8; 8192];
    let hp = host.as_mut_ptr();
    ok!(cuMemHostRegister_v2(hp.cast(), 8192, 0));
    assert_eq!(cu!(cuMemHostRegister_v2(hp.wrapping_add(100).cast(), 10, 0)), CUresult::HOST_MEMORY_ALREADY_REGISTERED);
    let mut ty = 0u32;
    ok!(cuPointerGetAttribute((&mut ty as *mut u32).cast(), pa::MEMORY_TYPE, hp as u64 + 8));
    assert_eq!(ty, 1);
    // Read when the copy runs, as pinned memory is.
    let s = stream(1);
    let flag = Flag::new();
    let d = alloc(8192);
    flag.gate(s, 1);
    ok!(cuMemcpyHtoDAsync_v2(d, hp.cast_const().cast(), 8192, s));
    // SAFETY: the registered buffer, written by the host while the stream is held back.
    unsafe { std::ptr::write_bytes(hp, 6, 8192) };
    flag.set(1);
    ok!(cuStreamSynchronize(s));
    assert_eq!(download(d, 8192), vec![6u8; 8192]);
    ok!(cuMemHostUnregister(hp.cast()));
    assert_eq!(cu!(cuMemHostUnregister(hp.cast())), CUresult::HOST_MEMORY_NOT_REGISTERED);
    // Read-only registered memory is no copy destination.
    ok!(cuMemHostRegister_v2(hp.cast(), 8192, 8));
    assert_eq!(cu!(cuMemcpyDtoHAsync_v2(hp.cast(), d, 64, s)), CUresult::INVALID_VALUE);
    ok!(cuMemcpyHtoDAsync_v2(d, hp.cast_const().cast(), 64, s));
    ok!(cuStreamSynchronize(s));
    ok!(cuMemHostUnregister(hp.cast()));
    drop(host);
}

#[test]
fn unified_copies_find_their_direction() {
    let _ctx = Ctx::new(0);
    let d = alloc(256);
    let d2 = alloc(256);
    let src = vec![4u8; 256];
    let pin = pinned(256);
    ok!(cuMemcpyAsync(d, src.as_ptr() as u64, 256, null_mut()));
    ok!(cuMemcpyAsync(d2, d, 256, null_mut()));
    ok!(cuMemcpyAsync(pin.as_mut_ptr() as u64, d2, 256, null_mut()));
    let mut out = vec![0u8; 256];
    ok!(cuMemcpyAsync(out.as_mut_ptr() as u64, pin.as_ptr() as u64, 256, null_mut()));
    assert_eq!(out, vec![4u8; 256], "host to host is synchronous; device to pageable too");
    assert_eq!(cu!(cuMemcpyAsync(d, d2 + 1, 256, null_mut())), CUresult::INVALID_VALUE);
}

#[test]
fn streams_report_their_context_and_flags() {
    let ctx = Ctx::new(1);
    let s = stream(1);
    let mut c = null_mut();
    ok!(cuStreamGetCtx(s, &mut c));
    assert_eq!(c, ctx.0);
    ok!(cuStreamGetCtx(null_mut(), &mut c));
    assert_eq!(c, ctx.0);
    let mut flags = 9;
    ok!(cuStreamGetFlags(s, &mut flags));
    assert_eq!(flags, 1);
    let mut capturing = 9u32;
    ok!(cuStreamIsCapturing(s, &mut capturing));
    assert_eq!(capturing, 0);
    ok!(cuStreamQuery(s));
    ok!(cuStreamDestroy_v2(s));
    assert_eq!(cu!(cuStreamQuery(s)), CUresult::INVALID_HANDLE);
    assert_eq!(cu!(cuStreamCreate(&mut c, 4)), CUresult::INVALID_VALUE);
}

/// Host code dereferencing a device pointer crashes, as on a GPU.
#[test]
fn host_dereference_of_a_device_pointer_segfaults() {
    use std::os::unix::process::ExitStatusExt;
    let status = run_child("child", "deref", &[]);
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}");
}

#[test]
fn child() {
    let Some(body) = child_body() else { return };
    match body.as_str() {
        "deref" => {
            let _ctx = Ctx::new(0);
            let p = upload(&[1u8; 64]);
            // SAFETY: deliberately not: `p` is a device pointer; this read must fault.
            let v = unsafe { std::ptr::read_volatile(p as *const u8) };
            panic!("read {v} through a device pointer");
        }
        other => panic!("unknown child body {other}"),
    }
}

#[test]
fn device_memory_exports_page_aligned_ranges_as_dma_buf() {
    let _ctx = Ctx::new(0);
    let page = 4096usize;
    let len = 3 * page;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let p = upload(&data);
    let mut supported = 0;
    ok!(cuDeviceGetAttribute(&mut supported, 124, 0));
    assert_eq!(supported, 1, "DMA_BUF_SUPPORTED");
    // The range must be page aligned, and lie within the allocation's pages.
    let first = p / page as u64 * page as u64;
    let mut fd: i32 = -1;
    let h = (&mut fd as *mut i32).cast::<c_void>();
    assert_eq!(cu!(cuMemGetHandleForAddressRange(h, p + 1, page, 1, 0)), CUresult::INVALID_VALUE);
    assert_eq!(cu!(cuMemGetHandleForAddressRange(h, first, page + 1, 1, 0)), CUresult::INVALID_VALUE);
    assert_eq!(cu!(cuMemGetHandleForAddressRange(h, first, 2 * len, 1, 0)), CUresult::INVALID_VALUE);
    assert_eq!(cu!(cuMemGetHandleForAddressRange(h, first, page, 2, 0)), CUresult::INVALID_VALUE);
    let host = pinned(page);
    let hp = host.as_ptr() as u64 / page as u64 * page as u64;
    assert_eq!(cu!(cuMemGetHandleForAddressRange(h, hp, page, 1, 0)), CUresult::INVALID_VALUE, "host memory");
    // The second page of the allocation's pages: the descriptor, mapped at its position, shows
    // the device bytes there, and writes through it are the device's.
    ok!(cuMemGetHandleForAddressRange(h, first + page as u64, page, 1, 0));
    assert!(fd >= 0);
    // SAFETY: `fd` is a descriptor the driver handed over; lseek and mmap only read it.
    let pos = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
    assert_eq!(pos as u64 % page as u64, 0);
    // SAFETY: a shared mapping of a page of the memfd at a page-aligned offset.
    let m = unsafe { libc::mmap(null_mut(), page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, pos) };
    assert_ne!(m, libc::MAP_FAILED);
    let at = (first + page as u64 - p) as usize;
    // SAFETY: the page just mapped.
    let view = unsafe { std::slice::from_raw_parts_mut(m.cast::<u8>(), page) };
    assert_eq!(view, &data[at..at + page]);
    view[0] = !view[0];
    assert_eq!(download(p + at as u64, 1)[0], !data[at]);
    // SAFETY: unmapping what was mapped above; closing the descriptor we own.
    unsafe {
        libc::munmap(m, page);
        libc::close(fd);
    }
    ok!(cuMemFree_v2(p));
}

#[test]
fn gpudirect_writes_are_flushed_from_a_context() {
    let mut v = -1;
    init();
    ok!(cuDeviceGetAttribute(&mut v, 117, 0));
    assert_eq!(v, 1, "the HOST flush option");
    ok!(cuDeviceGetAttribute(&mut v, 118, 0));
    assert_eq!(v, 0, "writes not ordered: a flush is needed");
    std::thread::spawn(|| {
        assert_eq!(cu!(cuFlushGPUDirectRDMAWrites(0, 100)), CUresult::INVALID_CONTEXT);
    })
    .join()
    .unwrap();
    let _ctx = Ctx::new(0);
    let before = cuda_standin::memory::rdma_flushes();
    assert_eq!(cu!(cuFlushGPUDirectRDMAWrites(1, 100)), CUresult::INVALID_VALUE);
    assert_eq!(cu!(cuFlushGPUDirectRDMAWrites(0, 7)), CUresult::INVALID_VALUE);
    ok!(cuFlushGPUDirectRDMAWrites(0, 100));
    ok!(cuFlushGPUDirectRDMAWrites(0, 200));
    assert!(cuda_standin::memory::rdma_flushes() >= before + 2);
}

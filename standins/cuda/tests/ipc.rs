//! Legacy CUDA IPC across two processes: device memory and an interprocess event exported by
//! this process and used by a child (the same test binary running a named body), with the
//! rules on who may open what.

#[macro_use]
mod common;

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::Duration;

use common::*;
use cuda_standin::sys::CUipcHandle;

const N: usize = 8192;

fn hex(h: &CUipcHandle) -> String {
    h.reserved.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> CUipcHandle {
    let mut h = CUipcHandle { reserved: [0; 64] };
    for (i, b) in h.reserved.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    h
}

#[test]
fn memory_and_events_cross_processes() {
    let _ctx = Ctx::new(0);
    let mem = upload(&[1u8; N]);
    let mut mem_handle = CUipcHandle { reserved: [0; 64] };
    ok!(cuIpcGetMemHandle(&mut mem_handle, mem));
    assert_eq!(cu!(cuIpcGetMemHandle(&mut mem_handle, mem + 256)), CUresult::INVALID_VALUE, "not the base");
    ok!(cuIpcGetMemHandle(&mut mem_handle, mem));
    let mut p = 0;
    assert_eq!(cu!(cuIpcOpenMemHandle_v2(&mut p, mem_handle, 1)), CUresult::INVALID_CONTEXT, "opened by its exporter");

    let mut ev = null_mut();
    ok!(cuEventCreate(&mut ev, 2 | 4));
    let mut ev_handle = CUipcHandle { reserved: [0; 64] };
    ok!(cuIpcGetEventHandle(&mut ev_handle, ev));

    // The child must see what this process writes after the gate opens: it waits for the event.
    let s = stream(1);
    let flag = Flag::new();
    flag.gate(s, 1);
    ok!(cuMemsetD8Async(mem, 0x5a, N, s));
    ok!(cuEventRecord(ev, s));
    let env = [("IPC_MEM", hex(&mem_handle)), ("IPC_EVENT", hex(&ev_handle))];
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        flag.set(1);
    });
    let status = run_child("child", "importer", &env);
    opener.join().unwrap();
    assert!(status.success(), "{status:?}");
    // The child wrote the second half.
    let back = download(mem, N);
    assert!(back[..N / 2].iter().all(|&b| b == 0x5a));
    assert!(back[N / 2..].iter().all(|&b| b == 0x77));
}

#[test]
fn only_cu_mem_alloc_memory_and_interprocess_events_have_handles() {
    let _ctx = Ctx::new(0);
    let mut pool = 0;
    ok!(cuMemAllocAsync(&mut pool, 4096, null_mut()));
    let mut h = CUipcHandle { reserved: [0; 64] };
    assert_eq!(cu!(cuIpcGetMemHandle(&mut h, pool)), CUresult::INVALID_VALUE, "pool memory");
    let pin = pinned(64);
    assert_eq!(cu!(cuIpcGetMemHandle(&mut h, pin.as_ptr() as u64)), CUresult::INVALID_VALUE, "host memory");
    let mut ev = null_mut();
    ok!(cuEventCreate(&mut ev, 2));
    assert_eq!(cu!(cuIpcGetEventHandle(&mut h, ev)), CUresult::INVALID_VALUE, "not INTERPROCESS");
    let mut p = 0;
    assert_eq!(cu!(cuIpcOpenMemHandle_v2(&mut p, CUipcHandle { reserved: [7; 64] }, 0)), CUresult::INVALID_VALUE);
}

#[test]
fn child() {
    let Some(body) = child_body() else { return };
    assert_eq!(body, "importer");
    let _ctx = Ctx::new(0);
    let mem_handle = unhex(&std::env::var("IPC_MEM").unwrap());
    let ev_handle = unhex(&std::env::var("IPC_EVENT").unwrap());
    let mut mem = 0;
    ok!(cuIpcOpenMemHandle_v2(&mut mem, mem_handle, 1));
    let mut again = 0;
    assert_eq!(cu!(cuIpcOpenMemHandle_v2(&mut again, mem_handle, 1)), CUresult::ALREADY_MAPPED);
    let mut ev: *mut c_void = null_mut();
    ok!(cuIpcOpenEventHandle(&mut ev, ev_handle));
    let s = stream(1);
    ok!(cuStreamWaitEvent(s, ev, 0));
    let out = pinned(N);
    ok!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), mem, N, s));
    ok!(cuStreamSynchronize(s));
    assert!(out.iter().all(|&b| b == 0x5a), "waited for the exporter's write");
    ok!(cuMemsetD8Async(mem + N as u64 / 2, 0x77, N / 2, s));
    ok!(cuStreamSynchronize(s));
    assert_eq!(cu!(cuMemFree_v2(mem)), CUresult::INVALID_VALUE, "an IPC mapping is closed, not freed");
    ok!(cuIpcCloseMemHandle(mem));
    ok!(cuIpcOpenMemHandle_v2(&mut again, mem_handle, 1));
    ok!(cuIpcCloseMemHandle(again));
}

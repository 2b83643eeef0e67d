//! Stream capture and graphs: captured work does not run until the graph is launched, and then
//! runs again at every launch with the data its memory holds by then; what a real driver
//! refuses while a stream captures is refused with its code and invalidates the capture;
//! forked streams must be joined back; `CU_STREAM_PER_THREAD` is each thread's own blocking
//! stream. Captures in `GLOBAL` mode forbid unsafe calls in every thread of the process, so
//! this binary's tests run one at a time (`SERIAL`).

#[macro_use]
mod common;

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use topoccl_kernels_host::KernelArgs;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const GLOBAL: u32 = 0;
const THREAD_LOCAL: u32 = 1;
const RELAXED: u32 = 2;
const PER_THREAD: *mut c_void = 2 as *mut c_void;

fn sum_kernel() -> *mut c_void {
    let m = load(&ptx("8.8", "sm_90", &["topoccl_reduce_sum_f32"])).unwrap();
    function(m, "topoccl_reduce_sum_f32").unwrap()
}

fn as_floats(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn set_floats(b: &mut [u8], v: impl Fn(usize) -> f32) {
    for (i, c) in b.chunks_mut(4).enumerate() {
        c.copy_from_slice(&v(i).to_le_bytes());
    }
}

fn capturing(s: *mut c_void) -> u32 {
    let mut st = 9;
    ok!(cuStreamIsCapturing(s, &mut st));
    st
}

fn end(s: *mut c_void) -> (CUresult, *mut c_void) {
    let mut g = 1 as *mut c_void;
    let r = cu!(cuStreamEndCapture(s, &mut g));
    (r, g)
}

fn instantiate(g: *mut c_void) -> *mut c_void {
    let mut e = null_mut();
    ok!(cuGraphInstantiateWithFlags(&mut e, g, 0));
    e
}

#[test]
fn a_captured_sequence_runs_at_each_launch_with_the_data_of_then() {
    let _g = serial();
    let _ctx = Ctx::new(0);
    const N: usize = 1000;
    let sum = sum_kernel();
    let (host_in, host_out) = (pinned(4 * N), pinned(4 * N));
    let (a, b, d) = (alloc(4 * N), upload(&[0u8; 4 * N]), alloc(4 * N));
    let mut ones = vec![0u8; 4 * N];
    set_floats(&mut ones, |_| 1.0);
    ok!(cuMemcpyHtoD_v2(b, ones.as_ptr().cast(), 4 * N));
    let flag = Flag::new();
    let s = stream(1);
    ok!(cuStreamBeginCapture_v2(s, GLOBAL));
    assert_eq!(capturing(s), 1);
    ok!(cuMemcpyHtoDAsync_v2(a, host_in.as_ptr().cast(), 4 * N, s));
    let args = KernelArgs { dst: d, dst2: 0, a, b, count: N as u64, scalar: 0 };
    assert_eq!(launch(sum, 4, 128, s, &args), CUresult::SUCCESS);
    ok!(cuStreamWriteValue32_v2(s, flag.addr(), 7, 0));
    ok!(cuMemcpyDtoHAsync_v2(host_out.as_mut_ptr().cast(), d, 4 * N, s));
    let (r, g) = end(s);
    assert_eq!(r, CUresult::SUCCESS);
    assert_eq!(capturing(s), 0);
    let mut nodes = 0usize;
    ok!(cuGraphGetNodes(g, null_mut(), &mut nodes));
    assert_eq!(nodes, 4, "two copies, a kernel and a value write");
    // Nothing ran at capture.
    ok!(cuStreamSynchronize(s));
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(flag.0.load(std::sync::atomic::Ordering::SeqCst), 0);
    let exec = instantiate(g);
    ok!(cuGraphDestroy(g));
    for round in 0..5 {
        set_floats(host_in, |i| (i * 10 + round) as f32);
        flag.set(0);
        ok!(cuGraphLaunch(exec, s));
        ok!(cuStreamSynchronize(s));
        let want: Vec<f32> = (0..N).map(|i| (i * 10 + round) as f32 + 1.0).collect();
        assert_eq!(as_floats(host_out), want, "launch {round}");
        assert_eq!(flag.0.load(std::sync::atomic::Ordering::SeqCst), 7);
    }
    // Two launches of one executable graph run one after the other, even on two streams: the
    // second waits for the first, held back here by a gate before it.
    let (gated, other) = (stream(1), stream(1));
    flag.set(0);
    flag.gate(gated, 1);
    ok!(cuGraphLaunch(exec, gated));
    ok!(cuGraphLaunch(exec, other));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(cu!(cuStreamQuery(other)), CUresult::NOT_READY, "the second launch waits for the first");
    flag.set(1);
    ok!(cuStreamSynchronize(other));
    ok!(cuGraphExecDestroy(exec));
    assert_eq!(cu!(cuGraphLaunch(exec, s)), CUresult::INVALID_VALUE, "a destroyed graph");
}

#[test]
fn what_a_capturing_stream_refuses_invalidates_its_capture() {
    let _g = serial();
    let _ctx = Ctx::new(0);
    let s = stream(1);
    let dev = alloc(64);
    let refused = |what: &str, call: &dyn Fn() -> CUresult, code: CUresult| {
        ok!(cuStreamBeginCapture_v2(s, RELAXED));
        assert_eq!(call(), code, "{what}");
        assert_eq!(capturing(s), 2, "{what} invalidated the capture");
        assert_eq!(cu!(cuMemsetD8Async(dev, 1, 64, s)), CUresult::STREAM_CAPTURE_INVALIDATED, "after {what}");
        let (r, g) = end(s);
        assert_eq!((r, g), (CUresult::STREAM_CAPTURE_INVALIDATED, null_mut()), "{what}: no graph");
        assert_eq!(capturing(s), 0);
        ok!(cuStreamSynchronize(s));
    };
    refused("synchronising the stream", &|| cu!(cuStreamSynchronize(s)), CUresult::STREAM_CAPTURE_UNSUPPORTED);
    refused("querying the stream", &|| cu!(cuStreamQuery(s)), CUresult::STREAM_CAPTURE_UNSUPPORTED);
    refused("synchronising the context", &|| cu!(cuCtxSynchronize()), CUresult::STREAM_CAPTURE_UNSUPPORTED);
    let mut outside = null_mut();
    ok!(cuEventCreate(&mut outside, 2));
    ok!(cuEventRecord(outside, null_mut()));
    refused(
        "a wait for uncaptured work",
        &|| cu!(cuStreamWaitEvent(s, outside, 0)),
        CUresult::STREAM_CAPTURE_ISOLATION,
    );
    assert_eq!(cu!(cuStreamWaitEvent(s, outside, 1)), CUresult::INVALID_VALUE, "EXTERNAL outside a capture");

    // An event recorded in the capture cannot be queried or waited for on the host.
    let mut ev = null_mut();
    ok!(cuEventCreate(&mut ev, 2));
    ok!(cuStreamBeginCapture_v2(s, GLOBAL));
    ok!(cuEventRecord(ev, s));
    assert_eq!(cu!(cuEventQuery(ev)), CUresult::CAPTURED_EVENT);
    assert_eq!(cu!(cuEventSynchronize(ev)), CUresult::CAPTURED_EVENT);
    // Ending a global capture from another thread is refused (it goes on).
    let raw = s as usize;
    let from_other = std::thread::scope(|t| t.spawn(move || end(raw as *mut c_void).0).join().unwrap());
    assert_eq!(from_other, CUresult::STREAM_CAPTURE_WRONG_THREAD);
    assert_eq!(capturing(s), 1);
    let (r, g) = end(s);
    assert_eq!(r, CUresult::SUCCESS);
    ok!(cuGraphDestroy(g));
    ok!(cuEventRecord(ev, s));
    ok!(cuEventSynchronize(ev));

    // The legacy stream cannot capture, and while a blocking stream captures it is unusable.
    assert_eq!(cu!(cuStreamBeginCapture_v2(null_mut(), GLOBAL)), CUresult::STREAM_CAPTURE_UNSUPPORTED);
    let blocking = stream(0);
    ok!(cuStreamBeginCapture_v2(blocking, GLOBAL));
    let mut st = 0;
    assert_eq!(cu!(cuStreamIsCapturing(null_mut(), &mut st)), CUresult::STREAM_CAPTURE_IMPLICIT);
    assert_eq!(cu!(cuMemsetD8_v2(dev, 0, 64)), CUresult::STREAM_CAPTURE_IMPLICIT);
    assert_eq!(capturing(blocking), 2);
    assert_eq!(end(blocking).0, CUresult::STREAM_CAPTURE_INVALIDATED);
    ok!(cuMemsetD8_v2(dev, 0, 64));
}

#[test]
fn unsafe_calls_are_refused_as_the_threads_mode_says() {
    let _g = serial();
    let ctx = Ctx::new(0);
    let raw = ctx.0 as usize;
    let s = stream(1);
    let try_alloc = move || {
        ok!(cuCtxSetCurrent(raw as *mut c_void));
        let mut p = 0;
        let r = cu!(cuMemAlloc_v2(&mut p, 256));
        if r == CUresult::SUCCESS {
            ok!(cuMemFree_v2(p));
        }
        r
    };
    let on_other_thread = |mode: u32| {
        std::thread::scope(|t| {
            t.spawn(move || {
                let mut m = mode;
                ok!(cuThreadExchangeStreamCaptureMode(&mut m));
                try_alloc()
            })
            .join()
            .unwrap()
        })
    };
    // A global capture: refused on every thread but one in relaxed mode.
    ok!(cuStreamBeginCapture_v2(s, GLOBAL));
    assert_eq!(on_other_thread(RELAXED), CUresult::SUCCESS);
    assert_eq!(capturing(s), 1, "a relaxed thread's allocation leaves the capture alone");
    assert_eq!(on_other_thread(GLOBAL), CUresult::STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(capturing(s), 2);
    assert_eq!(end(s).0, CUresult::STREAM_CAPTURE_INVALIDATED);
    // A thread-local capture: only its own thread is refused.
    ok!(cuStreamBeginCapture_v2(s, THREAD_LOCAL));
    assert_eq!(on_other_thread(GLOBAL), CUresult::SUCCESS);
    assert_eq!(capturing(s), 1);
    assert_eq!(try_alloc(), CUresult::STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(end(s).0, CUresult::STREAM_CAPTURE_INVALIDATED);
    // The exchange returns the old mode.
    let mut m = RELAXED;
    ok!(cuThreadExchangeStreamCaptureMode(&mut m));
    assert_eq!(m, GLOBAL);
    ok!(cuThreadExchangeStreamCaptureMode(&mut m));
    assert_eq!(m, RELAXED);
    assert_eq!(try_alloc(), CUresult::SUCCESS);
}

#[test]
fn streams_forked_into_a_capture_must_join_it_again() {
    let _g = serial();
    let _ctx = Ctx::new(0);
    let (s1, s2) = (stream(1), stream(1));
    let (x, y) = (alloc(64), alloc(64));
    let (mut fork, mut join) = (null_mut(), null_mut());
    ok!(cuEventCreate(&mut fork, 2));
    ok!(cuEventCreate(&mut join, 2));
    // Unjoined: refused.
    ok!(cuStreamBeginCapture_v2(s1, GLOBAL));
    ok!(cuEventRecord(fork, s1));
    ok!(cuStreamWaitEvent(s2, fork, 0));
    assert_eq!(capturing(s2), 1, "the waiting stream joined the capture");
    ok!(cuMemsetD8Async(y, 2, 64, s2));
    assert_eq!(end(s1).0, CUresult::STREAM_CAPTURE_UNJOINED);
    assert_eq!(capturing(s2), 0);
    // Joined: both branches run at each launch.
    ok!(cuStreamBeginCapture_v2(s1, GLOBAL));
    ok!(cuMemsetD8Async(x, 1, 64, s1));
    ok!(cuEventRecord(fork, s1));
    ok!(cuStreamWaitEvent(s2, fork, 0));
    ok!(cuMemsetD8Async(y, 2, 64, s2));
    ok!(cuEventRecord(join, s2));
    ok!(cuStreamWaitEvent(s1, join, 0));
    let (r, g) = end(s1);
    assert_eq!(r, CUresult::SUCCESS);
    let exec = instantiate(g);
    ok!(cuMemsetD8_v2(x, 0, 64));
    ok!(cuMemsetD8_v2(y, 0, 64));
    ok!(cuStreamSynchronize(null_mut()));
    ok!(cuGraphLaunch(exec, s1));
    ok!(cuStreamSynchronize(s1));
    assert_eq!((download(x, 64), download(y, 64)), (vec![1u8; 64], vec![2u8; 64]));
    ok!(cuGraphExecDestroy(exec));
    ok!(cuGraphDestroy(g));
}

#[test]
fn the_per_thread_stream_is_each_threads_own_and_blocking() {
    let _g = serial();
    let ctx = Ctx::new(0);
    let raw = ctx.0 as usize;
    let flag = Flag::new();
    let dev = alloc(64);
    // This thread's per-thread stream waits on the flag; another thread's does not.
    flag.gate(PER_THREAD, 1);
    ok!(cuMemsetD8Async(dev, 5, 64, PER_THREAD));
    let other = std::thread::scope(|t| {
        t.spawn(move || {
            ok!(cuCtxSetCurrent(raw as *mut c_void));
            ok!(cuMemsetD8Async(dev, 6, 64, PER_THREAD));
            cu!(cuStreamSynchronize(PER_THREAD))
        })
        .join()
        .unwrap()
    });
    assert_eq!(other, CUresult::SUCCESS, "another thread's per-thread stream ran");
    assert_eq!(cu!(cuStreamQuery(PER_THREAD)), CUresult::NOT_READY);
    // Blocking: the legacy stream's work waits for it.
    let mut ev = null_mut();
    ok!(cuEventCreate(&mut ev, 2));
    ok!(cuEventRecord(ev, null_mut()));
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(cu!(cuEventQuery(ev)), CUresult::NOT_READY, "the legacy stream waits for the per-thread one");
    flag.set(1);
    ok!(cuEventSynchronize(ev));
    assert_eq!(download(dev, 64), vec![5u8; 64]);
    // It captures like any stream.
    ok!(cuStreamBeginCapture_v2(PER_THREAD, THREAD_LOCAL));
    assert_eq!(capturing(PER_THREAD), 1);
    ok!(cuMemsetD8Async(dev, 7, 64, PER_THREAD));
    let (r, g) = end(PER_THREAD);
    assert_eq!(r, CUresult::SUCCESS);
    let exec = instantiate(g);
    ok!(cuGraphLaunch(exec, PER_THREAD));
    ok!(cuStreamSynchronize(PER_THREAD));
    assert_eq!(download(dev, 64), vec![7u8; 64]);
    assert_eq!(cu!(cuStreamDestroy_v2(PER_THREAD)), CUresult::INVALID_HANDLE);
}

#[test]
fn captured_copies_of_pageable_memory_and_external_waits_run_at_launch() {
    let _g = serial();
    let _ctx = Ctx::new(0);
    let s = stream(1);
    let dev = alloc(64);
    let mut src = [0u8; 64];
    let mut dst = [0u8; 64];
    let gate = stream(1);
    let flag = Flag::new();
    let mut ev = null_mut();
    ok!(cuEventCreate(&mut ev, 2));
    ok!(cuStreamBeginCapture_v2(s, GLOBAL));
    ok!(cuStreamWaitEvent(s, ev, 1));
    ok!(cuMemcpyHtoDAsync_v2(dev, src.as_ptr().cast(), 64, s));
    ok!(cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), dev, 64, s));
    let (r, g) = end(s);
    assert_eq!(r, CUresult::SUCCESS);
    let exec = instantiate(g);
    for round in 1..4u8 {
        src.fill(round);
        // The launch waits for the event's record made before it: held by the gate.
        flag.gate(gate, u32::from(round));
        ok!(cuEventRecord(ev, gate));
        ok!(cuGraphLaunch(exec, s));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(cu!(cuStreamQuery(s)), CUresult::NOT_READY, "the external wait holds the launch");
        flag.set(u32::from(round));
        ok!(cuStreamSynchronize(s));
        assert_eq!(dst, [round; 64], "launch {round} read the pageable source as it was then");
    }
    ok!(cuGraphExecDestroy(exec));
    ok!(cuGraphDestroy(g));
}

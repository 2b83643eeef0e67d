//! Work runs later than it is enqueued, on one worker per stream: a missing wait gives wrong
//! data, CUDA's staging rules decide when host memory is read, and the legacy default stream
//! synchronises implicitly with blocking streams only. Streams are held back deterministically
//! with `cuStreamWaitValue32_v2` on a pinned flag that the test sets.

#[macro_use]
mod common;

use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::*;

const N: usize = 4096;

#[test]
fn a_missing_stream_wait_event_reads_stale_data() {
    let _ctx = Ctx::new(0);
    let (a, b) = (stream(1), stream(1));
    let flag = Flag::new();
    let src = upload(&[1u8; N]);
    let buf = upload(&[0u8; N]);
    // A produces buf, but only once the flag is 1; B consumes it without waiting.
    flag.gate(a, 1);
    ok!(cuMemcpyDtoDAsync_v2(buf, src, N, a));
    let mut out = vec![9u8; N];
    ok!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), buf, N, b));
    assert_eq!(out, vec![0u8; N], "B read buf before A wrote it");
    flag.set(1);
    ok!(cuStreamSynchronize(a));

    // With the wait, B sees A's data, however late A runs.
    let mut ev = null_mut();
    ok!(cuEventCreate(&mut ev, 2));
    ok!(cuMemsetD8Async(buf, 0, N, a));
    flag.gate(a, 2);
    ok!(cuMemcpyDtoDAsync_v2(buf, src, N, a));
    ok!(cuEventRecord(ev, a));
    ok!(cuStreamWaitEvent(b, ev, 0));
    let out = pinned(N);
    ok!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), buf, N, b));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(cu!(cuStreamQuery(b)), CUresult::NOT_READY);
    assert_eq!(cu!(cuEventQuery(ev)), CUresult::NOT_READY);
    flag.set(2);
    ok!(cuStreamSynchronize(b));
    assert!(out.iter().all(|&x| x == 1));

    // And with only the random delays racing, the wait is always enough.
    for round in 2..22u8 {
        let s = upload(&[round; N]);
        ok!(cuMemcpyDtoDAsync_v2(buf, s, N, a));
        ok!(cuEventRecord(ev, a));
        ok!(cuStreamWaitEvent(b, ev, 0));
        ok!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), buf, N, b));
        ok!(cuStreamSynchronize(b));
        assert!(out.iter().all(|&x| x == round), "round {round}");
        ok!(cuMemFree_v2(s));
    }
}

#[test]
fn pageable_sources_are_staged_pinned_ones_read_when_the_copy_runs() {
    let _ctx = Ctx::new(0);
    let s = stream(1);
    let flag = Flag::new();
    let (d1, d2) = (alloc(N), alloc(N));
    flag.gate(s, 1);
    let mut pageable = vec![1u8; N];
    ok!(cuMemcpyHtoDAsync_v2(d1, pageable.as_ptr().cast(), N, s));
    pageable.fill(2);
    let pin = pinned(N);
    pin.fill(1);
    ok!(cuMemcpyHtoDAsync_v2(d2, pin.as_ptr().cast(), N, s));
    pin.fill(2);
    // To pinned memory: lands when it runs (the stream is still held back).
    let back = pinned(N);
    back.fill(0);
    ok!(cuMemcpyDtoHAsync_v2(back.as_mut_ptr().cast(), d1, N, s));
    assert!(back.iter().all(|&x| x == 0), "not yet");
    flag.set(1);
    ok!(cuStreamSynchronize(s));
    assert_eq!(download(d1, N), vec![1u8; N], "staged at call time");
    assert_eq!(download(d2, N), vec![2u8; N], "read when the copy ran");
    assert!(back.iter().all(|&x| x == 1));

    // To pageable memory: the call returns only after the stream ran it.
    flag.gate(s, 2);
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        flag.set(2);
    });
    let t = Instant::now();
    let mut out = vec![0u8; N];
    ok!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), d2, N, s));
    assert!(t.elapsed() >= Duration::from_millis(90), "{:?}", t.elapsed());
    assert_eq!(out, vec![2u8; N]);
    setter.join().unwrap();
}

#[test]
fn the_legacy_stream_synchronises_with_blocking_streams_only() {
    let _ctx = Ctx::new(0);
    let flag = Flag::new();
    let x = upload(&[0u8; N]);
    let y = alloc(N);
    let legacy = null_mut();

    // Legacy work waits for earlier work of a blocking stream.
    let blocking = stream(0);
    flag.gate(blocking, 1);
    ok!(cuMemsetD8Async(x, 7, N, blocking));
    ok!(cuMemcpyDtoDAsync_v2(y, x, N, legacy));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(cu!(cuStreamQuery(legacy)), CUresult::NOT_READY);
    flag.set(1);
    ok!(cuStreamSynchronize(legacy));
    assert_eq!(download(y, N), vec![7u8; N]);

    // ... but not for a non-blocking stream's.
    let non_blocking = stream(1);
    flag.gate(non_blocking, 2);
    ok!(cuMemsetD8Async(x, 9, N, non_blocking));
    ok!(cuMemcpyDtoDAsync_v2(y, x, N, legacy));
    ok!(cuStreamSynchronize(legacy));
    assert_eq!(download(y, N), vec![7u8; N], "copied before the non-blocking memset ran");
    flag.set(2);
    ok!(cuStreamSynchronize(non_blocking));

    // A blocking stream waits for earlier legacy work; a non-blocking one does not.
    flag.gate(legacy, 3);
    ok!(cuMemsetD8Async(x, 1, N, blocking));
    ok!(cuMemsetD8Async(y, 1, N, non_blocking));
    ok!(cuStreamSynchronize(non_blocking));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(cu!(cuStreamQuery(blocking)), CUresult::NOT_READY);
    flag.set(3);
    ok!(cuStreamSynchronize(blocking));
    assert_eq!(download(x, N), vec![1u8; N]);
}

#[test]
fn synchronous_copies_reach_non_blocking_streams_through_events() {
    let _ctx = Ctx::new(0);
    let d = upload(&[0u8; N]);
    let non_blocking = stream(1);
    // From pageable memory, cuMemcpyHtoD_v2 returns once the data is staged (the copy may
    // not have run): a non-blocking stream sees it only when ordered after it, by an event.
    let mut ev = null_mut();
    ok!(cuEventCreate(&mut ev, 2));
    for round in 1..=10u8 {
        ok!(cuMemcpyHtoD_v2(d, vec![round; N].as_ptr().cast(), N));
        ok!(cuEventRecord(ev, null_mut()));
        ok!(cuStreamWaitEvent(non_blocking, ev, 0));
        let out = pinned(N);
        ok!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), d, N, non_blocking));
        ok!(cuStreamSynchronize(non_blocking));
        assert!(out.iter().all(|&x| x == round));
    }
    // From pinned memory the synchronous copy has completed when it returns.
    let pin = pinned(N);
    pin.fill(42);
    ok!(cuMemcpyHtoD_v2(d, pin.as_ptr().cast(), N));
    pin.fill(0);
    assert_eq!(download(d, N), vec![42u8; N]);
}

#[test]
fn streams_wait_for_and_write_values() {
    let _ctx = Ctx::new(0);
    let (a, b) = (stream(1), stream(1));
    let word = upload(&[0u8; 256]);
    let y = upload(&[0u8; 64]);
    // A waits on device memory that B writes.
    ok!(cuStreamWaitValue32_v2(a, word, 5, 0));
    ok!(cuMemsetD8Async(y, 1, 64, a));
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(cu!(cuStreamQuery(a)), CUresult::NOT_READY);
    ok!(cuStreamWriteValue32_v2(b, word, 5, 0));
    ok!(cuStreamSynchronize(a));
    assert_eq!(download(y, 64), vec![1u8; 64]);
    assert_eq!(download(word, 4), 5u32.to_le_bytes());

    // EQ waits for exactly the value; host-mapped pinned memory works too.
    let flag = Flag::new();
    ok!(cuStreamWaitValue32_v2(a, flag.addr(), 3, 1));
    flag.set(4);
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(cu!(cuStreamQuery(a)), CUresult::NOT_READY);
    flag.set(3);
    ok!(cuStreamSynchronize(a));
    // A stream writes host memory the host then sees.
    ok!(cuStreamWriteValue32_v2(b, flag.addr(), 11, 0));
    ok!(cuStreamSynchronize(b));
    assert_eq!(flag.0.load(std::sync::atomic::Ordering::SeqCst), 11);
    assert_eq!(cu!(cuStreamWaitValue32_v2(a, word + 2, 1, 0)), CUresult::INVALID_VALUE, "misaligned");
    assert_eq!(cu!(cuStreamWaitValue32_v2(a, word, 1, 7)), CUresult::INVALID_VALUE, "unknown comparison");
}

#[test]
fn pool_memory_freed_in_stream_order_faults_a_racing_stream() {
    let _ctx = Ctx::new(0);
    let (a, b) = (stream(1), stream(1));
    let flag = Flag::new();
    let mut p = 0;
    ok!(cuMemAllocAsync(&mut p, N, a));
    flag.gate(b, 1);
    ok!(cuMemsetD8Async(p, 0, N, b));
    ok!(cuMemFreeAsync(p, a));
    assert_eq!(cu!(cuMemFreeAsync(p, a)), CUresult::INVALID_VALUE, "freed twice");
    ok!(cuStreamSynchronize(a));
    assert_eq!(cu!(cuMemsetD8Async(p, 0, N, a)), CUresult::INVALID_VALUE, "freed: known at call time");
    flag.set(1);
    assert_eq!(cu!(cuStreamSynchronize(b)), CUresult::ILLEGAL_ADDRESS, "B used it after the free ran");
}

#[test]
fn creating_streams_and_events_waits_for_a_copy_into_pageable_memory() {
    let ctx = Ctx::new(0);
    let a = stream(1);
    let flag = Flag::new();
    let src = upload(&[7u8; N]);
    flag.gate(a, 1);
    let (raw_ctx, raw_a) = (ctx.0 as usize, a as usize);
    let copier = std::thread::spawn(move || {
        ok!(cuCtxSetCurrent(raw_ctx as *mut std::ffi::c_void));
        let mut out = vec![0u8; N];
        ok!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), src, N, raw_a as *mut std::ffi::c_void));
        out
    });
    std::thread::sleep(Duration::from_millis(50));
    // The copy waits for the flag, holding the context's lock: creation waits with it.
    let creator = std::thread::spawn(move || {
        ok!(cuCtxSetCurrent(raw_ctx as *mut std::ffi::c_void));
        let t = Instant::now();
        let mut ev = null_mut();
        ok!(cuEventCreate(&mut ev, 2));
        let _ = stream(1);
        t.elapsed()
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(!creator.is_finished(), "cuEventCreate returned while a pageable copy waited");
    flag.set(1);
    assert_eq!(copier.join().unwrap(), vec![7u8; N]);
    assert!(creator.join().unwrap() >= Duration::from_millis(150));
}

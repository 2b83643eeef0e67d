//! NCCL's stream semantics, under the stand-in driver: a call starts only after the work
//! before it on its stream, and the stream's later work waits for the call's end. Each test
//! holds one side back long enough that breaking the rule (the executor not waiting for the
//! caller's earlier work; the caller's stream not waiting for the call) gives wrong data.
#![cfg(feature = "cuda")]

mod common;
mod device_support;
mod standin;

use std::time::Duration;

use cudarc::driver::DevicePtr;
use device_support::{device_config, stream};
use topoccl::cuda::{Context, Pinned, StreamRef};
use topoccl::{Buffer, Collective, CollectiveCall, Dtype, ReduceOp, TransportPolicy};

#[test]
fn a_call_waits_for_the_work_before_it_on_its_stream() {
    if !standin::child("a_call_waits_for_the_work_before_it_on_its_stream", &[]) {
        return;
    }
    let cfg = device_config(TransportPolicy::Auto, 30.0);
    let n = 50_000;
    let results = common::on_ranks(2, &cfg, |comm| {
        let s = stream();
        let ctx = Context::primary(0).expect("context");
        // The stream is held at a gate the host opens later; only then does the input land.
        let gate = Pinned::new(&ctx, 4).expect("gate");
        let mut send = s.alloc_zeros::<f32>(n).expect("alloc");
        let mut recv = s.alloc_zeros::<f32>(n).expect("alloc");
        // SAFETY: the gate outlives the stream's wait (the stream is synchronised below).
        unsafe { StreamRef(s.cu_stream()).wait_value(gate.device_addr(), 1) }.expect("gate");
        let mine = vec![comm.rank() as f32 + 1.0; n];
        s.memcpy_htod(&mine, &mut send).expect("input");
        comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &s).expect("all-reduce");
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: a live, aligned word of pinned memory.
        unsafe { std::ptr::write_volatile(gate.addr() as *mut u32, 1) };
        let got = device_support::read_back(&s, &recv);
        device_support::assert_no_foreign_driver_calls(comm);
        got.iter().filter(|v| **v != 3.0).count()
    });
    assert_eq!(results, vec![0, 0], "elements of the all-reduce that missed the input written before it");
}

#[test]
fn the_stream_waits_for_the_call_before_its_later_work() {
    if !standin::child("the_stream_waits_for_the_call_before_its_later_work", &[]) {
        return;
    }
    let cfg = device_config(TransportPolicy::Auto, 30.0);
    let n = 50_000;
    let results = common::on_ranks(2, &cfg, |comm| {
        let s = stream();
        let send = s.clone_htod(&vec![comm.rank() as f32 + 1.0; n]).expect("input");
        let recv = s.alloc_zeros::<f32>(n).expect("alloc");
        let ctx = Context::primary(0).expect("context");
        let out = Pinned::new(&ctx, n * 4).expect("pinned");
        // Rank 1 comes late: rank 0's call cannot end before it does.
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let call = CollectiveCall::new(Collective::AllReduce, Dtype::Float32, n).reduced_with(ReduceOp::Sum);
        let (sp, _) = send.device_ptr(&s);
        let (rp, _) = recv.device_ptr(&s);
        let stream = StreamRef(s.cu_stream());
        // SAFETY: the slices live until the stream is synchronised below.
        unsafe { comm.submit_on(&call, Buffer::at(sp as *const u8), Buffer::at(rp as *const u8), stream) }
            .expect("all-reduce");
        // The caller's next work on the stream: copy the result out, asynchronously (pinned).
        let ctx_guard = ctx.enter().expect("enter");
        // SAFETY: both ranges are live and `n * 4` bytes long; the stream is synchronised below.
        unsafe { topoccl_copy(out.addr(), rp as usize, n * 4, stream) };
        drop(ctx_guard);
        s.synchronize().expect("sync");
        // SAFETY: pinned memory of `n` floats, written by the finished copy.
        let got = unsafe { std::slice::from_raw_parts(out.addr() as *const f32, n) };
        device_support::assert_no_foreign_driver_calls(comm);
        got.iter().filter(|v| **v != 3.0).count()
    });
    assert_eq!(results, vec![0, 0], "elements copied out before the all-reduce wrote them");
}

/// An asynchronous copy on `stream` (the caller's own later work).
///
/// # Safety
/// Both ranges must be valid for `len` bytes until the stream has run the copy.
unsafe fn topoccl_copy(dst: usize, src: usize, len: usize, stream: StreamRef) {
    // SAFETY: this fn's contract.
    let r = unsafe { cudarc::driver::sys::cuMemcpyAsync(dst as u64, src as u64, len, stream.0) };
    assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS, "cuMemcpyAsync");
}

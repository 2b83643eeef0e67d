//! Device buffers end to end, under the stand-in CUDA driver: every collective × datatype ×
//! reduction (PreMulSum included) with device memory on 2 and 4 ranks that are threads of one
//! process, through the Rust API on a stream, each result equal byte for byte to the same call
//! on host buffers, and a hand-computed all-reduce.
#![cfg(feature = "cuda")]

mod common;
mod device_support;
mod standin;

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream};
use device_support::{device_and_host, matrix};
use topoccl::{ReduceOp, TransportPolicy};

/// A stream of the device's primary context. cudarc synchronises the whole context when a
/// context object makes its first stream while it tracks events — with several ranks in one
/// process that waits for the other ranks' streams, which wait for this rank's calls: a
/// deadlock. The ranks here order their own work, so tracking is off.
fn stream() -> Arc<CudaStream> {
    let ctx = CudaContext::new(0).expect("stand-in context");
    // SAFETY: each slice of these tests is used on one stream only.
    unsafe { ctx.disable_event_tracking() };
    ctx.new_stream().expect("stream")
}

#[test]
fn all_reduce_of_device_buffers_on_two_threads() {
    if !standin::child("all_reduce_of_device_buffers_on_two_threads", &[]) {
        return;
    }
    let cfg = common::config(TransportPolicy::Auto, 20.0);
    let results = common::on_ranks(2, &cfg, |comm| {
        let s = stream();
        let n = 300_000;
        let host: Vec<f32> = (0..n).map(|i| (i as f32) * (comm.rank() as f32 + 1.0)).collect();
        let send = s.clone_htod(&host).expect("htod");
        let mut recv = s.alloc_zeros::<f32>(n).expect("alloc");
        comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &s).expect("all-reduce");
        let got = s.clone_dtoh(&recv).expect("dtoh");
        got.iter().enumerate().filter(|(i, v)| **v != (*i as f32) * 3.0).count()
    });
    assert_eq!(results, vec![0, 0]);
}

fn every_call_on(n: u32, transport: TransportPolicy) {
    let cfg = common::config(transport, 30.0);
    let t = Instant::now();
    let counts = [1, 1000, (600 << 10) / 8 + 3];
    let calls = matrix(n, &counts);
    let results = common::on_ranks(n, &cfg, |comm| {
        let s = stream();
        let mut wrong = Vec::new();
        for (i, (call, placement)) in calls.iter().enumerate() {
            let (dev, host) = device_and_host(comm, &s, call, *placement, i).expect("call");
            if dev != host {
                let first = dev.iter().zip(&host).position(|(a, b)| a != b).unwrap_or(0);
                wrong.push(format!("{call} ({placement:?}): first difference at byte {first}"));
            }
        }
        wrong
    });
    println!("{n} ranks over {transport:?}: {} calls × {n} ranks in {:.1} s", calls.len(), t.elapsed().as_secs_f64());
    for (r, w) in results.iter().enumerate() {
        assert!(w.is_empty(), "rank {r}: {} calls differ from the host path:\n{}", w.len(), w.join("\n"));
    }
}

#[test]
fn every_collective_type_and_reduction_on_two_ranks() {
    if !standin::child("every_collective_type_and_reduction_on_two_ranks", &[("TOPOCCL_STANDIN_DELAY_US", "20")]) {
        return;
    }
    every_call_on(2, TransportPolicy::Auto);
}

#[test]
fn every_collective_type_and_reduction_on_four_ranks_over_tcp() {
    if !standin::child(
        "every_collective_type_and_reduction_on_four_ranks_over_tcp",
        &[("TOPOCCL_STANDIN_DELAY_US", "20")],
    ) {
        return;
    }
    every_call_on(4, TransportPolicy::Tcp);
}

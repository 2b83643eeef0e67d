//! Device buffers end to end, under the stand-in CUDA driver: every collective × datatype ×
//! reduction (PreMulSum included) with device memory on 2 and 4 ranks, as threads of one
//! process and as processes, through the Rust API on a stream, each result equal byte for byte
//! to the same call on host buffers; and a hand-computed all-reduce.
#![cfg(feature = "cuda")]

mod common;
mod device_support;
mod standin;

use std::time::Instant;

use device_support::{device_and_host, device_config, matrix, stream};
use topoccl::cuda::StreamRef;
use topoccl::{Communicator, ReduceOp, TransportPolicy};

#[test]
fn all_reduce_of_device_buffers_on_two_threads() {
    if !standin::child("all_reduce_of_device_buffers_on_two_threads", &[]) {
        return;
    }
    let cfg = device_config(TransportPolicy::Auto, 20.0);
    let results = common::on_ranks(2, &cfg, |comm| {
        let s = stream();
        let n = 300_000;
        let host: Vec<f32> = (0..n).map(|i| (i as f32) * (comm.rank() as f32 + 1.0)).collect();
        let send = s.clone_htod(&host).expect("htod");
        let mut recv = s.alloc_zeros::<f32>(n).expect("alloc");
        comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &s).expect("all-reduce");
        let got = device_support::read_back(&s, &recv);
        got.iter().enumerate().filter(|(i, v)| **v != (*i as f32) * 3.0).count()
    });
    assert_eq!(results, vec![0, 0]);
}

/// Element counts of the matrix: one element, a small call, and one over the 512 KiB slice
/// for every type (several slices, staging pools in use).
const COUNTS: [usize; 3] = [1, 1000, (600 << 10) / 8 + 3];

/// Runs the whole matrix on `comm`; the calls whose device result differs from the host's.
fn matrix_on(comm: &Communicator) -> Vec<String> {
    let s = stream();
    let mut wrong = Vec::new();
    for (i, (call, placement)) in matrix(comm.nranks(), &COUNTS).iter().enumerate() {
        let (dev, host) = device_and_host(comm, &s, call, *placement, i).expect("call");
        if dev != host {
            let first = dev.iter().zip(&host).position(|(a, b)| a != b).unwrap_or(0);
            wrong.push(format!("{call} ({placement:?}): first difference at byte {first}"));
        }
    }
    println!(
        "rank {}: {:?} device-resident and {} staged of {} calls, {} driver calls from threads outside a call",
        comm.rank(),
        comm.device_resident_calls(),
        comm.device_staged_calls(),
        matrix(comm.nranks(), &COUNTS).len(),
        topoccl::cuda::foreign_driver_calls()
    );
    device_support::assert_no_foreign_driver_calls(comm);
    wrong
}

fn every_call_on(n: u32, transport: TransportPolicy) {
    let cfg = device_config(transport, 30.0);
    let t = Instant::now();
    let results = common::on_ranks(n, &cfg, |comm| matrix_on(comm));
    let calls = matrix(n, &COUNTS).len();
    println!("{n} ranks over {transport:?}: {calls} calls × {n} ranks in {:.1} s", t.elapsed().as_secs_f64());
    for (r, w) in results.iter().enumerate() {
        assert!(w.is_empty(), "rank {r}: {} calls differ from the host path:\n{}", w.len(), w.join("\n"));
    }
}

/// The matrix on this process's rank of a job the parent launched.
fn every_call_in_this_process() {
    let t = Instant::now();
    let comm = Communicator::from_env().expect("join");
    let wrong = matrix_on(&comm);
    let calls = matrix(comm.nranks(), &COUNTS).len();
    println!(
        "rank {} of {} processes over {:?}: {calls} calls in {:.1} s",
        comm.rank(),
        comm.nranks(),
        comm.transports(),
        t.elapsed().as_secs_f64()
    );
    assert!(wrong.is_empty(), "{} calls differ from the host path:\n{}", wrong.len(), wrong.join("\n"));
    comm.destroy().expect("destroy");
}

#[test]
fn every_collective_type_and_reduction_on_two_processes() {
    let env = [("TOPOCCL_STANDIN_DELAY_US", "20")];
    if standin::ranks("every_collective_type_and_reduction_on_two_processes", 2, &env, 300) {
        every_call_in_this_process();
    }
}

#[test]
fn every_collective_type_and_reduction_on_four_processes_over_tcp() {
    let env = [("TOPOCCL_STANDIN_DELAY_US", "20"), ("TOPOCCL_TRANSPORT", "tcp")];
    if standin::ranks("every_collective_type_and_reduction_on_four_processes_over_tcp", 4, &env, 300) {
        every_call_in_this_process();
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

#[test]
fn sends_and_receives_of_device_buffers_in_a_group() {
    if !standin::child("sends_and_receives_of_device_buffers_in_a_group", &[]) {
        return;
    }
    let cfg = device_config(TransportPolicy::Auto, 20.0);
    let results = common::on_ranks(3, &cfg, |comm| {
        let s = stream();
        let (r, n) = (comm.rank(), comm.nranks());
        let count = 70_000;
        let mine: Vec<i64> = (0..count as i64).map(|i| i * 10 + i64::from(r)).collect();
        let send = s.clone_htod(&mine).expect("htod");
        let mut from_left = s.alloc_zeros::<i64>(count).expect("alloc");
        let mut own = s.alloc_zeros::<i64>(count).expect("alloc");
        let mut g = comm.group();
        // SAFETY: every buffer lives until the stream is synchronised by the copies below.
        unsafe {
            g.send_device(&send, (r + 1) % n, &s).expect("send");
            g.recv_device(&mut from_left, (r + n - 1) % n, &s).expect("recv");
            g.send_device(&send, r, &s).expect("send to self");
            g.recv_device(&mut own, r, &s).expect("recv from self");
            g.submit_on(StreamRef(s.cu_stream())).expect("group");
        }
        // Staged through pinned host slots: read back as users do, straight after the group.
        let read = device_support::reader::<i64>(comm);
        let (left, own) = (read(&s, &from_left), read(&s, &own));
        let want_left = i64::from((r + n - 1) % n);
        let bad = left.iter().enumerate().filter(|(i, v)| **v != *i as i64 * 10 + want_left).count();
        device_support::assert_no_foreign_driver_calls(comm);
        bad + own.iter().zip(&mine).filter(|(a, b)| a != b).count()
    });
    assert_eq!(results, vec![0, 0, 0]);
}

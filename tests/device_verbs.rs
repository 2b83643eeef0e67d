//! RDMA verbs into and out of GPU memory, under both stand-ins (the CUDA driver's
//! `libcuda.so.1` and `standins/ibverbs`): ranks on different host identities with device
//! buffers. Where the driver exports dma-bufs and the port registers them, a receive into
//! device memory is offered to the sender and written there by the NIC, and a send from device
//! memory into such an offer is read there by the NIC (no copy through host memory on either
//! side); where either cannot, the bytes come through host memory. Every collective × datatype × reduction
//! on device buffers must equal the host path byte for byte, both ways.
#![cfg(feature = "cuda")]

mod common;
mod device_support;
mod standin;
mod verbs_standin;

use std::time::{Duration, Instant};

use device_support::{matrix, matrix_on, stream};
use topoccl::cuda::StreamRef;
use topoccl::transports::verbs::VerbsCounts;
use topoccl::{Collective, CollectiveCall, Communicator, Dtype};

/// A small call and one over the 512 KiB slice (offers start at 64 KiB).
const COUNTS: [usize; 2] = [1000, (600 << 10) / 8 + 3];

/// Rank `r`'s environment: its own host, the stand-in libibverbs, and `extra`.
fn on_own_host(r: u32, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("TOPOCCL_HOSTID".to_string(), format!("host{r}")),
        ("TOPOCCL_IBVERBS_LIB".to_string(), verbs_standin::lib()),
        ("TOPOCCL_TIMEOUT".to_string(), "120".to_string()),
        ("TOPOCCL_IB_BYTES".to_string(), (256 << 10).to_string()),
        ("TOPOCCL_STANDIN_DELAY_US".to_string(), "20".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// This rank's part: every pair over verbs, the matrix on device buffers; the verbs counters.
fn matrix_in_this_process() -> VerbsCounts {
    let t = Instant::now();
    let s = stream();
    let comm = Communicator::from_env().expect("join");
    let me = comm.rank();
    for (p, t) in comm.transports().iter().enumerate() {
        assert_eq!(*t, (p as u32 != me).then_some("ib"), "rank {me} to rank {p}: {:?}", comm.transports());
    }
    let wrong = matrix_on(&comm, &s, &COUNTS);
    let c = comm.verbs_counts().expect("a verbs transport");
    println!(
        "rank {me} of {}: {} calls in {:.1} s, {c:?}",
        comm.nranks(),
        matrix(comm.nranks(), &COUNTS).len(),
        t.elapsed().as_secs_f64()
    );
    assert!(wrong.is_empty(), "{} calls differ from the host path:\n{}", wrong.len(), wrong.join("\n"));
    comm.destroy().expect("destroy");
    c
}

#[test]
fn host_driven_receives_into_device_memory_are_written_there_through_dma_buf() {
    let name = "host_driven_receives_into_device_memory_are_written_there_through_dma_buf";
    // The host-driven device protocol's test (the NIC reads and writes device memory): staged
    // calls, the default, move only host bytes over verbs.
    let host_driven = [("TOPOCCL_DEVICE_STAGED", "0")];
    if let Some(out) = standin::ranks_each(name, 2, u32::MAX, &|r| on_own_host(r, &host_driven), 300) {
        print!("{out}");
        return;
    }
    let c = matrix_in_this_process();
    // Device buffers registered once per allocation, and written in place by the peer.
    assert!(c.device_registrations > 0 && c.offers > 0 && c.direct_messages > 0, "{c:?}");
}

#[test]
fn without_dma_buf_device_receives_come_through_host_memory() {
    let name = "without_dma_buf_device_receives_come_through_host_memory";
    for knob in ["TOPOCCL_STANDIN_DMABUF", "TOPOCCL_STANDIN_IB_DMABUF"] {
        // The driver exports no dma-buf, or the port registers none.
        if let Some(out) = standin::ranks_each(name, 2, u32::MAX, &|r| on_own_host(r, &[(knob, "0")]), 300) {
            print!("{out}");
            continue;
        }
        let c = matrix_in_this_process();
        assert_eq!((c.device_registrations, c.device_sends), (0, 0), "{c:?}");
        return;
    }
}

/// A send read from device memory by the NIC (the receiver offered its buffer long before) is
/// issued from the host, outside the stream's order: it must wait for the work queued before
/// the call on the caller's stream (here an upload that the stand-in runs up to 20 ms late),
/// or the NIC reads the buffer before it is written.
#[test]
fn host_driven_a_send_read_in_place_from_device_memory_waits_for_the_work_before_the_call() {
    let name = "host_driven_a_send_read_in_place_from_device_memory_waits_for_the_work_before_the_call";
    // The host-driven device protocol's (see above).
    let env = |r: u32| on_own_host(r, &[("TOPOCCL_STANDIN_DELAY_US", "20000"), ("TOPOCCL_DEVICE_STAGED", "0")]);
    if let Some(out) = standin::ranks_each(name, 2, u32::MAX, &env, 300) {
        print!("{out}");
        return;
    }
    let s = stream();
    let comm = Communicator::from_env().expect("join");
    let n = 1 << 18;
    let call = CollectiveCall::new(Collective::Broadcast { root: 0 }, Dtype::Float32, n);
    for round in 0..4u32 {
        let data: Vec<u8> = (0..n as u32).flat_map(|i| ((i ^ round << 9) as f32).to_le_bytes()).collect();
        let mut buf = s.alloc_zeros::<u8>(n * 4).expect("alloc");
        if comm.rank() == 0 {
            // The receiver offers its buffer meanwhile.
            std::thread::sleep(Duration::from_millis(200));
            s.memcpy_htod(&data, &mut buf).expect("upload, queued");
        }
        let at = device_support::at(&buf, &s);
        // SAFETY: `buf` holds the call's bytes and lives until the stream has passed the call
        // (the download below synchronises it).
        unsafe { comm.submit_on(&call, at, at, StreamRef(s.cu_stream())) }.expect("broadcast");
        let out = device_support::read_back(&s, &buf);
        comm.flush().expect("the broadcast failed");
        if let Some(i) = out.iter().zip(&data).position(|(a, b)| a != b) {
            panic!("rank {}, round {round}: byte {i} differs ({} for {})", comm.rank(), out[i], data[i]);
        }
    }
    let c = comm.verbs_counts().expect("a verbs transport");
    println!("rank {}: {c:?}", comm.rank());
    if comm.rank() == 0 {
        assert!(c.device_sends >= 4, "the sends were not read in place: {c:?}");
    }
    comm.destroy().expect("destroy");
}

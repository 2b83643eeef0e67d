//! CUDA IPC under the stand-in driver: ranks whose communicator knows its GPU at init (a context
//! current on the joining thread) connect by CUDA IPC, device payloads going GPU to GPU through
//! the receivers' windows. Every collective × datatype × reduction on device buffers must equal
//! the host path byte for byte, in processes (handles opened across processes) and in threads
//! (windows reached by address); host buffers in the same job still work (their frames travel in
//! the pair's shared memory); a rank killed mid-call fails the others promptly, naming it.
#![cfg(feature = "cuda")]

mod common;
mod device_support;
mod standin;

use std::time::{Duration, Instant};

use device_support::{matrix, matrix_on, stream};
use topoccl::cuda::{Context, DeviceMemory, StreamRef};
use topoccl::transports::ipc::IpcCounts;
use topoccl::{Buffer, Collective, CollectiveCall, Communicator, Config, Dtype, ReduceOp, TransportPolicy};

/// One element, a small call, and one over the 512 KiB slice for every type.
const COUNTS: [usize; 3] = [1, 1000, (600 << 10) / 8 + 3];

fn assert_ipc(comm: &Communicator) {
    for (p, t) in comm.transports().iter().enumerate() {
        if p as u32 != comm.rank() {
            assert_eq!(*t, Some("cuda-ipc"), "rank {} to rank {p}: {:?}", comm.rank(), comm.transports());
        }
    }
}

/// The matrix on this process's rank of a job the parent launched, joined with a context
/// current (so the communicator knows its device at init).
fn every_call_in_this_process(counts: &[usize]) -> IpcCounts {
    let t = Instant::now();
    let s = stream();
    let comm = Communicator::from_env().expect("join");
    assert_ipc(&comm);
    // Host buffers of the same job: the IPC connections carry them through their rings.
    let host: Vec<f32> = (0..5000).map(|i| i as f32 + comm.rank() as f32).collect();
    let mut out = vec![0f32; host.len()];
    comm.all_reduce(&host, &mut out, ReduceOp::Sum).expect("host all-reduce");
    let n = comm.nranks() as f32;
    assert!(out.iter().enumerate().all(|(i, v)| *v == i as f32 * n + n * (n - 1.0) / 2.0), "host all-reduce");
    let wrong = matrix_on(&comm, &s, counts);
    println!(
        "rank {} of {} processes over {:?}: {} calls in {:.1} s",
        comm.rank(),
        comm.nranks(),
        comm.transports(),
        matrix(comm.nranks(), counts).len(),
        t.elapsed().as_secs_f64()
    );
    assert!(wrong.is_empty(), "{} calls differ from the host path:\n{}", wrong.len(), wrong.join("\n"));
    let c = comm.ipc_counts().expect("an IPC transport");
    println!("rank {}: {c:?}", comm.rank());
    comm.destroy().expect("destroy");
    c
}

#[test]
fn host_driven_every_collective_over_cuda_ipc_on_two_processes() {
    // A device without memory pools: cudarc allocates with `cuMemAlloc`, so buffers have IPC
    // handles and receives are offered (the other tests' pool memory never is). The host-driven
    // protocol's test: device-resident and staged calls (which `tests/device_resident.rs` and
    // `tests/device_collectives.rs` check) are off.
    let env = [
        ("TOPOCCL_STANDIN_DELAY_US", "20"),
        ("TOPOCCL_STANDIN_POOLS", "0"),
        ("TOPOCCL_DEVICE_RESIDENT", "0"),
        ("TOPOCCL_DEVICE_STAGED", "0"),
    ];
    if standin::ranks("host_driven_every_collective_over_cuda_ipc_on_two_processes", 2, &env, 300) {
        let c = every_call_in_this_process(&COUNTS);
        // Some receives were offered in time, some not (the sender was first).
        assert!(c.window_messages > 0 && c.direct_messages > 0, "{c:?}");
        assert!(c.offers > 0 && c.cache.registered > 0, "{c:?}");
    }
}

#[test]
fn every_collective_over_cuda_ipc_on_four_processes_with_small_windows() {
    // Windows of two slices: senders wait for room again and again.
    let env = [("TOPOCCL_STANDIN_DELAY_US", "20"), ("TOPOCCL_IPC_BYTES", "1048576"), ("TOPOCCL_TIMEOUT", "90")];
    if standin::ranks("every_collective_over_cuda_ipc_on_four_processes_with_small_windows", 4, &env, 300) {
        every_call_in_this_process(&COUNTS);
    }
}

#[test]
fn eight_processes_over_cuda_ipc() {
    let env = [("TOPOCCL_STANDIN_DELAY_US", "10"), ("TOPOCCL_IPC_BYTES", "1048576")];
    if standin::ranks("eight_processes_over_cuda_ipc", 8, &env, 300) {
        every_call_in_this_process(&[1000]);
    }
}

#[test]
fn every_collective_over_cuda_ipc_on_two_threads() {
    if !standin::child("every_collective_over_cuda_ipc_on_two_threads", &[("TOPOCCL_STANDIN_DELAY_US", "20")]) {
        return;
    }
    let cfg = Config { cuda_device: Some(0), ..common::config(TransportPolicy::Auto, 30.0) };
    let results = common::on_ranks(2, &cfg, |comm| {
        assert_ipc(comm);
        let s = stream();
        matrix_on(comm, &s, &COUNTS)
    });
    for (r, w) in results.iter().enumerate() {
        assert!(w.is_empty(), "rank {r}: {} calls differ from the host path:\n{}", w.len(), w.join("\n"));
    }
}

#[test]
fn a_rank_killed_mid_call_fails_the_others_naming_it() {
    let env = [("TOPOCCL_STANDIN_DELAY_US", "200"), ("TOPOCCL_TIMEOUT", "60")];
    if !standin::ranks_where_one_dies("a_rank_killed_mid_call_fails_the_others_naming_it", 3, 2, &env, 120) {
        return;
    }
    let s = stream();
    let comm = Communicator::from_env().expect("join");
    assert_ipc(&comm);
    let n = 16 << 20;
    let send = s.alloc_zeros::<f32>(n).expect("alloc");
    let mut recv = s.alloc_zeros::<f32>(n).expect("alloc");
    if comm.rank() == 2 {
        // Dies while the others are in the call, waiting for its part (which it is slow to
        // start: the call is quick on its own).
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            std::process::exit(0);
        });
        std::thread::sleep(Duration::from_millis(600));
    }
    let t = Instant::now();
    // Queued at once; the host's part ends (or fails) by the flush.
    let r = comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &s).and_then(|_work| comm.flush());
    if comm.rank() == 2 {
        // Finished before dying: the test is too fast to show anything here.
        panic!("rank 2 outlived the call ({r:?})");
    }
    let e = r.expect_err("the call must fail without rank 2").to_string();
    println!("rank {} failed after {:.1} s: {e}", comm.rank(), t.elapsed().as_secs_f64());
    assert!(t.elapsed() < Duration::from_secs(30), "not prompt: {:.1} s", t.elapsed().as_secs_f64());
    assert!(e.contains("rank 2"), "the error does not name rank 2: {e}");
}

/// Buffers from `cuMemAlloc` (what `ncclMemAlloc` returns) have IPC handles: a receive into one
/// is offered to the sender, whose copy engine writes the message in place (one copy, no
/// window). A buffer freed and allocated again — the same address, another allocation — must
/// not be written through the old registration: it is registered again, and the old one is
/// revoked at the peer, which closes its mapping. This is the host-driven IPC protocol, which
/// device-resident and staged calls (the defaults) do not use: it runs with them off.
#[test]
fn host_driven_receives_land_straight_in_registered_buffers_and_a_freed_one_is_registered_again() {
    let name = "host_driven_receives_land_straight_in_registered_buffers_and_a_freed_one_is_registered_again";
    let env = [
        ("TOPOCCL_STANDIN_DELAY_US", "20"),
        ("TOPOCCL_TIMEOUT", "30"),
        ("TOPOCCL_DEVICE_RESIDENT", "0"),
        ("TOPOCCL_DEVICE_STAGED", "0"),
    ];
    if !standin::ranks(name, 2, &env, 120) {
        return;
    }
    let s = stream();
    let comm = Communicator::from_env().expect("join");
    assert_ipc(&comm);
    let ctx = Context::primary(0).expect("context");
    // 4 MiB: eight messages of one 512 KiB slice.
    let n = 1 << 20;
    let call = CollectiveCall::new(Collective::Broadcast { root: 0 }, Dtype::Float32, n);
    let mut bases = Vec::new();
    for round in 0..3u32 {
        let buf = DeviceMemory::new(&ctx, n * 4).expect("cuMemAlloc");
        bases.push(buf.addr());
        let data: Vec<f32> = (0..n as u32).map(|i| (i ^ (round << 7)) as f32).collect();
        let mine = if comm.rank() == 0 { data.clone() } else { vec![-1f32; n] };
        // SAFETY: `buf` holds `n` floats; the context is current on this thread.
        unsafe { cudarc::driver::result::memcpy_htod_sync(buf.addr() as u64, &mine) }.expect("upload");
        if comm.rank() == 0 {
            // The receiver is waiting by then, and has offered its buffer.
            std::thread::sleep(Duration::from_millis(300));
        }
        let at = Buffer::at(buf.addr() as *const u8);
        // SAFETY: `buf` is device memory of the call's size, used by nothing else until the
        // stream has passed the call (synchronised below, before it is freed).
        unsafe { comm.submit_on(&call, at, at, StreamRef(s.cu_stream())) }.expect("broadcast");
        s.synchronize().expect("synchronize");
        comm.flush().expect("the broadcast failed");
        let mut out = vec![0f32; n];
        // SAFETY: as for the upload.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut out, buf.addr() as u64) }.expect("download");
        if let Some(i) = out.iter().zip(&data).position(|(a, b)| a != b) {
            panic!(
                "rank {}, round {round}: the broadcast differs from element {i} ({} for {}); buffers at {bases:x?}; {:?}",
                comm.rank(),
                out[i],
                data[i],
                comm.ipc_counts()
            );
        }
        // `buf` is freed here: the next round's allocation may take its address.
    }
    let c = comm.ipc_counts().expect("an IPC transport");
    println!("rank {}: buffers at {bases:x?}; {c:?}", comm.rank());
    let reused = bases.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    if comm.rank() == 0 {
        assert!(c.direct_messages >= 3, "no message was copied straight into the offered buffer: {c:?}");
        assert!(c.opened >= 3, "{c:?}");
        assert!(c.closed >= reused.min(1), "a revoked registration stayed open: {c:?}");
    } else {
        assert!(c.offers >= 3 && c.announced >= 3, "{c:?}");
        assert!(c.cache.stale >= reused && c.revoked >= reused, "a freed buffer kept its registration: {c:?}");
    }
    comm.destroy().expect("destroy");
}

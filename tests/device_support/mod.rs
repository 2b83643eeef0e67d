//! What the device tests share: inputs of every datatype, and one call run twice — on device
//! buffers through a stream, and on host buffers through the host path — whose results must
//! be equal byte for byte (the kernels equal `CpuOps` bit for bit, and both paths run the same
//! schedule, so they reduce in the same order).
#![allow(dead_code)]

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};
use topoccl::cuda::StreamRef;
use topoccl::fp8::Fp8;
use topoccl::{Buffer, Collective, CollectiveCall, Communicator, Dtype, ReduceOp, Reduction, Scalar};

/// Settings for ranks that run as threads of one process on device 0: bound to the device at
/// init. A rank whose first call bound it would make its device resources (a stream, events)
/// then, and making them waits, on a GPU, while another rank thread sits in a copy into
/// pageable memory waiting for its own call, which waits for this rank: a deadlock (seen on an
/// H200; the stand-in driver has that lock too).
pub fn device_config(transport: topoccl::TransportPolicy, timeout_s: f64) -> topoccl::Config {
    // From the environment first, so that a run can switch what it compares
    // (`TOPOCCL_DEVICE_RESIDENT=0`: the host-driven device path).
    topoccl::Config {
        cuda_device: Some(0),
        transport,
        timeout: std::time::Duration::from_secs_f64(timeout_s),
        ..topoccl::Config::from_env().expect("TOPOCCL_* settings")
    }
}

/// A stream of device 0's primary context, for one rank. cudarc synchronises the whole
/// context when a context object makes its first stream while it tracks events — with several
/// ranks in one process that waits for the other ranks' streams, which wait for this rank's
/// calls: a deadlock. The tests' ranks order their own work, so tracking is off.
pub fn stream() -> Arc<CudaStream> {
    let ctx = cudarc::driver::CudaContext::new(0).expect("stand-in context");
    // SAFETY: each slice of these tests is used on one stream only.
    unsafe { ctx.disable_event_tracking() };
    ctx.new_stream().expect("stream")
}

/// `slice` read back to the host as users read results: a copy into pageable memory queued
/// right after the call, with no synchronisation first (`tensor.cpu()`, `loss.item()`,
/// `cudaMemcpy` into a `std::vector`). Into pageable memory the copy returns only once its
/// stream has run up to it, and while it waits it holds a lock of the context that resource
/// calls (allocation, stream and event creation, IPC mapping, module loading) also take (seen
/// on an H200, driver 580; the stand-in's `TOPOCCL_STANDIN_LOCKS=all` models it): a call whose
/// completion needs such a call from another thread hangs here, as it would for a user.
pub fn read_back<T: cudarc::driver::DeviceRepr>(stream: &Arc<CudaStream>, slice: &CudaSlice<T>) -> Vec<T> {
    stream.clone_dtoh(slice).expect("dtoh")
}

/// `slice` read back once `stream` has passed everything queued on it: for communicators whose
/// device calls run host-driven (`TOPOCCL_DEVICE_STAGED=0`), which make driver calls from the
/// progress thread during a call and so hang under [`read_back`]'s copy.
pub fn read_back_synchronized<T: cudarc::driver::DeviceRepr>(stream: &Arc<CudaStream>, slice: &CudaSlice<T>) -> Vec<T> {
    stream.synchronize().expect("synchronize");
    stream.clone_dtoh(slice).expect("dtoh")
}

/// How `comm`'s results are read back: as users do, unless its device calls run host-driven
/// (`TOPOCCL_DEVICE_RESIDENT=0 TOPOCCL_DEVICE_STAGED=0`, the old path kept for comparison).
pub fn reader<T: cudarc::driver::DeviceRepr>(comm: &Communicator) -> fn(&Arc<CudaStream>, &CudaSlice<T>) -> Vec<T> {
    if comm.device_resident_calls().is_some() || comm.config().device_staged {
        read_back
    } else {
        read_back_synchronized
    }
}

/// `v` as one element of `dtype` (small integers and halves: exact in every type).
pub fn encode(dtype: Dtype, v: f32) -> Vec<u8> {
    match dtype {
        Dtype::Int8 => (v as i8).to_ne_bytes().to_vec(),
        Dtype::Uint8 => (v as u8).to_ne_bytes().to_vec(),
        Dtype::Int32 => (v as i32).to_ne_bytes().to_vec(),
        Dtype::Uint32 => (v as u32).to_ne_bytes().to_vec(),
        Dtype::Int64 => (v as i64).to_ne_bytes().to_vec(),
        Dtype::Uint64 => (v as u64).to_ne_bytes().to_vec(),
        Dtype::Float16 => f16::from_f32(v).to_ne_bytes().to_vec(),
        Dtype::Float32 => v.to_ne_bytes().to_vec(),
        Dtype::Float64 => f64::from(v).to_ne_bytes().to_vec(),
        Dtype::Bfloat16 => bf16::from_f32(v).to_ne_bytes().to_vec(),
        Dtype::Float8e4m3 => vec![Fp8::E4m3.from_f32(v)],
        Dtype::Float8e5m2 => vec![Fp8::E5m2.from_f32(v)],
    }
}

/// Rank `rank`'s input of `bytes` bytes for a call of `dtype` (element `i` depends on the rank,
/// the index and `seed`; products stay within every type's exact range).
pub fn input(dtype: Dtype, bytes: usize, rank: u32, seed: usize, prod: bool) -> Vec<u8> {
    let n = bytes / dtype.size();
    let mut out = Vec::with_capacity(bytes);
    for i in 0..n {
        let x = (i * 7 + rank as usize * 3 + seed) % 5;
        let v = if prod { 1.0 + (x == 0) as u32 as f32 } else { x as f32 };
        out.extend_from_slice(&encode(dtype, v));
    }
    out
}

/// Where a call's buffers lie relative to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Apart,
    InPlace,
}

/// The reductions a collective of `dtype` is checked with (PreMulSum by 2, a value scalar).
pub fn reductions(dtype: Dtype) -> Vec<Reduction> {
    let mut r: Vec<Reduction> = ReduceOp::ALL.iter().map(|&op| Reduction::Op(op)).collect();
    let mut two = [0u8; 8];
    let e = encode(dtype, 2.0);
    two[..e.len()].copy_from_slice(&e);
    r.push(Reduction::PreMulSum(Scalar::Value(two)));
    r
}

/// A device pointer of a cudarc slice, as a `Buffer`.
pub fn at(slice: &CudaSlice<u8>, stream: &CudaStream) -> Buffer {
    let (p, _) = slice.device_ptr(stream);
    Buffer::at(p as *const u8)
}

/// Runs `call` (with `seed`'s inputs) on the device through `stream`, then on the host, and
/// returns the device's output and the host's; `Err` on a failed call.
pub fn device_and_host(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    call: &CollectiveCall,
    placement: Placement,
    seed: usize,
) -> Result<(Vec<u8>, Vec<u8>), topoccl::Error> {
    let n = comm.nranks();
    let (block, in_bytes, out_bytes) = call.bytes(n)?;
    let prod = call.reduction == Reduction::Op(ReduceOp::Prod);
    let whole = in_bytes.max(out_bytes);
    let inp = input(call.dtype, in_bytes, comm.rank(), seed, prod);
    // In place, the buffer holds the input where NCCL puts it (all-gather: this rank's block).
    let start = match (placement, call.collective) {
        (Placement::InPlace, Collective::AllGather) => comm.rank() as usize * block,
        _ => 0,
    };
    let mut buf = vec![0u8; whole];
    buf[start..start + in_bytes].copy_from_slice(&inp);
    let dev = match placement {
        Placement::Apart => {
            let send = stream.clone_htod(&inp).expect("htod");
            let mut recv = stream.alloc_zeros::<u8>(out_bytes.max(1)).expect("alloc");
            let (s, r) = (at(&send, stream), at(&recv, stream));
            // SAFETY: both slices live until the stream has passed the call (the copy below).
            unsafe { comm.submit_on(call, s, r, StreamRef(stream.cu_stream()))? };
            let out = reader(comm)(stream, &recv);
            drop((send, &mut recv));
            out[..out_bytes].to_vec()
        }
        Placement::InPlace => {
            let d = stream.clone_htod(&buf).expect("htod");
            let base = at(&d, stream);
            let mine = base.offset(comm.rank() as usize * block).expect("offset");
            let (s, r) = match call.collective {
                Collective::AllGather => (mine, base),
                Collective::ReduceScatter => (base, mine),
                _ => (base, base),
            };
            // SAFETY: as above.
            unsafe { comm.submit_on(call, s, r, StreamRef(stream.cu_stream()))? };
            reader(comm)(stream, &d)
        }
    };
    let host = match placement {
        Placement::Apart => {
            let mut out = vec![0u8; out_bytes];
            comm.collective_bytes(call, &inp, &mut out)?;
            out
        }
        Placement::InPlace => {
            comm.collective_bytes_in_place(call, &mut buf)?;
            buf
        }
    };
    Ok((dev, host))
}

/// Every collective call of the matrix: (call, placement), for `n` ranks.
pub fn matrix(n: u32, counts: &[usize]) -> Vec<(CollectiveCall, Placement)> {
    let mut calls = Vec::new();
    for &count in counts {
        for dtype in Dtype::ALL {
            for red in reductions(dtype) {
                for coll in [Collective::AllReduce, Collective::ReduceScatter, Collective::Reduce { root: n - 1 }] {
                    calls.push((CollectiveCall::new(coll, dtype, count).reduced_with(red), Placement::Apart));
                }
            }
            for coll in [Collective::AllGather, Collective::Broadcast { root: 1 }, Collective::AllToAll] {
                calls.push((CollectiveCall::new(coll, dtype, count), Placement::Apart));
            }
            let sum = Reduction::Op(ReduceOp::Sum);
            for coll in [Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather] {
                calls.push((CollectiveCall::new(coll, dtype, count).reduced_with(sum), Placement::InPlace));
            }
        }
    }
    calls
}

/// Every call of the matrix on `comm` with `counts`; the calls whose device result differs from
/// the host's.
pub fn matrix_on(comm: &Communicator, s: &Arc<CudaStream>, counts: &[usize]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (i, (call, placement)) in matrix(comm.nranks(), counts).iter().enumerate() {
        let (dev, host) = device_and_host(comm, s, call, *placement, i).expect("call");
        if dev != host {
            let first = dev.iter().zip(&host).position(|(a, b)| a != b).unwrap_or(0);
            wrong.push(format!("{call} ({placement:?}): first difference at byte {first}"));
        }
    }
    assert_no_foreign_driver_calls(comm);
    wrong
}

/// NCCL's invariant, checked: the executor made no driver call while a device call of this
/// process was outstanding (`topoccl::cuda::foreign_driver_calls`), unless `comm` runs the old
/// host-driven path (`TOPOCCL_DEVICE_STAGED=0`), which breaks it by design.
pub fn assert_no_foreign_driver_calls(comm: &Communicator) {
    if comm.device_resident_calls().is_some() || comm.config().device_staged {
        let n = topoccl::cuda::foreign_driver_calls();
        assert_eq!(
            n,
            0,
            "rank {}: the executor made {n} driver calls while device calls were outstanding",
            comm.rank()
        );
    }
}

/// CUDA graph capture and replay, as PyTorch's CUDA graphs call it, each call checked.
pub mod graph {
    use cudarc::driver::sys::{self, CUgraph, CUgraphExec, CUresult, CUstream};

    fn ok(r: CUresult, what: &str) {
        assert_eq!(r, CUresult::CUDA_SUCCESS, "{what}");
    }

    /// Begins a global-mode capture on `s` (a live stream of the current context).
    pub fn begin(s: CUstream) {
        // SAFETY: a live stream; the mode is a valid enumerator.
        ok(
            unsafe { sys::cuStreamBeginCapture_v2(s, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) },
            "begin",
        );
    }

    /// Ends the capture on `s`: the graph.
    pub fn end(s: CUstream) -> CUgraph {
        let mut g = std::ptr::null_mut();
        // SAFETY: a live stream; the out-pointer is a local.
        ok(unsafe { sys::cuStreamEndCapture(s, &mut g) }, "end capture");
        g
    }

    /// How many nodes `g` holds.
    pub fn nodes(g: CUgraph) -> usize {
        let mut n = 0usize;
        // SAFETY: a live graph; NULL nodes asks for the count into a local.
        ok(unsafe { sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n) }, "nodes");
        n
    }

    pub fn instantiate(g: CUgraph) -> CUgraphExec {
        let mut e = std::ptr::null_mut();
        // SAFETY: a live graph; the out-pointer is a local.
        ok(unsafe { sys::cuGraphInstantiateWithFlags(&mut e, g, 0) }, "instantiate");
        e
    }

    pub fn launch(e: CUgraphExec, s: CUstream) {
        // SAFETY: a live executable graph and stream of one context.
        ok(unsafe { sys::cuGraphLaunch(e, s) }, "launch");
    }

    /// Destroys both (queued launches still run).
    pub fn destroy(e: CUgraphExec, g: CUgraph) {
        // SAFETY: live handles, each destroyed once.
        ok(unsafe { sys::cuGraphExecDestroy(e) }, "destroy exec");
        // SAFETY: as above.
        ok(unsafe { sys::cuGraphDestroy(g) }, "destroy graph");
    }
}

//! The all-reduce sweep of `examples/allreduce_sweep.rs` on **device buffers**: one process per
//! rank, launched the same way (`RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`), the same
//! sizes, iteration rule, warm-up and output (rank 0 prints "bytes time_us algbw busbw" per
//! size), but the buffers are cudarc device slices on CUDA device 0 and each call is
//! `all_reduce_device` on a stream, timed up to `stream.synchronize()`. The result is copied
//! back and checked in full at every size. Several ranks may share one GPU.
//!
//! Arguments: min bytes, max bytes, factor (default 8 B, 64 MiB, 4). float32, sum.
//! `SWEEP_ALLOC=cumem`: the buffers come from `cuMemAlloc` (what `cudaMalloc`, `ncclMemAlloc`
//! and PyTorch's allocator give), which CUDA IPC can offer to the sender, so receives may land
//! in place; by default they are cudarc's, pool memory on a device with pools (every message
//! through the receiver's window). `benches/gpu/run.sh` runs it on 2 and 4 ranks.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream};
use topoccl::cuda::{Context, DeviceMemory, StreamRef};
use topoccl::{Buffer, Collective, CollectiveCall, Communicator, Dtype, ReduceOp};

/// A send and a receive buffer of `count` floats, the send one filled with ones.
enum Buffers {
    Cudarc(cudarc::driver::CudaSlice<f32>, cudarc::driver::CudaSlice<f32>),
    CuMem(DeviceMemory, DeviceMemory),
}

impl Buffers {
    fn new(cumem: bool, count: usize, stream: &Arc<CudaStream>) -> Result<Buffers, Box<dyn std::error::Error>> {
        let ones = vec![1.0f32; count];
        if !cumem {
            return Ok(Buffers::Cudarc(stream.clone_htod(&ones)?, stream.alloc_zeros::<f32>(count)?));
        }
        let ctx = Context::primary(0)?;
        let (send, recv) = (DeviceMemory::new(&ctx, count * 4)?, DeviceMemory::new(&ctx, count * 4)?);
        // SAFETY: `send` holds `count` floats; device 0's primary context is current here.
        unsafe { cudarc::driver::result::memcpy_htod_sync(send.addr() as u64, &ones) }?;
        Ok(Buffers::CuMem(send, recv))
    }

    fn all_reduce(&mut self, comm: &Communicator, stream: &CudaStream) -> topoccl::Result<()> {
        match self {
            Buffers::Cudarc(send, recv) => comm.all_reduce_device(send, recv, ReduceOp::Sum, stream).map(drop),
            Buffers::CuMem(send, recv) => {
                let call = CollectiveCall::new(Collective::AllReduce, Dtype::Float32, send.len() / 4)
                    .reduced_with(ReduceOp::Sum);
                let (s, r) = (Buffer::at(send.addr() as *const u8), Buffer::at(recv.addr() as *const u8));
                // SAFETY: both are device memory of the call's size, kept (and used by nothing
                // else) until the stream has passed every call: the sweep synchronises before
                // it reads or frees them.
                unsafe { comm.submit_on(&call, s, r, StreamRef(stream.cu_stream())) }.map(drop)
            }
        }
    }

    fn result(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        Ok(match self {
            // Waited for in the synchronize, not in a copy into pageable memory (which holds a
            // lock of the context that other ranks' stream and event creation wait for).
            Buffers::Cudarc(_, recv) => {
                stream.synchronize()?;
                stream.clone_dtoh(recv)?
            }
            Buffers::CuMem(_, recv) => {
                let mut out = vec![0f32; recv.len() / 4];
                // SAFETY: `recv` holds that many floats; the stream has passed the calls.
                unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut out, recv.addr() as u64) }?;
                out
            }
        })
    }
}

/// The same iteration rule as the peer programs.
fn iterations(bytes: usize) -> usize {
    ((64usize << 20) / bytes.max(1)).clamp(5, 500)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, d: usize| std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (min, max, factor) = (arg(1, 8), arg(2, 64 << 20), arg(3, 4).max(2));
    let cumem = std::env::var("SWEEP_ALLOC").is_ok_and(|v| v == "cumem");
    // topoccl's own check first: cudarc panics when it finds no driver library.
    topoccl::cuda::driver()?;
    let ctx = CudaContext::new(0)?;
    // cudarc synchronises the whole context when a context object makes its first stream while
    // it tracks events; with several ranks on one GPU that waits for the other ranks' streams,
    // which wait for this rank's calls. Each slice here is used on this one stream.
    // SAFETY: no slice is used on two streams.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream()?;
    let comm = Communicator::from_env()?;
    let n = comm.nranks() as f64;
    // Warm up for 300 ms (rank 0 decides when to stop), as allreduce_sweep does.
    let t0 = Instant::now();
    loop {
        let mut go = [u8::from(comm.rank() == 0 && t0.elapsed().as_millis() < 300)];
        comm.all_reduce_in_place(&mut go, ReduceOp::Max)?;
        if go[0] == 0 {
            break;
        }
    }
    let mut bytes = min;
    while bytes <= max {
        let count = (bytes / 4).max(1);
        let mut buffers = Buffers::new(cumem, count, &stream)?;
        let iters = iterations(count * 4);
        for _ in 0..(iters / 10).max(2) {
            buffers.all_reduce(&comm, &stream)?;
        }
        stream.synchronize()?;
        comm.all_reduce_in_place(&mut [0f32], ReduceOp::Sum)?; // barrier
        let t = Instant::now();
        for _ in 0..iters {
            buffers.all_reduce(&comm, &stream)?;
        }
        stream.synchronize()?;
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        comm.flush()?;
        let got = buffers.result(&stream)?;
        if let Some(i) = got.iter().position(|v| *v != n as f32) {
            return Err(format!("rank {}: wrong result {} at element {i} of {bytes} bytes", comm.rank(), got[i]).into());
        }
        if comm.rank() == 0 {
            let algbw = (count * 4) as f64 / us / 1e3;
            println!("{} {:.2} {:.3} {:.3}", count * 4, us, algbw, algbw * 2.0 * (n - 1.0) / n);
        }
        bytes *= factor;
    }
    stream.synchronize()?;
    if let (true, Some(c)) = (cumem, comm.ipc_counts()) {
        eprintln!(
            "rank {}: {} device messages in place, {} through the window",
            comm.rank(),
            c.direct_messages,
            c.window_messages
        );
    }
    comm.destroy()?;
    Ok(())
}

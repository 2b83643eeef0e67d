//! The all-reduce sweep of `examples/allreduce_sweep.rs` on **device buffers**: one process per
//! rank, launched the same way (`RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`), the same
//! sizes, iteration rule, warm-up and output (rank 0 prints "bytes time_us algbw busbw" per
//! size), but the buffers are cudarc device slices on CUDA device 0 and each call is
//! `all_reduce_device` on a stream, timed up to `stream.synchronize()`. The result is copied
//! back and checked in full at every size. Several ranks may share one GPU.
//!
//! Arguments: min bytes, max bytes, factor (default 8 B, 64 MiB, 4). float32, sum.
//! `benches/gpu/run.sh` runs it on 2 and 4 ranks.

use std::time::Instant;

use cudarc::driver::CudaContext;
use topoccl::{Communicator, ReduceOp};

/// The same iteration rule as the peer programs.
fn iterations(bytes: usize) -> usize {
    ((64usize << 20) / bytes.max(1)).clamp(5, 500)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, d: usize| std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (min, max, factor) = (arg(1, 8), arg(2, 64 << 20), arg(3, 4).max(2));
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
        let send = stream.clone_htod(&vec![1.0f32; count])?;
        let mut recv = stream.alloc_zeros::<f32>(count)?;
        let iters = iterations(count * 4);
        for _ in 0..(iters / 10).max(2) {
            comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &stream)?;
        }
        stream.synchronize()?;
        comm.all_reduce_in_place(&mut [0f32], ReduceOp::Sum)?; // barrier
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &stream)?;
        }
        stream.synchronize()?;
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let got = stream.clone_dtoh(&recv)?;
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
    comm.destroy()?;
    Ok(())
}

//! An all-reduce bandwidth sweep, one process per rank, launched like an MPI program
//! (`RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`, or under mpirun/srun). It prints, on rank
//! 0, one line per size in the same format as the peer programs under `benches/peers/`, so the
//! script there can compare them; see `benches/peers/run.sh`.
//!
//! Arguments: min bytes, max bytes, factor (default 8 B, 64 MiB, 4). float32, sum.

use std::time::Instant;

use topoccl::{Communicator, ReduceOp};

/// The same iteration rule as the peer programs.
fn iterations(bytes: usize) -> usize {
    ((64usize << 20) / bytes.max(1)).clamp(5, 500)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, d: usize| std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (min, max, factor) = (arg(1, 8), arg(2, 64 << 20), arg(3, 4).max(2));
    let comm = Communicator::from_env()?;
    let n = comm.nranks() as f64;
    // Warm up for 300 ms (rank 0 decides when to stop), as the peer programs do: processes
    // that just started run slowly at first on a virtual machine. The decision travels by
    // all-reduce, which waits for every rank (a broadcast would let the root run ahead by
    // hundreds of thousands of calls, all queued at the others).
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
        let send = vec![1.0f32; count];
        let mut recv = vec![0.0f32; count];
        let iters = iterations(count * 4);
        for _ in 0..(iters / 10).max(2) {
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
        }
        comm.all_reduce_in_place(&mut [0f32], ReduceOp::Sum)?; // barrier
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        if recv[0] != n as f32 {
            return Err(format!("wrong result {} at {bytes} bytes", recv[0]).into());
        }
        if comm.rank() == 0 {
            let algbw = (count * 4) as f64 / us / 1e3;
            println!("{} {:.2} {:.3} {:.3}", count * 4, us, algbw, algbw * 2.0 * (n - 1.0) / n);
        }
        bytes *= factor;
    }
    comm.destroy()?;
    Ok(())
}

//! The library's own cost per blocking call, where no bytes travel: one rank all-reduces 128
//! bytes in place `CALLS` times (default 2 000 000) and prints the time per call. Every such
//! call takes the executor's turn, runs, and lets it go (the hot path of `src/comm/work.rs`);
//! `ASYNC=1` queues the calls instead (`submit` + `wait`), for the progress thread's path;
//! `COUNT` sets the float32 elements (default 32).

use std::time::Instant;

use topoccl::{Communicator, Config, ReduceOp, UniqueId};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let calls: usize = std::env::var("CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000_000);
    let queued = std::env::var("ASYNC").is_ok_and(|v| v == "1");
    let comm = Communicator::init_with(&UniqueId::new()?, 0, 1, Config::from_env()?)?;
    let count: usize = std::env::var("COUNT").ok().and_then(|v| v.parse().ok()).unwrap_or(32);
    let mut buf = vec![1.0f32; count];
    for _ in 0..calls / 20 {
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
    }
    let t = Instant::now();
    if queued {
        let call = topoccl::CollectiveCall::new(topoccl::Collective::AllReduce, topoccl::Dtype::Float32, buf.len());
        let b = topoccl::Buffer::host(buf.as_mut_ptr());
        for _ in 0..calls {
            // SAFETY: `buf` outlives the call, which is waited for before the next.
            unsafe { comm.submit(&call, b, b) }?.wait()?;
        }
    } else {
        for _ in 0..calls {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        }
    }
    let per = t.elapsed().as_secs_f64() / calls as f64;
    println!("{} calls, {:.3} us per call ({})", calls, per * 1e6, if queued { "queued" } else { "blocking" });
    Ok(())
}

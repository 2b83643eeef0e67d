//! The first call of each size against its steady time, on local ranks (threads) over real
//! connections: what a job sees of the tuner's decisions (`benches/tuner/first-call.sh` runs it
//! with `TOPOCCL_TUNE=first-call` and `background` side by side).
//!
//! `first_call [ranks] [calls per size]`: all-reduce of float32 (sum), sizes 1 KiB to 64 MiB by
//! 4×; per size the first call's time and the median of the next calls, the slowest rank's, and
//! what the last call ran.

use std::time::{Duration, Instant};

use topoccl::{Collective, CollectiveCall, Communicator, Config, Dtype, ReduceOp, UniqueId};

fn main() -> topoccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let calls: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let sizes: Vec<usize> = (0..9).map(|i| 1024usize << (2 * i)).collect();
    let config = Config::from_env()?;
    let id = UniqueId::new()?;
    let per_rank: Vec<topoccl::Result<Vec<(Duration, Duration, String)>>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                let (id, config, sizes) = (id.clone(), config.clone(), &sizes);
                s.spawn(move || {
                    let comm = Communicator::init_with(&id, r, n, config)?;
                    sizes.iter().map(|&bytes| one_size(&comm, bytes / 4, calls)).collect()
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err(topoccl::Error::Internal("a rank panicked".into()))))
            .collect()
    });
    let per_rank: Vec<Vec<(Duration, Duration, String)>> = per_rank.into_iter().collect::<topoccl::Result<_>>()?;
    println!("| bytes | first call ms | steady ms (median of {calls}) | first / steady | ran at the end |");
    println!("|---:|---:|---:|---:|---|");
    for (i, bytes) in sizes.iter().enumerate() {
        let first = per_rank.iter().map(|r| r[i].0).max().unwrap_or_default();
        let steady = per_rank.iter().map(|r| r[i].1).max().unwrap_or_default();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {bytes} | {:.3} | {:.3} | {:.1} | {} |",
            ms(first),
            ms(steady),
            ms(first) / ms(steady).max(1e-9),
            per_rank[0][i].2
        );
    }
    Ok(())
}

/// The first call of `count` floats, then the median of `calls` more; what runs after them.
fn one_size(comm: &Communicator, count: usize, calls: usize) -> topoccl::Result<(Duration, Duration, String)> {
    let send = vec![1.0f32; count];
    let mut recv = vec![0.0f32; count];
    // Touched now, not by the first call (a fresh allocation's pages fault in at first write).
    recv.fill(-1.0);
    let started = Instant::now();
    comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
    let first = started.elapsed();
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
        times.push(started.elapsed());
    }
    times.sort();
    let want = comm.nranks() as f32;
    if recv.iter().any(|&x| x != want) {
        return Err(topoccl::Error::Internal(format!("{count} floats: a wrong sum")));
    }
    let call = CollectiveCall::new(Collective::AllReduce, Dtype::Float32, count);
    Ok((first, times[times.len() / 2], comm.algorithm_for(&call)?.to_string()))
}

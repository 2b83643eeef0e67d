//! Two (or more) processes all-reduce a vector.
//!
//! ```sh
//! RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 cargo run --release --example allreduce &
//! RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 cargo run --release --example allreduce
//! ```
//!
//! Each rank contributes `rank + 1` in every element; every rank prints the sum and exits 0.
//! If a rank never comes, the others exit 1 with a message after `TOPOCCL_TIMEOUT` seconds.

use std::process::ExitCode;

use topoccl::{Communicator, ReduceOp};

fn run() -> topoccl::Result<()> {
    let comm = Communicator::from_env()?;
    let (rank, n) = (comm.rank(), comm.nranks());
    let mut data = vec![rank as f32 + 1.0; 8];
    comm.all_reduce_in_place(&mut data, ReduceOp::Sum)?;
    let expected = (n * (n + 1) / 2) as f32;
    println!(
        "rank {rank} of {n} ({:?}): all_reduce = {data:?}",
        comm.transports().iter().flatten().collect::<Vec<_>>()
    );
    if data.iter().any(|&v| v != expected) {
        return Err(topoccl::Error::Internal(format!("expected {expected} everywhere")));
    }
    comm.destroy()
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
            eprintln!("allreduce (rank {rank}): {e}");
            ExitCode::FAILURE
        }
    }
}

//! The soak benchmark's rank: `SOAK_CALLS` (10 000) collectives of random kinds, sizes,
//! datatypes, reductions and roots, every result checked, on the ranks the launcher started
//! (`benches/soak/run.sh` starts 4). Every rank draws the same calls from the same seed.
//!
//! Prints its resident memory after the first call and at the end, the calls per second, and
//! exits 1 on the first wrong value or error.

use std::process::ExitCode;
use std::time::Instant;

use topoccl::{Collective, CollectiveCall, Communicator, Dtype, ReduceOp};

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Resident memory of this process, KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches(" kB").to_string()))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `v` (a small non-negative integer) as one element of `t`.
fn encode(t: Dtype, v: u32, out: &mut Vec<u8>) {
    match t {
        Dtype::Int8 | Dtype::Uint8 => out.push(v as u8),
        Dtype::Int32 | Dtype::Uint32 => out.extend_from_slice(&v.to_le_bytes()),
        Dtype::Int64 | Dtype::Uint64 => out.extend_from_slice(&u64::from(v).to_le_bytes()),
        Dtype::Float16 => out.extend_from_slice(&half::f16::from_f32(v as f32).to_le_bytes()),
        Dtype::Bfloat16 => out.extend_from_slice(&half::bf16::from_f32(v as f32).to_le_bytes()),
        Dtype::Float32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        Dtype::Float64 => out.extend_from_slice(&f64::from(v).to_le_bytes()),
        Dtype::Float8e4m3 | Dtype::Float8e5m2 => out.push(t.fp8().map_or(0, |f| f.from_f32(v as f32))),
    }
}

/// What rank `r` contributes at element `j` of call `i`: 1 or 2 (products of 4 ranks stay
/// exact in every type, sums of 8 too).
fn value(r: u32, j: usize, i: u64) -> u32 {
    1 + ((r as usize + j + i as usize) % 2) as u32
}

fn reduce(op: ReduceOp, vals: impl Iterator<Item = u32>) -> u32 {
    let v: Vec<u32> = vals.collect();
    match op {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::Max => v.iter().copied().max().unwrap_or(0),
        ReduceOp::Min => v.iter().copied().min().unwrap_or(0),
        ReduceOp::Avg => v.iter().sum::<u32>() / v.len().max(1) as u32,
    }
}

fn run() -> Result<(), String> {
    let calls: u64 = std::env::var("SOAK_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let comm = Communicator::from_env().map_err(|e| e.to_string())?;
    let (me, n) = (comm.rank(), comm.nranks());
    let mut rng = Rng(0x50a4_c0de_1234_5678);
    let types = Dtype::ALL;
    // Averages of 1s and 2s are exact only where the type has fractions: sums, products,
    // extremes everywhere.
    let ops = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min];
    let mut rss_start = 0;
    let mut bytes_moved = 0u64;
    let t0 = Instant::now();
    for i in 0..calls {
        let root = rng.below(u64::from(n)) as u32;
        let kinds = [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast { root },
            Collective::Reduce { root },
            Collective::AllToAll,
        ];
        let c = kinds[rng.below(kinds.len() as u64) as usize];
        let t = types[rng.below(types.len() as u64) as usize];
        let op = ops[rng.below(ops.len() as u64) as usize];
        // Mostly small calls, some up to 1 Mi elements.
        let count = match rng.below(10) {
            0 => rng.below(1 << 20),
            1..=3 => rng.below(1 << 14),
            _ => rng.below(256),
        } as usize;
        let call = CollectiveCall::new(c, t, count).reduced_with(op);
        let (_, in_bytes, out_bytes) = call.bytes(n).map_err(|e| e.to_string())?;
        let size = t.size();
        let mut input = Vec::with_capacity(in_bytes);
        for j in 0..in_bytes / size {
            encode(t, value(me, j, i), &mut input);
        }
        let mut out = vec![0u8; out_bytes];
        comm.collective_bytes(&call, &input, &mut out).map_err(|e| format!("call {i} ({call}): {e}"))?;
        bytes_moved += out_bytes as u64;
        let expect = |j: usize| -> Option<u32> {
            match c {
                Collective::AllReduce => Some(reduce(op, (0..n).map(|r| value(r, j, i)))),
                Collective::Reduce { root } => (me == root).then(|| reduce(op, (0..n).map(|r| value(r, j, i)))),
                Collective::Broadcast { root } => Some(value(root, j, i)),
                Collective::AllGather => Some(value((j / count) as u32, j % count, i)),
                Collective::ReduceScatter => Some(reduce(op, (0..n).map(|r| value(r, me as usize * count + j, i)))),
                Collective::AllToAll => Some(value((j / count) as u32, me as usize * count + j % count, i)),
            }
        };
        let mut want = Vec::with_capacity(size);
        for j in 0..out_bytes / size {
            let Some(v) = expect(j) else { continue };
            want.clear();
            encode(t, v, &mut want);
            if out[j * size..(j + 1) * size] != want[..] {
                return Err(format!(
                    "call {i} ({call}): element {j} is {:?}, expected {want:?}",
                    &out[j * size..(j + 1) * size]
                ));
            }
        }
        if i == 0 {
            rss_start = rss_kib();
        }
        if me == 0 && (i + 1) % 2000 == 0 {
            eprintln!("rank 0: {} calls, {:.1} s, RSS {} MiB", i + 1, t0.elapsed().as_secs_f64(), rss_kib() / 1024);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "rank {me}: {calls} calls checked in {secs:.1} s ({:.0} calls/s, {:.1} GB received), RSS after the first call {} MiB, at the end {} MiB",
        calls as f64 / secs,
        bytes_moved as f64 / 1e9,
        rss_start / 1024,
        rss_kib() / 1024
    );
    comm.destroy().map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::FAILURE
        }
    }
}

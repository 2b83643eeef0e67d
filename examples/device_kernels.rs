//! The device reduction kernel against a device-to-device copy (the copy engine,
//! `cuMemcpyAsync`), in one program, on CUDA device 0, through topoccl's own device operations
//! (`topoccl::cuda::CudaOps`, the [`LocalOps`] the executor uses): for each size, N launches of
//! a copy and of a sum reduction of f32, f16, bf16, fp8 e4m3 and i32 and a bf16 product, waited for with
//! `done(fence)`, and one table line each — µs per call, bandwidth counted as bytes moved (a
//! copy reads and writes the size once, a reduction reads two operands and writes one), and the
//! ratios to the copy of the same size. Every result is checked (the first and last 64 KiB of
//! the destination) against the host's operations (`CpuOps`).
//!
//! ```text
//! cargo run --release --example device_kernels -- [--min 1M] [--max 1G] [--factor 4]
//!                                                 [--target-ms 100] [--iters N]
//! ```
//!
//! Sizes take K/M/G suffixes (binary). N is chosen per size and operation so the timed loop
//! lasts about `--target-ms` (between 3 and 2000 launches), unless `--iters` fixes it.
//! `benches/gpu/lease.sh` runs it; under the stand-in driver the numbers say nothing about speed.

use std::time::Instant;

#[path = "support/size.rs"]
mod size;

use clap::Parser;
use topoccl::cuda::{Context, CudaOps};
use topoccl::ops::{CpuOps, Fence, LocalOps, Workspace};
use topoccl::{Dtype, ReduceOp, Region};

#[derive(Parser, Debug)]
#[command(about = "topoccl's device reduction kernel against a device-to-device copy")]
struct Args {
    /// Smallest size (bytes; K/M/G suffixes).
    #[arg(long, default_value = "1M", value_parser = size::parse_size)]
    min: usize,
    /// Largest size (bytes; K/M/G suffixes).
    #[arg(long, default_value = "1G", value_parser = size::parse_size)]
    max: usize,
    /// Each size is the previous one times this.
    #[arg(long, default_value_t = 4)]
    factor: usize,
    /// Timed loop length to aim for, in milliseconds (chooses N).
    #[arg(long, default_value_t = 100.0)]
    target_ms: f64,
    /// Launches per timed loop (overrides --target-ms).
    #[arg(long)]
    iters: Option<usize>,
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// What one table line times.
#[derive(Clone, Copy)]
enum Op {
    Copy,
    Sum(Dtype),
    Prod(Dtype),
}

impl Op {
    fn label(self) -> String {
        match self {
            Op::Copy => "copy d2d".into(),
            Op::Sum(d) => format!("reduce {} sum", d.name()),
            Op::Prod(d) => format!("reduce {} prod", d.name()),
        }
    }

    /// Bytes moved by one call on `size` bytes.
    fn moved(self, size: usize) -> usize {
        match self {
            Op::Copy => 2 * size,
            Op::Sum(_) | Op::Prod(_) => 3 * size,
        }
    }
}

/// The device buffers, `max` bytes each; every size uses their first bytes.
struct Buffers {
    a: Workspace,
    b: Workspace,
    dst: Workspace,
}

fn prefix(w: &Workspace, len: usize) -> Region {
    let r = w.region();
    Region::new(r.space, r.addr, len)
}

fn wait(ops: &mut CudaOps, f: Fence) -> Res<()> {
    while !ops.done(f)? {
        std::hint::spin_loop();
    }
    Ok(())
}

/// Submits one call of `op` on the first `size` bytes.
fn submit(ops: &mut CudaOps, bufs: &Buffers, op: Op, size: usize) -> Res<Fence> {
    let (dst, a, b) = (prefix(&bufs.dst, size), prefix(&bufs.a, size), prefix(&bufs.b, size));
    // SAFETY: three distinct device allocations of at least `size` bytes, alive (owned by
    // `bufs`, and kept by `ops` until it is dropped) and used by nothing else.
    Ok(unsafe {
        match op {
            Op::Copy => ops.copy(dst, a)?,
            Op::Sum(d) => ops.reduce(d, ReduceOp::Sum, dst, a, b)?,
            Op::Prod(d) => ops.reduce(d, ReduceOp::Prod, dst, a, b)?,
        }
    })
}

/// Mean µs per call of `n` back-to-back calls, waited for once at the end.
fn timed(ops: &mut CudaOps, bufs: &Buffers, op: Op, size: usize, n: usize) -> Res<f64> {
    let t = Instant::now();
    let mut last = Fence::DONE;
    for _ in 0..n {
        last = submit(ops, bufs, op, size)?;
    }
    wait(ops, last)?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Fills the first `len` bytes of `w` with a byte pattern valid for every datatype measured
/// (each byte in 0x30..=0x3f: finite floats — fp8 e4m3 0.5..1.875, f32 and bf16 well inside
/// their range — and i32 below 2^30, so sums neither overflow nor turn NaN).
fn fill(ops: &mut CudaOps, w: &Workspace, len: usize, seed: usize) -> Res<()> {
    let chunk: Vec<u8> = (0..(1usize << 20).min(len))
        .map(|i| 0x30 | ((i.wrapping_mul(7 + 2 * seed) + i / 251 + seed) & 0xf) as u8)
        .collect();
    let r = w.region();
    let mut last = Fence::DONE;
    let mut at = 0;
    while at < len {
        let n = chunk.len().min(len - at);
        // SAFETY: the destination lies inside `w`'s allocation; the source is pageable host
        // memory, which the driver reads before the copy call returns.
        last = unsafe { ops.copy(Region::new(r.space, r.addr + at, n), Region::host(chunk.as_ptr() as usize, n))? };
        at += n;
    }
    wait(ops, last)
}

/// Bytes `[at, at + len)` of device region `r`.
fn read(ops: &mut CudaOps, r: Region, at: usize, len: usize) -> Res<Vec<u8>> {
    let mut out = vec![0u8; len];
    // SAFETY: the range lies inside `r`, live device memory.
    unsafe { ops.read(&mut out, Region::new(r.space, r.addr + at, len))? };
    Ok(out)
}

/// Checks the head and tail of the destination against the host's result of `op`.
fn check(ops: &mut CudaOps, bufs: &Buffers, op: Op, size: usize) -> Res<()> {
    let sample = size.min(64 << 10);
    for at in [0, size - sample] {
        let got = read(ops, prefix(&bufs.dst, size), at, sample)?;
        let a = read(ops, prefix(&bufs.a, size), at, sample)?;
        let want = match op {
            Op::Copy => a,
            Op::Sum(d) | Op::Prod(d) => {
                let r = if matches!(op, Op::Sum(_)) { ReduceOp::Sum } else { ReduceOp::Prod };
                let b = read(ops, prefix(&bufs.b, size), at, sample)?;
                let mut want = vec![0u8; sample];
                let host = |v: &[u8]| Region::host(v.as_ptr() as usize, v.len());
                let dst = Region::host(want.as_mut_ptr() as usize, sample);
                // SAFETY: three live host buffers of `sample` bytes; CpuOps completes at once.
                unsafe { CpuOps.reduce(d, r, dst, host(&a), host(&b))? };
                want
            }
        };
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            return Err(format!(
                "{} of {}: byte {} differs from the host's result ({:#04x}, expected {:#04x})",
                op.label(),
                human(size),
                at + i,
                got[i],
                want[i]
            )
            .into());
        }
    }
    Ok(())
}

fn main() -> Res<()> {
    let args = Args::parse();
    if args.min == 0 || args.max < args.min || args.factor < 2 {
        return Err("sizes: need 0 < --min <= --max and --factor >= 2".into());
    }
    let ctx = Context::primary(0)?;
    let mut ops = CudaOps::new(&ctx)?;
    println!(
        "device 0: compute capability {}.{}, {} multiprocessors; {}",
        ctx.sm.0,
        ctx.sm.1,
        ctx.multiprocessors,
        match args.iters {
            Some(n) => format!("{n} launches per line"),
            None => format!("launches per line chosen for ~{} ms", args.target_ms),
        }
    );
    println!("bandwidth = bytes moved / time (copy: 1 read + 1 write; reduce: 2 reads + 1 write)");
    // The buffers live as long as `ops` (its memory is freed only when it is dropped), so
    // they are made once, at the largest size, and each size uses their first bytes.
    let bufs = Buffers { a: ops.alloc(args.max)?, b: ops.alloc(args.max)?, dst: ops.alloc(args.max)? };
    fill(&mut ops, &bufs.a, args.max, 0)?;
    fill(&mut ops, &bufs.b, args.max, 1)?;
    println!(
        "{:>9}  {:<22} {:>6} {:>11} {:>9} {:>9} {:>9}",
        "size", "op", "iters", "us/call", "GB/s", "time/copy", "bw/copy"
    );
    let ops_measured = [
        Op::Copy,
        Op::Sum(Dtype::Float32),
        // f16 and bf16 sums and products run as paired instructions (kernels/packs.cuh): the
        // check below is their bit-equality with CpuOps on a GPU.
        Op::Sum(Dtype::Float16),
        Op::Sum(Dtype::Bfloat16),
        Op::Prod(Dtype::Bfloat16),
        Op::Sum(Dtype::Float8e4m3),
        Op::Sum(Dtype::Int32),
    ];
    let mut size = args.min;
    while size <= args.max {
        let mut copy: Option<(f64, f64)> = None;
        for op in ops_measured {
            // One warm-up call (kernel lookup, first touch), then a short calibration.
            let first = submit(&mut ops, &bufs, op, size)?;
            wait(&mut ops, first)?;
            let n = match args.iters {
                Some(n) => n.max(1),
                None => {
                    let us = timed(&mut ops, &bufs, op, size, 2)?;
                    ((args.target_ms * 1e3 / us.max(0.001)) as usize).clamp(3, 2000)
                }
            };
            let us = timed(&mut ops, &bufs, op, size, n)?;
            check(&mut ops, &bufs, op, size)?;
            let gbs = op.moved(size) as f64 / us / 1e3;
            let (t_ratio, bw_ratio) = match copy {
                Some((cu, cb)) => (us / cu, gbs / cb),
                None => (1.0, 1.0),
            };
            if matches!(op, Op::Copy) {
                copy = Some((us, gbs));
            }
            println!(
                "{:>9}  {:<22} {:>6} {:>11.2} {:>9.2} {:>9.2} {:>9.2}",
                human(size),
                op.label(),
                n,
                us,
                gbs,
                t_ratio,
                bw_ratio
            );
        }
        match size.checked_mul(args.factor) {
            Some(s) => size = s,
            None => break,
        }
    }
    drop(bufs);
    drop(ops);
    println!("all results equal the host's");
    Ok(())
}

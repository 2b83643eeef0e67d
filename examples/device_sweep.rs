//! The all-reduce sweep of `examples/allreduce_sweep.rs` on **device buffers**: the same sizes,
//! iteration rule, warm-up and output (rank 0 prints "bytes time_us algbw busbw" per size), but
//! the buffers are on CUDA device 0 and each call is an all-reduce on a stream, timed up to
//! `stream.synchronize()`. Several ranks may share one GPU.
//!
//! ```text
//! device_sweep [MIN] [MAX] [FACTOR] [--threads N] [--once] [--graph]
//! ```
//!
//! Sizes in bytes (default 8 B, 64 MiB, ×4), float32, sum. Ranks are processes launched as
//! `examples/allreduce_sweep.rs`'s (`RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`), or with
//! `--threads N` N threads of this process, each a rank with its own communicator on the one
//! context of device 0. Every rank is bound to device 0 at init (as NCCL's communicators are).
//!
//! The data is nccl-tests' kind: element i of rank r's input depends on both, so a misplaced
//! or missing chunk shows. At every size the output is poisoned (NaN), one more call is made,
//! and the result is read back with a copy into pageable memory **straight after the call**,
//! as a program reads `loss.item()` or `cudaMemcpy`s into a `std::vector`: no synchronize first.
//! Every element is checked against the exact sum. `--once`: only that checked call per size,
//! no timing (the lease script's smoke test).
//!
//! `--graph`: the timed calls of a size are captured into one CUDA graph (as nccl-tests' `-G`
//! and PyTorch's CUDA graphs use NCCL) and the time is one launch of it over its calls; the
//! checked call is a launch of that graph too. A size whose call cannot be captured prints a
//! `#` line saying why and is skipped.
//!
//! `SWEEP_ALLOC=cumem`: the buffers come from `cuMemAlloc` (what `cudaMalloc`, `ncclMemAlloc`
//! and PyTorch's allocator give), which CUDA IPC can offer to the sender, so receives may land
//! in place; by default they are cudarc's, pool memory on a device with pools (every message
//! through the receiver's window). `SWEEP_MAX_ITERS=N`: at most N timed calls per size (the
//! lease script's stand-in run, where a call costs milliseconds). `benches/gpu/lease.sh` runs it.

use std::sync::Arc;
use std::time::Instant;

#[path = "support/size.rs"]
mod size;

use clap::Parser;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use topoccl::cuda::{Context, DeviceMemory, StreamRef};
use topoccl::{Buffer, Collective, CollectiveCall, Communicator, Config, Dtype, ReduceOp, UniqueId};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug, Clone)]
#[command(about = "topoccl's all-reduce on device buffers, checked at every size")]
struct Args {
    /// Smallest size in bytes (K/M/G suffixes).
    #[arg(default_value = "8", value_parser = size::parse_size)]
    min: usize,
    /// Largest size in bytes (K/M/G suffixes).
    #[arg(default_value = "64M", value_parser = size::parse_size)]
    max: usize,
    /// Each size is the previous one times this.
    #[arg(default_value_t = 4)]
    factor: usize,
    /// Ranks as this many threads of this process (one CUDA context) instead of one rank
    /// joining from the environment.
    #[arg(long)]
    threads: Option<u32>,
    /// Only the checked call per size (read back straight after it), no timing.
    #[arg(long)]
    once: bool,
    /// Capture each size's calls into a CUDA graph and time its launch.
    #[arg(long)]
    graph: bool,
}

/// A CUDA graph of calls captured on a stream, instantiated; destroyed when dropped.
struct Graph {
    graph: cudarc::driver::sys::CUgraph,
    exec: cudarc::driver::sys::CUgraphExec,
}

impl Graph {
    /// Captures `calls` calls of `call` on `stream` (a global-mode capture, as PyTorch's).
    fn capture(
        stream: &CudaStream,
        calls: usize,
        mut call: impl FnMut() -> topoccl::Result<()>,
    ) -> Result<Graph, Failure> {
        use cudarc::driver::sys;
        let raw = stream.cu_stream();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: a live stream of the current context.
        unsafe { sys::cuStreamBeginCapture_v2(raw, mode) }.result()?;
        let made = (0..calls).try_for_each(|_| call());
        let mut graph = std::ptr::null_mut();
        // SAFETY: the capture begun above; the out-pointer is a local.
        let ended = unsafe { sys::cuStreamEndCapture(raw, &mut graph) }.result();
        made?;
        ended?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: the graph just made; the out-pointer is a local.
        if let Err(e) = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result() {
            // SAFETY: made above, destroyed once.
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(e.into());
        }
        Ok(Graph { graph, exec })
    }

    fn launch(&self, stream: &CudaStream) -> Result<(), Failure> {
        // SAFETY: a live executable graph and a stream of its context.
        unsafe { cudarc::driver::sys::cuGraphLaunch(self.exec, stream.cu_stream()) }.result()?;
        Ok(())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: made by `capture`, destroyed once (launches still queued run first).
        unsafe {
            cudarc::driver::sys::cuGraphExecDestroy(self.exec);
            cudarc::driver::sys::cuGraphDestroy(self.graph);
        }
    }
}

/// Rank `rank`'s element `i`: small integers, so every sum of up to 64 ranks is exact in f32.
fn input(rank: u32, i: usize) -> f32 {
    ((i * 7 + rank as usize * 13) % 61) as f32 - 30.0
}

/// A send and a receive buffer of `count` floats, the send one holding this rank's input.
enum Buffers {
    Cudarc(CudaSlice<f32>, CudaSlice<f32>),
    CuMem(DeviceMemory, DeviceMemory),
}

impl Buffers {
    fn new(cumem: bool, rank: u32, count: usize, stream: &Arc<CudaStream>) -> Result<Buffers, Failure> {
        let data: Vec<f32> = (0..count).map(|i| input(rank, i)).collect();
        if !cumem {
            let send = stream.clone_htod(&data)?;
            stream.synchronize()?;
            return Ok(Buffers::Cudarc(send, stream.alloc_zeros::<f32>(count)?));
        }
        let ctx = Context::primary(0)?;
        let (send, recv) = (DeviceMemory::new(&ctx, count * 4)?, DeviceMemory::new(&ctx, count * 4)?);
        // SAFETY: `send` holds `count` floats; device 0's primary context is current here.
        unsafe { cudarc::driver::result::memcpy_htod_sync(send.addr() as u64, &data) }?;
        Ok(Buffers::CuMem(send, recv))
    }

    fn recv_addr(&self, stream: &CudaStream) -> u64 {
        match self {
            Buffers::Cudarc(_, recv) => recv.device_ptr(stream).0,
            Buffers::CuMem(_, recv) => recv.addr() as u64,
        }
    }

    fn count(&self) -> usize {
        match self {
            Buffers::Cudarc(send, _) => send.len(),
            Buffers::CuMem(send, _) => send.len() / 4,
        }
    }

    fn all_reduce(&mut self, comm: &Communicator, stream: &CudaStream) -> topoccl::Result<()> {
        match self {
            Buffers::Cudarc(send, recv) => comm.all_reduce_device(send, recv, ReduceOp::Sum, stream).map(drop),
            Buffers::CuMem(send, recv) => {
                let call = CollectiveCall::new(Collective::AllReduce, Dtype::Float32, send.len() / 4)
                    .reduced_with(ReduceOp::Sum);
                let (s, r) = (Buffer::at(send.addr() as *const u8), Buffer::at(recv.addr() as *const u8));
                // SAFETY: both are device memory of the call's size, kept (and used by nothing
                // else) until the stream has passed every call: the sweep reads them back on
                // the stream before it frees them.
                unsafe { comm.submit_on(&call, s, r, StreamRef(stream.cu_stream())) }.map(drop)
            }
        }
    }

    /// The output poisoned with NaN, on the stream (ordered before the next call).
    fn poison(&self, stream: &CudaStream) -> Result<(), Failure> {
        // SAFETY: the receive buffer holds `count` floats on this stream's context.
        unsafe {
            cudarc::driver::result::memset_d8_async(self.recv_addr(stream), 0xff, self.count() * 4, stream.cu_stream())
        }?;
        Ok(())
    }

    /// The output, copied into pageable memory on the stream: the copy returns once the
    /// stream has reached it, i.e. after the calls queued before it.
    fn read_back(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>, Failure> {
        Ok(match self {
            Buffers::Cudarc(_, recv) => stream.clone_dtoh(recv)?,
            Buffers::CuMem(_, recv) => {
                let mut out = vec![0f32; recv.len() / 4];
                // SAFETY: `recv` holds that many floats; the copy is ordered after the calls on
                // this stream and, into pageable memory, returns once it has been made.
                unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, recv.addr() as u64, stream.cu_stream()) }?;
                out
            }
        })
    }
}

/// The same iteration rule as the peer programs.
fn iterations(bytes: usize) -> usize {
    let most = std::env::var("SWEEP_MAX_ITERS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(500).max(5);
    ((64usize << 20) / bytes.max(1)).clamp(5, most)
}

/// The rank's stream on device 0, made before the rank joins: a stream made while another rank
/// thread of the context sits in a copy into pageable memory waits for that copy (the driver
/// holds a lock of the context), and that copy waits for a call that needs this rank — with
/// any library, NCCL's too. Joining is collective, so every rank has its stream before any
/// rank makes a call.
fn rank_stream() -> Result<Arc<CudaStream>, Failure> {
    let ctx = CudaContext::new(0)?;
    // cudarc synchronises the whole context when a context object makes its first stream while
    // it tracks events; with several ranks on one GPU that waits for the other ranks' streams,
    // which wait for this rank's calls. Each slice here is used on this one stream.
    // SAFETY: no slice is used on two streams.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx.new_stream()?)
}

/// One rank's sweep on its stream; rank 0's lines go to stdout.
fn sweep(comm: &Communicator, stream: &Arc<CudaStream>, args: &Args, cumem: bool) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.nranks());
    if !args.once {
        // Warm up for 300 ms (rank 0 decides when to stop), as allreduce_sweep does.
        let t0 = Instant::now();
        loop {
            let mut go = [u8::from(rank == 0 && t0.elapsed().as_millis() < 300)];
            comm.all_reduce_in_place(&mut go, ReduceOp::Max)?;
            if go[0] == 0 {
                break;
            }
        }
    }
    let mut bytes = args.min;
    while bytes <= args.max {
        let count = (bytes / 4).max(1);
        let mut buffers = Buffers::new(cumem, rank, count, stream)?;
        let mut us = 0.0;
        if args.graph {
            // Every rank refuses a call it cannot capture alike.
            let calls = if args.once { 1 } else { iterations(count * 4) };
            let graph = match Graph::capture(stream, calls, || buffers.all_reduce(comm, stream)) {
                Ok(g) => g,
                Err(e) => {
                    if rank == 0 {
                        println!("# {} not captured: {e}", count * 4);
                    }
                    bytes *= args.factor;
                    continue;
                }
            };
            if !args.once {
                graph.launch(stream)?;
                stream.synchronize()?;
                comm.all_reduce_in_place(&mut [0f32], ReduceOp::Sum)?; // barrier
                let t = Instant::now();
                graph.launch(stream)?;
                stream.synchronize()?;
                us = t.elapsed().as_secs_f64() * 1e6 / calls as f64;
            }
            buffers.poison(stream)?;
            graph.launch(stream)?;
        } else if !args.once {
            let iters = iterations(count * 4);
            for _ in 0..(iters / 10).max(2) {
                buffers.all_reduce(comm, stream)?;
            }
            stream.synchronize()?;
            comm.all_reduce_in_place(&mut [0f32], ReduceOp::Sum)?; // barrier
            let t = Instant::now();
            for _ in 0..iters {
                buffers.all_reduce(comm, stream)?;
            }
            stream.synchronize()?;
            us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        }
        // The checked call: poisoned output, read back straight after the call (with --graph:
        // after the graph's launch, queued above).
        if !args.graph {
            buffers.poison(stream)?;
            buffers.all_reduce(comm, stream)?;
        }
        let got = buffers.read_back(stream)?;
        let want = |i: usize| (0..n).map(|r| input(r, i)).sum::<f32>();
        let wrong: Vec<usize> = (0..count).filter(|&i| got[i].to_bits() != want(i).to_bits()).collect();
        if let Some(&i) = wrong.first() {
            return Err(format!(
                "rank {rank}: {} of {count} elements wrong at {bytes} bytes; first at element {i}: {} (want {})",
                wrong.len(),
                got[i],
                want(i)
            )
            .into());
        }
        if rank == 0 {
            if args.once {
                println!("{} checked", count * 4);
            } else {
                let algbw = (count * 4) as f64 / us / 1e3;
                let nf = f64::from(n);
                println!("{} {:.2} {:.3} {:.3}", count * 4, us, algbw, algbw * 2.0 * (nf - 1.0) / nf);
            }
        }
        bytes *= args.factor;
    }
    stream.synchronize()?;
    if let (true, Some(c)) = (cumem, comm.ipc_counts()) {
        eprintln!(
            "rank {rank}: {} device messages in place, {} through the window",
            c.direct_messages, c.window_messages
        );
    }
    Ok(())
}

fn main() -> Result<(), Failure> {
    let mut args = Args::parse();
    args.factor = args.factor.max(2);
    let cumem = std::env::var("SWEEP_ALLOC").is_ok_and(|v| v == "cumem");
    // topoccl's own check first: cudarc panics when it finds no driver library.
    topoccl::cuda::driver()?;
    let config = Config { cuda_device: Some(0), ..Config::from_env()? };
    let Some(threads) = args.threads else {
        let stream = rank_stream()?;
        let comm = Communicator::from_env_with(config)?;
        sweep(&comm, &stream, &args, cumem)?;
        comm.destroy()?;
        return Ok(());
    };
    let id = UniqueId::new()?;
    let results: Vec<Result<(), Failure>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|r| {
                let (id, config, args) = (id.clone(), config.clone(), &args);
                s.spawn(move || -> Result<(), Failure> {
                    let stream = rank_stream()?;
                    let comm = Communicator::init_with(&id, r, threads, config)?;
                    sweep(&comm, &stream, args, cumem)?;
                    comm.destroy()?;
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a rank thread panicked".into()))).collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        res.map_err(|e| format!("rank thread {r}: {e}"))?;
    }
    Ok(())
}

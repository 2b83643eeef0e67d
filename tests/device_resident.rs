//! Device-resident calls under the stand-in driver, tested the way users call: each result is
//! read back with a copy into pageable memory queued right after the call, with no
//! synchronisation first (`tensor.cpu()`, `float(loss)`, `cudaMemcpy` into a vector), and
//! must equal the same call on host buffers byte for byte. Every call between CUDA IPC peers
//! must have run device-resident (queued whole on the caller's stream by the caller's thread),
//! and the executor must have made no driver call while one was outstanding
//! (`topoccl::cuda::foreign_driver_calls`): NCCL's invariant, which is what keeps those copies
//! from deadlocking. Ranks as threads of one process (one context: the queue gate) and as
//! processes; and a rank that never makes its call leaves the others' streams released, with
//! an error naming it, instead of hung.
#![cfg(feature = "cuda")]

mod common;
mod device_support;
mod standin;

use std::time::{Duration, Instant};

use device_support::{at, device_and_host, device_config, graph, read_back, stream, Placement};
use topoccl::cuda::StreamRef;
use topoccl::{Collective, CollectiveCall, Communicator, Dtype, ReduceOp, Reduction, TransportPolicy};

/// The calls every run checks on `n` ranks: each collective, every reduction (PreMulSum with a
/// scalar by value: one in device memory still runs host-driven), three sizes, out of place
/// and in place.
fn calls(n: u32) -> Vec<(CollectiveCall, Placement)> {
    let mut v = Vec::new();
    for count in [1, 1000, 100_003] {
        for dtype in [Dtype::Float32, Dtype::Int32, Dtype::Bfloat16, Dtype::Float8e4m3] {
            for red in device_support::reductions(dtype) {
                for coll in [Collective::AllReduce, Collective::ReduceScatter, Collective::Reduce { root: n - 1 }] {
                    v.push((CollectiveCall::new(coll, dtype, count).reduced_with(red), Placement::Apart));
                }
            }
            for coll in [Collective::AllGather, Collective::Broadcast { root: 1 }, Collective::AllToAll] {
                v.push((CollectiveCall::new(coll, dtype, count), Placement::Apart));
            }
            for coll in [Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather] {
                let sum = Reduction::Op(ReduceOp::Sum);
                v.push((CollectiveCall::new(coll, dtype, count).reduced_with(sum), Placement::InPlace));
            }
        }
    }
    v
}

/// Runs every call on `comm`, on two streams by turns (calls share the communicator's
/// workspaces, so each must wait for the one before on the other stream); what went wrong, in
/// words.
fn run_all(comm: &Communicator) -> Vec<String> {
    run_calls(comm, calls(comm.nranks()), false)
}

/// The calls of [`calls`] of at most 64 KiB, each of which must run as one kernel.
fn run_small(comm: &Communicator) -> Vec<String> {
    let small = calls(comm.nranks()).into_iter().filter(|(c, _)| c.count <= 1000).collect();
    run_calls(comm, small, true)
}

fn run_calls(comm: &Communicator, all: Vec<(CollectiveCall, Placement)>, one_kernel: bool) -> Vec<String> {
    let streams = [stream(), stream()];
    let mut wrong = Vec::new();
    let before = comm.device_resident_calls();
    let one_before = comm.device_one_launch_calls();
    for (i, (call, placement)) in all.iter().enumerate() {
        let one = comm.device_one_launch_calls();
        let result = device_and_host(comm, &streams[i % 2], call, *placement, i);
        if one_kernel && comm.device_one_launch_calls() == one {
            wrong.push(format!("{call} ({placement:?}) did not run as one kernel"));
        }
        match result {
            Ok((dev, host)) if dev != host => wrong.push(format!("{call} ({placement:?}) differs from the host path")),
            Ok(_) => {}
            Err(e) => wrong.push(format!("{call} ({placement:?}) failed: {e}")),
        }
    }
    let resident = comm.device_resident_calls().unwrap_or(0) - before.unwrap_or(0);
    println!(
        "rank {}: {resident} of {} device calls device-resident; {} executor driver calls while one was outstanding",
        comm.rank(),
        all.len(),
        topoccl::cuda::foreign_driver_calls()
    );
    if resident != all.len() as u64 {
        wrong.push(format!("{resident} of {} calls ran device-resident", all.len()));
    }
    let one = comm.device_one_launch_calls().unwrap_or(0) - one_before.unwrap_or(0);
    if one_kernel && one != all.len() as u64 {
        wrong.push(format!("{one} of {} calls ran as one kernel", all.len()));
    }
    if topoccl::cuda::foreign_driver_calls() != 0 {
        wrong.push(format!("{} driver calls by the executor during calls", topoccl::cuda::foreign_driver_calls()));
    }
    wrong
}

/// Runs `check` on three thread ranks of test `name` (one context: the queue gate) and asserts
/// that nothing went wrong on any.
fn on_three_threads(name: &str, timeout_s: f64, check: fn(&Communicator) -> Vec<String>) {
    on_three_threads_with(name, &[], timeout_s, check)
}

/// As [`on_three_threads`], with `env` in the test process's environment.
fn on_three_threads_with(name: &str, env: &[(&str, &str)], timeout_s: f64, check: fn(&Communicator) -> Vec<String>) {
    if !standin::child(name, env) {
        return;
    }
    let cfg = device_config(TransportPolicy::Auto, timeout_s);
    let results = common::on_ranks(3, &cfg, |comm| check(comm));
    for (r, w) in results.iter().enumerate() {
        assert!(w.is_empty(), "rank {r}:\n{}", w.join("\n"));
    }
}

/// Runs `check` on `n` processes of test `name` (the stand-in's copies slowed a little) and
/// asserts that nothing went wrong on any.
fn on_processes(name: &str, n: u32, check: fn(&Communicator) -> Vec<String>) {
    on_processes_with(name, n, &[], check)
}

/// As [`on_processes`], with `extra` in the ranks' environment.
fn on_processes_with(name: &str, n: u32, extra: &[(&str, &str)], check: fn(&Communicator) -> Vec<String>) {
    let mut env = vec![("TOPOCCL_STANDIN_DELAY_US", "20")];
    env.extend_from_slice(extra);
    if standin::ranks(name, n, &env, 300) {
        let _s = stream();
        let comm = Communicator::from_env().expect("join");
        let wrong = check(&comm);
        assert!(wrong.is_empty(), "rank {}:\n{}", comm.rank(), wrong.join("\n"));
        comm.destroy().expect("destroy");
    }
}

#[test]
fn every_call_on_three_threads_runs_resident_and_reads_back_at_once() {
    on_three_threads("every_call_on_three_threads_runs_resident_and_reads_back_at_once", 30.0, run_all);
}

/// Small calls as one kernel each, on thread ranks sharing a context (each on streams of its
/// own) and on processes, asked to (`TOPOCCL_DEVICE_LL=2`: all share the stand-in's one
/// device), with every result equal to the host path's.
#[test]
fn small_calls_on_three_threads_run_as_one_kernel() {
    let env = [("TOPOCCL_DEVICE_LL", "2")];
    on_three_threads_with("small_calls_on_three_threads_run_as_one_kernel", &env, 30.0, run_small);
}

#[test]
fn small_calls_on_three_processes_run_as_one_kernel() {
    let env = [("TOPOCCL_DEVICE_LL", "2")];
    on_processes_with("small_calls_on_three_processes_run_as_one_kernel", 3, &env, run_small);
}

#[test]
fn every_call_on_four_processes_runs_resident_and_reads_back_at_once() {
    on_processes("every_call_on_four_processes_runs_resident_and_reads_back_at_once", 4, run_all);
}

/// Calls larger than the resident workspaces (4 MiB) and windows (8 MiB), and odd in length: every collective, every
/// reduction of one type, in place and apart.
fn large_calls(n: u32) -> Vec<(CollectiveCall, Placement)> {
    let mut v = Vec::new();
    for red in device_support::reductions(Dtype::Float32) {
        v.push((
            CollectiveCall::new(Collective::AllReduce, Dtype::Float32, 6_000_007).reduced_with(red),
            Placement::Apart,
        ));
    }
    let sum = Reduction::Op(ReduceOp::Sum);
    let avg = Reduction::Op(ReduceOp::Avg);
    for (coll, dtype, count, red, placement) in [
        (Collective::AllReduce, Dtype::Bfloat16, 12_000_001, avg, Placement::InPlace),
        (Collective::ReduceScatter, Dtype::Float32, 4_800_011, sum, Placement::Apart),
        (Collective::ReduceScatter, Dtype::Int32, 4_400_003, sum, Placement::InPlace),
        (Collective::AllGather, Dtype::Float32, 5_200_001, sum, Placement::Apart),
        (Collective::AllGather, Dtype::Float8e4m3, 18_000_007, sum, Placement::InPlace),
        (Collective::Reduce { root: n - 1 }, Dtype::Float32, 5_600_009, Reduction::Op(ReduceOp::Max), Placement::Apart),
        (Collective::Broadcast { root: 1 }, Dtype::Int32, 5_000_003, sum, Placement::Apart),
        (Collective::AllToAll, Dtype::Float32, 4_800_007, sum, Placement::Apart),
    ] {
        v.push((CollectiveCall::new(coll, dtype, count).reduced_with(red), placement));
    }
    v
}

/// Every large call on `comm`, checked against the host path: each must run device-resident,
/// cut into several pieces, with no executor driver call meanwhile.
fn run_large(comm: &Communicator) -> Vec<String> {
    let s = stream();
    let mut wrong = Vec::new();
    for (i, (call, placement)) in large_calls(comm.nranks()).iter().enumerate() {
        let (calls, pieces) = (comm.device_resident_calls(), comm.device_resident_pieces());
        match device_and_host(comm, &s, call, *placement, i) {
            Ok((dev, host)) if dev != host => {
                let first = dev.iter().zip(&host).position(|(a, b)| a != b).unwrap_or(0);
                wrong.push(format!("{call} ({placement:?}): differs from the host path at byte {first}"));
            }
            Ok(_) => {}
            Err(e) => wrong.push(format!("{call} ({placement:?}) failed: {e}")),
        }
        let went = comm.device_resident_calls().unwrap_or(0) - calls.unwrap_or(0);
        let cut = comm.device_resident_pieces().unwrap_or(0) - pieces.unwrap_or(0);
        if comm.rank() == 0 {
            println!("{call} ({placement:?}): {cut} pieces");
        }
        if went != 1 || cut < 2 {
            wrong.push(format!("{call} ({placement:?}): {went} device-resident calls in {cut} pieces"));
        }
    }
    if topoccl::cuda::foreign_driver_calls() != 0 {
        wrong.push(format!("{} driver calls by the executor during calls", topoccl::cuda::foreign_driver_calls()));
    }
    wrong
}

/// Calls too large for the workspaces run device-resident in pieces (never through the host),
/// on three thread ranks sharing a context (the gate between every piece) ...
#[test]
fn large_calls_run_resident_in_pieces_on_three_threads() {
    on_three_threads("large_calls_run_resident_in_pieces_on_three_threads", 60.0, run_large);
}

/// ... and on two processes.
#[test]
fn large_calls_run_resident_in_pieces_on_two_processes() {
    on_processes("large_calls_run_resident_in_pieces_on_two_processes", 2, run_large);
}

/// Rank 0 never makes the call its peers make: their streams must be let go (their read-back
/// returns) within about the timeout, and the call fail naming rank 0.
#[test]
fn a_rank_that_never_calls_leaves_its_peers_streams_released() {
    never_calls("a_rank_that_never_calls_leaves_its_peers_streams_released", &[("TOPOCCL_TIMEOUT", "3")]);
}

/// The same with the call as one kernel, which waits for rank 0's lines inside the kernel:
/// the host's abort word makes it return.
#[test]
fn a_rank_that_never_calls_leaves_a_one_kernel_call_released() {
    let env = [("TOPOCCL_TIMEOUT", "3"), ("TOPOCCL_DEVICE_LL", "2")];
    never_calls("a_rank_that_never_calls_leaves_a_one_kernel_call_released", &env);
}

fn never_calls(name: &str, env: &[(&str, &str)]) {
    if !standin::ranks(name, 2, env, 120) {
        return;
    }
    let s = stream();
    let comm = Communicator::from_env().expect("join");
    assert!(comm.device_resident_calls().is_some(), "{:?}", comm.transports());
    if comm.rank() == 0 {
        std::thread::sleep(Duration::from_secs(8));
        return;
    }
    let n = 4096;
    let send = s.clone_htod(&vec![1.0f32; n]).expect("htod");
    let mut recv = s.alloc_zeros::<f32>(n).expect("alloc");
    let t = Instant::now();
    let one = comm.device_one_launch_calls();
    let work = comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &s).expect("queued");
    let _ = read_back(&s, &recv);
    if env.contains(&("TOPOCCL_DEVICE_LL", "2")) {
        assert_eq!(comm.device_one_launch_calls(), one.map(|n| n + 1), "the call ran as one kernel");
    }
    let waited = t.elapsed();
    let err = work.wait().expect_err("a call rank 0 never made succeeded");
    println!("rank 1: stream released after {:.1} s: {err}", waited.as_secs_f64());
    assert!(waited < Duration::from_secs(7), "the stream was held {waited:?}");
    assert!(err.to_string().contains("rank 0"), "{err}");
    // The stream is usable again.
    let _ = StreamRef(s.cu_stream());
    let again = s.clone_htod(&[2.0f32]).expect("htod after");
    assert_eq!(read_back(&s, &again), [2.0]);
}

/// The driver calls one call makes, by collective and size, from the caller's thread (all of
/// them: the call's work is queued then) and from the executor while it is outstanding (none):
/// rank 0's rows.
fn driver_calls_table(comm: &Communicator) -> Vec<String> {
    let s = stream();
    let mut rows = Vec::new();
    for coll in
        [Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter, Collective::Broadcast { root: 0 }]
    {
        for bytes in [8usize, 64 << 10, 1 << 20, 4 << 20, 32 << 20] {
            // nccl-tests' size: the larger buffer.
            let (i, o) = coll.blocks(comm.nranks());
            let count = bytes / 4 / i.max(o);
            let call = CollectiveCall::new(coll, Dtype::Float32, count).reduced_with(Reduction::Op(ReduceOp::Sum));
            let (_, in_bytes, out_bytes) = call.bytes(comm.nranks()).expect("sizes");
            let send = s.alloc_zeros::<u8>(in_bytes.max(1)).expect("alloc");
            let recv = s.alloc_zeros::<u8>(out_bytes.max(1)).expect("alloc");
            let (a, b) = (device_support::at(&send, &s), device_support::at(&recv, &s));
            let (resident, staged) = (comm.device_resident_calls(), comm.device_staged_calls());
            let (pieces, one, ops) =
                (comm.device_resident_pieces(), comm.device_one_launch_calls(), comm.device_resident_ops());
            let (here, foreign) = (topoccl::cuda::driver_calls_on_this_thread(), topoccl::cuda::foreign_driver_calls());
            // SAFETY: both buffers live until the read-back below has passed the call.
            unsafe { comm.submit_on(&call, a, b, StreamRef(s.cu_stream())) }.expect("call");
            let caller = topoccl::cuda::driver_calls_on_this_thread() - here;
            let _ = read_back(&s, &recv);
            comm.flush().expect("flush");
            let went = comm.device_resident_calls().unwrap_or(0) - resident.unwrap_or(0);
            let cut = comm.device_resident_pieces().unwrap_or(0) - pieces.unwrap_or(0);
            let staged = comm.device_staged_calls() - staged;
            let one = comm.device_one_launch_calls().unwrap_or(0) - one.unwrap_or(0);
            let ops = comm.device_resident_ops().unwrap_or(0) - ops.unwrap_or(0);
            let path = match (went, staged, one) {
                (1, 0, 1) => "resident, one kernel".into(),
                (1, 0, _) => format!("resident ×{cut}"),
                (0, 1, _) => "staged".into(),
                _ => "host".into(),
            };
            rows.push(format!(
                "| {:<14} | {:>8} | {:>20} | {:>10} | {:>19} | {:>24} |",
                coll.name(),
                bytes,
                path,
                if went == 1 { ops.to_string() } else { "-".into() },
                caller,
                topoccl::cuda::foreign_driver_calls() - foreign
            ));
        }
    }
    rows
}

const TABLE_HEAD: &str = "| collective     |    bytes | path (pieces)        | stream ops | caller driver calls | executor calls meanwhile |\n|---|---|---|---|---|---|";

/// Every row ran on `path` and the executor made no driver call meanwhile.
fn all_on_and_none_from_the_executor(rows: &[String], path: &str) -> bool {
    rows.iter().all(|r| {
        let cells: Vec<&str> = r.split('|').map(str::trim).collect();
        cells.get(3).is_some_and(|c| c.starts_with(path)) && cells.get(6) == Some(&"0")
    })
}

/// Every row of at most 64 KiB ran as one kernel and queued nothing else (the calls of the
/// table share one stream, so none waits for a call on another).
fn small_rows_are_one_kernel(rows: &[String]) -> bool {
    rows.iter().all(|r| {
        let cells: Vec<&str> = r.split('|').map(str::trim).collect();
        let small = cells.get(2).and_then(|b| b.parse::<usize>().ok()).is_some_and(|b| b <= 64 << 10);
        !small || (cells.get(3) == Some(&"resident, one kernel") && cells.get(4) == Some(&"1"))
    })
}

/// The table on rank 0 of 2 processes (the parent launches them with `env`): every row on
/// `path`, none with an executor call.
fn table_on_two_processes(name: &str, env: &[(&str, &str)], path: &str) {
    if standin::ranks(name, 2, env, 120) {
        let _s = stream();
        let comm = Communicator::from_env().expect("join");
        let rows = driver_calls_table(&comm);
        if comm.rank() == 0 {
            println!("2 processes {env:?}, rank 0:\n{TABLE_HEAD}\n{}", rows.join("\n"));
        }
        assert!(all_on_and_none_from_the_executor(&rows, path), "{rows:?}");
        if env.contains(&("TOPOCCL_DEVICE_LL", "2")) {
            assert!(small_rows_are_one_kernel(&rows), "{rows:?}");
        }
        comm.destroy().expect("destroy");
    }
}

/// The table on 2 thread ranks sharing a context over `transport`, checked on both.
fn table_on_two_threads(name: &str, transport: TransportPolicy, path: &str) {
    if !standin::child(name, &[("TOPOCCL_DEVICE_LL", "2")]) {
        return;
    }
    let cfg = device_config(transport, 30.0);
    let tables = common::on_ranks(2, &cfg, |comm| driver_calls_table(comm));
    println!("2 threads over {transport:?}, rank 0:\n{TABLE_HEAD}\n{}", tables[0].join("\n"));
    for rows in &tables {
        assert!(all_on_and_none_from_the_executor(rows, path), "{rows:?}");
        if path == "resident" {
            assert!(small_rows_are_one_kernel(rows), "{rows:?}");
        }
    }
}

#[test]
fn driver_calls_per_call_on_two_processes() {
    table_on_two_processes("driver_calls_per_call_on_two_processes", &[], "resident");
}

/// Ranks sharing one device take the one-launch path only when asked (processes' kernels spin
/// in their own context's time slice on a real GPU): by default the stream path (above);
/// asked, their small calls are one kernel (the thread tables below are asked too).
#[test]
fn driver_calls_per_call_on_two_processes_one_launch() {
    table_on_two_processes(
        "driver_calls_per_call_on_two_processes_one_launch",
        &[("TOPOCCL_DEVICE_LL", "2")],
        "resident",
    );
}

#[test]
fn driver_calls_per_call_on_two_threads() {
    table_on_two_threads("driver_calls_per_call_on_two_threads", TransportPolicy::Auto, "resident");
}

/// The same table for staged calls (peers over TCP: every piece through the pinned host
/// slots), on 2 processes ...
#[test]
fn driver_calls_per_staged_call_on_two_processes_over_tcp() {
    let env = [("TOPOCCL_TRANSPORT", "tcp")];
    table_on_two_processes("driver_calls_per_staged_call_on_two_processes_over_tcp", &env, "staged");
}

/// ... and on 2 thread ranks sharing a context (each caller waits for its pieces' outputs
/// itself).
#[test]
fn driver_calls_per_staged_call_on_two_threads_over_tcp() {
    table_on_two_threads("driver_calls_per_staged_call_on_two_threads_over_tcp", TransportPolicy::Tcp, "staged");
}

/// The calls a captured graph holds: every collective, reductions of several kinds (an
/// average, PreMulSum's scalar), five datatypes, all within the one-kernel path.
fn captured_calls(n: u32) -> Vec<CollectiveCall> {
    let red = |op| Reduction::Op(op);
    let two = Reduction::PreMulSum(topoccl::Scalar::Value({
        let mut b = [0u8; 8];
        b[..2].copy_from_slice(&half::f16::from_f32(2.0).to_le_bytes());
        b
    }));
    vec![
        CollectiveCall::new(Collective::AllReduce, Dtype::Float32, 1000).reduced_with(red(ReduceOp::Sum)),
        CollectiveCall::new(Collective::AllReduce, Dtype::Bfloat16, 777).reduced_with(red(ReduceOp::Avg)),
        CollectiveCall::new(Collective::ReduceScatter, Dtype::Int32, 300).reduced_with(red(ReduceOp::Max)),
        CollectiveCall::new(Collective::AllGather, Dtype::Float8e4m3, 500),
        CollectiveCall::new(Collective::Broadcast { root: 1 }, Dtype::Float64, 100),
        CollectiveCall::new(Collective::Reduce { root: n - 1 }, Dtype::Float16, 64).reduced_with(two),
        CollectiveCall::new(Collective::AllToAll, Dtype::Int32, 90),
    ]
}

/// Captures [`captured_calls`] into one CUDA graph, as PyTorch's CUDA graphs and vLLM do
/// (static buffers, new inputs copied in before each replay), and replays it: every replay's
/// results must equal the same calls on the host with that replay's inputs, also with an
/// uncaptured call between replays on the same stream. Each captured call is one node (one
/// kernel, nothing else queued), and a call too large for that path is refused in capture
/// with an error, on every rank, instead of captured wrong.
fn run_captured_small(comm: &Communicator) -> Vec<String> {
    run_captured(comm, false)
}

/// [`run_captured_small`] with calls of the stream path too (256 KiB, and 5 MiB in pieces),
/// for ranks that share no CUDA context.
fn run_captured_all(comm: &Communicator) -> Vec<String> {
    run_captured(comm, true)
}

fn run_captured(comm: &Communicator, large: bool) -> Vec<String> {
    let n = comm.nranks();
    let s = stream();
    let raw = s.cu_stream();
    let mut calls = captured_calls(n);
    let small = calls.len();
    if large {
        let sum = Reduction::Op(ReduceOp::Sum);
        calls.push(CollectiveCall::new(Collective::AllReduce, Dtype::Float32, 1 << 16).reduced_with(sum));
        calls.push(
            CollectiveCall::new(Collective::ReduceScatter, Dtype::Bfloat16, 1 << 18)
                .reduced_with(Reduction::Op(ReduceOp::Avg)),
        );
        calls.push(CollectiveCall::new(Collective::AllReduce, Dtype::Float32, (5 << 20) / 4 + 3).reduced_with(sum));
        calls.push(CollectiveCall::new(Collective::AllGather, Dtype::Int32, 100_003));
    }
    let mut wrong = Vec::new();
    let mut bufs: Vec<_> = calls
        .iter()
        .map(|c| {
            let (_, i, o) = c.bytes(n).expect("sizes");
            (s.alloc_zeros::<u8>(i.max(1)).expect("alloc"), s.alloc_zeros::<u8>(o.max(1)).expect("alloc"), i, o)
        })
        .collect();
    let (big_send, mut big_recv) =
        (s.alloc_zeros::<f32>(1 << 16).expect("alloc"), s.alloc_zeros::<f32>(1 << 16).expect("alloc"));
    s.synchronize().expect("sync");
    let one = comm.device_one_launch_calls().unwrap_or(0);
    let ops = comm.device_resident_ops().unwrap_or(0);
    // Ranks sharing a context (`!large`) share its hardware queues, and with fewer queues than
    // streams (`CUDA_DEVICE_MAX_CONNECTIONS=1`) a rank's second kernel would wait at a queue's
    // head for its first, which waits for a peer's kernel queued behind it: there each call is
    // a graph of its own, and the ranks launch each graph before any launches the next (what
    // the library's gate does for the calls it launches itself).
    let per_graph = if large { calls.len() } else { 1 };
    let mut graphs = Vec::new();
    let mut nodes = 0;
    for (k, group) in calls.chunks(per_graph).enumerate() {
        graph::begin(raw);
        for (c, (send, recv, _, _)) in group.iter().zip(&bufs[k * per_graph..]) {
            // SAFETY: the buffers live until the graph's last replay has run (read back below).
            let r = unsafe { comm.submit_on(c, at(send, &s), at(recv, &s), StreamRef(raw)) };
            if let Err(e) = r {
                wrong.push(format!("{c} could not be captured: {e}"));
            }
        }
        if !large && k == 0 {
            // Ranks sharing a context: too large for one kernel, refused, and the capture goes on.
            if comm.all_reduce_device(&big_send, &mut big_recv, ReduceOp::Sum, &s).is_ok() {
                wrong.push("a 256 KiB all-reduce was captured between ranks of one context".into());
            }
        }
        let g = graph::end(raw);
        nodes += graph::nodes(g);
        graphs.push((g, graph::instantiate(g)));
    }
    let queued = comm.device_resident_ops().unwrap_or(0) - ops;
    if comm.rank() == 0 {
        println!("rank 0: {} captured calls ({small} as one kernel): {nodes} graph nodes", calls.len());
    }
    if nodes as u64 != queued {
        wrong.push(format!("the graphs hold {nodes} nodes where the calls queued {queued} operations"));
    }
    if !large && nodes != calls.len() {
        wrong.push(format!("{} captured calls made {nodes} graph nodes, not one kernel each", calls.len()));
    }
    let captured = comm.device_one_launch_calls().unwrap_or(0) - one;
    if captured != small as u64 {
        wrong.push(format!("{captured} of {small} small captured calls ran as one kernel"));
    }
    for replay in 0..4usize {
        let mut inputs = Vec::new();
        for (i, (c, (send, _, in_bytes, _))) in calls.iter().zip(bufs.iter_mut()).enumerate() {
            let prod = c.reduction == Reduction::Op(ReduceOp::Prod);
            let inp = device_support::input(c.dtype, *in_bytes, comm.rank(), 100 * replay + i, prod);
            // Into the graph's static input, on the stream, before the launch.
            if *in_bytes > 0 {
                s.memcpy_htod(&inp, send).expect("htod");
            }
            inputs.push(inp);
        }
        for &(_, exec) in &graphs {
            graph::launch(exec, raw);
            if !large {
                // Every rank's graph launched before any queues work behind its own (above).
                comm.all_reduce_in_place(&mut [0u8], ReduceOp::Max).expect("barrier");
            }
        }
        for (c, ((_, recv, _, out_bytes), inp)) in calls.iter().zip(bufs.iter().zip(&inputs)) {
            let dev = read_back(&s, recv);
            let mut host = vec![0u8; *out_bytes];
            comm.collective_bytes(c, inp, &mut host).expect("host call");
            if dev[..*out_bytes] != host[..] {
                wrong.push(format!("replay {replay}: {c} differs from the host path"));
            }
        }
        if replay == 1 {
            // An uncaptured call between replays, on the same stream.
            match device_and_host(comm, &s, &calls[0], Placement::Apart, 999) {
                Ok((d, h)) if d != h => wrong.push("the call between replays differs from the host path".into()),
                Ok(_) => {}
                Err(e) => wrong.push(format!("the call between replays failed: {e}")),
            }
        }
    }
    for (g, exec) in graphs {
        graph::destroy(exec, g);
    }
    wrong
}

#[test]
fn captured_calls_replay_right_on_three_threads() {
    let env = [("TOPOCCL_DEVICE_LL", "2")];
    on_three_threads_with("captured_calls_replay_right_on_three_threads", &env, 30.0, run_captured_small);
}

#[test]
fn captured_calls_replay_right_on_three_processes() {
    let env = [("TOPOCCL_DEVICE_LL", "2")];
    on_processes_with("captured_calls_replay_right_on_three_processes", 3, &env, run_captured_all);
}

/// Calls on `CU_STREAM_PER_THREAD` (what `cudaStreamPerThread` and nvcc's
/// `--default-stream per-thread` give): each rank thread's own default stream, a blocking
/// stream of the context; every call device-resident and equal to the host path, read back
/// with a copy into pageable memory on that stream straight after the call.
fn run_per_thread_stream(comm: &Communicator) -> Vec<String> {
    use cudarc::driver::{sys, DevicePtr};
    const PER_THREAD: sys::CUstream = 2 as sys::CUstream;
    let n = comm.nranks();
    let s = stream();
    let mut wrong = Vec::new();
    let before = comm.device_resident_calls().unwrap_or(0);
    let calls = [
        CollectiveCall::new(Collective::AllReduce, Dtype::Float32, 1000).reduced_with(Reduction::Op(ReduceOp::Sum)),
        CollectiveCall::new(Collective::AllGather, Dtype::Int32, 100_003),
        CollectiveCall::new(Collective::ReduceScatter, Dtype::Bfloat16, 1 << 18)
            .reduced_with(Reduction::Op(ReduceOp::Max)),
    ];
    for (i, c) in calls.iter().enumerate() {
        let (_, in_bytes, out_bytes) = c.bytes(n).expect("sizes");
        let inp = device_support::input(c.dtype, in_bytes, comm.rank(), i, false);
        let send = s.clone_htod(&inp).expect("htod");
        let recv = s.alloc_zeros::<u8>(out_bytes).expect("alloc");
        s.synchronize().expect("sync");
        let (sp, rp) = (send.device_ptr(&s).0, recv.device_ptr(&s).0);
        // SAFETY: both buffers live until the copy below, which waits for the call.
        let r = unsafe {
            comm.submit_on(
                c,
                topoccl::Buffer::at(sp as *const u8),
                topoccl::Buffer::at(rp as *const u8),
                StreamRef(PER_THREAD),
            )
        };
        if let Err(e) = r {
            wrong.push(format!("{c} on the per-thread stream failed: {e}"));
            continue;
        }
        let mut dev = vec![0u8; out_bytes];
        // SAFETY: `dev` holds `out_bytes`; into pageable memory the copy returns once made.
        let copied = unsafe { sys::cuMemcpyDtoHAsync_v2(dev.as_mut_ptr().cast(), rp, out_bytes, PER_THREAD) };
        assert_eq!(copied, sys::CUresult::CUDA_SUCCESS, "read back");
        let mut host = vec![0u8; out_bytes];
        comm.collective_bytes(c, &inp, &mut host).expect("host call");
        if dev != host {
            wrong.push(format!("{c} on the per-thread stream differs from the host path"));
        }
    }
    let resident = comm.device_resident_calls().unwrap_or(0) - before;
    if resident != calls.len() as u64 {
        wrong.push(format!("{resident} of {} calls on the per-thread stream ran device-resident", calls.len()));
    }
    wrong
}

#[test]
fn calls_on_the_per_thread_stream_on_three_threads() {
    on_three_threads("calls_on_the_per_thread_stream_on_three_threads", 30.0, run_per_thread_stream);
}

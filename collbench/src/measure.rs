//! One rank's part of a measured sweep: for every transport, algorithm, collective, datatype,
//! operator and size, check the result against the reference, then time the iterations. Rank 0
//! prints the table as rows finish; the others only compute.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use topoccl_synth::registry::Registry;
use topoccl_synth::sim::SimConfig;
use topoccl_synth::sim::Simulator;
use topoccl_synth::topology::Topology;

use super::check::{self, Value};
use super::plan::{Bench, SweepSpec};
use super::table::{Block, MeasuredReport, MeasuredRow, Predicted, RowId, Timing};
use crate::error::{Error, Result};
use topoccl::comm::{CollectiveCall, Communicator, Config, UniqueId, UNIQUE_ID_BYTES};
use topoccl::tuner::Choice;
use topoccl::types::{Dtype, ReduceOp};
use topoccl::Collective;

/// Where rank 0 writes.
pub struct Output<'a> {
    pub out: &'a mut dyn Write,
    /// A transient progress line before each row (stdout is a terminal).
    pub progress: bool,
    /// Predict each row on this topology (`--compare-sim`), with the cost model the tuner uses.
    pub topology: Option<(Topology, SimConfig)>,
}

fn io(e: std::io::Error) -> Error {
    Error::Io { context: "writing the report".into(), source: e }
}

/// Buffers reused across sizes (8-byte aligned, as the reduction kernels like).
#[derive(Default)]
struct Buffers {
    send: Vec<u64>,
    recv: Vec<u64>,
}

fn grow(v: &mut Vec<u64>, len: usize) {
    if v.len() * 8 < len {
        v.resize(len.div_ceil(8), 0);
    }
}

/// A communicator for each transport after the first: rank 0 makes a unique id and hands it
/// out over the first communicator.
fn join_another(first: &mut Communicator, config: Config) -> Result<Communicator> {
    let mut bytes = [0u8; UNIQUE_ID_BYTES];
    let id = if first.rank() == 0 {
        let id = UniqueId::new()?;
        bytes = id.to_bytes();
        first.broadcast_in_place(&mut bytes, 0)?;
        id
    } else {
        first.broadcast_in_place(&mut bytes, 0)?;
        UniqueId::from_bytes(&bytes)?
    };
    Ok(Communicator::init_with(&id, first.rank(), first.nranks(), config)?)
}

/// Who runs where, one line per rank (gathered to every rank), with the transports the rank
/// reaches its peers by (`shm ×3, ib ×4`).
fn describe_ranks(comm: &mut Communicator) -> Result<Vec<String>> {
    const RECORD: usize = 160;
    let mut mine = [0u8; RECORD];
    let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let mut by_name: Vec<(&str, usize)> = Vec::new();
    for t in comm.transports().into_iter().flatten() {
        match by_name.iter_mut().find(|(n, _)| *n == t) {
            Some((_, k)) => *k += 1,
            None => by_name.push((t, 1)),
        }
    }
    let links: Vec<String> = by_name.iter().map(|(t, k)| format!("{t} ×{k}")).collect();
    let line = format!(
        "{} {host}{}",
        std::process::id(),
        if links.is_empty() { String::new() } else { format!(": {}", links.join(", ")) }
    );
    let n = line.len().min(RECORD);
    mine[..n].copy_from_slice(&line.as_bytes()[..n]);
    let mut all = vec![0u8; RECORD * comm.nranks() as usize];
    comm.all_gather(&mine, &mut all)?;
    Ok(all
        .chunks(RECORD)
        .enumerate()
        .map(|(r, rec)| {
            let text = String::from_utf8_lossy(rec).trim_end_matches('\0').to_string();
            let (pid, host) = text.split_once(' ').unwrap_or((&text, ""));
            format!("Rank {r:>3} Pid {pid:>7} on {host}")
        })
        .collect())
}

/// Runs the plan on this rank; rank 0 fills and prints the report. Returns the report (on
/// every rank, with the wrong counts every rank agrees on).
pub fn run(
    plan: &SweepSpec,
    first: Communicator,
    config: &Config,
    out: Output<'_>,
    mode: String,
) -> Result<MeasuredReport> {
    let mut comms = vec![first];
    for &t in &plan.transports[1..] {
        let c = join_another(&mut comms[0], Config { transport: t, ..config.clone() })?;
        comms.push(c);
    }
    let n = comms[0].nranks();
    let me = comms[0].rank();
    let ranks = describe_ranks(&mut comms[0])?;
    let mut report = MeasuredReport { mode, nranks: n, ranks, blocks: Vec::new() };
    if me == 0 {
        write!(out.out, "{}", report.header()).map_err(io)?;
    }
    let rows = |b: Bench| plan.dtypes.len() * plan.sizes.len() * if b.reduces() { plan.ops.len() } else { 1 };
    let total: usize = plan.transports.len() * plan.algos.len() * plan.benches.iter().map(|&b| rows(b)).sum::<usize>();
    let mut done = 0usize;
    let mut bufs = Buffers::default();
    for (ti, comm) in comms.iter_mut().enumerate() {
        for (ai, algo) in plan.algos.iter().enumerate() {
            comm.set_algorithm(Some(algo))?;
            for &bench in &plan.benches {
                let group = rows(bench);
                // Send/recv has no algorithm: measured once per transport.
                if !SweepSpec::builds(algo, bench) || (bench == Bench::SendRecv && ai > 0) {
                    if me == 0 && bench != Bench::SendRecv {
                        writeln!(out.out, "#\n# {} · algorithm {algo}: does not build it, skipped", bench.name())
                            .map_err(io)?;
                    }
                    done += group;
                    continue;
                }
                let mut block = Block {
                    transport: plan.transports[ti].name().to_string(),
                    algorithm: if bench == Bench::SendRecv { "p2p".into() } else { algo.clone() },
                    collective: bench.name().to_string(),
                    rows: Vec::new(),
                };
                if me == 0 {
                    write!(out.out, "{}", block.heading(out.topology.is_some())).map_err(io)?;
                }
                for &dtype in &plan.dtypes {
                    let ops: &[ReduceOp] = if bench.reduces() { &plan.ops } else { &[ReduceOp::Sum] };
                    for &op in ops {
                        for &size in &plan.sizes {
                            if me == 0 && out.progress {
                                write!(
                                    out.out,
                                    "\r\x1b[2K# {}/{total}: {} {} {} {size} B…",
                                    done + 1,
                                    bench.name(),
                                    dtype.name(),
                                    op.name()
                                )
                                .map_err(io)?;
                                out.out.flush().map_err(io)?;
                            }
                            let row = measure(comm, plan, bench, dtype, op, size, &mut bufs, out.topology.as_ref())?;
                            if me == 0 {
                                let clear = if out.progress { "\r\x1b[2K" } else { "" };
                                writeln!(out.out, "{clear}{}", row.line()).map_err(io)?;
                                out.out.flush().map_err(io)?;
                            }
                            block.rows.push(row);
                            done += 1;
                        }
                    }
                }
                report.blocks.push(block);
            }
        }
    }
    if me == 0 {
        write!(out.out, "{}", report.footer()).map_err(io)?;
    }
    for c in comms {
        c.destroy()?;
    }
    Ok(report)
}

/// One operation as `measure` runs it.
#[derive(Clone, Copy)]
enum Op {
    Coll(CollectiveCall),
    SendRecv { dtype: Dtype, count: usize },
}

fn call(comm: &mut Communicator, op: Op, send: &mut [u8], recv: &mut [u8], in_place: bool) -> Result<()> {
    match op {
        Op::Coll(c) if in_place => Ok(comm.collective_bytes_in_place(&c, recv)?),
        Op::Coll(c) => Ok(comm.collective_bytes(&c, send, recv)?),
        Op::SendRecv { dtype, count } => {
            let (n, r) = (comm.nranks(), comm.rank());
            let bytes = count * dtype.size();
            let mut g = comm.group();
            g.send_bytes(&send[..bytes], dtype, (r + 1) % n)?;
            g.recv_bytes(&mut recv[..bytes], dtype, (r + n - 1) % n)?;
            Ok(g.end()?)
        }
    }
}

/// The expected output element `i` of `op` on rank `me` of `n`, where this rank has output.
fn expected(op: Op, n: u32, me: u32, i: usize) -> Option<Value> {
    let own = |rank: u32, j: usize, rop: ReduceOp| Value::Exact(check::input(rop, rank, j));
    match op {
        Op::SendRecv { .. } => Some(own((me + n - 1) % n, i, ReduceOp::Sum)),
        Op::Coll(c) => {
            let count = c.count.max(1);
            let rop = c.reduction.op();
            match c.collective {
                Collective::AllReduce => Some(check::reduced(rop, n, i)),
                Collective::ReduceScatter => Some(check::reduced(rop, n, me as usize * count + i)),
                Collective::AllGather => Some(own((i / count) as u32, i % count, rop)),
                Collective::Broadcast { root } => Some(own(root, i, rop)),
                Collective::Reduce { root } => (me == root).then(|| check::reduced(rop, n, i)),
                Collective::AllToAll => Some(own((i / count) as u32, me as usize * count + i % count, rop)),
            }
        }
    }
}

/// Fills the input (`buf` laid out as the call reads it) with this rank's check data.
fn fill_input(op: Op, me: u32, dtype: Dtype, buf: &mut [u8], in_place: bool) {
    let rop = match op {
        Op::Coll(c) => c.reduction.op(),
        Op::SendRecv { .. } => ReduceOp::Sum,
    };
    let esize = dtype.size();
    match op {
        // In place, all-gather's input is this rank's block of the output.
        Op::Coll(c) if in_place && c.collective == Collective::AllGather => {
            let block = c.count * esize;
            let at = me as usize * block;
            check::fill(dtype, &mut buf[at..at + block], |i| Value::Exact(check::input(rop, me, i)));
        }
        Op::Coll(c) if !c.collective.uses_input(me) => {}
        _ => check::fill(dtype, buf, |i| Value::Exact(check::input(rop, me, i))),
    }
}

#[allow(clippy::too_many_arguments)]
fn measure(
    comm: &mut Communicator,
    plan: &SweepSpec,
    bench: Bench,
    dtype: Dtype,
    rop: ReduceOp,
    size: u64,
    bufs: &mut Buffers,
    topology: Option<&(Topology, SimConfig)>,
) -> Result<MeasuredRow> {
    let (n, me) = (comm.nranks(), comm.rank());
    let esize = dtype.size() as u64;
    let blocks = bench.size_blocks(n);
    let count = (size / (esize * blocks)) as usize;
    let bytes = count as u64 * esize * blocks;
    let root = plan.root;
    let op = match bench {
        Bench::Collective(kind) => Op::Coll(CollectiveCall::new(kind.with_root(root), dtype, count).reduced_with(rop)),
        Bench::SendRecv => Op::SendRecv { dtype, count },
    };
    let (in_blocks, out_blocks) = match bench {
        Bench::Collective(k) => k.blocks(n),
        Bench::SendRecv => (1, 1),
    };
    let block_bytes = count * dtype.size();
    let (send_len, recv_len) = (block_bytes * in_blocks, block_bytes * out_blocks);
    let choice = match op {
        Op::Coll(c) => Some(comm.algorithm_for(&c)?),
        Op::SendRecv { .. } => None,
    };
    let algorithm = choice.as_ref().map_or_else(|| "p2p".to_string(), Choice::to_string);
    let mut variants = Vec::new();
    for in_place in [false, true] {
        if in_place && bench == Bench::SendRecv {
            variants.push(None);
            continue;
        }
        let recv_len = if in_place { send_len.max(recv_len) } else { recv_len };
        grow(&mut bufs.send, send_len);
        grow(&mut bufs.recv, recv_len);
        let send = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut bufs.send)[..send_len];
        let recv = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut bufs.recv)[..recv_len];
        let wrong = if plan.check {
            fill_input(op, me, dtype, send, false);
            recv.fill(0xA5);
            if in_place {
                fill_input(op, me, dtype, recv, true);
            }
            call(comm, op, send, recv, in_place)?;
            // In place, reduce-scatter's result is this rank's block of the buffer.
            let result = match op {
                Op::Coll(c) if in_place && c.collective == Collective::ReduceScatter => {
                    &recv[me as usize * block_bytes..(me as usize + 1) * block_bytes]
                }
                _ => &recv[..out_blocks * block_bytes],
            };
            let has_output = !matches!(op, Op::Coll(c) if !c.collective.uses_output(me));
            let bad = if has_output {
                check::wrong(dtype, result, |i| expected(op, n, me, i).unwrap_or(Value::Exact(0)))
            } else {
                0
            };
            let mut total = [bad];
            comm.all_reduce_in_place(&mut total, ReduceOp::Sum)?;
            Some(total[0])
        } else {
            None
        };
        for _ in 0..plan.warmup {
            call(comm, op, send, recv, in_place)?;
        }
        comm.all_reduce_in_place(&mut [0u8], ReduceOp::Max)?;
        let t = Instant::now();
        for _ in 0..plan.iters {
            call(comm, op, send, recv, in_place)?;
        }
        let mine = t.elapsed().as_secs_f64() * 1e6 / f64::from(plan.iters);
        let time_us = aggregate(comm, mine, plan.average)?;
        let algbw = if time_us > 0.0 { bytes as f64 / time_us / 1e3 } else { 0.0 };
        variants.push(Some(Timing { time_us, algbw, busbw: algbw * bench.bus_factor(n), wrong }));
    }
    let predicted = match (topology, op) {
        (Some((topo, sim)), Op::Coll(c)) => match &choice {
            Some(choice) => Some(predict(topo, sim, choice, c, bytes)?),
            None => None,
        },
        _ => None,
    };
    let out_of_place = variants[0].ok_or_else(|| Error::Internal("no out-of-place timing".into()))?;
    Ok(MeasuredRow {
        id: RowId {
            size: bytes,
            count: count as u64,
            dtype: dtype.name().to_string(),
            redop: if bench.reduces() { rop.name().to_string() } else { "none".to_string() },
            root: match bench {
                Bench::Collective(k) if k.rooted() => i64::from(root),
                _ => -1,
            },
        },
        out_of_place,
        in_place: variants[1],
        algorithm,
        predicted,
    })
}

/// This rank's time combined over ranks as nccl-tests' `-a` says.
fn aggregate(comm: &mut Communicator, mine: f64, average: u32) -> Result<f64> {
    let mut v = [mine];
    match average {
        0 => comm.broadcast_in_place(&mut v, 0)?,
        2 => comm.all_reduce_in_place(&mut v, ReduceOp::Min)?,
        3 => comm.all_reduce_in_place(&mut v, ReduceOp::Max)?,
        _ => comm.all_reduce_in_place(&mut v, ReduceOp::Avg)?,
    }
    Ok(v[0])
}

/// The simulator's time for `algorithm` on `topo` (the schedule the runtime ran, rebuilt for
/// the topology).
fn predict(topo: &Topology, sim: &SimConfig, choice: &Choice, c: CollectiveCall, bytes: u64) -> Result<Predicted> {
    let coll = c.collective;
    let request = choice.request(topo, coll, bytes).follow_paths(sim.follow_paths);
    let schedule = Registry::builtin().generate(&choice.algorithm, &request)?;
    let time_us = Simulator::with_config(topo, *sim).run(&schedule, bytes)?.time_us;
    let algbw = if time_us > 0.0 { bytes as f64 / time_us / 1e3 } else { 0.0 };
    Ok(Predicted { time_us, busbw: algbw * coll.bus_factor(topo.nranks() as u32) })
}

/// True when rank 0's standard output is a terminal (progress lines make sense).
pub fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}

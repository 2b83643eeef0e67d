//! `collbench --simulate`: builds each algorithm's schedule for the topology, proves it correct
//! with the verifier, and prices every size in the simulator (no bytes move).

use std::io::Write;
use std::time::Instant;

use topoccl_synth::algorithms::{Registry, Request};
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::{SimConfig, Simulator};
use topoccl_synth::topology;
use topoccl_synth::{bound, verify};

use super::report::{Report, Row, RowId, Sweep};
use super::Args;
use crate::error::{Error, Result};
use crate::types::{Dtype, ReduceOp};

/// The predicted sweep, written to `out`.
pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let dtype: Dtype = args.datatype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    let topo = topology::resolve(args.topology.as_deref().unwrap_or("dgx1"))?;
    let n = topo.nranks() as u32;
    if args.root >= n {
        return Err(Error::InvalidArgument(format!(
            "root {} out of range: topology {} has {n} ranks",
            args.root,
            topo.name()
        )));
    }
    let coll = Collective::parse(&args.collective, args.root).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "unknown collective `{}` (all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all)",
            args.collective
        ))
    })?;
    let sizes = super::plan::sizes_of(args)?;
    let registry = Registry::builtin();
    let names: Vec<&str> = if args.algo == "all" {
        registry.iter().filter(|g| g.supports(coll)).map(|g| g.name()).collect()
    } else {
        // `auto` is the runtime's choice; the simulator prices what it runs for large sizes.
        args.algo.split(',').map(str::trim).map(|a| if a == "auto" { "ring" } else { a }).collect()
    };
    for name in &names {
        registry.get(name)?;
    }
    let config = SimConfig { message_overhead_us: args.sim_overhead_us, ..SimConfig::default() };
    let mut sim = Simulator::with_config(&topo, config);
    let bound = bound::bound(&topo, coll);
    let mut report = Report {
        mode: "simulated (predicted times, no bytes moved)".into(),
        topology: topo.name().to_string(),
        nranks: topo.nranks(),
        collective: coll.to_string(),
        bound: describe_bound(&bound),
        sweeps: Vec::new(),
    };
    let root = coll.root().map_or(-1, i64::from);
    for name in names {
        let started = Instant::now();
        let request = Request::new(&topo, coll).pipeline(args.pipeline).channels(args.channels);
        let schedule = registry.generate(name, &request)?;
        let generated = started.elapsed();
        // Large schedules are proven by the test suite; verify here what is quick to verify.
        let stats = schedule.stats();
        let verified = if stats.steps <= 2_000_000 {
            verify::verify(&schedule)?;
            "verified"
        } else {
            "not verified here (large)"
        };
        let sim_started = Instant::now();
        let mut rows = Vec::with_capacity(sizes.len());
        for &size in &sizes {
            // nccl-tests: per-rank counts for the collectives whose buffer is n blocks.
            let per = dtype.size() as u64 * u64::from(coll.chunk_multiple(n));
            let count_total = size / per * u64::from(coll.chunk_multiple(n));
            let bytes = count_total * dtype.size() as u64;
            let count = count_total / u64::from(coll.chunk_multiple(n));
            let t = sim.run(&schedule, bytes)?.time_us;
            let algbw = if t > 0.0 { bytes as f64 / t / 1e3 } else { 0.0 };
            rows.push(Row {
                id: RowId {
                    size: bytes,
                    count,
                    dtype: dtype.name().into(),
                    redop: if coll.reduces() { op.name().into() } else { "none".into() },
                    root,
                },
                time_us: t,
                algbw,
                busbw: algbw * coll.bus_factor(n),
                pct_of_bound: 100.0 * bound.efficiency(bytes, t),
            });
        }
        report.sweeps.push(Sweep {
            algorithm: name.to_string(),
            schedule: format!(
                "{} channels, {} chunks, {} steps, {} messages; {verified}; generated in {:.1} ms, {} sizes simulated in {:.1} ms",
                stats.max_channels,
                schedule.chunks,
                stats.steps,
                stats.sends,
                generated.as_secs_f64() * 1e3,
                sizes.len(),
                sim_started.elapsed().as_secs_f64() * 1e3
            ),
            rows,
        });
    }
    let io = |e: std::io::Error| Error::Io { context: "writing the report".into(), source: e };
    match args.json.as_deref() {
        Some("-") => writeln!(out, "{}", report.json()).map_err(io),
        Some(path) => {
            std::fs::write(path, report.json())
                .map_err(|e| Error::Io { context: format!("writing {path}"), source: e })?;
            write!(out, "{}", report.table()).map_err(io)
        }
        None => write!(out, "{}", report.table()).map_err(io),
    }
}

/// One line: the bound's algorithm bandwidth, where it comes from, its latency term.
fn describe_bound(b: &bound::Bound) -> String {
    let shapes: Vec<String> = b.shapes.iter().map(|(s, r)| format!("{s} {r:.2}")).collect();
    format!(
        "algbw ≤ {:.2} GB/s ({}{}; shapes: {}), time ≥ {:.2} us latency; column `bound` = bound time / time",
        b.rate_gbps,
        b.shape,
        if b.exact { ", exact" } else { ", valid but not tight" },
        shapes.join(", "),
        b.latency_us
    )
}

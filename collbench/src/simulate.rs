//! `collbench --simulate`: builds each algorithm's schedule for the topology, proves it correct
//! with the verifier, and prices every size in the simulator (no bytes move).

use std::io::Write;
use std::time::Instant;

use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::{SimConfig, Simulator};
use topoccl_synth::topology;
use topoccl_synth::{bound, verify};

use super::plot;
use super::report::{Report, Row, RowId, Sweep};
use super::Args;
use crate::error::{Error, Result};
use topoccl::tuner::cache::DiskCache;
use topoccl::tuner::{Selector, SelectorOptions};
use topoccl::types::{Dtype, ReduceOp};

/// The predicted sweep, written to `out`.
pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let dtype: Dtype = args.datatype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    let topo = match &args.emulate {
        // What an emulated run of that machine should measure.
        Some(spec) => crate::emu::plan::NetPlan::new(&topology::resolve(spec)?, args.emulate_scale)?.scaled,
        None => {
            let chosen = super::detect::choose(Some(args.topology.as_deref().unwrap_or("dgx1")))?;
            if let Some(report) = &chosen.report {
                super::detect::print(report, args.json.as_deref() == Some("-"), out)?;
            }
            // Detection found nothing: the host model of -n ranks.
            match chosen.topology {
                Some(t) => t,
                None => topology::resolve(&format!("host:{}", args.nranks))?,
            }
        }
    };
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
        registry.iter().filter(|g| g.supports(coll)).map(|g| g.name()).chain(["auto"]).collect()
    } else {
        args.algo.split(',').map(str::trim).collect()
    };
    for name in names.iter().filter(|&&a| a != "auto") {
        registry.get(name)?;
    }
    let config = SimConfig {
        message_overhead_us: args.sim_overhead_us,
        rank_message_us: args.sim_message_us,
        pair_sharing: args.sim_pair_sharing,
        pair_queue_bytes: args.sim_pair_queue.map(|b| b as f64),
        ..SimConfig::default()
    };
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
    // nccl-tests' sizes: per-rank counts for the collectives whose buffer is n blocks.
    let sized: Vec<(u64, u64)> = sizes
        .iter()
        .map(|&size| {
            let per = dtype.size() as u64 * u64::from(coll.chunk_multiple(n));
            let count_total = size / per * u64::from(coll.chunk_multiple(n));
            (count_total * dtype.size() as u64, count_total / u64::from(coll.chunk_multiple(n)))
        })
        .collect();
    if args.first_call {
        let sizes: Vec<u64> = sized.iter().map(|&(bytes, _)| bytes).collect();
        return super::first_call::run(&topo, coll, &sizes, config, out);
    }
    let row = |bytes: u64, count: u64, t: f64, choice: Option<String>| {
        let algbw = if t > 0.0 { bytes as f64 / t / 1e3 } else { 0.0 };
        Row {
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
            choice,
        }
    };
    for &name in &names {
        let started = Instant::now();
        if name == "auto" {
            let options =
                SelectorOptions { forced: None, sim: config, cache: DiskCache::from_env(), ..Default::default() };
            let mut tuner = Selector::new(topo.clone(), options)?;
            let mut rows = Vec::with_capacity(sized.len());
            let mut deciding = 0.0;
            for &(bytes, count) in &sized {
                let decided = Instant::now();
                if args.auto_priced {
                    let chosen = tuner.choose_priced(coll, bytes)?;
                    deciding += decided.elapsed().as_secs_f64();
                    rows.push(row(bytes, count, chosen.time_us, Some(chosen.choice.to_string())));
                    continue;
                }
                let choice = tuner.choose(coll, bytes)?;
                deciding += decided.elapsed().as_secs_f64();
                let schedule = tuner.schedule(&choice, coll, bytes)?;
                let t = sim.run(&schedule, bytes)?.time_us;
                rows.push(row(bytes, count, t, Some(choice.to_string())));
            }
            let timed = if args.auto_priced {
                "times are the tuner's prices of its choices (closed forms at scale), not simulations"
            } else {
                "with building and simulating the choices"
            };
            report.sweeps.push(Sweep {
                algorithm: "auto".into(),
                schedule: format!(
                    "the tuner's choice per size (candidates priced in this simulator's model); {} sizes in {:.1} ms \
                     deciding, {:.1} ms in all {timed}",
                    sized.len(),
                    deciding * 1e3,
                    started.elapsed().as_secs_f64() * 1e3
                ),
                rows,
            });
            continue;
        }
        // In a list, an algorithm that does not build this collective is skipped (as measured
        // sweeps do); asked for alone, it is an error.
        if names.len() > 1 && !registry.get(name)?.supports(coll) {
            report.sweeps.push(Sweep {
                algorithm: name.to_string(),
                schedule: format!("does not build {coll}, skipped"),
                rows: Vec::new(),
            });
            continue;
        }
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
        let mut rows = Vec::with_capacity(sized.len());
        for &(bytes, count) in &sized {
            let t = sim.run(&schedule, bytes)?.time_us;
            rows.push(row(bytes, count, t, None));
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
                sized.len(),
                sim_started.elapsed().as_secs_f64() * 1e3
            ),
            rows,
        });
    }
    if let Some(path) = &args.plot {
        let mut series: Vec<plot::Series> = report
            .sweeps
            .iter()
            .map(|sw| plot::Series {
                label: sw.algorithm.clone(),
                points: sw.rows.iter().filter(|r| r.id.size > 0).map(|r| (r.id.size as f64, r.busbw)).collect(),
                dashed: false,
            })
            .collect();
        let bound_points = sized
            .iter()
            .filter(|&&(bytes, _)| bytes > 0)
            .map(|&(bytes, _)| (bytes as f64, bytes as f64 / bound.time_us(bytes) / 1e3 * coll.bus_factor(n)))
            .collect();
        series.push(plot::Series { label: "bound".into(), points: bound_points, dashed: true });
        let title = format!("{} on {} ({} ranks): predicted bus bandwidth", coll, topo.name(), n);
        std::fs::write(path, plot::svg_of(&series, &title))
            .map_err(|e| Error::Io { context: format!("writing {path}"), source: e })?;
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

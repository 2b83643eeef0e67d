//! # collbench
//!
//! topoccl's tools, kept out of the library crate: `collbench`, an nccl-tests-style bandwidth
//! sweep of topoccl's collectives, and [`emu`], the network emulator `collbench --emulate`
//! builds machines with.
//!
//! Run plainly, it spawns `-n` ranks on this machine ([`launch`]); under mpirun, srun or
//! torchrun it is one rank of the launched job. Every rank checks each size against a
//! reference ([`check`]) and times it ([`measure`]); rank 0 prints nccl-tests' table
//! ([`table`]) and can write JSON, CSV and an SVG plot ([`plot`]). `--simulate` predicts
//! instead of running ([`simulate`]); `--compare-sim` prints both side by side.

pub mod check;
pub mod detect;
pub mod emu;
pub mod emulate;
pub mod error;
pub mod first_call;
pub mod launch;
pub mod measure;
pub mod plan;
pub mod plot;
pub mod report;
pub mod simulate;
pub mod sizes;
pub mod table;

use std::io::Write;

use clap::Parser;
use topoccl_synth::topology;

use crate::error::{Error, Result};
use launch::Role;
use plan::SweepSpec;
use topoccl::{Config, TransportPolicy};

/// Command-line arguments (nccl-tests' flags where they exist; `-n` is the number of local
/// ranks to spawn, nccl-tests' iteration count is `--iters`/`-N`).
#[derive(Debug, Parser)]
#[command(name = "collbench", version, about = "Bandwidth sweep of topoccl collectives (nccl-tests style)")]
pub struct Args {
    /// Ranks to spawn on this machine (ignored under mpirun/srun/torchrun, which say how many).
    #[arg(short = 'n', long = "nranks", default_value_t = 2)]
    pub nranks: u32,
    /// Timed iterations per size (nccl-tests' -n).
    #[arg(short = 'N', long = "iters", default_value_t = 20)]
    pub iters: u32,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub warmup: u32,
    /// Check results against a reference (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u32,
    /// nccl-tests' blocking flag; topoccl's calls always complete before returning, so both
    /// values time the same thing.
    #[arg(short = 'z', long = "blocking", default_value_t = 0)]
    pub blocking: u32,
    /// Time reported: 0 rank 0's, 1 the mean over ranks, 2 the minimum, 3 the maximum.
    #[arg(short = 'a', long = "average", default_value_t = 1)]
    pub average: u32,
    /// Predict with the simulator instead of running ranks.
    #[arg(long)]
    pub simulate: bool,
    /// Print the simulator's prediction beside each measured row (on --topology, default the
    /// communicator's own model of the ranks).
    #[arg(long)]
    pub compare_sim: bool,
    /// Topology: a built-in machine (dgx1, dgx-a100, …), a family (torus2d:8x8, cluster:64x8),
    /// or a .toml file; append [0,1,3,6] for a subset of ranks. `detect` asks NVML which machine
    /// this is, prints what it found and uses it (the host model where there is no NVML).
    /// --simulate defaults to dgx1; on real ranks it is the machine the tuner reasons about (as
    /// TOPOCCL_TOPOLOGY).
    #[arg(long)]
    pub topology: Option<String>,
    /// Run the ranks on TOPOLOGY built as a real network on this machine (root: one network
    /// namespace per node, a veth pair per link shaped with tc, routed as the simulator routes);
    /// torn down when the run ends. -n is the topology's rank count. With --simulate: predict
    /// the machine as emulated.
    #[arg(long, value_name = "TOPOLOGY")]
    pub emulate: Option<String>,
    /// (--emulate) Emulated Mbit/s per GB/s of modelled bandwidth (default: the fastest link
    /// at 400 Mbit/s).
    #[arg(long, value_name = "MBIT_PER_GBPS")]
    pub emulate_scale: Option<f64>,
    /// Algorithm(s), comma-separated: auto (topoccl's choice) or names; with --simulate also
    /// `all`.
    #[arg(long, default_value = "auto")]
    pub algo: String,
    /// Transport(s), comma-separated: auto, tcp, shm, ib. Without it, the library's own
    /// setting: `TOPOCCL_TRANSPORT` (default auto).
    #[arg(long)]
    pub transport: Option<String>,
    /// Collective(s), comma-separated: all_reduce, reduce_scatter, all_gather, broadcast,
    /// reduce, all_to_all, sendrecv, or all.
    #[arg(long, default_value = "all_reduce")]
    pub collective: String,
    /// Minimum size in bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "32M")]
    pub min_bytes: String,
    /// Maximum size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
    pub max_bytes: String,
    /// Multiply the size by this factor between steps.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub step_factor: u64,
    /// Add this many bytes between steps (overrides -f).
    #[arg(short = 'i', long = "stepbytes", default_value = "0")]
    pub step_bytes: String,
    /// Datatype(s), comma-separated, or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub datatype: String,
    /// Reduction operator(s), comma-separated, or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Root rank of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: u32,
    /// (--simulate) Chunks per block for pipelining (0: each algorithm's default).
    #[arg(long, default_value_t = 0)]
    pub pipeline: u32,
    /// (--simulate) Channels (rings, tree pairs); 0: each algorithm's default.
    #[arg(long, default_value_t = 0)]
    pub channels: u32,
    /// (--simulate) Per-message software overhead the simulator adds, µs.
    #[arg(long, default_value_t = 0.0)]
    pub sim_overhead_us: f64,
    /// (--simulate) Time a rank's engine spends posting each message, µs (serialized per rank:
    /// a CPU executor; 0 for GPUs, which post in parallel).
    #[arg(long, default_value_t = 0.0)]
    pub sim_message_us: f64,
    /// (--simulate) The `auto` rows give the tuner's own price of its choice (a closed form at
    /// scale, else its simulation) instead of simulating the choice again: a cluster too large to
    /// simulate in a sweep (`cluster:512x8`) is decided, and priced, in seconds.
    #[arg(long)]
    pub auto_priced: bool,
    /// (--simulate) Instead of the sweep, the tuner's first call of each size: the quick
    /// choice's deciding time and price against the full decision's, and the goal (first call
    /// within twice the steady time plus 1 ms). Cold: no disk cache is read.
    #[arg(long)]
    pub first_call: bool,
    /// (--simulate) Flows between the same two ranks share one fair share of a link, as over
    /// topoccl's one connection per peer (the runtime's model; GPUs share per flow).
    #[arg(long)]
    pub sim_pair_sharing: bool,
    /// (--simulate) Eager sends through one FIFO queue per rank pair of at most BYTES, as
    /// topoccl's executor sends (the runtime's model, with its `TOPOCCL_MAX_BACKLOG`).
    #[arg(long, value_name = "BYTES", value_parser = sizes::parse_size)]
    pub sim_pair_queue: Option<u64>,
    /// Write JSON to FILE (or, with no FILE, to standard output instead of the table).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<String>,
    /// Write the rows as CSV to FILE.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<String>,
    /// Draw bus bandwidth against size as SVG into FILE.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<String>,
}

fn write_file(path: &str, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::Io { context: format!("writing {path}"), source: e })
}

/// Runs collbench; returns the process exit code (0, 1 for an error a rank or the launcher
/// reported, [`launch::WRONG_RESULTS`] for wrong results).
pub fn run(args: &Args, out: &mut dyn Write) -> Result<i32> {
    if args.simulate {
        simulate::run(args, out)?;
        return Ok(0);
    }
    let plan = SweepSpec::parse(args)?;
    if let Some(spec) = &args.emulate {
        if !emulate::is_emulated_rank() {
            return emulate::run(args, spec, out);
        }
    }
    let chosen = detect::choose(args.topology.as_deref())?;
    let topo = chosen.topology;
    let mut config = Config::from_env()?;
    config.transport = plan.transports[0];
    // The tuner reasons about the machine named or detected (a rank i of the topology is rank
    // i here), or the host model where detection found nothing.
    if args.topology.is_some() {
        config.topology = chosen.setting;
    }
    let json_to_stdout = args.json.as_deref() == Some("-");
    match launch::role(args.nranks, &config)? {
        Role::Spawn(n) => {
            if let Some(report) = &chosen.report {
                detect::print(report, json_to_stdout, out)?;
            }
            if plan.root >= n {
                return Err(Error::InvalidArgument(format!("root {} out of range for {n} ranks", plan.root)));
            }
            if plan.transports.contains(&TransportPolicy::Ib) {
                if let Err(why) = topoccl::comm::rdma_port(&config) {
                    return Err(Error::InvalidArgument(format!(
                        "TOPOCCL_TRANSPORT=ib, but there is no RDMA port: {why}"
                    )));
                }
            }
            if let Some(t) = &topo {
                if t.nranks() != n as usize {
                    let hint = match args.topology.as_deref() {
                        Some(spec) if topoccl::detect::names_detection(spec) && n >= 1 => {
                            format!(" (give -n {}, or a subset: --topology detect[0-{}])", t.nranks(), n - 1)
                        }
                        _ => String::new(),
                    };
                    return Err(Error::InvalidArgument(format!(
                        "topology {} has {} ranks, but -n is {n}{hint}",
                        t.name(),
                        t.nranks()
                    )));
                }
            }
            launch::spawn(n)
        }
        Role::Rank(comm, how, own_stdout) => {
            let rank = comm.rank();
            // Under a launcher every rank is a process of its own: rank 0 tells.
            if let (Some(report), false, 0) = (&chosen.report, own_stdout, rank) {
                detect::print(report, json_to_stdout, out)?;
            }
            let progress = own_stdout && measure::stdout_is_terminal();
            match run_rank(args, &plan, topo, *comm, &config, (how, progress), out) {
                Ok(code) => Ok(code),
                Err(e) => {
                    // One write: the ranks share the launcher's standard error, and a line
                    // written in pieces interleaves with another rank's.
                    let line = format!("collbench: rank {rank}: {e}\n");
                    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
                    Ok(1)
                }
            }
        }
    }
}

fn run_rank(
    args: &Args,
    plan: &SweepSpec,
    topo: Option<topology::Topology>,
    comm: topoccl::Communicator,
    config: &Config,
    (how, progress): (String, bool),
    out: &mut dyn Write,
) -> Result<i32> {
    let n = comm.nranks();
    if plan.root >= n {
        return Err(Error::InvalidArgument(format!("root {} out of range for {n} ranks", plan.root)));
    }
    let topology = if args.compare_sim {
        let t = match topo {
            Some(t) => t,
            None => topology::resolve(&format!("full:{n}"))?,
        };
        if t.nranks() != n as usize {
            return Err(Error::InvalidArgument(format!("topology {} has {} ranks, the job {n}", t.name(), t.nranks())));
        }
        Some(t)
    } else {
        None
    };
    let time = ["rank 0's time", "mean time over ranks", "minimum time over ranks", "maximum time over ranks"];
    let mode = format!(
        "measured on {how}; {} iterations after {} warm-up, check {}, {}{}",
        plan.iters,
        plan.warmup,
        if plan.check { "on" } else { "off" },
        time[plan.average as usize],
        topology.as_ref().map(|t| format!("; predictions on topology {}", t.name())).unwrap_or_default()
    );
    let me = comm.rank();
    let json_to_stdout = args.json.as_deref() == Some("-");
    let mut sink = std::io::sink();
    let table_out: &mut dyn Write = if me == 0 && !json_to_stdout { out } else { &mut sink };
    let progress = progress && me == 0 && !json_to_stdout;
    let report = measure::run(
        plan,
        comm,
        config,
        measure::Output {
            out: table_out,
            progress,
            topology: topology.map(|t| (t, topoccl::comm::runtime_sim_config(config))),
        },
        mode,
    )?;
    if me == 0 {
        if let Some(path) = &args.json {
            if path == "-" {
                println!("{}", report.json());
            } else {
                write_file(path, &report.json())?;
            }
        }
        if let Some(path) = &args.csv {
            write_file(path, &report.csv())?;
        }
        if let Some(path) = &args.plot {
            let title = format!("{} ranks: bus bandwidth (out-of-place)", report.nranks);
            write_file(path, &plot::svg(&report, &title))?;
        }
    }
    Ok(if report.wrong() > 0 { launch::WRONG_RESULTS } else { 0 })
}

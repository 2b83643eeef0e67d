//! What a sweep will do, parsed and checked from the arguments before any rank starts (so bad
//! input fails in one line, once).

use topoccl_synth::registry::Registry;

use super::sizes;
use super::Args;
use crate::error::{Error, Result};
use topoccl::comm::TransportPolicy;
use topoccl::types::{Dtype, ReduceOp};
use topoccl::Collective;

/// What one row group measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bench {
    /// A collective (rooted ones with root 0 here; the sweep's root is set when it runs).
    Collective(Collective),
    /// nccl-tests' sendrecv: every rank sends to the next and receives from the previous.
    SendRecv,
}

impl Bench {
    pub fn name(self) -> &'static str {
        match self {
            Bench::Collective(k) => k.name(),
            Bench::SendRecv => "sendrecv",
        }
    }

    pub fn reduces(self) -> bool {
        matches!(self, Bench::Collective(k) if k.reduces())
    }

    /// nccl-tests' bus bandwidth factor.
    pub fn bus_factor(self, n: u32) -> f64 {
        match self {
            Bench::Collective(k) => k.bus_factor(n),
            Bench::SendRecv => 1.0,
        }
    }

    /// Blocks of `count` elements the size column counts (n for the per-rank collectives).
    pub fn size_blocks(self, n: u32) -> u64 {
        match self {
            Bench::Collective(k) => {
                let (i, o) = k.blocks(n);
                i.max(o) as u64
            }
            Bench::SendRecv => 1,
        }
    }
}

/// The sizes `-b`, `-e`, `-f` and `-i` ask for.
pub fn sizes_of(args: &Args) -> Result<Vec<u64>> {
    sizes::sweep(
        sizes::parse_size(&args.min_bytes)?,
        sizes::parse_size(&args.max_bytes)?,
        args.step_factor,
        sizes::parse_size(&args.step_bytes)?,
    )
}

/// The parsed sweep.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    pub sizes: Vec<u64>,
    pub benches: Vec<Bench>,
    pub dtypes: Vec<Dtype>,
    pub ops: Vec<ReduceOp>,
    /// `auto` or algorithm names.
    pub algos: Vec<String>,
    pub transports: Vec<TransportPolicy>,
    pub iters: u32,
    pub warmup: u32,
    pub check: bool,
    /// nccl-tests' `-a`: 0 rank 0's time, 1 the mean, 2 the minimum, 3 the maximum over ranks.
    pub average: u32,
    pub root: u32,
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

impl SweepSpec {
    pub fn parse(args: &Args) -> Result<SweepSpec> {
        let sizes = sizes_of(args)?;
        let mut benches = Vec::new();
        for c in list(&args.collective) {
            match c {
                "all" => {
                    benches.extend(Collective::ALL.map(Bench::Collective));
                    benches.push(Bench::SendRecv);
                }
                "sendrecv" | "send_recv" => benches.push(Bench::SendRecv),
                other => benches.push(Bench::Collective(Collective::parse(other, 0).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "unknown collective `{other}` (all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, sendrecv, all)"
                    ))
                })?)),
            }
        }
        let dtypes = if args.datatype == "all" {
            Dtype::ALL.to_vec()
        } else {
            list(&args.datatype).map(str::parse).collect::<topoccl::Result<Vec<Dtype>>>()?
        };
        let ops = if args.op == "all" {
            ReduceOp::ALL.to_vec()
        } else {
            list(&args.op).map(str::parse).collect::<topoccl::Result<Vec<ReduceOp>>>()?
        };
        let registry = Registry::builtin();
        let algos: Vec<String> = list(&args.algo).map(str::to_string).collect();
        for a in &algos {
            if a != "auto" && registry.get(a).is_err() {
                return Err(Error::InvalidArgument(format!(
                    "unknown algorithm `{a}` (auto, {})",
                    registry.names().join(", ")
                )));
            }
        }
        // Only a `--transport` given overrides `TOPOCCL_TRANSPORT`, as the library documents it.
        let transports = match &args.transport {
            Some(t) => list(t).map(str::parse).collect::<topoccl::Result<Vec<TransportPolicy>>>()?,
            None => vec![topoccl::Config::from_env()?.transport],
        };
        if benches.is_empty() || dtypes.is_empty() || ops.is_empty() || algos.is_empty() || transports.is_empty() {
            return Err(Error::InvalidArgument(
                "empty list of collectives, types, ops, algorithms or transports".into(),
            ));
        }
        if args.iters == 0 {
            return Err(Error::InvalidArgument("iterations (--iters) must be at least 1".into()));
        }
        if args.average > 3 {
            return Err(Error::InvalidArgument(format!(
                "-a {}: expected 0 (rank 0), 1 (mean), 2 (min) or 3 (max)",
                args.average
            )));
        }
        Ok(SweepSpec {
            sizes,
            benches,
            dtypes,
            ops,
            algos,
            transports,
            iters: args.iters,
            warmup: args.warmup,
            check: args.check != 0,
            average: args.average,
            root: args.root,
        })
    }

    /// Whether algorithm `algo` builds `bench` (auto builds everything; send/recv has none).
    pub fn builds(algo: &str, bench: Bench) -> bool {
        match bench {
            Bench::SendRecv => true,
            Bench::Collective(k) => algo == "auto" || Registry::builtin().get(algo).is_ok_and(|g| g.supports(k)),
        }
    }
}

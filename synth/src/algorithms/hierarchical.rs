//! Two-level collectives for multi-node machines. All-reduce: reduce-scatter inside each host (fast links),
//! all-reduce of each block across hosts among the ranks holding it (one slow hop per block, on
//! the rank's own NIC: every NIC of a host carries its share), all-gather inside each host.
//! Inter-host traffic is 2(H−1)/H of the data per rank-block rather than a flat ring's crossing
//! of every slow link by every chunk.
//!
//! The data is cut into pieces that run the three phases as a pipeline: each phase has its own
//! channel, and piece p's inter-host all-reduce waits only for piece p's reduce-scatter on the
//! same rank, so while the NICs carry piece p the host's switch reduces piece p+1 and gathers
//! piece p−1. Without it the phases add up (61 % of the bound on a cluster of 64 DGX-A100
//! nodes); with it the time approaches the slower phase's alone.
//!
//! All-gather runs the same way without the reduction: each rank's piece goes round its rail
//! first (every NIC carries (H−1)/n of the buffer, what the host cut allows, where a flat ring
//! sends (n−1)/n through some NIC), then inside each host. Reduce-scatter is its mirror image:
//! reduce inside each host, then round each rail.

use super::hier_doubling;
use super::rails::HostLayout;
use super::ring::{all_gather_round, all_reduce_round, reduce_scatter_round, ring_edges};
use crate::error::Result;
use crate::generate::{unsupported, Request, ScheduleGenerator};
use crate::schedule::{Collective, Rank, Schedule, ScheduleBuilder, Slot, StepRef};
use crate::sim::lockstep::{pass_us, Lockstep};

/// The hierarchical collectives, with rings along the rails (`hier`: any host count, H−1 hops
/// per pass) or recursive halving/doubling along them (`hier-rhd`, built in
/// [`hier_doubling`]: the same bytes in log₂H exchanges, for a power-of-two host count).
/// Across 64 hosts at mid sizes a ring's 63 hops per pass are most of the time.
pub struct Hierarchical {
    pub halving_doubling: bool,
}

/// Pieces in flight when the request leaves the depth to the generator: enough that the first
/// and last pieces' lone phases are a small part of the whole.
const DEFAULT_PIECES: u32 = 16;

/// The channels of the intra-host phases; piece p's inter-host all-reduce runs on channel
/// `INTER + p mod k` for k inter-host channels (the request's channels, by default
/// [`DEFAULT_INTER_CHANNELS`], at most one per piece): pieces on one channel pay the rings' latency across
/// the hosts one after another, pieces on channels side by side pay it about once but share
/// the NICs until the last of them is done, which delays every piece's gather.
const INTRA_REDUCE: u32 = 0;
const INTRA_GATHER: u32 = 1;
const INTER: u32 = 2;
/// Inter-host channels by default: on clusters of 8 and 64 DGX-A100-like nodes, the depth that
/// is within 2 points of the best of 1–16 channels at 1 GiB on both (the tuner prices others).
const DEFAULT_INTER_CHANNELS: u32 = 4;

impl Hierarchical {
    /// Pieces and inter-host channels: the request's, or this variant's defaults where it
    /// leaves them open (pipeline 1, channels 0); at most one channel per piece.
    fn knobs(&self, req: &Request) -> (u32, u32) {
        let (pieces, channels) =
            if self.halving_doubling { hier_doubling::DEFAULTS } else { (DEFAULT_PIECES, DEFAULT_INTER_CHANNELS) };
        let pieces = if req.pipeline > 1 { req.pipeline } else { pieces };
        let channels = if req.channels > 0 { req.channels } else { channels };
        (pieces, channels.clamp(1, pieces))
    }
}

impl ScheduleGenerator for Hierarchical {
    fn name(&self) -> &'static str {
        if self.halving_doubling {
            "hier-rhd"
        } else {
            "hier"
        }
    }
    fn describe(&self) -> &'static str {
        if self.halving_doubling {
            "hierarchical with recursive halving-doubling across hosts (power-of-two host counts)"
        } else {
            "hierarchical: intra-host reduce-scatter, inter-host all-reduce per NIC, intra-host all-gather, pipelined"
        }
    }
    fn supports(&self, c: Collective) -> bool {
        matches!(c, Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter)
    }
    fn channel_variants(&self) -> &'static [u32] {
        &[1, 2, 8]
    }

    /// `hier-rhd`: `hier_doubling::estimate`; `hier`'s all-gather and reduce-scatter:
    /// `ring_rails_estimate`. `hier`'s all-reduce as a pipeline of three lock-step stages per
    /// piece, all on the wire at once (their flows share the links): the intra-host
    /// reduce-scatter and all-gather (m−1 steps each, one piece at a time on their channel)
    /// and the ring all-reduce of every rail (2(H−1) steps; k pieces side by side on the
    /// inter-host channels). The pipeline takes its fill plus the slowest stage once per piece
    /// it serves.
    fn estimate(&self, req: &Request, bytes: u64, model: &mut Lockstep) -> Option<f64> {
        let layout = HostLayout::alike(req.topology).ok()?;
        if self.halving_doubling {
            let (pieces, channels) = self.knobs(req);
            // Pieces side by side arrive together: as one piece per channel's worth.
            return hier_doubling::estimate(&layout, req.collective, bytes, pieces / channels, model);
        }
        if req.collective != Collective::AllReduce {
            return ring_rails_estimate(&layout, req.collective, self.knobs(req), bytes, model);
        }
        let (m, h) = (layout.per_host(), layout.hosts());
        if h < 2 || m < 2 {
            return None;
        }
        let (pieces, k) = self.knobs(req);
        let (pieces, k) = (pieces as usize, k as usize);
        let rails: Vec<Vec<Rank>> = (0..m).map(|j| layout.rail(j)).collect();
        // Intra-host rings (reduce-scatter and all-gather), then k copies of the rails' flows.
        let mut flows: Vec<(Rank, Rank)> = Vec::new();
        for _ in 0..2 {
            flows.extend(layout.members.iter().flat_map(|g| ring_edges(g)));
        }
        let intra = flows.len();
        let rail_flows: Vec<(Rank, Rank)> = rails.iter().flat_map(|r| ring_edges(r)).collect();
        for _ in 0..k {
            flows.extend(&rail_flows);
        }
        let round = model.round(&flows)?;
        let block = bytes as f64 / (pieces * m) as f64;
        let per_host = |first: usize| {
            (0..h)
                .map(|g| pass_us(&round.part(first + g * m..first + (g + 1) * m), block, m - 1, true))
                .reduce(f64::max)
        };
        let (reduce, gather) = (per_host(0)?, per_host(h * m)?);
        let part = block / h as f64;
        let inter = (0..m)
            .map(|j| {
                let rail = round.part(intra + j * h..intra + (j + 1) * h);
                pass_us(&rail, part, 2 * (h - 1), true)
            })
            .reduce(f64::max)?;
        let rounds_inter = pieces.div_ceil(k) as f64;
        let fill = reduce + inter + gather;
        let p = pieces as f64 - 1.0;
        Some((fill + p * reduce).max(fill + (rounds_inter - 1.0) * inter).max(fill + p * gather))
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        let coll = req.collective;
        if !self.supports(coll) {
            return Err(unsupported(
                self.name(),
                coll,
                "the hierarchical algorithms build all-reduce, all-gather and reduce-scatter",
            ));
        }
        let topo = req.topology;
        // Every host in the first host's bandwidth-maximising order (hosts of a cluster are
        // alike): position j of every host is rail j.
        let layout = HostLayout::alike(topo).map_err(|why| unsupported("hier", coll, &why))?;
        let hosts = &layout.members;
        let m = layout.per_host();
        let h = hosts.len() as u32;
        if self.halving_doubling && !h.is_power_of_two() {
            return Err(unsupported(self.name(), coll, &format!("{h} hosts is not a power of two")));
        }
        let (pieces, inter_channels) = self.knobs(req);
        let n = topo.nranks() as u32;
        if self.halving_doubling {
            let build = match coll {
                Collective::AllGather => hier_doubling::all_gather,
                Collective::ReduceScatter => hier_doubling::reduce_scatter,
                _ => hier_doubling::all_reduce,
            };
            return Ok(build(self.name(), &layout, pieces, inter_channels));
        }
        match coll {
            Collective::AllGather => return Ok(all_gather(self.name(), &layout, pieces, inter_channels)),
            Collective::ReduceScatter => return Ok(reduce_scatter(self.name(), &layout, pieces, inter_channels)),
            _ => {}
        }
        // Piece p, local block j, inter-host part t: chunk (p·m + j)·h + t.
        let mut b = ScheduleBuilder::new(self.name(), coll, n, pieces * m as u32 * h);
        b.in_place(true);
        for p in 0..pieces {
            let at = |j: usize| (p * m as u32 + j as u32) * h;
            let inter = INTER + p % inter_channels;
            // What the next phase of this piece waits for, per rank.
            let mut ready: Vec<Option<StepRef>> = vec![None; n as usize];
            // 1. Reduce-scatter inside each host: position j ends with block j.
            for g in hosts {
                reduce_scatter_round(&mut b, g, INTRA_REDUCE, h, &|j| Slot::input(at(j)), &|j| Slot::output(at(j)));
                for &r in g {
                    ready[r as usize] = b.last_step(r, INTRA_REDUCE);
                }
            }
            // 2. All-reduce block j across hosts among the ranks at position j.
            for j in 0..m {
                let rail = layout.rail(j);
                let first: Vec<StepRef> = rail.iter().map(|&r| b.next_step(r, inter)).collect();
                let part = |t: usize| Slot::output(at(j) + t as u32);
                all_reduce_round(&mut b, &rail, inter, 1, &part, &part);
                wait_for_previous_phase(&mut b, &rail, &first, &mut ready, inter);
            }
            // 3. All-gather inside each host.
            for g in hosts {
                let first: Vec<StepRef> = g.iter().map(|&r| b.next_step(r, INTRA_GATHER)).collect();
                let block = |j: usize| Slot::output(at(j));
                all_gather_round(&mut b, g, INTRA_GATHER, h, &block, &block);
                wait_for_previous_phase(&mut b, g, &first, &mut ready, INTRA_GATHER);
            }
        }
        Ok(b.build())
    }
}

/// All-gather and reduce-scatter run their H intra-host passes (one per host's pieces) on up to
/// this many channels side by side, after the inter-host channels: one after another they would
/// pay H·(m−1) latencies per piece.
const INTRA_PASS_CHANNELS: u32 = 8;

/// All-gather or reduce-scatter ([`all_gather`], [`reduce_scatter`]) as a two-stage pipeline
/// over the pieces, both stages on the wire at once: each piece's ring round every rail (H−1
/// steps; k pieces side by side on the inter-host channels) and its H intra-host ring passes
/// (m−1 steps each), shared out over [`INTRA_PASS_CHANNELS`] channels that each run their
/// passes one after another, one piece after another.
///
/// All-gather's rails start at once, k pieces a round, and the hosts pass each piece on as its
/// round ends. Reduce-scatter's pieces reach the rails one host stage apart: a rail round that
/// finds the NICs idle runs alone, and only where the rails are the slower stage do k of them
/// share the NICs.
fn ring_rails_estimate(
    layout: &HostLayout,
    coll: Collective,
    (pieces, k): (u32, u32),
    bytes: u64,
    model: &mut Lockstep,
) -> Option<f64> {
    let (m, h) = (layout.per_host(), layout.hosts());
    if h < 2 || m < 2 {
        return None;
    }
    let (pieces, k) = (pieces as usize, k as usize);
    let passes = (INTRA_PASS_CHANNELS as usize).min(h);
    let mut flows: Vec<(Rank, Rank)> = Vec::new();
    for _ in 0..passes {
        flows.extend(layout.members.iter().flat_map(|g| ring_edges(g)));
    }
    let intra = flows.len();
    let rails: Vec<(Rank, Rank)> = (0..m).flat_map(|j| ring_edges(&layout.rail(j)).collect::<Vec<_>>()).collect();
    let chunk = bytes as f64 / (pieces * h * m) as f64;
    // µs of one piece's rail round with `copies` rounds side by side, and the host stage then.
    let mut stages = |copies: usize| -> Option<(f64, f64)> {
        let mut all = flows.clone();
        for _ in 0..copies {
            all.extend(&rails);
        }
        let round = model.round(&all)?;
        let steps = h.div_ceil(passes) * (m - 1);
        let host = (0..h).map(|g| pass_us(&round.part(g * m..(g + 1) * m), chunk, steps, true)).reduce(f64::max)?;
        let rail = (0..m)
            .map(|j| pass_us(&round.part(intra + j * h..intra + (j + 1) * h), chunk, h - 1, true))
            .reduce(f64::max)?;
        Some((host, rail))
    };
    let (host, rail) = stages(k)?;
    if coll == Collective::AllGather {
        let mut host_free = 0.0f64;
        for p in 0..pieces {
            host_free = host_free.max((p / k + 1) as f64 * rail) + host;
        }
        return Some(host_free);
    }
    let (_, alone) = stages(1)?;
    // A rail round's time on the wire per piece: what k side by side add over one alone is
    // k − 1 pieces' bytes. Rounds that reach the rails apart overlap one's latency with
    // another's bytes, so rails that are the slower stage keep the NICs busy.
    let wire = if k > 1 { ((rail - alone) / (k - 1) as f64).clamp(0.0, alone) } else { alone };
    let pieces_f = pieces as f64;
    let host_bound = pieces_f * host + alone;
    let nic_bound = host + pieces_f * wire + (alone - wire);
    let lane_bound = host + pieces.div_ceil(k) as f64 * alone;
    Some(host_bound.max(nic_bound).max(lane_bound))
}

/// All-gather in `pieces` pieces: piece p of rank r is chunk r·pieces + p.
fn all_gather(name: &str, layout: &HostLayout, pieces: u32, inter_channels: u32) -> Schedule {
    let hosts = &layout.members;
    let h = layout.hosts() as u32;
    let n = h * layout.per_host() as u32;
    let intra = |t: u32| inter_channels + t % INTRA_PASS_CHANNELS.min(h);
    let mut b = ScheduleBuilder::new(name, Collective::AllGather, n, n * pieces);
    b.in_place(true);
    let chunk = |r: Rank, p: u32| r * pieces + p;
    for p in 0..pieces {
        let inter = p % inter_channels;
        let mut ready: Vec<Option<StepRef>> = vec![None; n as usize];
        // 1. Round each rail: position j of every host gets piece p of every rank at position j.
        for j in 0..layout.per_host() {
            let rail = layout.rail(j);
            all_gather_round(&mut b, &rail, inter, 1, &|_| Slot::input(p), &|t| Slot::output(chunk(rail[t], p)));
            for &r in &rail {
                ready[r as usize] = b.last_step(r, inter);
            }
        }
        // 2. Inside each host, one ring pass per host t: position j passes on rank (t, j)'s piece.
        for g in hosts {
            for (t, source) in hosts.iter().enumerate() {
                let ch = intra(t as u32);
                let first: Vec<StepRef> = g.iter().map(|&r| b.next_step(r, ch)).collect();
                let block = |j: usize| Slot::output(chunk(source[j], p));
                all_gather_round(&mut b, g, ch, 1, &block, &block);
                for (&r, &at) in g.iter().zip(&first) {
                    let pushed = b.last_step(r, ch).is_some_and(|last| last.step >= at.step);
                    if let (true, Some(on)) = (pushed, ready[r as usize]) {
                        b.depend(r, at, on);
                    }
                }
            }
        }
    }
    b.build()
}

/// Reduce-scatter in `pieces` pieces: rank r ends with chunks r·pieces.. of the sum. Host sums
/// wait in scratch: chunk t·pieces + p holds position j's share of rank (t, j)'s piece p.
fn reduce_scatter(name: &str, layout: &HostLayout, pieces: u32, inter_channels: u32) -> Schedule {
    let hosts = &layout.members;
    let h = layout.hosts() as u32;
    let n = h * layout.per_host() as u32;
    let passes = INTRA_PASS_CHANNELS.min(h);
    let mut b = ScheduleBuilder::new(name, Collective::ReduceScatter, n, n * pieces);
    b.reserve_scratch(h * pieces);
    b.in_place(true);
    let chunk = |r: Rank, p: u32| r * pieces + p;
    for p in 0..pieces {
        let inter = p % inter_channels;
        // 1. Inside each host, one reduce-scatter per host t: position j ends with the host's
        //    sum of rank (t, j)'s piece.
        for g in hosts {
            for (t, target) in hosts.iter().enumerate() {
                let t = t as u32;
                let ch = inter_channels + t % passes;
                reduce_scatter_round(&mut b, g, ch, 1, &|j| Slot::input(chunk(target[j], p)), &|_| {
                    Slot::scratch(t * pieces + p)
                });
            }
        }
        // 2. Round each rail: position t ends with the total of rank (t, j)'s piece, once
        //    every intra-host pass of this piece is done on the rank.
        for j in 0..layout.per_host() {
            let rail = layout.rail(j);
            let first: Vec<StepRef> = rail.iter().map(|&r| b.next_step(r, inter)).collect();
            let part = |t: usize| Slot::scratch(t as u32 * pieces + p);
            reduce_scatter_round(&mut b, &rail, inter, 1, &part, &|_| Slot::output(p));
            for (&r, &at) in rail.iter().zip(&first) {
                if b.last_step(r, inter).is_some_and(|last| last.step >= at.step) {
                    for c in 0..passes {
                        if let Some(on) = b.last_step(r, inter_channels + c) {
                            b.depend(r, at, on);
                        }
                    }
                }
            }
        }
    }
    b.build()
}

/// Makes the first step each rank of `ranks` just pushed on `channel` (at `first`) wait for
/// its `ready` step, and makes the rank's last step on `channel` the next phase's `ready`.
/// A rank that pushed nothing (a phase over one rank) passes its `ready` on.
fn wait_for_previous_phase(
    b: &mut ScheduleBuilder,
    ranks: &[Rank],
    first: &[StepRef],
    ready: &mut [Option<StepRef>],
    channel: u32,
) {
    for (&r, &at) in ranks.iter().zip(first) {
        let Some(last) = b.last_step(r, channel) else { continue };
        if last.step < at.step {
            continue;
        }
        if let Some(on) = ready[r as usize] {
            b.depend(r, at, on);
        }
        ready[r as usize] = Some(last);
    }
}

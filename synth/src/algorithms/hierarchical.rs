//! Two-level all-reduce for multi-node machines: reduce-scatter inside each host (fast links),
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

use super::rails::HostLayout;
use super::ring::{all_gather_round, all_reduce_round, reduce_scatter_round};
use super::{unsupported, Request, ScheduleGenerator};
use crate::error::Result;
use crate::schedule::{Collective, Rank, Schedule, ScheduleBuilder, Slot, StepRef};

pub struct Hierarchical;

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

impl ScheduleGenerator for Hierarchical {
    fn name(&self) -> &'static str {
        "hier"
    }
    fn describe(&self) -> &'static str {
        "hierarchical: intra-host reduce-scatter, inter-host all-reduce per NIC, intra-host all-gather, pipelined"
    }
    fn supports(&self, c: Collective) -> bool {
        c == Collective::AllReduce
    }
    fn channel_variants(&self) -> &'static [u32] {
        &[1, 2, 8]
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        let coll = req.collective;
        if !self.supports(coll) {
            return Err(unsupported("hier", coll, "the hierarchical algorithm builds all-reduce only"));
        }
        let topo = req.topology;
        // Every host in the first host's bandwidth-maximising order (hosts of a cluster are
        // alike): position j of every host is rail j.
        let layout = HostLayout::alike(topo).map_err(|why| unsupported("hier", coll, &why))?;
        let hosts = &layout.members;
        let m = layout.per_host();
        let h = hosts.len() as u32;
        let pieces = if req.pipeline > 1 { req.pipeline } else { DEFAULT_PIECES };
        let inter_channels = match req.channels {
            0 => DEFAULT_INTER_CHANNELS,
            c => c,
        }
        .clamp(1, pieces);
        let n = topo.nranks() as u32;
        // Piece p, local block j, inter-host part t: chunk (p·m + j)·h + t.
        let mut b = ScheduleBuilder::new("hier", coll, n, pieces * m as u32 * h);
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
                let rail: Vec<Rank> = hosts.iter().map(|g| g[j]).collect();
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

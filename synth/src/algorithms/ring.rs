//! Ring algorithms: reduce-scatter and all-gather around a ring (all-reduce is both, fused at
//! the turn), and pipelined chains for broadcast and reduce.
//!
//! The round functions work on any ring of ranks and any block → slot mapping, so that composite
//! algorithms (hierarchical) reuse them on sub-rings.

use super::rails::HostLayout;
use super::ring_order;
use crate::error::Result;
use crate::generate::{unsupported, Request, ScheduleGenerator};
use crate::schedule::{Collective, Op, Rank, Schedule, ScheduleBuilder, Slot};
use crate::sim::lockstep::{pass_us, Lockstep};

/// NCCL-style rings over a topology-aware rank order; with several channels, odd channels run
/// the ring the other way round so that both directions of every link carry data. On a machine
/// of several alike hosts each channel enters the hosts at its own rank ([`HostLayout::ring`]),
/// so the channels together use every NIC, and there are as many channels as ranks per host.
pub struct Ring;

fn neighbours(order: &[Rank], i: usize) -> (Rank, Rank, Rank) {
    let m = order.len();
    (order[(i + m - 1) % m], order[i], order[(i + 1) % m])
}

/// Every edge of the ring `order`, position i to i + 1 (the flows of one lock-step round).
pub(crate) fn ring_edges(order: &[Rank]) -> impl Iterator<Item = (Rank, Rank)> + '_ {
    let m = order.len();
    (0..m).map(move |i| (order[i], order[(i + 1) % m]))
}

/// Block index `i - d` modulo the ring size.
fn back(i: usize, d: usize, m: usize) -> usize {
    (i + m * (d / m + 1) - d) % m
}

/// The first m−1 reduce-scatter steps of ring position `i` (m ≥ 2): send block i−1, then pass
/// on block i−1−s reduced with the local copy; the caller adds the last step, which receives
/// the rest of block `i`.
fn reduce_scatter_prefix(
    b: &mut ScheduleBuilder,
    order: &[Rank],
    i: usize,
    channel: u32,
    count: u32,
    inp: &dyn Fn(usize) -> Slot,
) {
    let m = order.len();
    let (prev, me, next) = neighbours(order, i);
    b.push(me, channel, Op::Send { to: next, src: inp(back(i, 1, m)) }, count);
    for s in 1..m - 1 {
        b.push(me, channel, Op::RecvReduceSend { from: prev, to: next, src: inp(back(i, 1 + s, m)) }, count);
    }
}

/// One all-reduce pass: ring position `i` ends with block `i` reduced after the reduce-scatter
/// half, then every block travels once more round the ring. `inp(b)`/`out(b)` give block `b`'s
/// slots (the same on every rank). 2(m−1) sends per rank.
pub(crate) fn all_reduce_round(
    b: &mut ScheduleBuilder,
    order: &[Rank],
    channel: u32,
    count: u32,
    inp: &dyn Fn(usize) -> Slot,
    out: &dyn Fn(usize) -> Slot,
) {
    let m = order.len();
    for i in 0..m {
        let (prev, me, next) = neighbours(order, i);
        if m == 1 {
            if inp(0) != out(0) {
                b.push(me, channel, Op::Copy { src: inp(0), dst: out(0) }, count);
            }
            continue;
        }
        reduce_scatter_prefix(b, order, i, channel, count, inp);
        b.push(me, channel, Op::RecvReduceCopySend { from: prev, to: next, src: inp(i), dst: out(i) }, count);
        for t in 1..m - 1 {
            b.push(me, channel, Op::RecvCopySend { from: prev, to: next, dst: out(back(i, t, m)) }, count);
        }
        b.push(me, channel, Op::Recv { from: prev, dst: out((i + 1) % m) }, count);
    }
}

/// One reduce-scatter pass: position `i` ends with block `i` reduced into `dst(i)`.
pub(crate) fn reduce_scatter_round(
    b: &mut ScheduleBuilder,
    order: &[Rank],
    channel: u32,
    count: u32,
    inp: &dyn Fn(usize) -> Slot,
    dst: &dyn Fn(usize) -> Slot,
) {
    let m = order.len();
    for i in 0..m {
        let (prev, me, _) = neighbours(order, i);
        if m == 1 {
            if inp(0) != dst(0) {
                b.push(me, channel, Op::Copy { src: inp(0), dst: dst(0) }, count);
            }
            continue;
        }
        reduce_scatter_prefix(b, order, i, channel, count, inp);
        b.push(me, channel, Op::RecvReduce { from: prev, src: inp(i), dst: dst(i) }, count);
    }
}

/// One all-gather pass: position `i` contributes the block at `own(i)`; every rank ends with
/// block `b` at `out(b)`.
pub(crate) fn all_gather_round(
    b: &mut ScheduleBuilder,
    order: &[Rank],
    channel: u32,
    count: u32,
    own: &dyn Fn(usize) -> Slot,
    out: &dyn Fn(usize) -> Slot,
) {
    let m = order.len();
    for i in 0..m {
        let (prev, me, next) = neighbours(order, i);
        if m > 1 {
            b.push(me, channel, Op::Send { to: next, src: own(i) }, count);
        }
        if own(i) != out(i) {
            b.push(me, channel, Op::Copy { src: own(i), dst: out(i) }, count);
        }
        for s in 1..m.saturating_sub(1) {
            b.push(me, channel, Op::RecvCopySend { from: prev, to: next, dst: out(back(i, s, m)) }, count);
        }
        if m > 1 {
            b.push(me, channel, Op::Recv { from: prev, dst: out((i + 1) % m) }, count);
        }
    }
}

/// The rings of a request's channels: on hosts alike, entering each host at a rank of its own
/// ([`HostLayout::ring`]); elsewhere the bandwidth-maximising order, odd channels reversed.
fn channel_orders(req: &Request) -> Vec<Vec<Rank>> {
    let n = req.nranks();
    let layout = HostLayout::of(req.topology);
    let rings = match (req.channels, &layout) {
        (0, Some(l)) => l.per_host() as u32,
        (0, None) if n > 2 => 2,
        (0, None) => 1,
        (c, _) => c,
    };
    if let Some(l) = layout {
        return (0..rings).map(|c| l.ring(c, rings)).collect();
    }
    let order = ring_order(req.topology);
    (0..rings)
        .map(|c| {
            let mut o = order.clone();
            if c % 2 == 1 {
                o.reverse();
            }
            o
        })
        .collect()
}

impl ScheduleGenerator for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }
    fn describe(&self) -> &'static str {
        "rings over a bandwidth-maximising rank order, both directions (NCCL's ring)"
    }
    fn supports(&self, c: Collective) -> bool {
        !matches!(c, Collective::AllToAll)
    }
    fn channel_variants(&self) -> &'static [u32] {
        &[2, 4]
    }

    /// Every channel's ring moves in lock-step: k passes of its hops (2(n−1) for all-reduce,
    /// n−1 for all-gather and reduce-scatter), each a chunk over every ring edge at once
    /// ([`pass_us`]). Chains (broadcast, reduce) have none: a shallow chain has one hop of each
    /// channel on the wire at a time, not every edge.
    fn estimate(&self, req: &Request, bytes: u64, model: &mut Lockstep) -> Option<f64> {
        let n = req.nranks() as usize;
        let k = req.pipeline.max(1) as usize;
        let steps = match req.collective {
            Collective::AllReduce => k * 2 * (n - 1),
            Collective::AllGather | Collective::ReduceScatter => k * (n - 1),
            _ => return None,
        };
        if n < 2 {
            return None;
        }
        let orders = channel_orders(req);
        let rings = orders.len();
        let edges: Vec<(Rank, Rank)> = orders.iter().flat_map(|o| ring_edges(o)).collect();
        let round = model.round(&edges)?;
        let chunk = bytes as f64 / (n * rings * k) as f64;
        (0..rings).map(|c| pass_us(&round.part(c * n..(c + 1) * n), chunk, steps, true)).reduce(f64::max)
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        let n = req.nranks();
        let orders = channel_orders(req);
        let rings = orders.len() as u32;
        let k = req.pipeline.max(1);
        let rounds = rings * k; // chunks per block
        let coll = req.collective;
        let chunks = match coll {
            Collective::Broadcast { .. } | Collective::Reduce { .. } => rounds,
            _ => n * rounds,
        };
        let mut b = ScheduleBuilder::new("ring", coll, n, chunks);
        b.in_place(true);
        for j in 0..rounds {
            let ch = j % rings;
            let o = &orders[ch as usize];
            // Block of ring position p: the data "owned" by the rank there.
            let blk = |p: usize| o[p] * rounds + j;
            match coll {
                Collective::AllReduce => {
                    all_reduce_round(&mut b, o, ch, 1, &|p| Slot::input(blk(p)), &|p| Slot::output(blk(p)))
                }
                Collective::ReduceScatter => {
                    reduce_scatter_round(&mut b, o, ch, 1, &|p| Slot::input(blk(p)), &|_| Slot::output(j))
                }
                Collective::AllGather => {
                    all_gather_round(&mut b, o, ch, 1, &|_| Slot::input(j), &|p| Slot::output(blk(p)))
                }
                Collective::Broadcast { root } => chain_broadcast(&mut b, o, root, ch, j),
                Collective::Reduce { root } => chain_reduce(&mut b, o, root, ch, j),
                Collective::AllToAll => return Err(unsupported("ring", coll, "use the pairwise algorithm")),
            }
        }
        Ok(b.build())
    }
}

/// Chunk `c` flows root → … → last along the ring.
fn chain_broadcast(b: &mut ScheduleBuilder, order: &[Rank], root: Rank, ch: u32, c: u32) {
    let m = order.len();
    let start = order.iter().position(|&r| r == root).unwrap_or(0);
    let at = |i: usize| order[(start + i) % m];
    if m > 1 {
        b.push(root, ch, Op::Send { to: at(1), src: Slot::input(c) }, 1);
    }
    b.push(root, ch, Op::Copy { src: Slot::input(c), dst: Slot::output(c) }, 1);
    for i in 1..m {
        let op = if i + 1 < m {
            Op::RecvCopySend { from: at(i - 1), to: at(i + 1), dst: Slot::output(c) }
        } else {
            Op::Recv { from: at(i - 1), dst: Slot::output(c) }
        };
        b.push(at(i), ch, op, 1);
    }
}

/// Chunk `c` is reduced along the ring, ending at the root; only the root writes output.
fn chain_reduce(b: &mut ScheduleBuilder, order: &[Rank], root: Rank, ch: u32, c: u32) {
    let m = order.len();
    let start = order.iter().position(|&r| r == root).unwrap_or(0);
    // Position i of the chain: the rank i+1 steps after the root; the root comes last.
    let at = |i: usize| order[(start + 1 + i) % m];
    if m == 1 {
        b.push(root, ch, Op::Copy { src: Slot::input(c), dst: Slot::output(c) }, 1);
        return;
    }
    b.push(at(0), ch, Op::Send { to: at(1), src: Slot::input(c) }, 1);
    for i in 1..m - 1 {
        b.push(at(i), ch, Op::RecvReduceSend { from: at(i - 1), to: at(i + 1), src: Slot::input(c) }, 1);
    }
    b.push(root, ch, Op::RecvReduce { from: at(m - 2), src: Slot::input(c), dst: Slot::output(c) }, 1);
}

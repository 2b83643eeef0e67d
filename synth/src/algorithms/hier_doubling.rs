//! `hier-rhd`: recursive doubling (halving) along each rail across hosts, and a direct
//! exchange inside each host that forwards (reduces) every block the moment it arrives.
//! All-gather and reduce-scatter are built here; all-reduce is reduce-scatter, then
//! all-gather.
//!
//! Across H hosts a ring pays H−1 network latencies one after another; at mid sizes on 64
//! hosts that is as long as the transfer itself. Doubling pays log₂H of them and moves the same
//! bytes: each rank's NIC carries (H−1)/H of the rail's data, what the host cut allows. Inside
//! the host every rank sends each block it holds straight to each other local rank (an
//! NVSwitch carries them all at once), one message per block and peer, so the intra-host phase
//! is one hop deep and runs under the rail's transfers instead of after them.
//!
//! Each rail exchange has its own two channels, one per direction, so a rank's sends never
//! queue behind its receives and a block received is forwarded as soon as it lands.

use super::rails::HostLayout;
use crate::schedule::{Collective, Op, Rank, Schedule, ScheduleBuilder, Slot, StepRef};
use crate::sim::lockstep::Lockstep;

/// Pieces and inter-host channels when the request leaves them open. Pieces let the host
/// forward (all-gather) or reduce (reduce-scatter) one piece while the next is on the wire; on
/// clusters of 8 to 64 DGX-like hosts 4 is within a point of the best depth at 64 MiB and
/// 1 GiB. Pieces side by side on several channels only share the NIC and arrive together.
pub(super) const DEFAULTS: (u32, u32) = (4, 1);

/// µs for all-gather or reduce-scatter of `bytes` (the whole buffer) in `pieces` pieces, in
/// closed form: the rail's log₂H exchanges moving (H−1)/H of the buffer's rail share through
/// each NIC, one after another but each waiting only for its first piece, beside the host's
/// exchange of every block with every local peer. All-gather ends one piece's forwarding
/// after its rail; reduce-scatter starts one host sum's reduction before it. Either ends no
/// earlier than the host's exchange alone. Hosts alike with disjoint insides, so one host's
/// flows stand for all. All-reduce is the two added.
pub(super) fn estimate(
    layout: &HostLayout,
    coll: Collective,
    bytes: u64,
    pieces: u32,
    model: &mut Lockstep,
) -> Option<f64> {
    let (h, m) = (layout.hosts(), layout.per_host());
    let gather = match coll {
        Collective::AllGather => true,
        Collective::ReduceScatter => false,
        // Reduce-scatter, then all-gather (which overlaps it by at most a piece).
        Collective::AllReduce => {
            let reduce = estimate(layout, Collective::ReduceScatter, bytes, pieces, model)?;
            return Some(reduce + estimate(layout, Collective::AllGather, bytes, pieces, model)?);
        }
        _ => return None,
    };
    if h < 2 || m < 2 || !h.is_power_of_two() {
        return None;
    }
    // All-gather sends to every local peer at once (a lane each); reduce-scatter sends to one
    // peer after another on one channel, so one offset stands for all.
    let offsets = if gather { m } else { 2 };
    let host = &layout.members[0];
    let mut flows: Vec<(Rank, Rank)> = Vec::new();
    for (j, &me) in host.iter().enumerate() {
        flows.extend((1..offsets).map(|k| (me, host[(j + k) % m])));
    }
    let intra = flows.len();
    // Every exchange crosses the NICs alike; the first (farthest) one stands for all.
    for (g, members) in layout.members.iter().enumerate() {
        flows.extend(members.iter().zip(&layout.members[g ^ (h / 2)]).map(|(&a, &b)| (a, b)));
    }
    let round = model.round(&flows)?;
    let slowest = |range: std::ops::Range<usize>| {
        let f = &round.flows[range];
        (f.iter().map(|f| f.rate).fold(f64::INFINITY, f64::min), f.iter().map(|f| f.latency_us).fold(0.0, f64::max))
    };
    let ((rate_i, alpha_i), (rate_r, alpha_r)) = (slowest(0..intra), slowest(intra..flows.len()));
    let block = bytes as f64 / (h * m) as f64;
    let piece = block / f64::from(pieces);
    let moved = (h - 1) as f64 * block;
    // Exchanges of 1, 2, … H/2 blocks (all-gather; reduce-scatter the reverse), one after
    // another on the NIC: the next starts when this one's bytes have left and its first
    // piece has come in from the partner.
    let sizes: Vec<f64> = (0..h.trailing_zeros()).map(|l| f64::from(1u32 << l)).collect();
    let sizes = if gather { sizes } else { sizes.into_iter().rev().collect() };
    let (last, earlier) = sizes.split_last()?;
    let starts: f64 = earlier.iter().map(|&s| (s * block / rate_r).max(s * piece / rate_r + alpha_r)).sum();
    let rail = starts + last * block / rate_r + alpha_r + if gather { 0.0 } else { round.local_us(moved) };
    let blocks = (h as u32 * pieces) as f64;
    let peers = (m - 1) as f64;
    // Messages a rank posts one after another, priced at the round's posting cost per flow.
    let per_rank_flows = offsets as f64;
    let posting = round.posting_us / per_rank_flows * ((h - 1) as f64 * f64::from(pieces) + peers * blocks);
    let time = if gather {
        (rail + piece / rate_i + alpha_i).max(h as f64 * block / rate_i + alpha_i)
    } else {
        // The first host sum is every peer's piece in, reduced; the rest stream behind it.
        let first = peers * (piece / rate_i + round.local_us(piece)) + alpha_i;
        let host_sums = blocks * peers * (piece / rate_i + round.local_us(piece)) + alpha_i;
        (first + rail).max(host_sums + alpha_r)
    };
    Some(time + posting)
}

/// One collective's shape: its hosts, pieces and inter-host channels, and the first channel it
/// uses (all-reduce runs reduce-scatter, then all-gather on the channels after it).
struct Plan<'a> {
    layout: &'a HostLayout,
    pieces: u32,
    inter_channels: u32,
    first_channel: u32,
}

impl Plan<'_> {
    /// Channels: `m` intra-host ones (all-gather's offsets 1..m, reduce-scatter's senders),
    /// then [`Self::rail_channels`] per inter-host channel.
    fn channels(&self) -> u32 {
        self.layout.per_host() as u32 + self.rail_channels() * self.inter_channels
    }

    /// Rail channels of one inter-host channel: two per exchange (log₂H of them).
    fn rail_channels(&self) -> u32 {
        2 * self.layout.hosts().trailing_zeros()
    }

    /// The first rail channel of piece `p`.
    fn rail_base(&self, p: u32) -> u32 {
        self.first_channel + self.layout.per_host() as u32 + self.rail_channels() * (p % self.inter_channels)
    }

    /// The channel of a rail message of piece `p` from host `from` to host `to` (partners at one
    /// exchange, `from ^ to` a power of two). Each exchange has its own pair, by direction: on
    /// one pair, a rank whose direction flips from one exchange to the next would queue its
    /// next sends behind its last receives, and pay a network latency per exchange with
    /// nothing on the wire.
    fn rail_channel(&self, p: u32, from: usize, to: usize) -> u32 {
        self.rail_base(p) + 2 * (from ^ to).trailing_zeros() + u32::from(from > to)
    }

    /// All-gather's channel to the local peer at offset `k` (and from the one at −k).
    fn offset_channel(&self, k: usize) -> u32 {
        self.first_channel + k as u32
    }

    /// Reduce-scatter's channel of the blocks local rank `j` sends to its local peers: each rank
    /// sends on its own channel, one peer after another, and receives from peer `i` on channel
    /// `i`, so its sends never wait for a reduction and each peer's blocks are reduced as they
    /// land.
    fn sender_channel(&self, j: usize) -> u32 {
        self.first_channel + j as u32
    }
}

/// Keeps a rank's rail sends in exchange order: the first send of each piece in an exchange
/// waits for the last send of the exchange before on its inter-host channel. Each exchange has
/// its own channels ([`Plan::rail_channel`]), so without this a later exchange's sends would share
/// the NIC with an earlier one's, its blocks would land out of the order the host forwards
/// (reduces) them in, and the host would hold the later ones back.
struct ExchangeOrder {
    /// Per inter-host channel: the last send of the exchange before, and of this one.
    before: Vec<Option<StepRef>>,
    this: Vec<Option<StepRef>>,
}

impl ExchangeOrder {
    fn new(inter_channels: u32) -> ExchangeOrder {
        ExchangeOrder { before: vec![None; inter_channels as usize], this: vec![None; inter_channels as usize] }
    }

    /// Records send `at` of piece `p`; the first of the piece in this exchange waits.
    fn sent(&mut self, b: &mut ScheduleBuilder, me: Rank, p: u32, first: bool, at: StepRef) {
        let lane = p as usize % self.this.len();
        if let (true, Some(on)) = (first, self.before[lane]) {
            b.depend(me, at, on);
        }
        self.this[lane] = Some(at);
    }

    fn next_exchange(&mut self) {
        for (before, this) in self.before.iter_mut().zip(&mut self.this) {
            if this.is_some() {
                *before = this.take();
            }
        }
    }
}

/// A block a rank holds: the host it came from, where it is, and the step that wrote it.
type Held = (usize, Slot, Option<StepRef>);

/// All-gather in `pieces` pieces: piece p of rank r is output chunk r·pieces + p. The hosts
/// must be a power of two.
pub(super) fn all_gather(name: &str, layout: &HostLayout, pieces: u32, inter_channels: u32) -> Schedule {
    let n = (layout.hosts() * layout.per_host()) as u32;
    let mut b = ScheduleBuilder::new(name, Collective::AllGather, n, n * pieces);
    b.in_place(true);
    let plan = Plan { layout, pieces, inter_channels, first_channel: 0 };
    // Its own pieces copied to the output, where every send reads them; in place the copy is
    // a no-op, but no send may read a piece while it is written.
    let own = |b: &mut ScheduleBuilder, me: Rank, p: u32| {
        let dst = Slot::output(me * pieces + p);
        Some(b.push(me, plan.rail_base(p), Op::Copy { src: Slot::input(p), dst }, 1))
    };
    gather_into(&mut b, &plan, own);
    b.build()
}

/// All-reduce in `pieces` pieces per rank: reduce-scatter leaves rank r's pieces, summed, at
/// output chunks r·pieces.., and all-gather hands each on the moment its sum is done, on
/// channels of its own.
pub(super) fn all_reduce(name: &str, layout: &HostLayout, pieces: u32, inter_channels: u32) -> Schedule {
    let n = (layout.hosts() * layout.per_host()) as u32;
    let mut b = ScheduleBuilder::new(name, Collective::AllReduce, n, n * pieces);
    b.in_place(true);
    let reduce = Plan { layout, pieces, inter_channels, first_channel: 0 };
    let summed = reduce_scatter_into(&mut b, &reduce, &|me, p| Slot::output(me * pieces + p));
    let gather = Plan { first_channel: reduce.channels(), ..reduce };
    gather_into(&mut b, &gather, |_, me, p| summed[me as usize][p as usize]);
    b.build()
}

/// Recursive doubling along each rail, then every block to every local peer, into `b`: piece p
/// of rank r ends at output chunk r·pieces + p on every rank. `own(b, r, p)` is the step after
/// which rank r's own piece p is there (`None`: from the start). Each exchange sends every
/// piece of what the rank holds, piece after piece, so the host forwards the first piece
/// while the last is on the wire.
fn gather_into(
    b: &mut ScheduleBuilder,
    plan: &Plan,
    mut own: impl FnMut(&mut ScheduleBuilder, Rank, u32) -> Option<StepRef>,
) {
    let (layout, pieces) = (plan.layout, plan.pieces);
    let hosts = &layout.members;
    let (h, m) = (layout.hosts(), layout.per_host());
    let chunk = |t: usize, j: usize, p: u32| Slot::output(hosts[t][j] * pieces + p);
    for (g, host) in hosts.iter().enumerate() {
        for (j, &me) in host.iter().enumerate() {
            // levels[l][p]: the blocks of piece p this rank got from exchange l (level 0: its
            // own).
            let own: Vec<Vec<Held>> = (0..pieces).map(|p| vec![(g, chunk(g, j, p), own(b, me, p))]).collect();
            let mut levels = vec![own];
            let mut sent = ExchangeOrder::new(plan.inter_channels);
            let mut d = 1;
            while d < h {
                let (partner_host, partner) = (g ^ d, hosts[g ^ d][j]);
                let mut got = Vec::with_capacity(pieces as usize);
                for p in 0..pieces {
                    let (out, inn) = (plan.rail_channel(p, g, partner_host), plan.rail_channel(p, partner_host, g));
                    let held: Vec<Held> = levels.iter().flat_map(|l| l[p as usize].iter().copied()).collect();
                    for (i, &(_, src, ready)) in held.iter().enumerate() {
                        let at = b.push_after(me, out, Op::Send { to: partner, src }, 1, ready.as_slice());
                        sent.sent(b, me, p, i == 0, at);
                    }
                    // The partner holds the mirror image of this rank's list, in the same order.
                    let piece: Vec<Held> = held
                        .iter()
                        .map(|&(t, _, _)| {
                            let dst = chunk(t ^ d, j, p);
                            (t ^ d, dst, Some(b.push(me, inn, Op::Recv { from: partner, dst }, 1)))
                        })
                        .collect();
                    got.push(piece);
                }
                levels.push(got);
                sent.next_exchange();
                d <<= 1;
            }
            // Every local peer receives each block in the order it arrived here; the peers
            // share this rank's host, so their rails deliver in the same order. All sends
            // first: each waits for its block to land, never for a peer's message.
            let arrived: Vec<(u32, Held)> = levels
                .iter()
                .flat_map(|l| l.iter().enumerate().flat_map(|(p, blocks)| blocks.iter().map(move |&x| (p as u32, x))))
                .collect();
            for k in 1..m {
                let (to, from_j) = (host[(j + k) % m], (j + m - k) % m);
                let lane = plan.offset_channel(k);
                for &(_, (_, src, ready)) in &arrived {
                    b.push_after(me, lane, Op::Send { to, src }, 1, ready.as_slice());
                }
                for &(p, (t, _, _)) in &arrived {
                    b.push(me, lane, Op::Recv { from: host[from_j], dst: chunk(t, from_j, p) }, 1);
                }
            }
        }
    }
}

/// Reduce-scatter in `pieces` pieces: rank r ends with output chunk p = the sum of every
/// rank's input chunk r·pieces + p. The hosts must be a power of two.
pub(super) fn reduce_scatter(name: &str, layout: &HostLayout, pieces: u32, inter_channels: u32) -> Schedule {
    let n = (layout.hosts() * layout.per_host()) as u32;
    let mut b = ScheduleBuilder::new(name, Collective::ReduceScatter, n, n * pieces);
    b.in_place(true);
    let plan = Plan { layout, pieces, inter_channels, first_channel: 0 };
    reduce_scatter_into(&mut b, &plan, &|_, p| Slot::output(p));
    b.build()
}

/// Inside each host every block to the local rank on its rail, reduced as it lands, then
/// recursive halving along each rail, into `b`: rank r ends with the sum of every rank's input
/// chunk r·pieces + p at `result(r, p)`. Host sums wait in scratch chunk t·pieces + p (the host
/// sum of the block of host t's rank on this rail), the other hosts' sums of it in scratch
/// chunk (h + t)·pieces + p. Returns, per rank and piece, the step that writes the result.
fn reduce_scatter_into(
    b: &mut ScheduleBuilder,
    plan: &Plan,
    result: &dyn Fn(Rank, u32) -> Slot,
) -> Vec<Vec<Option<StepRef>>> {
    let (layout, pieces) = (plan.layout, plan.pieces);
    let hosts = &layout.members;
    let (h, m) = (layout.hosts(), layout.per_host());
    if h > 1 {
        b.reserve_scratch(2 * h as u32 * pieces);
    }
    let mut done = vec![vec![None; pieces as usize]; h * m];
    let input = |t: usize, j: usize, p: u32| Slot::input(hosts[t][j] * pieces + p);
    let scratch = |t: usize, p: u32| Slot::scratch(t as u32 * pieces + p);
    let rail_sum = |t: usize, p: u32| scratch(h + t, p);
    for (g, host) in hosts.iter().enumerate() {
        let order = halving_order(g, h);
        for (j, &me) in host.iter().enumerate() {
            // partial[p][t]: where this rank's partial sum of piece p of host t's rail-j block
            // is, and the step that last wrote it.
            let mut partial: Vec<Vec<(Slot, Option<StepRef>)>> =
                (0..pieces).map(|p| (0..h).map(|t| (input(t, j, p), None)).collect()).collect();
            let host_sum = |t: usize, p: u32| if h == 1 { result(me, p) } else { scratch(t, p) };
            if m == 1 && h == 1 {
                for p in 0..pieces {
                    let copy = Op::Copy { src: input(g, j, p), dst: result(me, p) };
                    done[me as usize][p as usize] = Some(b.push(me, plan.first_channel, copy, 1));
                }
            }
            // Inside the host: peer j − k's contributions arrive with offset k, reduced one
            // offset after another into the host sum, in the order the rail needs them.
            let needed =
                order.iter().flat_map(|level| (0..pieces).flat_map(move |p| level.iter().map(move |&t| (p, t))));
            for (p, t) in needed {
                for k in 1..m {
                    let (to_j, from_j) = ((j + k) % m, (j + m - k) % m);
                    let send = Op::Send { to: host[to_j], src: input(t, to_j, p) };
                    b.push(me, plan.sender_channel(j), send, 1);
                    let (src, prev) = partial[p as usize][t];
                    let dst = host_sum(t, p);
                    let reduce = Op::RecvReduce { from: host[from_j], src, dst };
                    let at = b.push_after(me, plan.sender_channel(from_j), reduce, 1, prev.as_slice());
                    partial[p as usize][t] = (dst, Some(at));
                }
            }
            if h == 1 && m > 1 {
                for (p, partial) in partial.iter().enumerate() {
                    done[me as usize][p] = partial[g].1;
                }
            }
            // Along the rail: halve the hosts held, keeping the half with this host. What the
            // partners send accumulates apart from the host sum (rail[p][t], the step that
            // last wrote it), so that it never waits for this host's reduction of the block;
            // the two meet only where the block moves on or ends.
            let mut rail: Vec<Vec<Option<StepRef>>> = vec![vec![None; h]; pieces as usize];
            let mut d = h / 2;
            let mut held: Vec<usize> = (0..h).collect();
            let mut sent = ExchangeOrder::new(plan.inter_channels);
            while d >= 1 {
                let (partner_host, partner) = (g ^ d, hosts[g ^ d][j]);
                let (keep, give) = halve(&held, g, d);
                for (p, (partial, rail)) in (0..pieces).zip(partial.iter().zip(rail.iter_mut())) {
                    let (out, inn) = (plan.rail_channel(p, g, partner_host), plan.rail_channel(p, partner_host, g));
                    for (i, &t) in give.iter().enumerate() {
                        let (src, ready) = combine(b, me, out, partial[t], rail[t], rail_sum(t, p));
                        let at = b.push_after(me, out, Op::Send { to: partner, src }, 1, ready.as_slice());
                        sent.sent(b, me, p, i == 0, at);
                    }
                    // The partner gives exactly the hosts kept here.
                    for &t in &keep {
                        let (op, after) = if d == 1 {
                            let (src, after) = combine(b, me, inn, partial[t], rail[t], rail_sum(t, p));
                            (Op::RecvReduce { from: partner, src, dst: result(me, p) }, after)
                        } else if rail[t].is_some() {
                            (Op::RecvReduce { from: partner, src: rail_sum(t, p), dst: rail_sum(t, p) }, rail[t])
                        } else {
                            (Op::Recv { from: partner, dst: rail_sum(t, p) }, None)
                        };
                        rail[t] = Some(b.push_after(me, inn, op, 1, after.as_slice()));
                    }
                }
                held = keep;
                sent.next_exchange();
                d /= 2;
            }
            if h > 1 {
                // The last exchange kept this host's block alone and wrote its total.
                for (p, rail) in rail.iter().enumerate() {
                    done[me as usize][p] = rail[g];
                }
            }
        }
    }
    done
}

/// The block's host sum added into what the rail brought, where the rail brought anything:
/// the slot that holds both, and the step a reader of it waits for.
fn combine(
    b: &mut ScheduleBuilder,
    me: Rank,
    channel: u32,
    (host_sum, host_ready): (Slot, Option<StepRef>),
    rail: Option<StepRef>,
    rail_sum: Slot,
) -> (Slot, Option<StepRef>) {
    match rail {
        None => (host_sum, host_ready),
        Some(on) => {
            let at = b.push_after(me, channel, Op::Reduce { src: host_sum, dst: rail_sum }, 1, host_ready.as_slice());
            b.depend(me, at, on);
            (rail_sum, Some(at))
        }
    }
}

/// Where host `t`'s sum comes in [`halving_order`]`(g, ·)` flattened: hosts differing from
/// `g` in a higher bit are handed on earlier, ties in ascending order, `g` last.
fn need_rank(g: usize, t: usize) -> (u32, usize) {
    (u32::MAX - (usize::BITS - (t ^ g).leading_zeros()), t)
}

/// The hosts whose sums host `g` hands on along its rail, one list per exchange in the order
/// recursive halving hands them on (each in the order its receiver hands them on again),
/// then `g` itself: the order the host sums are needed in.
fn halving_order(g: usize, h: usize) -> Vec<Vec<usize>> {
    let mut order = Vec::new();
    let mut held: Vec<usize> = (0..h).collect();
    let mut d = h / 2;
    while d >= 1 {
        let (keep, give) = halve(&held, g, d);
        order.push(give);
        held = keep;
        d /= 2;
    }
    order.push(held);
    order
}

/// Host `g`'s exchange across bit `d` of recursive halving over the hosts `held`: the hosts it
/// keeps, in the order it receives them (its own [`need_rank`]), and those it gives, in the
/// order its partner hands them on, which is the order the partner receives them in.
fn halve(held: &[usize], g: usize, d: usize) -> (Vec<usize>, Vec<usize>) {
    let (mut keep, mut give): (Vec<usize>, Vec<usize>) = held.iter().partition(|&&t| t & d == g & d);
    keep.sort_by_key(|&t| need_rank(g, t));
    give.sort_by_key(|&t| need_rank(g ^ d, t));
    (keep, give)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;
    use crate::verify::verify;

    fn layout(name: &str) -> HostLayout {
        HostLayout::alike(&resolve(name).unwrap()).unwrap()
    }

    #[test]
    fn halving_hands_on_every_other_host_once_and_keeps_its_own_last() {
        let order = halving_order(5, 8);
        // Host 1 (5 ^ 4) hands on 2 and 3 at its second exchange, 0 at its third; host 7
        // hands on 6 and keeps 7.
        assert_eq!(order, vec![vec![2, 3, 0, 1], vec![6, 7], vec![4], vec![5]]);
        for g in 0..16 {
            let mut all = halving_order(g, 16).concat();
            assert_eq!(all.pop(), Some(g));
            all.sort_unstable();
            assert_eq!(all, (0..16).filter(|&t| t != g).collect::<Vec<_>>());
        }
    }

    #[test]
    fn every_collective_verifies_on_every_shape() {
        for name in ["cluster:2x4", "cluster:4x2", "cluster:8x3", "cluster:1x4", "cluster:4x1", "cluster:1x1"] {
            let l = layout(name);
            for (pieces, channels) in [(1, 1), (3, 2)] {
                let ag = all_gather("t", &l, pieces, channels);
                verify(&ag).unwrap_or_else(|e| panic!("{name} all-gather p{pieces}: {e}"));
                let rs = reduce_scatter("t", &l, pieces, channels);
                verify(&rs).unwrap_or_else(|e| panic!("{name} reduce-scatter p{pieces}: {e}"));
                let ar = all_reduce("t", &l, pieces, channels);
                verify(&ar).unwrap_or_else(|e| panic!("{name} all-reduce p{pieces}: {e}"));
            }
        }
    }

    #[test]
    fn each_rank_sends_log_h_rail_exchanges_and_one_message_per_block_and_peer() {
        let l = layout("cluster:8x4");
        let ag = all_gather("t", &l, 1, 1);
        // Rail: 7 blocks out; host: 8 blocks to each of 3 peers.
        for r in 0..32 {
            let sends: usize =
                ag.ranks[r].channels.iter().map(|c| c.steps.iter().filter(|s| s.op.send_to().is_some()).count()).sum();
            assert_eq!(sends, 7 + 8 * 3, "rank {r}");
        }
    }
}

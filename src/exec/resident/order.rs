//! The order a rank's steps go onto one stream, and where each message lands.
//!
//! The host engine runs a rank's channels side by side and moves each as far as it can, so any
//! deadlock-free schedule runs. One CUDA stream runs its work strictly in order, so a rank's
//! steps must be put on it in an order that cannot wait for ever: a receive may only be queued
//! behind work that never depends on what comes after it. [`stream_order`] finds such an order
//! for every rank at once by running the whole schedule in rounds (each channel of each rank
//! takes one step per round when its dependencies are done and, for a receive, its message was
//! sent in an earlier round) and sorting each rank's steps by round. A receive then only ever
//! waits for a send of an earlier round, which its sender queued ahead of everything it queued
//! later, and by induction on rounds every wait is released.
//!
//! Messages between two ranks are numbered in the sender's order (one count per direction, as
//! the stream writes it), and laid out in the receiver's window back to back in that order.

use rustc_hash::FxHashMap;
use topoccl_synth::schedule::{Schedule, StepRef};

use super::super::layout::ChunkLayout;

/// Window offsets are multiples of this (any datatype's alignment; copies like it).
pub(crate) const WINDOW_ALIGN: usize = 256;

/// Every rank's steps in stream order, or why there is none (a schedule that deadlocks).
pub(crate) fn stream_order(schedule: &Schedule) -> Result<Vec<Vec<StepRef>>, String> {
    let n = schedule.ranks.len();
    let mut pos: Vec<Vec<u32>> = schedule.ranks.iter().map(|r| vec![0; r.channels.len()]).collect();
    let mut sent: FxHashMap<(u32, u32, u32), u32> = FxHashMap::default();
    let mut received: FxHashMap<(u32, u32, u32), u32> = FxHashMap::default();
    let mut order: Vec<Vec<StepRef>> = vec![Vec::new(); n];
    let total: usize = schedule.ranks.iter().flat_map(|r| &r.channels).map(|c| c.steps.len()).sum();
    let mut placed = 0usize;
    let mut ready = Vec::new();
    while placed < total {
        ready.clear();
        for (r, rank) in schedule.ranks.iter().enumerate() {
            for (c, ch) in rank.channels.iter().enumerate() {
                let at = pos[r][c];
                let Some(st) = ch.steps.get(at as usize) else { continue };
                let deps_done = ch.deps_of(at).all(|d| pos[r].get(d.channel as usize).is_some_and(|&p| p > d.step));
                let message_sent = st.op.recv_from().map_or(true, |f| {
                    let key = (f, r as u32, c as u32);
                    sent.get(&key).copied().unwrap_or(0) > received.get(&key).copied().unwrap_or(0)
                });
                if deps_done && message_sent {
                    ready.push((r, c));
                }
            }
        }
        if ready.is_empty() {
            return Err(format!("schedule {} cannot run on one stream per rank: it deadlocks", schedule.name));
        }
        for &(r, c) in &ready {
            let at = pos[r][c];
            let st = schedule.ranks[r].channels[c].steps[at as usize];
            if let Some(to) = st.op.send_to() {
                *sent.entry((r as u32, to, c as u32)).or_default() += 1;
            }
            if let Some(from) = st.op.recv_from() {
                *received.entry((from, r as u32, c as u32)).or_default() += 1;
            }
            order[r].push(StepRef { channel: c as u32, step: at });
            pos[r][c] += 1;
            placed += 1;
        }
    }
    Ok(order)
}

/// One message of a call between two ranks: its number in its direction (from 0) and where it
/// lies in the receiver's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Message {
    pub index: u32,
    pub offset: usize,
    pub len: usize,
}

/// The messages of one call that concern one rank: those it sends, by its own steps, and those
/// it receives, by its steps, with the totals per peer.
#[derive(Debug, Default)]
pub(crate) struct Messages {
    pub sent: FxHashMap<StepRef, (u32, Message)>,
    pub received: FxHashMap<StepRef, (u32, Message)>,
    /// Per peer: messages and window bytes this rank sends it, and receives from it.
    pub to: FxHashMap<u32, (u32, usize)>,
    pub from: FxHashMap<u32, (u32, usize)>,
    /// The most window bytes any rank sends any one peer in the call: what every rank's
    /// windows must hold for the call to run device-resident, the same on every rank.
    pub peak: usize,
}

/// Numbers and places the messages `me` sends and receives, given every rank's stream order.
pub(crate) fn messages(schedule: &Schedule, layout: &ChunkLayout, order: &[Vec<StepRef>], me: u32) -> Messages {
    let mut out = Messages::default();
    for (r, steps) in order.iter().enumerate() {
        let r = r as u32;
        // Per receiver: the next message number and window offset; per (receiver, channel):
        // how many sends so far, which is how the receiver names them.
        let mut next: FxHashMap<u32, (u32, usize)> = FxHashMap::default();
        let mut nth: FxHashMap<(u32, u32), u32> = FxHashMap::default();
        let mut by_nth: FxHashMap<(u32, u32, u32), Message> = FxHashMap::default();
        let mut bytes_to: FxHashMap<u32, usize> = FxHashMap::default();
        for s in steps {
            let st = schedule.ranks[r as usize].channels[s.channel as usize].steps[s.step as usize];
            let Some(to) = st.op.send_to() else { continue };
            let slot = st.op.src().or(st.op.dst());
            let len = slot.map_or(0, |sl| layout.range(sl.index as usize, st.count as usize).1);
            let sent = bytes_to.entry(to).or_default();
            *sent += len.next_multiple_of(WINDOW_ALIGN);
            out.peak = out.peak.max(*sent);
            if r != me && to != me {
                continue;
            }
            let (index, offset) = next.entry(to).or_default();
            let m = Message { index: *index, offset: *offset, len };
            *index += 1;
            *offset += len.next_multiple_of(WINDOW_ALIGN);
            let k = nth.entry((to, s.channel)).or_default();
            by_nth.insert((to, s.channel, *k), m);
            *k += 1;
            if r == me {
                out.sent.insert(*s, (to, m));
            }
        }
        for (to, totals) in next {
            if r == me {
                out.to.insert(to, totals);
            } else if to == me {
                out.from.insert(r, totals);
            }
        }
        if r == me {
            continue;
        }
        // This rank's receives from `r`, named as `r` numbered them.
        let mut nth: FxHashMap<u32, u32> = FxHashMap::default();
        for s in &order[me as usize] {
            let st = schedule.ranks[me as usize].channels[s.channel as usize].steps[s.step as usize];
            if st.op.recv_from() != Some(r) {
                continue;
            }
            // Receives of one channel from one peer are in channel order in any stream order.
            let k = nth.entry(s.channel).or_default();
            if let Some(m) = by_nth.get(&(me, s.channel, *k)) {
                out.received.insert(*s, (r, *m));
            }
            *k += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use topoccl_synth::generate::Request;
    use topoccl_synth::registry::Registry;
    use topoccl_synth::schedule::Collective;
    use topoccl_synth::topology::resolve;

    #[test]
    fn every_builtin_schedule_has_a_stream_order_that_pairs_every_message() {
        let reg = Registry::builtin();
        for spec in ["dgx1[0,1,2,4,5]", "dgx1[0,1]"] {
            let topo = resolve(spec).unwrap();
            for coll in Collective::ALL {
                for g in reg.iter().filter(|g| g.supports(coll)) {
                    let Ok(s) = g.generate(&Request::new(&topo, coll).pipeline(2)) else { continue };
                    let order = stream_order(&s).unwrap_or_else(|e| panic!("{} {coll}: {e}", g.name()));
                    let k = (s.chunks / s.collective.chunk_multiple(s.nranks)) as usize;
                    let layout = ChunkLayout::new(k, 5 * k + 1, 4);
                    for me in 0..s.nranks {
                        let m = messages(&s, &layout, &order, me);
                        let recvs = s.ranks[me as usize]
                            .channels
                            .iter()
                            .flat_map(|c| &c.steps)
                            .filter(|st| st.op.recv_from().is_some())
                            .count();
                        assert_eq!(m.received.len(), recvs, "{} {coll} rank {me}", g.name());
                    }
                }
            }
        }
    }
}

//! How each emulated link's egress is shaped: an htb token bucket at the link's rate, with one
//! class per rank pair whose route crosses the link, so that pairs sharing a link get equal
//! shares of it and each waits only behind its own queue.
//!
//! Why not one token bucket with one queue (tbf): the links stand for NVLink, PCIe and
//! InfiniBand, whose switches arbitrate between flows and hold a few packets' worth of credit;
//! a single drop-tail queue shared by several TCP connections is what none of them has. TCP
//! fills such a queue until it drops, so a chunk of one pair waits behind hundreds of
//! milliseconds of another pair's data, and the shares go to whoever queued more. Measured on
//! `cluster-2x4-slow` (four GPUs' inter-node traffic through one NIC): Blink took 12.7–17.7 s
//! per 64 MiB call behind one queue (10.9 s predicted). Classes per pair implement the
//! simulator's sharing rule (`SimConfig::pair_sharing`) on the wire.

use super::plan::NetPlan;

/// How long a class's queue may be, in time at the link's rate. A pair waits only behind its
/// own queue, so a long one costs other pairs nothing, and the fabrics emulated do not drop
/// (credit-based flow control): TCP should not see losses either. (The routes also raise
/// TCP's minimum retransmission timeout, see `Emulation::wire`.)
const QUEUE_SECONDS: f64 = 2.0;

/// The htb bucket: at least 64 KiB (a GSO segment, and one packet at the link MTU) and 4 ms of
/// traffic.
fn burst_bytes(mbit: f64) -> u64 {
    ((mbit * 1e6 / 8.0 * 0.004) as u64).max(64 * 1024)
}

/// `tc` batch lines that shape every link end of namespace `at`.
pub fn tc_commands(plan: &NetPlan, at: usize) -> Vec<String> {
    let mut tc = Vec::new();
    for (l, link) in plan.links.iter().enumerate().filter(|(_, l)| l.a == at || l.b == at) {
        let Some(mbit) = (if link.a == at { link.rate_ab } else { link.rate_ba }) else { continue };
        let dev = link.iface_at(at);
        // Ordered (source, destination) rank pairs whose route leaves `at` over this link.
        let mut pairs: Vec<(usize, usize)> =
            plan.hops.iter().filter(|h| h.at == at && h.link == l).map(|h| (h.from, h.to)).collect();
        pairs.sort_unstable();
        pairs.dedup();
        let kbit = |m: f64| (m * 1000.0).round().max(8.0) as u64;
        let burst = burst_bytes(mbit);
        let limit = ((mbit * 1e6 / 8.0 * QUEUE_SECONDS) as u64).max(2 * burst);
        // Class 1:1 is the link; 1:2 takes what no pair class matches (bootstrap, ARP);
        // 1:(10 + k) is pair k. Every class may use the whole link when the others are idle.
        let share = mbit / (pairs.len() + 1) as f64;
        let class = |id: usize, rate: f64| {
            format!(
                "class add dev {dev} parent 1:1 classid 1:{id:x} htb rate {}kbit ceil {}kbit burst {burst} cburst {burst} quantum 65536",
                kbit(rate),
                kbit(mbit)
            )
        };
        tc.push(format!("qdisc add dev {dev} root handle 1: htb default 2"));
        tc.push(format!(
            "class add dev {dev} parent 1: classid 1:1 htb rate {0}kbit ceil {0}kbit burst {burst} cburst {burst}",
            kbit(mbit)
        ));
        tc.push(class(2, share));
        tc.push(format!("qdisc add dev {dev} parent 1:2 bfifo limit {limit}"));
        for (k, &(from, to)) in pairs.iter().enumerate() {
            let id = 0x10 + k;
            tc.push(class(id, share));
            tc.push(format!("qdisc add dev {dev} parent 1:{id:x} bfifo limit {limit}"));
            tc.push(format!(
                "filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip src {}/32 match ip dst {}/32 flowid 1:{id:x}",
                plan.nodes[from].ip, plan.nodes[to].ip
            ));
        }
    }
    tc
}

#[cfg(test)]
mod tests {
    use super::*;
    use topoccl_synth::topology::resolve;

    #[test]
    fn a_shared_link_gets_a_class_per_pair_crossing_it() {
        // cluster-2x4-slow: each node's NIC uplink carries the four GPUs' traffic to the four
        // of the other node.
        let topo = resolve("cluster-2x4-slow").unwrap();
        let plan = NetPlan::new(&topo, None).unwrap();
        let mut most = 0;
        for at in 0..plan.nodes.len() {
            let tc = tc_commands(&plan, at);
            for (l, link) in plan.links.iter().enumerate().filter(|(_, l)| l.a == at || l.b == at) {
                let dev = link.iface_at(at);
                let filters =
                    tc.iter().filter(|c| c.starts_with("filter") && c.contains(&format!("dev {dev} "))).count();
                let pairs: std::collections::BTreeSet<_> =
                    plan.hops.iter().filter(|h| h.at == at && h.link == l).map(|h| (h.from, h.to)).collect();
                assert_eq!(filters, pairs.len(), "{} {dev}", plan.nodes[at].name);
                most = most.max(filters);
            }
        }
        assert_eq!(most, 16, "a NIC link carries 4 × 4 pairs");
    }

    #[test]
    fn every_class_can_take_the_whole_link() {
        let topo = resolve("ring:3").unwrap();
        let plan = NetPlan::new(&topo, Some(100.0)).unwrap();
        let tc = tc_commands(&plan, 0);
        for link in plan.links.iter().filter(|l| l.a == 0 || l.b == 0) {
            let dev = link.iface_at(0);
            let mbit = if link.a == 0 { link.rate_ab } else { link.rate_ba }.unwrap();
            let ceil = format!("ceil {}kbit", (mbit * 1000.0).round() as u64);
            let classes: Vec<&String> =
                tc.iter().filter(|c| c.starts_with("class") && c.contains(&format!("dev {dev} "))).collect();
            // The link, the default class, and the one pair (0 → its neighbour) leaving by it.
            assert_eq!(classes.len(), 3, "{tc:#?}");
            assert!(classes.iter().all(|c| c.contains(&ceil)), "{tc:#?}");
            assert!(tc.contains(&format!("qdisc add dev {dev} root handle 1: htb default 2")));
        }
    }
}

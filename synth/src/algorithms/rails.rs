//! How a multi-host machine's ranks are laid out for the classic algorithms: hosts of equal
//! size, one order of a host's ranks (the same local order on every host), and per channel the
//! rank a ring enters each host at.
//!
//! On a cluster whose GPUs each have their own NIC, a ring that crosses every host through the
//! same pair of GPUs sends all its inter-host traffic through one NIC per host, an eighth of what
//! the host's eight NICs carry. NCCL rotates the entry GPU per channel so that channel `c`
//! leaves each host through one NIC and enters the next through another, and the channels
//! together use every NIC in both directions; the rings here do the same. The hop from host h to
//! host h+1 then goes from local position `r−1` to local position `r` (`r` the channel's
//! rotation): a rail of a rail-optimised fabric, and with destination routing a shift
//! permutation that a fat-tree carries without two flows meeting on an up-link.

use super::ring_order;
use crate::schedule::Rank;
use crate::topology::Topology;

/// Hosts of equal rank counts, in host order, each host's ranks in one local order.
#[derive(Debug, Clone, PartialEq)]
pub struct HostLayout {
    /// `members[h][j]`: the rank at local position `j` of host `h`.
    pub members: Vec<Vec<Rank>>,
}

impl HostLayout {
    /// The layout of `topo`, or `None` where it is one host, one rank per host, or hosts of
    /// different sizes (the flat algorithms then apply). The local order is the
    /// bandwidth-maximising ring order of the first host, applied by local index to every host
    /// (hosts of a cluster are alike).
    pub fn of(topo: &Topology) -> Option<HostLayout> {
        HostLayout::alike(topo).ok().filter(|l| l.hosts() >= 2 && l.per_host() >= 2)
    }

    /// The layout of any machine whose hosts have equal rank counts, one host or one rank per
    /// host included; otherwise why not.
    pub fn alike(topo: &Topology) -> Result<HostLayout, String> {
        let (members, names) = host_members(topo);
        let m = members[0].len();
        if let Some(odd) = members.iter().position(|g| g.len() != m) {
            return Err(format!(
                "hosts have different rank counts ({} on `{}`, {} on `{}`)",
                m,
                names[0],
                members[odd].len(),
                names[odd]
            ));
        }
        let local = local_order(topo, &members[0]);
        let members = members.iter().map(|g| local.iter().map(|&j| g[j as usize]).collect()).collect();
        Ok(HostLayout { members })
    }

    /// Ranks per host.
    pub fn per_host(&self) -> usize {
        self.members[0].len()
    }

    pub fn hosts(&self) -> usize {
        self.members.len()
    }

    /// Rail `j`: the rank at local position `j` of every host, in host order.
    pub fn rail(&self, j: usize) -> Vec<Rank> {
        self.members.iter().map(|g| g[j]).collect()
    }

    /// The ring of channel `c` out of `channels`: hosts in order, each entered at local
    /// position `rotation(c)` and left from the position before it. With fewer channels than
    /// ranks per host the rotations spread evenly; with twice as many or more, every other
    /// block of `per_host` channels runs the other way round.
    pub fn ring(&self, c: u32, channels: u32) -> Vec<Rank> {
        let m = self.per_host();
        let channels = channels.max(1) as usize;
        let c = c as usize;
        let rotation = if channels >= m { c % m } else { c * m / channels };
        let mut order = Vec::with_capacity(m * self.hosts());
        for host in &self.members {
            order.extend((0..m).map(|j| host[(rotation + j) % m]));
        }
        if (c / m) % 2 == 1 {
            order.reverse();
        }
        order
    }
}

/// The ranks of each host, in rank order, and the hosts' names.
fn host_members(topo: &Topology) -> (Vec<Vec<Rank>>, Vec<String>) {
    let (host_of, hosts) = topo.hosts();
    let mut members: Vec<Vec<Rank>> = vec![Vec::new(); hosts.len()];
    for (r, &h) in host_of.iter().enumerate() {
        members[h as usize].push(r as Rank);
    }
    (members, hosts)
}

/// The bandwidth-maximising ring order of the ranks of one host, as local indices into `host`.
fn local_order(topo: &Topology, host: &[Rank]) -> Vec<Rank> {
    topo.select(host).map(|t| ring_order(&t)).unwrap_or_else(|_| (0..host.len() as Rank).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::resolve;
    use crate::topology::routing::Router;

    #[test]
    fn flat_machines_have_no_layout() {
        for name in ["dgx1", "ring:8", "host:4", "torus2d:4x4"] {
            assert_eq!(HostLayout::of(&resolve(name).unwrap()), None, "{name}");
        }
        assert!(HostLayout::of(&resolve("cluster:2x8").unwrap()).is_some());
    }

    #[test]
    fn each_channel_leaves_every_host_through_its_own_nic() {
        let t = resolve("cluster:4x8").unwrap();
        let layout = HostLayout::of(&t).unwrap();
        let mut router = Router::new(&t);
        let mut first_hops = std::collections::HashMap::new();
        for c in 0..8 {
            let ring = layout.ring(c, 8);
            assert_eq!(ring.len(), 32);
            let mut sorted = ring.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..32).collect::<Vec<_>>(), "channel {c} is not a permutation");
            for i in 0..ring.len() {
                let (a, b) = (ring[i], ring[(i + 1) % ring.len()]);
                if a / 8 != b / 8 {
                    // The group a message between hosts leaves its GPU by: the GPU's NIC link.
                    let out = router.route(a, b).unwrap().groups[0];
                    assert!(
                        first_hops.insert((a / 8, out), c).is_none(),
                        "two channels leave host {} by one NIC",
                        a / 8
                    );
                }
            }
        }
        assert_eq!(first_hops.len(), 4 * 8);
    }

    #[test]
    fn fewer_channels_spread_their_rotations_and_many_go_both_ways() {
        let t = resolve("cluster:2x4").unwrap();
        let l = HostLayout::of(&t).unwrap();
        assert_eq!(l.ring(0, 2), vec![0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(l.ring(1, 2), vec![2, 3, 0, 1, 6, 7, 4, 5]);
        assert_eq!(l.ring(5, 8), vec![4, 7, 6, 5, 0, 3, 2, 1]);
    }
}

//! Two-level all-reduce for multi-node machines: reduce-scatter inside each host (fast links),
//! all-reduce of each block across hosts among the ranks holding it (one slow hop per block),
//! all-gather inside each host. Inter-host traffic is 2(H−1)/H of the data per rank-block rather
//! than a flat ring's crossing of every slow link by every chunk.

use super::rails::{host_members, local_order};
use super::ring::{all_gather_round, all_reduce_round, reduce_scatter_round};
use super::{unsupported, Request, ScheduleGenerator};
use crate::error::Result;
use crate::schedule::{Collective, Rank, Schedule, ScheduleBuilder, Slot};

pub struct Hierarchical;

impl ScheduleGenerator for Hierarchical {
    fn name(&self) -> &'static str {
        "hier"
    }
    fn describe(&self) -> &'static str {
        "hierarchical: intra-host reduce-scatter, inter-host all-reduce, intra-host all-gather"
    }
    fn supports(&self, c: Collective) -> bool {
        c == Collective::AllReduce
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        let coll = req.collective;
        if !self.supports(coll) {
            return Err(unsupported("hier", coll, "the hierarchical algorithm builds all-reduce only"));
        }
        let topo = req.topology;
        let (members, hosts) = host_members(topo);
        let m = members[0].len();
        if let Some(odd) = members.iter().position(|g| g.len() != m) {
            return Err(unsupported(
                "hier",
                coll,
                &format!(
                    "hosts have different rank counts ({} on `{}`, {} on `{}`)",
                    m,
                    hosts[0],
                    members[odd].len(),
                    hosts[odd]
                ),
            ));
        }
        // Intra-host ring order: the bandwidth-maximising order of the first host, applied by
        // local index to every host (hosts of a cluster are alike).
        let local = local_order(topo, &members[0]);
        let h = hosts.len() as u32;
        let k = req.pipeline.max(1);
        let block = h * k; // chunks per local block
        let n = topo.nranks() as u32;
        let mut b = ScheduleBuilder::new("hier", coll, n, m as u32 * block);
        b.in_place(true);
        let blk = |j: Rank| j * block;
        // 1. Reduce-scatter inside each host: local index j ends with block j.
        for g in &members {
            let order: Vec<Rank> = local.iter().map(|&j| g[j as usize]).collect();
            reduce_scatter_round(&mut b, &order, 0, block, &|p| Slot::input(blk(local[p])), &|p| {
                Slot::output(blk(local[p]))
            });
        }
        // 2. All-reduce block j across hosts among the ranks with local index j.
        for j in 0..m as Rank {
            let order: Vec<Rank> = members.iter().map(|g| g[j as usize]).collect();
            let sub = |p: usize| Slot::output(blk(j) + p as u32 * k);
            all_reduce_round(&mut b, &order, 0, k, &sub, &sub);
        }
        // 3. All-gather inside each host.
        for g in &members {
            let order: Vec<Rank> = local.iter().map(|&j| g[j as usize]).collect();
            let at = |p: usize| Slot::output(blk(local[p]));
            all_gather_round(&mut b, &order, 0, block, &at, &at);
        }
        Ok(b.build())
    }
}

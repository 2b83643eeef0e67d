//! Double binary trees (NCCL 2.4): two binary trees over the ranks such that a rank that is an
//! inner node in one is a leaf in the other, so every rank sends and receives about as much as
//! in a ring while the depth is only log₂ n. Half the chunks go up and down each tree,
//! pipelined chunk by chunk ([`TreeLanes`] emits a chunk over each tree).
//!
//! Broadcast and reduce with a root R: tree 0 is laid out with R at its root; tree 1 is
//! re-rooted by hanging its old root under R, so both trees start (or end) at R.

use super::ring_order;
use crate::error::Result;
use crate::generate::{Request, ScheduleGenerator};
use crate::schedule::{Collective, Rank, Schedule, ScheduleBuilder};
use crate::trees::{Tree, TreeLanes};

pub struct DoubleBinaryTree;

/// Default chunks per tree when the request leaves pipelining to us.
const DEFAULT_PIPELINE: u32 = 8;

/// Parent of position `r` in the in-order binary tree over `n` positions (position 0 is the
/// root; the tree is NCCL's `ncclGetBtree` shape).
fn btree_parent(n: usize, r: usize) -> Option<usize> {
    if r == 0 {
        return None;
    }
    let bit = 1usize << r.trailing_zeros();
    let up = (r ^ bit) | (bit << 1);
    Some(if up >= n { r ^ bit } else { up })
}

/// The two complementary trees over `n` positions: the second mirrors the first for even n and
/// shifts it by one for odd n.
pub fn double_binary_tree(n: usize) -> [Vec<Option<usize>>; 2] {
    let t0: Vec<Option<usize>> = (0..n).map(|r| btree_parent(n, r)).collect();
    let t1 = (0..n)
        .map(|r| {
            if n % 2 == 1 {
                btree_parent(n, (r + n - 1) % n).map(|p| (p + 1) % n)
            } else {
                btree_parent(n, n - 1 - r).map(|p| n - 1 - p)
            }
        })
        .collect();
    [t0, t1]
}

/// The two trees laid out over `order` (position → rank) and, if `root` is given, both rooted
/// there.
pub fn trees(order: &[Rank], root: Option<Rank>) -> [Tree; 2] {
    let n = order.len();
    let mut order = order.to_vec();
    if let Some(root) = root {
        let at = order.iter().position(|&r| r == root).unwrap_or(0);
        order.rotate_left(at);
    }
    double_binary_tree(n).map(|pos_parent| {
        let mut parent = vec![None; n];
        for (p, par) in pos_parent.iter().enumerate() {
            parent[order[p] as usize] = par.map(|q| order[q]);
        }
        let t = Tree::from_parents(parent);
        match root {
            Some(r) => t.reroot_under(r),
            None => t,
        }
    })
}

impl ScheduleGenerator for DoubleBinaryTree {
    fn name(&self) -> &'static str {
        "tree"
    }
    fn describe(&self) -> &'static str {
        "double binary tree, pipelined reduce-up / broadcast-down (NCCL 2.4)"
    }
    fn supports(&self, c: Collective) -> bool {
        matches!(c, Collective::AllReduce | Collective::Broadcast { .. } | Collective::Reduce { .. })
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        let n = req.nranks();
        let coll = req.collective;
        if !self.supports(coll) {
            return Err(crate::generate::unsupported("tree", coll, "trees build all-reduce, broadcast and reduce"));
        }
        let k = if req.pipeline <= 1 { DEFAULT_PIPELINE } else { req.pipeline };
        let pairs = req.channels.max(1);
        let chunks = 2 * pairs * k;
        let order = ring_order(req.topology);
        let pair = trees(&order, coll.root());
        let mut b = ScheduleBuilder::new("tree", coll, n, chunks);
        b.in_place(true);
        if matches!(coll, Collective::Reduce { .. }) {
            b.reserve_scratch(chunks);
        }
        // Chunk c goes over tree c % 2 of pair (c / 2) % pairs.
        let mut base = 0;
        let mut lanes = Vec::with_capacity(2 * pairs as usize);
        for _ in 0..pairs {
            for tree in &pair {
                let l = TreeLanes::new(tree.clone(), base);
                base += l.channels();
                lanes.push(l);
            }
        }
        for c in 0..chunks {
            let (t, p) = (c % 2, (c / 2) % pairs);
            lanes[(2 * p + t) as usize].emit_chunk(&mut b, coll, c)?;
        }
        Ok(b.build())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_tree(t: &Tree, n: usize) {
        // Every rank reaches the root by parent links, without cycles.
        for r in 0..n {
            let mut x = r as Rank;
            let mut steps = 0;
            while let Some(p) = t.parent[x as usize] {
                x = p;
                steps += 1;
                assert!(steps <= n, "cycle at {r}");
            }
            assert_eq!(x, t.root);
        }
    }

    #[test]
    fn trees_are_spanning_and_complementary() {
        for n in 1..=64usize {
            let order: Vec<Rank> = (0..n as Rank).collect();
            let [a, b] = trees(&order, None);
            check_tree(&a, n);
            check_tree(&b, n);
            if n >= 4 {
                // NCCL's property: no rank is an inner node in both trees (n even).
                if n % 2 == 0 {
                    let both = (0..n).filter(|&r| !a.children[r].is_empty() && !b.children[r].is_empty()).count();
                    assert_eq!(both, 0, "n={n}");
                }
            }
            for root in [0, n as Rank / 2, n as Rank - 1] {
                let [a, b] = trees(&order, Some(root));
                check_tree(&a, n);
                check_tree(&b, n);
                assert_eq!((a.root, b.root), (root, root));
            }
        }
    }
}

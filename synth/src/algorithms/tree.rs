//! Double binary trees (NCCL 2.4): two binary trees over the ranks such that a rank that is an
//! inner node in one is a leaf in the other, so every rank sends and receives about as much as
//! in a ring while the depth is only log₂ n. Half the chunks go up and down each tree,
//! pipelined chunk by chunk. [`TreeLanes`] emits a chunk over any rooted tree (Blink uses it
//! too).
//!
//! Broadcast and reduce with a root R: tree 0 is laid out with R at its root; tree 1 is
//! re-rooted by hanging its old root under R, so both trees start (or end) at R.

use super::{ring_order, Request, ScheduleGenerator};
use crate::error::Result;
use crate::schedule::{Collective, Op, Rank, Schedule, ScheduleBuilder, Slot, StepRef};

pub struct DoubleBinaryTree;

/// Default chunks per tree when the request leaves pipelining to us.
const DEFAULT_PIPELINE: u32 = 8;

/// A rooted spanning tree over ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct Tree {
    pub root: Rank,
    pub parent: Vec<Option<Rank>>,
    pub children: Vec<Vec<Rank>>,
}

impl Tree {
    pub fn from_parents(parent: Vec<Option<Rank>>) -> Tree {
        let mut children = vec![Vec::new(); parent.len()];
        let mut root = 0;
        for (r, p) in parent.iter().enumerate() {
            match p {
                Some(p) => children[*p as usize].push(r as Rank),
                None => root = r as Rank,
            }
        }
        Tree { root, parent, children }
    }

    /// Makes `new_root` the root: it is cut from its parent (keeping its subtree) and the old
    /// root, with the rest of the tree, is hung under it. The old root is nobody's descendant,
    /// so no cycle can form.
    fn reroot_under(mut self, new_root: Rank) -> Tree {
        if new_root == self.root {
            return self;
        }
        let old = self.root;
        if let Some(p) = self.parent[new_root as usize] {
            self.children[p as usize].retain(|&c| c != new_root);
        }
        self.parent[new_root as usize] = None;
        self.parent[old as usize] = Some(new_root);
        self.children[new_root as usize].push(old);
        self.root = new_root;
        self
    }
}

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

/// One tree's channels. Every tree edge has its own channel (the child's position among its
/// siblings, offset by `base`; reduce edges another `width` further), so that a rank feeds all
/// its children at once and takes all its children's partial sums at once — one channel per
/// tree would serialise a fan-out of k children into k turns of the same link time.
pub(crate) struct TreeLanes {
    tree: Tree,
    base: u32,
    /// Most children of any rank in this tree.
    width: u32,
    /// The channel of the edge into each rank from its parent (before `base`).
    lane: Vec<u32>,
    /// Whether the tree carries data both ways (all-reduce: up and down each on channels of
    /// their own) or one way only (broadcast down, or reduce up, on `width` channels).
    two_way: bool,
}

impl TreeLanes {
    pub(crate) fn new(tree: Tree, base: u32) -> TreeLanes {
        let mut lane = vec![0; tree.parent.len()];
        let mut width = 1;
        for kids in &tree.children {
            width = width.max(kids.len() as u32);
            for (j, &k) in kids.iter().enumerate() {
                lane[k as usize] = j as u32;
            }
        }
        TreeLanes { tree, base, width, lane, two_way: true }
    }

    /// A tree used in one direction only (see [`TreeLanes::broadcast`], [`TreeLanes::reduce`]),
    /// which occupies half the channels.
    pub(crate) fn one_way(tree: Tree, base: u32) -> TreeLanes {
        TreeLanes { two_way: false, ..TreeLanes::new(tree, base) }
    }

    /// Channels this tree occupies from `base` on.
    pub(crate) fn channels(&self) -> u32 {
        if self.two_way {
            2 * self.width
        } else {
            self.width
        }
    }

    /// The first channel this tree occupies.
    pub(crate) fn base(&self) -> u32 {
        self.base
    }

    /// Emits chunk `c` of `coll` over this tree: all-reduce reduces up and broadcasts back
    /// down, reduce accumulates in scratch on the way up, broadcast copies at the root and
    /// sends down.
    pub(crate) fn emit_chunk(&self, b: &mut ScheduleBuilder, coll: Collective, c: u32) -> Result<()> {
        match coll {
            Collective::AllReduce => {
                let last = self.reduce(b, Slot::input(c), &|_| Slot::output(c), Slot::output(c));
                self.broadcast(b, Slot::output(c), Slot::output(c), &last);
            }
            Collective::Reduce { .. } => {
                self.reduce(b, Slot::input(c), &|_| Slot::scratch(c), Slot::output(c));
            }
            Collective::Broadcast { root } => {
                let copy = b.push(root, self.base, Op::Copy { src: Slot::input(c), dst: Slot::output(c) }, 1);
                self.broadcast(b, Slot::input(c), Slot::output(c), &[copy]);
            }
            other => return Err(super::unsupported("tree", other, "trees build all-reduce, broadcast and reduce")),
        }
        Ok(())
    }

    fn down(&self, r: Rank) -> u32 {
        self.base + self.lane[r as usize]
    }

    fn up(&self, r: Rank) -> u32 {
        let offset = if self.two_way { self.width } else { 0 };
        self.base + offset + self.lane[r as usize]
    }

    /// Reduces `inp` up the tree: partial sums accumulate in `acc(rank)` one child after
    /// another, the root's total lands in `out`. Returns the root's last steps.
    pub(crate) fn reduce(
        &self,
        b: &mut ScheduleBuilder,
        inp: Slot,
        acc: &dyn Fn(Rank) -> Slot,
        out: Slot,
    ) -> Vec<StepRef> {
        let mut root_last = Vec::new();
        for x in 0..self.tree.parent.len() as Rank {
            let parent = self.tree.parent[x as usize];
            let target = if parent.is_some() { acc(x) } else { out };
            let mut prev: Option<StepRef> = None;
            for &kid in &self.tree.children[x as usize] {
                let src = if prev.is_some() { target } else { inp };
                let deps: Vec<StepRef> = prev.into_iter().collect();
                prev = Some(b.push_after(x, self.up(kid), Op::RecvReduce { from: kid, src, dst: target }, 1, &deps));
            }
            match parent {
                Some(p) => {
                    let src = if prev.is_some() { target } else { inp };
                    let deps: Vec<StepRef> = prev.into_iter().collect();
                    b.push_after(x, self.up(x), Op::Send { to: p, src }, 1, &deps);
                }
                None => match prev {
                    Some(last) => root_last.push(last),
                    None => root_last.push(b.push(x, self.up(x), Op::Copy { src: inp, dst: out }, 1)),
                },
            }
        }
        root_last
    }

    /// Broadcasts down the tree: the root sends `root_src` (after `root_deps`), the others
    /// store it in `out` and pass it on to all their children at once.
    pub(crate) fn broadcast(&self, b: &mut ScheduleBuilder, root_src: Slot, out: Slot, root_deps: &[StepRef]) {
        for x in 0..self.tree.parent.len() as Rank {
            let (src, deps) = match self.tree.parent[x as usize] {
                None => (root_src, root_deps.to_vec()),
                Some(p) => (out, vec![b.push(x, self.down(x), Op::Recv { from: p, dst: out }, 1)]),
            };
            for &kid in &self.tree.children[x as usize] {
                b.push_after(x, self.down(kid), Op::Send { to: kid, src }, 1, &deps);
            }
        }
    }
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
            return Err(super::unsupported("tree", coll, "trees build all-reduce, broadcast and reduce"));
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

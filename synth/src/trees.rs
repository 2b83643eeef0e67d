//! Rooted spanning trees over ranks ([`Tree`]) and the emission of a chunk's flow over one
//! ([`TreeLanes`]): what the double binary tree, Blink and forest packing build their
//! schedules from.

use crate::error::Result;
use crate::schedule::{Collective, Op, Rank, ScheduleBuilder, Slot, StepRef};

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
    pub(crate) fn reroot_under(mut self, new_root: Rank) -> Tree {
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
            other => {
                return Err(crate::generate::unsupported("tree", other, "trees build all-reduce, broadcast and reduce"))
            }
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

//! Maximum flow (Dinic's algorithm) on small capacitated digraphs. The optimality bound, the
//! exact tree packing and the synthesizers' checks all reduce to "how much can flow from here
//! to there", so this is the one implementation they share.

use std::collections::VecDeque;

/// Flows below this are treated as zero (capacities are GB/s, so this is far below anything a
/// topology states).
pub const EPS: f64 = 1e-9;

#[derive(Debug, Clone, Copy)]
struct Arc {
    to: usize,
    /// Remaining capacity.
    cap: f64,
}

/// A flow network. Arcs are added in pairs (forward, residual); `max_flow` consumes capacity,
/// so callers that run several flows on one network call [`FlowNetwork::reset`] in between.
#[derive(Debug, Clone, Default)]
pub struct FlowNetwork {
    arcs: Vec<Arc>,
    original: Vec<f64>,
    out: Vec<Vec<usize>>,
    level: Vec<i32>,
    next: Vec<usize>,
}

impl FlowNetwork {
    pub fn new(nodes: usize) -> FlowNetwork {
        FlowNetwork { out: vec![Vec::new(); nodes], ..FlowNetwork::default() }
    }

    pub fn nodes(&self) -> usize {
        self.out.len()
    }

    /// Adds a node; returns its index.
    pub fn add_node(&mut self) -> usize {
        self.out.push(Vec::new());
        self.out.len() - 1
    }

    /// Adds an arc `from → to` of capacity `cap`; returns its id (for [`FlowNetwork::set_capacity`]
    /// and [`FlowNetwork::flow_on`]).
    pub fn add_arc(&mut self, from: usize, to: usize, cap: f64) -> usize {
        let id = self.arcs.len();
        self.arcs.push(Arc { to, cap });
        self.arcs.push(Arc { to: from, cap: 0.0 });
        self.original.push(cap);
        self.original.push(0.0);
        self.out[from].push(id);
        self.out[to].push(id + 1);
        id
    }

    /// Changes an arc's capacity (takes effect at the next reset).
    pub fn set_capacity(&mut self, arc: usize, cap: f64) {
        self.original[arc] = cap;
    }

    /// Restores every arc to its capacity (forgets all flow).
    pub fn reset(&mut self) {
        for (a, &c) in self.arcs.iter_mut().zip(&self.original) {
            a.cap = c;
        }
    }

    /// Flow currently on an arc (after `max_flow`).
    pub fn flow_on(&self, arc: usize) -> f64 {
        (self.original[arc] - self.arcs[arc].cap).max(0.0)
    }

    /// Pushes as much as possible from `s` to `t` on top of the current flow and returns the
    /// amount; stops early once `limit` is reached (pass `f64::INFINITY` for the maximum).
    pub fn max_flow(&mut self, s: usize, t: usize, limit: f64) -> f64 {
        if s == t {
            return limit;
        }
        let mut total = 0.0;
        while total + EPS < limit && self.bfs(s, t) {
            self.next.clear();
            self.next.resize(self.out.len(), 0);
            loop {
                let pushed = self.dfs(s, t, limit - total);
                if pushed <= EPS {
                    break;
                }
                total += pushed;
                if total + EPS >= limit {
                    break;
                }
            }
        }
        total
    }

    /// Nodes reachable from `s` in the residual network (after a max flow: the source side of
    /// a minimum cut).
    pub fn residual_reachable(&self, s: usize) -> Vec<bool> {
        let mut seen = vec![false; self.out.len()];
        seen[s] = true;
        let mut queue = VecDeque::from([s]);
        while let Some(u) = queue.pop_front() {
            for &a in &self.out[u] {
                let arc = self.arcs[a];
                if arc.cap > EPS && !seen[arc.to] {
                    seen[arc.to] = true;
                    queue.push_back(arc.to);
                }
            }
        }
        seen
    }

    fn bfs(&mut self, s: usize, t: usize) -> bool {
        self.level.clear();
        self.level.resize(self.out.len(), -1);
        self.level[s] = 0;
        let mut queue = VecDeque::from([s]);
        while let Some(u) = queue.pop_front() {
            for &a in &self.out[u] {
                let arc = self.arcs[a];
                if arc.cap > EPS && self.level[arc.to] < 0 {
                    self.level[arc.to] = self.level[u] + 1;
                    queue.push_back(arc.to);
                }
            }
        }
        self.level[t] >= 0
    }

    /// One blocking-flow augmentation, iterative (deep paths on large tori would overflow a
    /// recursive version's stack).
    fn dfs(&mut self, s: usize, t: usize, limit: f64) -> f64 {
        let mut path: Vec<usize> = Vec::new();
        let mut u = s;
        loop {
            if u == t {
                let mut push = limit;
                for &a in &path {
                    push = push.min(self.arcs[a].cap);
                }
                for &a in &path {
                    self.arcs[a].cap -= push;
                    self.arcs[a ^ 1].cap += push;
                }
                return push;
            }
            let mut advanced = false;
            while self.next[u] < self.out[u].len() {
                let a = self.out[u][self.next[u]];
                let arc = self.arcs[a];
                if arc.cap > EPS && self.level[arc.to] == self.level[u] + 1 {
                    path.push(a);
                    u = arc.to;
                    advanced = true;
                    break;
                }
                self.next[u] += 1;
            }
            if !advanced {
                // Dead end: never try this node again in this phase, back up one arc.
                self.level[u] = -1;
                match path.pop() {
                    None => return 0.0,
                    Some(a) => {
                        u = self.arcs[a ^ 1].to;
                        self.next[u] += 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_example() {
        // CLRS figure 26.1: max flow 23.
        let mut g = FlowNetwork::new(6);
        for (a, b, c) in [
            (0, 1, 16.0),
            (0, 2, 13.0),
            (2, 1, 4.0),
            (1, 3, 12.0),
            (3, 2, 9.0),
            (2, 4, 14.0),
            (4, 3, 7.0),
            (3, 5, 20.0),
            (4, 5, 4.0),
        ] {
            g.add_arc(a, b, c);
        }
        assert!((g.max_flow(0, 5, f64::INFINITY) - 23.0).abs() < 1e-9);
        let side = g.residual_reachable(0);
        assert!(side[0] && !side[5]);
        g.reset();
        assert!((g.max_flow(0, 5, 10.0) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn long_chain_does_not_overflow_the_stack() {
        let n = 200_000;
        let mut g = FlowNetwork::new(n);
        for i in 0..n - 1 {
            g.add_arc(i, i + 1, 1.0 + (i % 3) as f64);
        }
        assert!((g.max_flow(0, n - 1, f64::INFINITY) - 1.0).abs() < 1e-9);
    }
}

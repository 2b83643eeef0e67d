//! Cheapest spanning trees, the oracles of the tree packing: Chu–Liu/Edmonds for rooted
//! arborescences (broadcast, reduce) and Kruskal for undirected trees used in both directions
//! (all-reduce).

use crate::schedule::Rank;

/// A weighted arc between ranks.
#[derive(Debug, Clone, Copy)]
pub struct WeightedArc {
    pub from: usize,
    pub to: usize,
    pub weight: f64,
}

/// The cheapest arborescence rooted at `root` that spans all `n` vertices, as the index (into
/// `arcs`) of each vertex's entering arc (`None` for the root); `None` if some vertex cannot be
/// reached. Chu–Liu/Edmonds: pick every vertex's cheapest entering arc, contract the cycles
/// that forms, recurse, expand.
pub fn min_arborescence(n: usize, root: usize, arcs: &[WeightedArc]) -> Option<Vec<Option<usize>>> {
    let level: Vec<(usize, usize, f64, usize)> = arcs
        .iter()
        .enumerate()
        .filter(|(_, a)| a.from != a.to && a.to != root)
        .map(|(i, a)| (a.from, a.to, a.weight, i))
        .collect();
    let chosen = contract(n, root, &level)?;
    let mut parent_arc = vec![None; n];
    for id in chosen {
        parent_arc[arcs[id].to] = Some(id);
    }
    Some(parent_arc)
}

/// One level of Chu–Liu/Edmonds over arcs (from, to, weight, original id); returns the original
/// ids chosen (one per non-root vertex).
fn contract(n: usize, root: usize, arcs: &[(usize, usize, f64, usize)]) -> Option<Vec<usize>> {
    let mut best: Vec<Option<usize>> = vec![None; n];
    for (k, &(u, v, w, _)) in arcs.iter().enumerate() {
        if u != v && v != root && best[v].map_or(true, |b| w < arcs[b].2) {
            best[v] = Some(k);
        }
    }
    if (0..n).any(|v| v != root && best[v].is_none()) {
        return None;
    }
    // Find cycles of the chosen entering arcs.
    let mut comp = vec![usize::MAX; n];
    let mut mark = vec![usize::MAX; n];
    let mut next_id = 0;
    let mut cycles = 0;
    for start in 0..n {
        let mut v = start;
        while v != root && mark[v] == usize::MAX && comp[v] == usize::MAX {
            mark[v] = start;
            v = arcs[best[v]?].0;
        }
        if v != root && comp[v] == usize::MAX && mark[v] == start {
            // A new cycle through v.
            let mut x = v;
            loop {
                comp[x] = next_id;
                x = arcs[best[x]?].0;
                if x == v {
                    break;
                }
            }
            next_id += 1;
            cycles += 1;
        }
    }
    if cycles == 0 {
        return Some((0..n).filter(|&v| v != root).filter_map(|v| best[v].map(|k| arcs[k].3)).collect());
    }
    for c in comp.iter_mut() {
        if *c == usize::MAX {
            *c = next_id;
            next_id += 1;
        }
    }
    // Contracted arcs, weights reduced by the entering arc they would replace.
    let mut sub = Vec::with_capacity(arcs.len());
    let mut origin = Vec::with_capacity(arcs.len());
    for (k, &(u, v, w, id)) in arcs.iter().enumerate() {
        if comp[u] != comp[v] {
            let reduce = best[v].map_or(0.0, |b| arcs[b].2);
            sub.push((comp[u], comp[v], w - reduce, id));
            origin.push(k);
        }
    }
    let chosen = contract(next_id, comp[root], &sub)?;
    // Expand: each chosen arc enters one vertex; cycle vertices not entered keep their arc.
    let mut entered = vec![false; n];
    let mut out = Vec::with_capacity(n);
    for id in &chosen {
        if let Some(pos) = sub.iter().position(|s| s.3 == *id) {
            let (_, v, _, _) = arcs[origin[pos]];
            entered[v] = true;
            out.push(*id);
        }
    }
    for v in 0..n {
        if v != root && !entered[v] {
            let in_cycle = comp.iter().filter(|&&c| c == comp[v]).count() > 1;
            if in_cycle {
                out.push(arcs[best[v]?].3);
            }
        }
    }
    Some(out)
}

/// The cheapest spanning tree of an undirected graph given as edges (a, b, weight); returns the
/// chosen edge indices, or `None` if the graph is disconnected.
pub fn min_spanning_tree(n: usize, edges: &[(usize, usize, f64)]) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..edges.len()).collect();
    order.sort_by(|&a, &b| edges[a].2.total_cmp(&edges[b].2).then(a.cmp(&b)));
    let mut uf: Vec<usize> = (0..n).collect();
    fn find(uf: &mut [usize], mut x: usize) -> usize {
        while uf[x] != x {
            uf[x] = uf[uf[x]];
            x = uf[x];
        }
        x
    }
    let mut out = Vec::with_capacity(n.saturating_sub(1));
    for e in order {
        let (a, b) = (find(&mut uf, edges[e].0), find(&mut uf, edges[e].1));
        if a != b {
            uf[a] = b;
            out.push(e);
        }
    }
    (out.len() + 1 == n || n == 0).then_some(out)
}

/// Parent array of the tree given by undirected `edges`, hung from `root`.
pub fn orient(n: usize, root: Rank, edges: &[(usize, usize)]) -> Vec<Option<Rank>> {
    let mut adj = vec![Vec::new(); n];
    for &(a, b) in edges {
        adj[a].push(b);
        adj[b].push(a);
    }
    let mut parent = vec![None; n];
    let mut seen = vec![false; n];
    seen[root as usize] = true;
    let mut stack = vec![root as usize];
    while let Some(u) = stack.pop() {
        for &v in &adj[u] {
            if !seen[v] {
                seen[v] = true;
                parent[v] = Some(u as Rank);
                stack.push(v);
            }
        }
    }
    parent
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(n: usize, root: usize, arcs: &[WeightedArc]) -> Option<f64> {
        // Every choice of one entering arc per non-root vertex that forms a tree.
        let choices: Vec<Vec<usize>> =
            (0..n).map(|v| (0..arcs.len()).filter(|&i| arcs[i].to == v && arcs[i].from != v).collect()).collect();
        let mut best: Option<f64> = None;
        let mut pick = vec![0usize; n];
        loop {
            let mut ok = true;
            let mut cost = 0.0;
            for v in (0..n).filter(|&v| v != root) {
                if choices[v].is_empty() {
                    return None;
                }
                cost += arcs[choices[v][pick[v]]].weight;
            }
            for v in 0..n {
                let mut x = v;
                let mut steps = 0;
                while x != root {
                    x = arcs[choices[x][pick[x]]].from;
                    steps += 1;
                    if steps > n {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                best = Some(best.map_or(cost, |b: f64| b.min(cost)));
            }
            // Next combination.
            let mut v = 0;
            loop {
                if v == n {
                    return best;
                }
                if v == root || choices[v].is_empty() {
                    v += 1;
                    continue;
                }
                pick[v] += 1;
                if pick[v] < choices[v].len() {
                    break;
                }
                pick[v] = 0;
                v += 1;
            }
        }
    }

    #[test]
    fn chu_liu_edmonds_matches_brute_force() {
        let mut seed = 12345u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..300 {
            let n = 2 + (rnd() % 4) as usize;
            let m = n + (rnd() % 8) as usize;
            let arcs: Vec<WeightedArc> = (0..m)
                .map(|_| WeightedArc {
                    from: (rnd() % n as u64) as usize,
                    to: (rnd() % n as u64) as usize,
                    weight: (rnd() % 10) as f64,
                })
                .collect();
            let got = min_arborescence(n, 0, &arcs);
            let want = brute(n, 0, &arcs);
            match (got, want) {
                (None, None) => {}
                (Some(p), Some(w)) => {
                    let cost: f64 = p.iter().flatten().map(|&i| arcs[i].weight).sum();
                    assert!((cost - w).abs() < 1e-9, "{arcs:?}: {cost} vs {w}");
                    // And it is a spanning arborescence.
                    for v in 0..n {
                        let mut x = v;
                        for _ in 0..=n {
                            if x == 0 {
                                break;
                            }
                            x = arcs[p[x].unwrap()].from;
                        }
                        assert_eq!(x, 0);
                    }
                }
                (g, w) => panic!("{arcs:?}: {g:?} vs {w:?}"),
            }
        }
    }

    #[test]
    fn kruskal_spans() {
        let e = [(0, 1, 1.0), (1, 2, 5.0), (0, 2, 2.0), (2, 3, 1.0)];
        let t = min_spanning_tree(4, &e).unwrap();
        let cost: f64 = t.iter().map(|&i| e[i].2).sum();
        assert_eq!(cost, 4.0);
        assert!(min_spanning_tree(3, &[(0, 1, 1.0)]).is_none());
        let p = orient(4, 0, &t.iter().map(|&i| (e[i].0, e[i].1)).collect::<Vec<_>>());
        assert_eq!(p[0], None);
        assert!(p[1..].iter().all(|x| x.is_some()));
    }
}

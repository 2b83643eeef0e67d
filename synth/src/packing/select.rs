//! From the many thin trees of the multiplicative-weights packing to a few fat ones: a linear
//! program finds the best rates over the trees found (often above the MWU's own rates), then an
//! integer program keeps the fewest trees whose best rates stay within a slack of that optimum
//! (Blink's second stage). Fewer trees mean fewer channels and larger messages per tree.

use good_lp::{constraint, microlp, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};

use super::fractional::{PackedTree, PackingShape};
use crate::topology::logical::RankGraph;

/// Above this many candidate trees the integer program is not attempted (branch and bound on
/// the pure-Rust solver grows quickly); the LP's support is kept instead.
const ILP_MAX_TREES: usize = 12;
/// The LP sees at most this many candidates (the MWU's heaviest trees); the pure-Rust simplex
/// slows down sharply with thousands of columns.
const LP_MAX_TREES: usize = 160;

/// Re-optimises `trees`' rates by LP and keeps a small subset by ILP. Returns the trees with new
/// rates (zero-rate trees dropped); falls back to the input where a solver fails.
pub fn select_trees(graph: &RankGraph, shape: PackingShape, trees: Vec<PackedTree>, slack: f64) -> Vec<PackedTree> {
    let cap: Vec<f64> = graph.arcs().iter().map(|a| a.bandwidth).collect();
    let usage: Vec<Vec<usize>> = trees.iter().map(|t| t.arcs(graph, shape)).collect();
    let rates: Vec<f64> = trees.iter().map(|t| t.rate).collect();
    select(&cap, &usage, &rates, slack).into_iter().map(|(i, rate)| PackedTree { rate, ..trees[i].clone() }).collect()
}

/// [`select_trees`] over any capacities: tree `i` at rate r puts r on every resource in
/// `usage[i]` (listed once per use), resource `k` holds `cap[k]`. Returns the kept trees'
/// indices with their new rates.
pub fn select(cap: &[f64], usage: &[Vec<usize>], rates: &[f64], slack: f64) -> Vec<(usize, f64)> {
    let mut order: Vec<usize> = (0..usage.len()).collect();
    if order.len() <= 1 {
        return order.into_iter().map(|i| (i, rates[i])).collect();
    }
    order.sort_by(|&a, &b| rates[b].total_cmp(&rates[a]));
    order.truncate(LP_MAX_TREES);
    let unchanged = || order.iter().map(|&i| (i, rates[i])).collect::<Vec<_>>();
    let of = |kept: &[(usize, f64)]| kept.iter().map(|&(i, _)| usage[i].clone()).collect::<Vec<_>>();
    let Some(best) = best_rates(cap, &order.iter().map(|&i| usage[i].clone()).collect::<Vec<_>>(), None) else {
        return unchanged();
    };
    let optimum: f64 = best.iter().sum();
    let mut kept: Vec<(usize, f64)> =
        order.iter().zip(&best).filter(|(_, &r)| r > 1e-9 * optimum).map(|(&i, &r)| (i, r)).collect();
    let floor = (1.0 - slack) * optimum;
    let before = kept.len();
    if kept.len() > 1 && kept.len() <= ILP_MAX_TREES {
        if let Some(rates) = best_rates(cap, &of(&kept), Some(floor)) {
            for (k, r) in kept.iter_mut().zip(rates) {
                k.1 = r;
            }
            kept.retain(|k| k.1 > 1e-9 * optimum);
        }
    } else {
        // Too many for branch and bound: drop the thinnest tree while the rest still reach the
        // floor.
        kept.sort_by(|a, b| b.1.total_cmp(&a.1));
        while kept.len() > 1 {
            match best_rates(cap, &of(&kept[..kept.len() - 1]), None) {
                Some(rates) if rates.iter().sum::<f64>() >= floor => {
                    kept.pop();
                }
                _ => break,
            }
        }
    }
    // Trees were dropped (and the integer program only needed enough): give the survivors
    // their best rates.
    if let Some(rates) = best_rates(cap, &of(&kept), None).filter(|_| kept.len() < before) {
        for (k, r) in kept.iter_mut().zip(rates) {
            k.1 = r;
        }
        kept.retain(|k| k.1 > 1e-9 * optimum);
    }
    kept
}

/// Rates per tree within the arc capacities: the maximum total (`min_total` None), or the
/// fewest trees reaching `min_total` (each tree then switched on or off by a binary).
fn best_rates(cap: &[f64], usage: &[Vec<usize>], min_total: Option<f64>) -> Option<Vec<f64>> {
    let mut vars = ProblemVariables::new();
    let rates: Vec<Variable> = usage.iter().map(|_| vars.add(variable().min(0.0))).collect();
    let total: Expression = rates.iter().sum();
    let mut per_arc: Vec<Expression> = vec![Expression::default(); cap.len()];
    for (u, &r) in usage.iter().zip(&rates) {
        for &a in u {
            per_arc[a] += r;
        }
    }
    let arcs_used: Vec<usize> = (0..per_arc.len()).filter(|&a| usage.iter().any(|u| u.contains(&a))).collect();
    let solution = match min_total {
        None => {
            let mut model = vars.maximise(total).using(microlp);
            for &a in &arcs_used {
                model = model.with(constraint!(per_arc[a].clone() <= cap[a]));
            }
            model.solve().ok()?
        }
        Some(floor) => {
            let on: Vec<Variable> = usage.iter().map(|_| vars.add(variable().binary())).collect();
            let count: Expression = on.iter().sum();
            let mut model = vars.minimise(count).using(microlp);
            for &a in &arcs_used {
                model = model.with(constraint!(per_arc[a].clone() <= cap[a]));
            }
            for (i, u) in usage.iter().enumerate() {
                let most = u.iter().map(|&a| cap[a]).fold(f64::INFINITY, f64::min);
                model = model.with(constraint!(rates[i] <= most * on[i]));
            }
            model = model.with(constraint!(total >= floor));
            model.solve().ok()?
        }
    };
    Some(rates.iter().map(|&r| solution.value(r).max(0.0)).collect())
}

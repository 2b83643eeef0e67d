//! From the many thin trees of the multiplicative-weights packing to a few fat ones: a linear
//! program finds the best rates over the trees found (often above the MWU's own rates), then an
//! integer program keeps the fewest trees whose best rates stay within a slack of that optimum
//! (Blink's second stage). Fewer trees mean fewer channels and larger messages per tree.

use good_lp::{constraint, microlp, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};

use super::packing::{PackedTree, PackingShape};
use crate::topology::logical::RankGraph;

/// Above this many candidate trees the integer program is not attempted (branch and bound on
/// the pure-Rust solver grows quickly); the LP's support is kept instead.
const ILP_MAX_TREES: usize = 12;
/// The LP sees at most this many candidates (the MWU's heaviest trees); the pure-Rust simplex
/// slows down sharply with thousands of columns.
const LP_MAX_TREES: usize = 160;

/// Re-optimises `trees`' rates by LP and keeps a small subset by ILP. Returns the trees with new
/// rates (zero-rate trees dropped); falls back to the input where a solver fails.
pub fn select_trees(graph: &RankGraph, shape: PackingShape, mut trees: Vec<PackedTree>, slack: f64) -> Vec<PackedTree> {
    if trees.len() <= 1 {
        return trees;
    }
    trees.sort_by(|a, b| b.rate.total_cmp(&a.rate));
    trees.truncate(LP_MAX_TREES);
    let usage: Vec<Vec<usize>> = trees.iter().map(|t| t.arcs(graph, shape)).collect();
    let Some(rates) = best_rates(graph, &usage, None) else {
        return trees;
    };
    let optimum: f64 = rates.iter().sum();
    let mut kept: Vec<(PackedTree, Vec<usize>)> = trees
        .into_iter()
        .zip(usage)
        .zip(&rates)
        .filter(|(_, &r)| r > 1e-9 * optimum)
        .map(|((mut t, u), &r)| {
            t.rate = r;
            (t, u)
        })
        .collect();
    let floor = (1.0 - slack) * optimum;
    let before = kept.len();
    if kept.len() > 1 && kept.len() <= ILP_MAX_TREES {
        let usage: Vec<Vec<usize>> = kept.iter().map(|(_, u)| u.clone()).collect();
        if let Some(rates) = best_rates(graph, &usage, Some(floor)) {
            for ((t, _), r) in kept.iter_mut().zip(rates) {
                t.rate = r;
            }
            kept.retain(|(t, _)| t.rate > 1e-9 * optimum);
        }
    } else {
        // Too many for branch and bound: drop the thinnest tree while the rest still reach the
        // floor.
        kept.sort_by(|a, b| b.0.rate.total_cmp(&a.0.rate));
        while kept.len() > 1 {
            let usage: Vec<Vec<usize>> = kept[..kept.len() - 1].iter().map(|(_, u)| u.clone()).collect();
            match best_rates(graph, &usage, None) {
                Some(rates) if rates.iter().sum::<f64>() >= floor => {
                    kept.pop();
                }
                _ => break,
            }
        }
    }
    // Trees were dropped (and the integer program only needed enough): give the survivors
    // their best rates.
    let usage: Vec<Vec<usize>> = kept.iter().map(|(_, u)| u.clone()).collect();
    if let Some(rates) = best_rates(graph, &usage, None).filter(|_| kept.len() < before) {
        for ((t, _), r) in kept.iter_mut().zip(rates) {
            t.rate = r;
        }
        kept.retain(|(t, _)| t.rate > 1e-9 * optimum);
    }
    kept.into_iter().map(|(t, _)| t).collect()
}

/// Rates per tree within the arc capacities: the maximum total (`min_total` None), or the
/// fewest trees reaching `min_total` (each tree then switched on or off by a binary).
fn best_rates(graph: &RankGraph, usage: &[Vec<usize>], min_total: Option<f64>) -> Option<Vec<f64>> {
    let mut vars = ProblemVariables::new();
    let rates: Vec<Variable> = usage.iter().map(|_| vars.add(variable().min(0.0))).collect();
    let total: Expression = rates.iter().sum();
    let mut per_arc: Vec<Expression> = vec![Expression::default(); graph.arcs().len()];
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
                model = model.with(constraint!(per_arc[a].clone() <= graph.arc(a).bandwidth));
            }
            model.solve().ok()?
        }
        Some(floor) => {
            let on: Vec<Variable> = usage.iter().map(|_| vars.add(variable().binary())).collect();
            let count: Expression = on.iter().sum();
            let mut model = vars.minimise(count).using(microlp);
            for &a in &arcs_used {
                model = model.with(constraint!(per_arc[a].clone() <= graph.arc(a).bandwidth));
            }
            for (i, u) in usage.iter().enumerate() {
                let most = u.iter().map(|&a| graph.arc(a).bandwidth).fold(f64::INFINITY, f64::min);
                model = model.with(constraint!(rates[i] <= most * on[i]));
            }
            model = model.with(constraint!(total >= floor));
            model.solve().ok()?
        }
    };
    Some(rates.iter().map(|&r| solution.value(r).max(0.0)).collect())
}

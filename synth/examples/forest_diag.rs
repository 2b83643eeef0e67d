//! Where the forest's rate goes: the cut bound, the fractional packing, and the lanes it is
//! run as. `cargo run --release -p topoccl-synth --example forest_diag -- dgx1`
use topoccl_synth::bound::bound;
use topoccl_synth::forest::packing::{forest_plan, Direction};
use topoccl_synth::packing::lanes::lane_counts_on;
use topoccl_synth::schedule::Collective;
use topoccl_synth::topology::resolve;

fn main() -> Result<(), topoccl_synth::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let topo = resolve(args.first().map_or("dgx1", String::as_str))?;
    let n = topo.nranks() as f64;
    for (direction, coll) in [(Direction::Out, Collective::AllGather), (Direction::In, Collective::ReduceScatter)] {
        let per_root = bound(&topo, coll).rate_gbps / n;
        let started = std::time::Instant::now();
        let Some(plan) = forest_plan(&topo, direction, true, 0.01, 0.01, 32) else {
            println!("{coll}: some rank cannot reach another");
            continue;
        };
        let seconds = started.elapsed().as_secs_f64();
        let rates: Vec<f64> = plan.bundles.iter().map(|b| b.rate).collect();
        let (counts, realized) = lane_counts_on(&plan.cap, &plan.usage, &rates, 32);
        let deepest = plan.bundles.iter().flat_map(|b| &b.trees).map(|t| t.depth()).max().unwrap_or(0);
        let groups = topo.link_groups();
        let mut by_latency: std::collections::BTreeMap<String, usize> = Default::default();
        for t in plan.bundles.iter().flat_map(|b| &b.trees) {
            for a in t.arc.iter().flatten() {
                let us: f64 = plan.arcs[*a].groups.iter().map(|&g| groups[g].latency).sum();
                *by_latency.entry(format!("{us:.1} us")).or_default() += 1;
            }
        }
        println!("{coll}: tree edges by path latency {by_latency:?}");
        println!(
            "{coll}: bound {per_root:.3} GB/s per root; packed {:.3} ({:.1} %) in {} bundles, trees up to {deepest} deep; \
             {} lanes realize {realized:.3} ({:.1} %); {seconds:.2} s",
            plan.rate,
            100.0 * plan.rate / per_root,
            plan.bundles.len(),
            counts.iter().sum::<usize>(),
            100.0 * realized / per_root
        );
    }
    Ok(())
}

//! TACOS all-gather at scale: steps and predicted time against the in-bandwidth bound, and how
//! long synthesis takes. `cargo run --release -p topoccl-synth --example tacos_scale -- torus3d:8x8x16`
use topoccl_synth::tacos::attempts::best_all_gather;
use topoccl_synth::tacos::problem::TenOptions;
use topoccl_synth::tacos::WINDOW;
use topoccl_synth::topology::{logical::RankGraph, resolve};

fn main() -> Result<(), topoccl_synth::Error> {
    let bytes = (1u64 << 30) as f64;
    for spec in std::env::args().skip(1) {
        let started = std::time::Instant::now();
        let g = RankGraph::of(&resolve(&spec)?);
        let n = g.nranks();
        let min_in = (0..n as u32)
            .map(|r| g.in_arcs(r).iter().map(|&a| g.arc(a).bandwidth).sum::<f64>())
            .fold(f64::INFINITY, f64::min);
        let opt = TenOptions { per_rank: 1, chunk_bytes: bytes / n as f64, keep_order: false, window: WINDOW, seed: 0 };
        let s = best_all_gather(&g, opt)?;
        let bound = (n as f64 - 1.0) / n as f64 * bytes / (min_in * 1e3);
        println!(
            "{spec}: {n} ranks, {} steps, {:.1} us vs bound {:.1} us = {:.1} %, synthesized in {:.2} s",
            s.steps,
            s.time_us,
            bound,
            100.0 * bound / s.time_us,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

//! Simulator throughput at scale: how long generating and simulating a schedule takes, per
//! message. `cargo run --release -p topoccl-synth --example sim_scale -- ring:4096 ring 2`
//! (topology, algorithm, channels; 0 channels: the algorithm's default).
use std::time::Instant;

use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::Simulator;
use topoccl_synth::topology::resolve;

fn main() -> Result<(), topoccl_synth::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec = args.first().map_or("ring:4096", String::as_str);
    let algo = args.get(1).map_or("ring", String::as_str);
    let channels: u32 = args.get(2).and_then(|c| c.parse().ok()).unwrap_or(0);
    let topo = resolve(spec)?;
    let started = Instant::now();
    let bound = topoccl_synth::bound::bound(&topo, Collective::AllReduce);
    println!(
        "{spec}: all-reduce bound {:.1} GB/s ({}, {}), computed in {:.2} s",
        bound.rate_gbps,
        bound.shape,
        if bound.exact { "exact" } else { "not exact" },
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let mut req = Request::new(&topo, Collective::AllReduce);
    if channels > 0 {
        req = req.channels(channels);
    }
    let sched = Registry::builtin().generate(algo, &req)?;
    let generated = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let r = Simulator::new(&topo).run(&sched, 1 << 30)?;
    let simulated = started.elapsed().as_secs_f64();
    println!(
        "{spec} {algo} c{channels}: {} messages, generated in {generated:.2} s, simulated in {simulated:.2} s \
         ({:.0} ns per message), predicted {:.1} us, {:.1} % of the bound",
        r.messages,
        simulated * 1e9 / r.messages as f64,
        r.time_us,
        100.0 * bound.efficiency(1 << 30, r.time_us)
    );
    Ok(())
}

//! Closed-form estimates alone, as % of the bound, for machines too large to simulate quickly:
//! `cargo run --release -p topoccl-synth --example estimate_only -- TOPOLOGY ALGO ag|rs|ar`.
use std::time::Instant;

use topoccl_synth::bound::bound;
use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::lockstep::Lockstep;
use topoccl_synth::sim::SimConfig;
use topoccl_synth::topology::resolve;

fn main() -> Result<(), topoccl_synth::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let topo = resolve(args.first().map_or("cluster:2x8", String::as_str))?;
    let algo = args.get(1).map_or("ring", String::as_str);
    let coll = match args.get(2).map(String::as_str) {
        Some("ag") => Collective::AllGather,
        Some("rs") => Collective::ReduceScatter,
        _ => Collective::AllReduce,
    };
    let reg = Registry::builtin();
    let g = reg.get(algo)?;
    let limit = bound(&topo, coll);
    let mut model = Lockstep::new(&topo, SimConfig::default());
    for bytes in [64u64 << 20, 1 << 30] {
        let req = Request::new(&topo, coll);
        let t = Instant::now();
        let est = g.estimate(&req, bytes, &mut model);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match est {
            Some(us) => println!(
                "{algo} {coll} {:>5} MiB: {us:.1} us, {:.1} % of the bound ({ms:.0} ms)",
                bytes >> 20,
                100.0 * limit.efficiency(bytes, us)
            ),
            None => println!("{algo} {coll}: no closed form"),
        }
    }
    Ok(())
}

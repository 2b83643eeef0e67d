//! Closed-form estimates beside the simulator: `cargo run --release -p topoccl-synth --example
//! estimate_check -- TOPOLOGY ALGO [COLLECTIVE]` prints both for a few sizes and knobs.
use std::time::Instant;

use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::lockstep::Lockstep;
use topoccl_synth::sim::{SimConfig, Simulator};
use topoccl_synth::topology::resolve;

fn main() -> Result<(), topoccl_synth::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let topo = resolve(args.first().map_or("cluster:2x8", String::as_str))?;
    let algo = args.get(1).map_or("ring", String::as_str);
    let colls: Vec<Collective> = match args.get(2).map(String::as_str) {
        Some("ag") => vec![Collective::AllGather],
        Some("rs") => vec![Collective::ReduceScatter],
        Some("bc") => vec![Collective::Broadcast { root: 0 }],
        Some("ar") => vec![Collective::AllReduce],
        _ => vec![Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter],
    };
    let reg = Registry::builtin();
    let g = reg.get(algo)?;
    let config = SimConfig::default();
    let mut model = Lockstep::new(&topo, config);
    let mut sim = Simulator::with_config(&topo, config);
    for coll in colls {
        for (p, c) in [(1, 0), (8, 0), (1, 2), (32, 0)] {
            let req = Request::new(&topo, coll).pipeline(p).channels(c);
            let Ok(s) = g.generate(&req) else { continue };
            for bytes in [1u64 << 20, 64 << 20, 1 << 30] {
                let t = Instant::now();
                let est = g.estimate(&req, bytes, &mut model);
                let te = t.elapsed().as_secs_f64() * 1e3;
                let t = Instant::now();
                let r = sim.run(&s, bytes)?;
                let ts = t.elapsed().as_secs_f64() * 1e3;
                println!(
                    "{coll} p{p} c{c} {:>5} MiB: sim {:>10.1} us ({ts:.0} ms)  est {:>10.1} us ({te:.1} ms)  ratio {:.3}",
                    bytes >> 20,
                    r.time_us,
                    est.unwrap_or(f64::NAN),
                    est.unwrap_or(f64::NAN) / r.time_us
                );
            }
        }
    }
    Ok(())
}

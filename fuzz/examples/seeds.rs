//! Writes the seed corpora under `corpus/<target>/` (run from this folder:
//! `cargo run --example seeds`). Every seed is made by the code under test itself (its
//! encoders, its generators, its topology files), so the seeds follow the formats as they
//! change; rerun this after a format change and commit what it writes.

use std::fs;
use std::path::Path;

use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::topology::{self, file};

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    fs::create_dir_all(&dir).expect("the corpus folder");
    fs::write(dir.join(name), bytes).expect("a seed");
}

fn main() {
    for (name, bytes) in topoccl_transports::fuzzing::frame_stream_seeds() {
        write("frame_header", name, &bytes);
    }
    for (name, bytes) in topoccl_transports::fuzzing::shm_ring_seeds() {
        write("shm_ring", name, &bytes);
    }
    for (name, bytes) in topoccl::fuzzing::call_header_seeds() {
        write("call_header", name, &bytes);
    }
    for (name, bytes) in topoccl::fuzzing::bootstrap_seeds() {
        write("bootstrap", name, &bytes);
    }

    // Topology files: small ones of topologies/, files written for subsets and families, and
    // names as TOPOCCL_TOPOLOGY takes them.
    let topologies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../topologies");
    for name in ["full-8", "ring-8", "cluster-2x4-slow", "torus3d-4x4x4", "dgx1"] {
        let text = fs::read(topologies.join(format!("{name}.toml"))).expect("a topology file");
        write("topology", &format!("{name}.toml"), &text);
    }
    for spec in ["dgx1[0,1,3,6]", "cluster:2x2,nic=gpu", "host:3"] {
        let t = topology::resolve(spec).expect("a topology");
        let name = spec.replace([':', ',', '=', '[', ']'], "-").trim_end_matches('-').to_string();
        write("topology", &format!("written-{name}.toml"), file::to_toml(&t).expect("as a file").as_bytes());
    }
    for spec in ["torus2d:4x4,bw=25", "dgx1[0-3]", "ring-8[7,0]", "cluster:2x4,nic=node,fabric=fattree"] {
        write(
            "topology",
            &format!("name-{}", spec.replace([':', ',', '=', '[', ']'], "-").trim_end_matches('-')),
            spec.as_bytes(),
        );
    }

    // Schedules as the generators emit them, on small machines.
    let registry = Registry::builtin();
    let mut written = 0;
    for spec in ["ring:4", "full:3"] {
        let topo = topology::resolve(spec).expect("a topology");
        for name in registry.names() {
            for collective in [Collective::AllReduce, Collective::Broadcast { root: 1 }, Collective::AllToAll] {
                let Ok(s) = registry.generate(name, &Request::new(&topo, collective)) else { continue };
                let json = s.to_json().expect("as JSON");
                if json.len() <= 6000 && written < 12 {
                    let file = format!("{name}-{}-{}.json", collective.name(), spec.replace(':', "-"));
                    write("schedule_json", &file, json.as_bytes());
                    written += 1;
                }
            }
        }
    }
}

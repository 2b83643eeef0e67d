//! Simulator and generator throughput. The scale target: a 4096-rank ring all-reduce
//! (33.5 M steps) simulated in under 10 s on a 2-core machine; run with
//! `cargo bench --bench simulator -- ring_4096`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::Simulator;
use topoccl_synth::topology::resolve;

fn ring_allreduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring_allreduce_sim");
    group.sample_size(10);
    for n in [256u32, 1024, 4096] {
        let topo = resolve(&format!("ring:{n}")).unwrap();
        let sched =
            Registry::builtin().generate("ring", &Request::new(&topo, Collective::AllReduce).channels(1)).unwrap();
        group.bench_with_input(BenchmarkId::new("ring", n), &n, |b, _| {
            b.iter(|| Simulator::new(&topo).run(&sched, 1 << 30).unwrap().time_us)
        });
    }
    group.finish();
}

fn generators(c: &mut Criterion) {
    let mut group = c.benchmark_group("generate");
    let dgx1 = resolve("dgx1").unwrap();
    let reg = Registry::builtin();
    for algo in ["ring", "tree", "rhd"] {
        group.bench_function(algo, |b| {
            b.iter(|| reg.generate(algo, &Request::new(&dgx1, Collective::AllReduce)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, generators, ring_allreduce);
criterion_main!(benches);

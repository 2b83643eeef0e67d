//! The synthesizers on random irregular machines: random connected graphs of 2–12 ranks with
//! mixed link speeds and latencies, some ranks behind a switch. For every schedule Blink and
//! TACOS build (and the fixed algorithms, as a control):
//! - the verifier proves it computes the collective;
//! - the simulator runs it to the end (no deadlock);
//! - it is never faster than the optimality bound (a schedule beating the bound would mean a
//!   wrong bound or a wrong simulator — this found the all-reduce bound ignoring that
//!   reduce-scatter is slower than all-gather on one-way-fast machines), and Blink's are not
//!   far from it.

use proptest::prelude::*;
use topoccl_synth::bound::bound;
use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::simulate;
use topoccl_synth::topology::{Link, LinkKind, Node, NodeKind, Topology};
use topoccl_synth::verify::verify;

/// A random machine: `n` ranks; a random spanning tree keeps it connected, `extra` more links
/// make it irregular; links are duplex with a speed drawn per direction (so some are
/// asymmetric); with `switch`, ranks 0..n/2 also hang off a switch.
#[derive(Debug, Clone)]
struct Machine {
    n: usize,
    tree: Vec<usize>,
    extra: Vec<(usize, usize)>,
    speeds: Vec<(f64, f64, f64)>,
    switch: bool,
}

const SPEEDS: [f64; 4] = [5.0, 12.5, 25.0, 50.0];

fn machine() -> impl Strategy<Value = Machine> {
    (2usize..=12).prop_flat_map(|n| {
        (
            Just(n),
            proptest::collection::vec(any::<prop::sample::Index>(), n - 1),
            proptest::collection::vec((0..n, 0..n), 0..=n),
            proptest::collection::vec((0usize..4, 0usize..4, 1u32..4), 3 * n),
            any::<bool>(),
        )
            .prop_map(|(n, parents, extra, speeds, switch)| Machine {
                n,
                tree: parents.iter().enumerate().map(|(i, p)| p.index(i + 1)).collect(),
                extra: extra.into_iter().filter(|(a, b)| a != b).collect(),
                speeds: speeds.into_iter().map(|(a, b, l)| (SPEEDS[a], SPEEDS[b], f64::from(l) * 0.5)).collect(),
                switch,
            })
    })
}

impl Machine {
    fn topology(&self) -> Topology {
        let mut nodes: Vec<Node> = (0..self.n)
            .map(|i| Node {
                name: format!("g{i}"),
                kind: NodeKind::Gpu,
                rank: Some(i as u32),
                host: "h".into(),
                // Like chips of a torus: a graph that is not complete needs relaying ranks.
                forwards: true,
            })
            .collect();
        let mut pairs: Vec<(usize, usize)> = self.tree.iter().enumerate().map(|(i, &p)| (i + 1, p)).collect();
        pairs.extend(self.extra.iter().copied());
        let mut links = Vec::new();
        for (k, &(a, b)) in pairs.iter().enumerate() {
            let (ab, ba, lat) = self.speeds[k % self.speeds.len()];
            let l = |bw| Link { bandwidth: bw, latency: lat, kind: LinkKind::NvLink };
            links.push((a, b, l(ab)));
            links.push((b, a, l(ba)));
        }
        if self.switch && self.n >= 4 {
            let sw = nodes.len();
            nodes.push(Node {
                name: "sw".into(),
                kind: NodeKind::Switch,
                rank: None,
                host: "h".into(),
                forwards: true,
            });
            for r in 0..self.n / 2 {
                let l = Link { bandwidth: 8.0, latency: 1.0, kind: LinkKind::Pcie };
                links.push((r, sw, l));
                links.push((sw, r, l));
            }
        }
        Topology::new("random", nodes, links).expect("a spanning tree connects every rank")
    }
}

fn collectives(n: u32) -> [Collective; 5] {
    [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast { root: n - 1 },
        Collective::Reduce { root: 0 },
    ]
}

const BYTES: u64 = 64 << 20;

/// TACOS moves whole chunks: with one chunk per rank a slow link can hold a chunk hostage, so
/// it is run (as the tuner would) with several chunks per rank.
fn pipeline(name: &str) -> u32 {
    if name == "tacos" {
        4
    } else {
        1
    }
}

fn check(m: &Machine) -> Result<(), TestCaseError> {
    let topo = m.topology();
    let n = topo.nranks() as u32;
    let reg = Registry::builtin();
    for coll in collectives(n) {
        let b = bound(&topo, coll);
        for name in ["blink", "tacos", "ring", "tree"] {
            let g = reg.get(name).unwrap();
            if !g.supports(coll) {
                continue;
            }
            let s = g.generate(&Request::new(&topo, coll).bytes(BYTES).pipeline(pipeline(name)));
            let s = s.map_err(|e| TestCaseError::fail(format!("{name} {coll}: {e}")))?;
            verify(&s).map_err(|e| TestCaseError::fail(format!("{name} {coll}: {e}")))?;
            let t = simulate(&topo, &s, BYTES).map_err(|e| TestCaseError::fail(format!("{name} {coll}: {e}")))?;
            let floor = b.time_us(BYTES);
            prop_assert!(
                t.time_us >= floor * (1.0 - 1e-6),
                "{name} {coll}: {:.1} µs beats the bound {:.1} µs ({})",
                t.time_us,
                floor,
                b.shape
            );
            // Blink packs trees into the machine: at least a quarter of the tree-shape bound on
            // any graph (rings may do far worse on irregular ones). TACOS is not held to a
            // floor here: its greedy time-expanded matching can send one chunk into a region
            // over two slow links where one would do (the published algorithm shares this), so
            // on some mixed-speed graphs it is slower than a ring; the tuner prices it and
            // picks another algorithm there.
            if name == "blink" && n > 1 {
                let rate = match coll {
                    Collective::AllReduce => b.shapes.iter().find(|s| s.0 == "trees").map_or(b.rate_gbps, |s| s.1),
                    _ => b.rate_gbps,
                };
                let best = (BYTES as f64 / (rate * 1e3)).max(b.latency_us);
                prop_assert!(
                    best / t.time_us > 0.25,
                    "{name} {coll}: {:.1}% of the bound ({:?})",
                    100.0 * best / t.time_us,
                    b.shapes
                );
            }
        }
    }
    Ok(())
}

proptest! {
    // A fixed seed: CI sees the same 200 machines every run. New machines are explored by
    // running with PROPTEST_RNG_SEED set; failures found that way are kept below.
    #![proptest_config(ProptestConfig { cases: 200, rng_seed: proptest::test_runner::RngSeed::Fixed(0x70c0), ..ProptestConfig::default() })]

    #[test]
    fn synthesized_schedules_are_correct_and_within_the_bound(m in machine()) {
        check(&m)?;
    }
}

/// Found by a random run (CI, 2026-11-23): rank 0 ended with a partial sum of chunk 35. The
/// matcher had stalled: rank 7 held the chunk, its only useful out-link had declined it (another
/// in-link of the destination was sooner, for other chunks) and was parked until rank 7 received
/// something new, which never came as rank 7 was complete; the all-gather ended with nine ranks
/// lacking the chunk. Links that decline are now woken when their destination changes, and a
/// stall forces a round without restraint (or reports a disconnected graph).
#[test]
fn tacos_all_reduce_on_an_irregular_11_rank_machine() {
    let s = |a, b, l| (a, b, l);
    let m = Machine {
        n: 11,
        tree: vec![0, 0, 0, 0, 0, 0, 0, 7, 7, 0],
        extra: vec![(0, 9), (0, 1), (1, 6), (1, 9), (7, 10), (0, 9)],
        speeds: vec![
            s(5.0, 5.0, 0.5),
            s(12.5, 5.0, 0.5),
            s(12.5, 5.0, 0.5),
            s(12.5, 5.0, 0.5),
            s(12.5, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 50.0, 0.5),
            s(12.5, 5.0, 0.5),
            s(50.0, 5.0, 0.5),
            s(12.5, 12.5, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 12.5, 0.5),
            s(50.0, 50.0, 0.5),
            s(5.0, 12.5, 1.0),
            s(12.5, 25.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 5.0, 0.5),
            s(5.0, 12.5, 0.5),
            s(50.0, 12.5, 1.0),
        ],
        switch: false,
    };
    check(&m).unwrap();
}

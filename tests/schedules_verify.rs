//! Every generator × every collective it supports, checked by the verifier: exhaustively for
//! small rank counts, and as property tests over random rank counts (1..=64), chunk counts
//! (pipeline depth, channels), roots and topologies.

use proptest::prelude::*;
use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::{Collective, Rank};
use topoccl_synth::topology::{resolve, Topology};
use topoccl_synth::verify::verify;

fn collectives(n: u32, root: Rank) -> Vec<Collective> {
    let root = root % n;
    vec![
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root },
        Collective::Reduce { root },
        Collective::AllToAll,
    ]
}

fn check_all(topo: &Topology, root: Rank, pipeline: u32, channels: u32) {
    let reg = Registry::builtin();
    let n = topo.nranks() as u32;
    for g in reg.iter() {
        for c in collectives(n, root) {
            if !g.supports(c) {
                continue;
            }
            let req = Request::new(topo, c).pipeline(pipeline).channels(channels);
            let s = match g.generate(&req) {
                Ok(s) => s,
                // The hierarchical algorithms refuse hosts of unequal size, and halving-doubling
                // across hosts a host count that is not a power of two, with a reason.
                Err(e)
                    if g.name().starts_with("hier")
                        && ["different rank counts", "not a power of two"]
                            .iter()
                            .any(|w| e.to_string().contains(w)) =>
                {
                    continue
                }
                // Tree packing per root refuses large rank counts, with a reason.
                Err(_) if g.name() == "forest" && n as usize > topoccl_synth::forest::FOREST_MAX_RANKS => continue,
                Err(e) => panic!("{} {c} on {} ranks ({}): {e}", g.name(), n, topo.name()),
            };
            assert_eq!(s.nranks, n);
            if let Err(e) = verify(&s) {
                panic!("{} {c} on {} (n={n}, pipeline {pipeline}, channels {channels}): {e}", g.name(), topo.name());
            }
        }
    }
}

#[test]
fn every_generator_is_correct_for_small_rank_counts() {
    for n in 1..=17 {
        let topo = resolve(&format!("full:{n}")).unwrap();
        for (pipeline, channels) in [(1, 0), (2, 1), (3, 3)] {
            check_all(&topo, n as Rank - 1, pipeline, channels);
        }
    }
}

#[test]
fn every_generator_is_correct_on_the_library_machines() {
    for name in topoccl_synth::topology::builtin_names() {
        let topo = resolve(name).unwrap();
        if topo.nranks() > 64 {
            continue;
        }
        check_all(&topo, 1, 1, 0);
    }
    for spec in ["cluster:3x4", "cluster:4x1", "cluster:1x5", "dgx1[0,1,3,6]", "dgx1[0,2,5]"] {
        check_all(&resolve(spec).unwrap(), 0, 2, 0);
    }
}

fn topology_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u32..=64).prop_map(|n| format!("full:{n}")),
        (1u32..=64).prop_map(|n| format!("ring:{n}")),
        (2u32..=8, 2u32..=8).prop_map(|(a, b)| format!("torus2d:{a}x{b}")),
        (1u32..=8, 1u32..=8).prop_map(|(h, g)| format!("cluster:{h}x{g}")),
        proptest::sample::subsequence((0u32..8).collect::<Vec<_>>(), 1..=8).prop_map(|ranks| {
            let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
            format!("dgx1[{}]", list.join(","))
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_topologies_ranks_and_chunkings(spec in topology_strategy(), root in 0u32..64, pipeline in 1u32..4, channels in 0u32..4) {
        let topo = resolve(&spec).unwrap();
        check_all(&topo, root, pipeline, channels);
    }
}

/// The verifier must reject broken variants of correct schedules: a reduction turned into a
/// copy, a step pointed at the wrong chunk, a dropped step, a swapped peer.
#[test]
fn mutated_schedules_are_rejected() {
    use topoccl_synth::schedule::{Op, Slot};
    let reg = Registry::builtin();
    let topo = resolve("full:5").unwrap();
    for (algo, coll) in [
        ("ring", Collective::AllReduce),
        ("tree", Collective::AllReduce),
        ("rhd", Collective::ReduceScatter),
        ("ring", Collective::AllGather),
    ] {
        let good = reg.generate(algo, &Request::new(&topo, coll)).unwrap();
        verify(&good).unwrap();
        let mut caught = 0;
        let mut tried = 0;
        for r in 0..good.ranks.len() {
            for c in 0..good.ranks[r].channels.len() {
                for s in 0..good.ranks[r].channels[c].steps.len() {
                    let step = good.ranks[r].channels[c].steps[s];
                    let mutants: Vec<Option<Op>> = vec![
                        match step.op {
                            Op::RecvReduce { from, dst, .. } => Some(Op::Recv { from, dst }),
                            Op::RecvReduceSend { from, to, .. } => {
                                Some(Op::RecvCopySend { from, to, dst: Slot::scratch(0) })
                            }
                            Op::Recv { from, dst } => Some(Op::Recv {
                                from,
                                dst: Slot { index: (dst.index + 1) % good.output_chunks(), ..dst },
                            }),
                            _ => None,
                        },
                        None, // drop the step
                    ];
                    for m in mutants.into_iter().filter(|m| *m != Some(step.op)) {
                        let mut bad = good.clone();
                        bad.scratch_chunks = bad.scratch_chunks.max(1);
                        let steps = &mut bad.ranks[r].channels[c].steps;
                        match m {
                            Some(op) => steps[s].op = op,
                            None => {
                                steps.remove(s);
                                bad.ranks[r].channels[c].deps.retain(|d| d.step < s as u32);
                            }
                        }
                        tried += 1;
                        if bad.validate().is_err() || verify(&bad).is_err() {
                            caught += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(caught, tried, "{algo} {coll}: {} of {tried} mutants passed the verifier", tried - caught);
    }
}

//! The simulator against closed-form alpha-beta times on uniform topologies (within 1%), and
//! link sharing. α = link latency (µs), B = link bandwidth, S = buffer bytes.

use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::{Collective, Op, ScheduleBuilder, Slot};
use topoccl_synth::sim::simulate;
use topoccl_synth::topology::resolve;

const ALPHA: f64 = 0.7;
const BW: f64 = 40.0; // GB/s

fn sim(spec: &str, algo: &str, coll: Collective, channels: u32, bytes: u64) -> f64 {
    let topo = resolve(&format!("{spec},bw={BW},lat={ALPHA}")).unwrap();
    let s = Registry::builtin().generate(algo, &Request::new(&topo, coll).channels(channels)).unwrap();
    simulate(&topo, &s, bytes).unwrap().time_us
}

fn close(got: f64, want: f64, what: &str) {
    let err = (got - want).abs() / want;
    assert!(err < 0.01, "{what}: simulated {got:.3} µs, formula {want:.3} µs ({:.2}% off)", err * 100.0);
}

/// Transfer time of `b` bytes at BW, µs.
fn xfer(b: f64) -> f64 {
    b / (BW * 1e3)
}

#[test]
fn ring_matches_the_alpha_beta_formula() {
    for n in [2u32, 3, 4, 5, 8, 16, 64] {
        for bytes in [1024u64, 1 << 20, 1 << 30] {
            let s = bytes as f64;
            let nf = f64::from(n);
            let spec = format!("ring:{n}");
            // One ring: 2(n−1) steps of S/n.
            close(
                sim(&spec, "ring", Collective::AllReduce, 1, bytes),
                2.0 * (nf - 1.0) * (ALPHA + xfer(s / nf)),
                &format!("ring AR n={n} S={bytes}"),
            );
            // Both directions: each ring carries half the data.
            if n > 2 {
                close(
                    sim(&spec, "ring", Collective::AllReduce, 2, bytes),
                    2.0 * (nf - 1.0) * (ALPHA + xfer(s / nf / 2.0)),
                    &format!("bidir ring AR n={n}"),
                );
            }
            let half = (nf - 1.0) * (ALPHA + xfer(s / nf));
            close(sim(&spec, "ring", Collective::ReduceScatter, 1, bytes), half, &format!("ring RS n={n}"));
            close(sim(&spec, "ring", Collective::AllGather, 1, bytes), half, &format!("ring AG n={n}"));
        }
    }
}

#[test]
fn halving_doubling_matches_the_alpha_beta_formula() {
    for n in [2u32, 4, 8, 16, 64] {
        for bytes in [4096u64, 1 << 20, 1 << 30] {
            let (s, nf, lg) = (bytes as f64, f64::from(n), f64::from(n.trailing_zeros()));
            let spec = format!("full:{n}");
            close(
                sim(&spec, "rhd", Collective::AllReduce, 0, bytes),
                2.0 * lg * ALPHA + 2.0 * xfer(s) * (nf - 1.0) / nf,
                &format!("rhd AR n={n} S={bytes}"),
            );
            let half = lg * ALPHA + xfer(s) * (nf - 1.0) / nf;
            close(sim(&spec, "rhd", Collective::ReduceScatter, 0, bytes), half, &format!("rhd RS n={n}"));
            close(sim(&spec, "rhd", Collective::AllGather, 0, bytes), half, &format!("rhd AG n={n}"));
        }
    }
}

#[test]
fn flows_sharing_a_link_share_its_bandwidth() {
    // Ranks 0 and 1 both send 1 MB to rank 2 through a switch: the switch → rank 2 link is
    // shared, so both finish after 2 MB / B (plus three hops of latency: two links + none).
    let topo = resolve(&format!("cluster:3x1,inter={BW},inter_lat={ALPHA},pcie=1000")).unwrap();
    let mut b = ScheduleBuilder::new("fan-in", Collective::AllGather, 3, 3);
    for r in [0, 1] {
        b.push(r, 0, Op::Send { to: 2, src: Slot::input(0) }, 1);
        b.push(2, 0, Op::Recv { from: r, dst: Slot::output(r) }, 1);
    }
    let s = b.build();
    let t = simulate(&topo, &s, 3_000_000).unwrap().time_us;
    // Each message is 1 MB; both cross nic→fabric (own link) and fabric→nic of rank 2 (shared).
    let path_latency = 2.0 * ALPHA + 2.0 * 0.5; // two network hops + two PCIe hops
    let pcie = 2.0 * 1e6 / (1000.0 * 1e3); // the 1000 GB/s PCIe hop is never the bottleneck
    let want = 2.0 * xfer(1e6) + path_latency;
    assert!(
        (t - want).abs() / want < 0.01 || (t - want - pcie).abs() / want < 0.01,
        "fan-in: {t} µs, want ≈ {want} µs"
    );
}

#[test]
fn a_rank_engine_posts_its_messages_one_at_a_time() {
    // Rank 0 sends one small message to each of 3 peers on separate links at once: with a
    // per-rank engine cost c the sends leave at c, 2c, 3c, so the last arrives at 3c + α.
    use topoccl_synth::sim::{SimConfig, Simulator};
    let topo = resolve(&format!("full:4,bw={BW},lat={ALPHA}")).unwrap();
    let mut b = ScheduleBuilder::new("fan-out", Collective::Broadcast { root: 0 }, 4, 1);
    for (c, to) in [1u32, 2, 3].into_iter().enumerate() {
        b.push(0, c as u32, Op::Send { to, src: Slot::input(0) }, 1);
        b.push(to, c as u32, Op::Recv { from: 0, dst: Slot::output(0) }, 1);
    }
    let s = b.build();
    let parallel = simulate(&topo, &s, 8).unwrap().time_us;
    close(parallel, ALPHA + xfer(8.0), "fan-out without an engine cost");
    let cost = 5.0;
    let config = SimConfig { rank_message_us: cost, ..SimConfig::default() };
    let serial = Simulator::with_config(&topo, config).run(&s, 8).unwrap().time_us;
    close(serial, 3.0 * cost + ALPHA + xfer(8.0), "fan-out with an engine cost");
}

/// A simulator with topoccl's executor's send queues of `cap` bytes per rank pair.
fn queued(topo: &topoccl_synth::topology::Topology, cap: Option<f64>) -> topoccl_synth::sim::Simulator<'_> {
    use topoccl_synth::sim::{SimConfig, Simulator};
    Simulator::with_config(topo, SimConfig { pair_sharing: true, pair_queue_bytes: cap, ..SimConfig::default() })
}

#[test]
fn a_rank_pair_queue_sends_first_in_first_out() {
    // Rank 0 sends chunks 0 and 1 (1 MB each) to rank 1 on two channels; rank 1 returns chunk
    // 0 as soon as it has it. Shared fairly, chunk 0 arrives after 2 MB / B; through one FIFO
    // queue (topoccl's executor: one connection per peer), after 1 MB / B.
    let topo = resolve(&format!("full:2,bw={BW},lat={ALPHA}")).unwrap();
    let mut b = ScheduleBuilder::new("fifo", Collective::Broadcast { root: 0 }, 2, 2);
    b.push(0, 0, Op::Send { to: 1, src: Slot::input(0) }, 1);
    b.push(0, 1, Op::Send { to: 1, src: Slot::input(1) }, 1);
    b.push(1, 0, Op::Recv { from: 0, dst: Slot::output(0) }, 1);
    b.push(1, 0, Op::Send { to: 0, src: Slot::output(0) }, 1);
    b.push(1, 1, Op::Recv { from: 0, dst: Slot::output(1) }, 1);
    b.push(0, 0, Op::Recv { from: 1, dst: Slot::output(0) }, 1);
    let s = b.build();
    let fair = queued(&topo, None).run(&s, 2_000_000).unwrap().time_us;
    close(fair, 3.0 * xfer(1e6) + 2.0 * ALPHA, "two channels sharing the link fairly");
    let fifo = queued(&topo, Some(4e6)).run(&s, 2_000_000).unwrap().time_us;
    close(fifo, 2.0 * xfer(1e6) + 2.0 * ALPHA, "two channels through one queue");
}

#[test]
fn queued_sends_complete_when_queued_up_to_the_cap() {
    // One channel of rank 0 sends 1 MB to rank 1, 1 MB to rank 1 again, then 3 MB to rank 2.
    // Eager into a large queue, the send to rank 2 starts at once (done at 3 MB / B); with a
    // queue of 1 MB, the second message to rank 1 waits for the first to leave, and the send
    // to rank 2 behind it starts 1 MB / B late. Without queues each send waits for its
    // predecessor's last byte: 1 + 1 + 3 MB / B.
    let topo = resolve(&format!("full:3,bw={BW},lat={ALPHA}")).unwrap();
    let mut b = ScheduleBuilder::new("eager", Collective::Broadcast { root: 0 }, 3, 5);
    b.push(0, 0, Op::Send { to: 1, src: Slot::input(0) }, 1);
    b.push(0, 0, Op::Send { to: 1, src: Slot::input(1) }, 1);
    b.push(0, 0, Op::Send { to: 2, src: Slot::input(2) }, 3);
    b.push(1, 0, Op::Recv { from: 0, dst: Slot::output(0) }, 1);
    b.push(1, 0, Op::Recv { from: 0, dst: Slot::output(1) }, 1);
    b.push(2, 0, Op::Recv { from: 0, dst: Slot::output(2) }, 3);
    let s = b.build();
    let bytes = 5_000_000;
    close(queued(&topo, Some(4e6)).run(&s, bytes).unwrap().time_us, 3.0 * xfer(1e6) + ALPHA, "eager, room");
    close(queued(&topo, Some(1e6)).run(&s, bytes).unwrap().time_us, 4.0 * xfer(1e6) + ALPHA, "eager, 1 MB cap");
    close(queued(&topo, None).run(&s, bytes).unwrap().time_us, 5.0 * xfer(1e6) + ALPHA, "not eager");
}

#[test]
fn a_send_via_the_fabric_takes_the_fabric_path_where_paths_are_followed() {
    // gpu0 and gpu3 of a DGX-1: two NVLinks (50 GB/s) and, through PCIe switch, CPU and PCIe
    // switch, PCIe (15.75 GB/s; 0.5 µs a hop against 1 µs for the NVLink).
    use topoccl_synth::sim::{SimConfig, Simulator};
    let topo = resolve("dgx1[0,3]").unwrap();
    let mut b = ScheduleBuilder::new("t", Collective::Broadcast { root: 0 }, 2, 1);
    b.push(0, 0, Op::Copy { src: Slot::input(0), dst: Slot::output(0) }, 1);
    b.push(0, 1, Op::Send { to: 1, src: Slot::input(0) }, 1);
    b.push(1, 1, Op::Recv { from: 0, dst: Slot::output(0) }, 1);
    let direct = b.build();
    let mut fabric = direct.clone();
    fabric.ranks[0].channels[1].via_fabric = vec![0];
    fabric.validate().unwrap();
    let mb = 1u64 << 20;
    let time = |s: &topoccl_synth::schedule::Schedule, follow: bool| {
        let config = SimConfig { follow_paths: follow, ..SimConfig::default() };
        Simulator::with_config(&topo, config).run(s, mb).unwrap().time_us
    };
    close(time(&direct, true), 1.0 + mb as f64 / 50e3, "over NVLink");
    close(time(&fabric, true), 4.0 * 0.5 + mb as f64 / 15.75e3, "over PCIe");
    close(time(&fabric, false), 1.0 + mb as f64 / 50e3, "paths not followed");
    // A fabric path on a step that sends nothing is malformed.
    let mut bad = direct.clone();
    bad.ranks[1].channels[1].via_fabric = vec![0];
    assert!(bad.validate().is_err());
}

/// A schedule too large to validate before it runs (over a million steps) is validated beside
/// the run; a fault anywhere in it still comes back as validation's error, naming the step,
/// whether the run would have failed on it (a dependency on a missing channel) or not (a step
/// of no chunks, at the start, which the run gives up on early).
#[test]
fn a_large_malformed_schedule_gets_validations_error() {
    use topoccl_synth::schedule::{Dep, StepRef};
    use topoccl_synth::Error;
    let topo = resolve("ring:1024").unwrap();
    let good = Registry::builtin().generate("ring", &Request::new(&topo, Collective::AllReduce).channels(1)).unwrap();
    let steps: usize = good.ranks.iter().flat_map(|p| &p.channels).map(|c| c.steps.len()).sum();
    assert!(steps > 1 << 20, "{steps} steps: too few to be validated beside the run");
    let mut missing_channel = good.clone();
    let last = missing_channel.ranks.last_mut().unwrap().channels.first_mut().unwrap();
    last.deps.push(Dep { step: 5, on: StepRef { channel: 3, step: 0 } });
    let mut no_chunks = good;
    no_chunks.ranks[0].channels[0].steps[0].count = 0;
    for (sched, names) in [(missing_channel, "rank 1023 channel 0 step 5"), (no_chunks, "rank 0 channel 0 step 0")] {
        match simulate(&topo, &sched, 1 << 20) {
            Err(Error::MalformedSchedule(m)) => assert!(m.contains(names), "{m}"),
            other => panic!("{names}: {other:?}"),
        }
    }
}

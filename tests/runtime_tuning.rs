//! The tuner at run time: a size's first call runs a quick choice at once, the full decision is
//! made in the background, and every rank switches to it at the same call, however late each
//! rank decides.

mod common;

use std::time::{Duration, Instant};

use common::on_ranks_with;
use topoccl::comm::runtime_sim_config;
use topoccl::tuner::cache::DiskCache;
use topoccl::tuner::{Selector, SelectorOptions};
use topoccl::{Collective, CollectiveCall, Communicator, Config, Dtype, ReduceOp, TransportPolicy};

const N: u32 = 3;

fn cfg(delay: Duration) -> Config {
    Config {
        // A model where the full decision differs from the quick one (a deep pipeline wins).
        topology: Some("ring:3".into()),
        tune_delay: delay,
        ..common::config(TransportPolicy::Tcp, 60.0)
    }
}

/// A float32 all-reduce size (elements) whose full decision differs from its quick one, found
/// as the communicator's tuner finds them.
fn switching_count(config: &Config) -> usize {
    let topology = topoccl::synth::topology::resolve(config.topology.as_deref().unwrap()).unwrap();
    let options =
        SelectorOptions { sim: runtime_sim_config(config), cache: DiskCache::disabled(), ..Default::default() };
    let mut s = Selector::new(topology, options).unwrap();
    for shift in [22u32, 20, 24, 18] {
        let bytes = 1u64 << shift;
        let quick = s.choose_quick(Collective::AllReduce, bytes).unwrap().choice;
        if s.choose(Collective::AllReduce, bytes).unwrap() != quick {
            return bytes as usize / 4;
        }
    }
    panic!("no size switches on {:?}", config.topology);
}

/// What each call ran (as the next call's choice reads after it) and when, from the first call
/// on, until ten calls after the choice changed (every rank sees it change after the same call,
/// so all make the same calls) or `rounds` calls.
fn run_until_switched(comm: &mut Communicator, count: usize, rounds: usize) -> Vec<(String, Duration)> {
    let call = CollectiveCall::new(Collective::AllReduce, Dtype::Float32, count).reduced_with(ReduceOp::Sum);
    let started = Instant::now();
    let mut seen = vec![(comm.algorithm_for(&call).unwrap().to_string(), Duration::ZERO)];
    let me = comm.rank() as f32;
    let mut switched = None;
    for round in 0..rounds {
        let send = vec![me + round as f32; count];
        let mut recv = vec![0f32; count];
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
        let want = (0..N).map(|r| r as f32 + round as f32).sum::<f32>();
        assert!(recv.iter().all(|&x| x == want), "round {round}: {} != {want}", recv[0]);
        let now = comm.algorithm_for(&call).unwrap().to_string();
        if switched.is_none() && now != seen[0].0 {
            switched = Some(round);
        }
        seen.push((now, started.elapsed()));
        if switched.is_some_and(|s| round >= s + 10) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    seen
}

#[test]
fn ranks_that_decide_at_different_times_switch_at_the_same_call() {
    // Rank 2 makes its background decisions 1.5 s late: the others have theirs long before,
    // and must go on running the quick choice until rank 2 has it too.
    let late = Duration::from_millis(1500);
    let delay = |r: u32| if r == 2 { late } else { Duration::ZERO };
    let count = switching_count(&cfg(Duration::ZERO));
    let seen = on_ranks_with(N, |r| cfg(delay(r)), |comm| run_until_switched(comm, count, 3000));
    let choices = |s: &Vec<(String, Duration)>| s.iter().map(|(c, _)| c.clone()).collect::<Vec<_>>();
    let ran = choices(&seen[0]);
    let first = ran.iter().position(|c| *c != ran[0]).expect("rank 0 never switched to the full decision");
    for (r, s) in seen.iter().enumerate() {
        assert_eq!(choices(s), ran, "rank {r} ran other choices than rank 0");
    }
    // Not before the late rank had decided (its clock started within milliseconds of rank 0's).
    let at = seen[0][first].1;
    assert!(at >= late - Duration::from_millis(200), "switched at call {first} after {at:?}, before rank 2 decided");
    eprintln!("quick {} → {} at call {first}, {at:?} in", ran[0], ran[first]);
}

#[test]
fn first_call_tuning_decides_in_full_before_the_first_call() {
    let config = Config { tune_background: false, ..cfg(Duration::ZERO) };
    let count = switching_count(&config);
    let seen = on_ranks_with(N, |_| config.clone(), |comm| run_until_switched(comm, count, 3));
    for s in &seen {
        assert!(s.iter().all(|(c, _)| *c == s[0].0), "{s:?}");
    }
}

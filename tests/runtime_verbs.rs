//! RDMA verbs over the stand-in libibverbs (`standins/ibverbs`: an emulated RC NIC per process,
//! writes landing out of order within each write, sources read after `post_send`): every
//! collective × type × operator × size × placement exact, on threads (every pair over verbs)
//! and on processes given different host identities (verbs across hosts, shared memory within
//! one); and the fallback to TCP, with one INFO line, where there is no library, no device or
//! a library without the verbs symbols.

mod common;
mod exact;
mod standin;
mod verbs_standin;

use std::time::Instant;

use topoccl::transports::verbs::VerbsCounts;
use topoccl::{Communicator, ReduceOp};

fn matrix_on_threads(n: u32) {
    let results = common::on_ranks(n, &verbs_standin::config(120.0), |comm| {
        assert!(comm.transports().iter().flatten().all(|t| *t == "ib"), "{:?}", comm.transports());
        exact::every_type(comm)
    });
    let wrong: Vec<String> = results.into_iter().flatten().collect();
    assert!(wrong.is_empty(), "{} wrong results, first: {:#?}", wrong.len(), &wrong[..wrong.len().min(10)]);
}

#[test]
fn every_collective_over_verbs_on_2_threads() {
    matrix_on_threads(2);
}

#[test]
fn every_collective_over_verbs_on_5_threads() {
    matrix_on_threads(5);
}

/// The environment of a rank process on host `host` that opens the stand-in.
fn on_host(host: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("TOPOCCL_HOSTID".to_string(), host.to_string()),
        ("TOPOCCL_IBVERBS_LIB".to_string(), verbs_standin::lib()),
        ("TOPOCCL_TIMEOUT".to_string(), "120".to_string()),
        ("TOPOCCL_IB_BYTES".to_string(), (256 << 10).to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// This rank's part of a job the parent launched: the transports its table chose (checked
/// against `host_of`), then the matrix.
fn matrix_in_this_process(host_of: impl Fn(u32) -> u32, full: bool) -> VerbsCounts {
    let t = Instant::now();
    let mut comm = Communicator::from_env().expect("join");
    let me = comm.rank();
    for (p, t) in comm.transports().iter().enumerate() {
        let want = if p as u32 == me {
            None
        } else if host_of(p as u32) == host_of(me) {
            Some("shm")
        } else {
            Some("ib")
        };
        assert_eq!(*t, want, "rank {me} to rank {p}: {:?}", comm.transports());
    }
    let wrong = if full { exact::every_type(&mut comm) } else { exact::check_type::<f32>(&mut comm, 7) };
    let c = comm.verbs_counts().expect("a verbs transport");
    println!("rank {me} of {} over {:?}: {:.1} s, {c:?}", comm.nranks(), comm.transports(), t.elapsed().as_secs_f64());
    assert!(wrong.is_empty(), "{} wrong results, first: {:#?}", wrong.len(), &wrong[..wrong.len().min(10)]);
    // Large receives were offered, and some of them written in place (an offer the sender
    // sees after it sent goes unused); the rest came through the rings.
    assert!(c.offers > 0 && c.direct_messages > 0 && c.ring_messages > 0, "{c:?}");
    comm.destroy().expect("destroy");
    c
}

#[test]
fn four_processes_on_two_hosts_use_verbs_across_and_shared_memory_within() {
    let name = "four_processes_on_two_hosts_use_verbs_across_and_shared_memory_within";
    let host_of = |r: u32| r / 2;
    // Three queue pairs per connection: large writes striped over them.
    let env = |r: u32| on_host(&format!("host{}", host_of(r)), &[("NCCL_IB_QPS_PER_CONNECTION", "3")]);
    if let Some(out) = standin::ranks_each(name, 4, u32::MAX, &env, 300) {
        print!("{out}");
    } else {
        let c = matrix_in_this_process(host_of, true);
        assert!(c.striped_messages > 0, "{c:?}");
    }
}

#[test]
fn eight_processes_on_eight_hosts() {
    let name = "eight_processes_on_eight_hosts";
    if let Some(out) = standin::ranks_each(name, 8, u32::MAX, &|r| on_host(&format!("host{r}"), &[]), 300) {
        print!("{out}");
    } else {
        let c = matrix_in_this_process(|r| r, false);
        assert_eq!(c.striped_messages, 0, "one queue pair per connection: {c:?}");
    }
}

/// Two ranks on two hosts whose RDMA library is `lib` (with the stand-in's `knobs`): they
/// talk over TCP, and each says once why not over verbs; the lines, and the parent's output.
fn falls_back(name: &str, lib: &str, knobs: &[(&str, &str)]) -> Option<Vec<String>> {
    let env = |r: u32| {
        let mut e = on_host(&format!("host{r}"), knobs);
        e.retain(|(k, _)| k != "TOPOCCL_IBVERBS_LIB");
        e.push(("TOPOCCL_IBVERBS_LIB".into(), lib.to_string()));
        e.push(("NCCL_DEBUG".into(), "INFO".into()));
        e
    };
    let Some(out) = standin::ranks_each(name, 2, u32::MAX, &env, 120) else {
        let comm = Communicator::from_env().expect("join");
        let peer = 1 - comm.rank() as usize;
        assert_eq!(comm.transports()[peer], Some("tcp"), "{:?}", comm.transports());
        let send = vec![1.0f32 + comm.rank() as f32; 1000];
        let mut recv = vec![0.0f32; 1000];
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum).expect("all-reduce");
        assert!(recv.iter().all(|&v| v == 3.0));
        return None;
    };
    print!("{out}");
    let lines: Vec<String> = out.lines().filter(|l| l.contains("NET/IB")).map(str::to_string).collect();
    assert_eq!(lines.len(), 2, "one INFO line per rank:\n{out}");
    Some(lines)
}

#[test]
fn no_library_falls_back_to_tcp_with_one_info_line() {
    let name = "no_library_falls_back_to_tcp_with_one_info_line";
    if let Some(lines) = falls_back(name, "/nonexistent/libibverbs.so.1", &[]) {
        assert!(lines.iter().all(|l| l.contains("cannot load /nonexistent/libibverbs.so.1")), "{lines:?}");
    }
}

#[test]
fn a_library_without_verbs_falls_back_to_tcp_with_one_info_line() {
    let name = "a_library_without_verbs_falls_back_to_tcp_with_one_info_line";
    if let Some(lines) = falls_back(name, "libc.so.6", &[]) {
        assert!(lines.iter().all(|l| l.contains("libc.so.6 has no ibv_get_device_list")), "{lines:?}");
    }
}

#[test]
fn no_device_falls_back_to_tcp_with_one_info_line() {
    let name = "no_device_falls_back_to_tcp_with_one_info_line";
    let lib = verbs_standin::lib();
    if let Some(lines) = falls_back(name, &lib, &[("TOPOCCL_STANDIN_IB_DEVICES", "0")]) {
        assert!(lines.iter().all(|l| l.contains("no RDMA device")), "{lines:?}");
    }
}

#[test]
fn a_kernel_without_rdma_falls_back_to_tcp_with_one_info_line() {
    let name = "a_kernel_without_rdma_falls_back_to_tcp_with_one_info_line";
    let lib = verbs_standin::lib();
    if let Some(lines) = falls_back(name, &lib, &[("TOPOCCL_STANDIN_IB_DEVICES", "enosys")]) {
        assert!(lines.iter().all(|l| l.contains("Function not implemented")), "{lines:?}");
    }
}

/// A rank whose call returned may end at once (without `destroy`): what it wrote must have
/// landed by then. RDMA writes are only queued when `post_send` returns, and the stand-in's NIC
/// takes its time; a call that ended on its writes being posted lost its last bytes here.
#[test]
fn a_rank_that_exits_as_its_call_returns_loses_nothing() {
    let name = "a_rank_that_exits_as_its_call_returns_loses_nothing";
    let env = |r: u32| on_host(&format!("host{r}"), &[("TOPOCCL_STANDIN_IB_DELAY_US", "3000")]);
    if let Some(out) = standin::ranks_each(name, 2, 0, &env, 120) {
        print!("{out}");
        assert!(out.contains("rank 0 sent"), "{out}");
        return;
    }
    let comm = Communicator::from_env().expect("join");
    let mut data = vec![comm.rank() as f32 + 1.0; 1 << 18];
    comm.broadcast_in_place(&mut data, 0).expect("broadcast");
    if comm.rank() == 0 {
        println!("rank 0 sent");
        std::process::exit(0);
    }
    assert!(data.iter().all(|&v| v == 1.0), "rank 1 received wrong data");
}

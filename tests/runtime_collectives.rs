//! Every collective × datatype × operator × size × placement, on 2, 3, 4, 5 and 8 ranks, over
//! TCP and over shared memory, checked element by element against a reference computed here
//! (`exact`).

mod common;
mod exact;

use exact::check_type;
use topoccl::TransportPolicy;

fn matrix(n: u32, transport: TransportPolicy) {
    let cfg = common::config(transport, 120.0);
    let results = common::on_ranks(n, &cfg, |comm| {
        let want = if transport == TransportPolicy::Tcp { "tcp" } else { "shm" };
        assert!(comm.transports().iter().flatten().all(|t| *t == want), "{:?}", comm.transports());
        exact::every_type(comm)
    });
    let wrong: Vec<String> = results.into_iter().flatten().collect();
    assert!(wrong.is_empty(), "{} wrong results, first: {:#?}", wrong.len(), &wrong[..wrong.len().min(10)]);
}

#[test]
fn tcp_2_ranks() {
    matrix(2, TransportPolicy::Tcp);
}
#[test]
fn tcp_3_ranks() {
    matrix(3, TransportPolicy::Tcp);
}
#[test]
fn tcp_4_ranks() {
    matrix(4, TransportPolicy::Tcp);
}
#[test]
fn tcp_5_ranks() {
    matrix(5, TransportPolicy::Tcp);
}
#[test]
fn tcp_8_ranks() {
    matrix(8, TransportPolicy::Tcp);
}
#[test]
fn shm_2_ranks() {
    matrix(2, TransportPolicy::Shm);
}
#[test]
fn shm_3_ranks() {
    matrix(3, TransportPolicy::Shm);
}
#[test]
fn shm_4_ranks() {
    matrix(4, TransportPolicy::Shm);
}
#[test]
fn shm_5_ranks() {
    matrix(5, TransportPolicy::Shm);
}
#[test]
fn shm_8_ranks() {
    matrix(8, TransportPolicy::Shm);
}

/// Synthesized schedules cut blocks into chunk counts that rarely divide the element count
/// (Blink: trees × lanes), so their chunks are uneven; forced onto a fragmented DGX-1 model,
/// every collective they build must still be exact, at sizes below and above the chunk count.
fn synthesized(algo: &str) {
    let mut cfg = common::config(TransportPolicy::Shm, 120.0);
    cfg.algo = Some(algo.to_string());
    cfg.topology = Some("dgx1[0,1,2,4,5]".to_string());
    // Small slices: steps span many, so forwarding steps run cut-through behind the steps they
    // depend on (slice by slice), which must not reorder any byte's reads and writes.
    cfg.slice_bytes = 4096;
    let results = common::on_ranks(5, &cfg, |comm| {
        let mut wrong = check_type::<f32>(comm, 7);
        wrong.extend(check_type::<i32>(comm, 2));
        wrong
    });
    let wrong: Vec<String> = results.into_iter().flatten().collect();
    assert!(wrong.is_empty(), "{algo}: {} wrong results, first: {:#?}", wrong.len(), &wrong[..wrong.len().min(10)]);
}

#[test]
fn blink_on_uneven_chunks() {
    synthesized("blink");
}
#[test]
fn tacos_on_uneven_chunks() {
    synthesized("tacos");
}

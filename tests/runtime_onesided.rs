//! One-sided transfers through the executor: with `shm_direct` on, receives that only copy
//! offer their destinations and shared memory puts large payloads straight there (where the
//! processes may write each other's memory; elsewhere the ring carries everything). Results
//! must be exact either way, over calls that mix offered and unoffered messages of one tag.

mod common;

use topoccl::{Config, ReduceOp, TransportPolicy};

fn direct() -> Config {
    Config { shm_direct: true, ..common::config(TransportPolicy::Shm, 60.0) }
}

#[test]
fn collectives_and_transfers_are_exact_with_direct_puts() {
    let got = common::on_ranks(3, &direct(), |comm| {
        let (n, r) = (comm.nranks() as usize, comm.rank() as usize);
        let mut bad = Vec::new();
        for len in [1usize << 14, 100_003, 1 << 19, (1 << 21) + 5] {
            let mine: Vec<u32> = (0..len).map(|i| (i * 3 + r) as u32).collect();
            let mut all = vec![0u32; len * n];
            comm.all_gather(&mine, &mut all).unwrap();
            if (0..len * n).any(|i| all[i] != ((i % len) * 3 + i / len) as u32) {
                bad.push(format!("all_gather {len}"));
            }
            let mut b = if r == 2 { mine.clone() } else { vec![0; len] };
            comm.broadcast_in_place(&mut b, 2).unwrap();
            if (0..len).any(|i| b[i] != (i * 3 + 2) as u32) {
                bad.push(format!("broadcast {len}"));
            }
            let mut sum = vec![0u32; len];
            comm.all_reduce(&mine, &mut sum, ReduceOp::Sum).unwrap();
            if (0..len).any(|i| sum[i] != (i * 9 + 3) as u32) {
                bad.push(format!("all_reduce {len}"));
            }
            let mut from = vec![0u32; len];
            let mut g = comm.group();
            g.send(&mine, ((r + 1) % n) as u32).unwrap();
            g.recv(&mut from, ((r + n - 1) % n) as u32).unwrap();
            g.end().unwrap();
            let left = (r + n - 1) % n;
            if (0..len).any(|i| from[i] != (i * 3 + left) as u32) {
                bad.push(format!("send/recv {len}"));
            }
        }
        bad
    });
    let bad: Vec<String> = got.into_iter().flatten().collect();
    assert!(bad.is_empty(), "{bad:?}");
}

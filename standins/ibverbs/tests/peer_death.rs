//! Two processes: a write lands in a peer that never calls verbs after connecting, then the
//! peer dies and the requester retries for what its QP's timeout and retry count say before
//! completing the first request with `RETRY_EXC_ERR` and flushing the rest.

#[macro_use]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn hex(g: &ibv_gid) -> String {
    g.raw.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> ibv_gid {
    let mut g = ibv_gid::default();
    for (i, b) in g.raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    g
}

/// The next line carrying "IBV " (the test harness may print before it on the same line),
/// from there on, split in words after the tag.
fn tagged(r: &mut impl BufRead) -> Vec<String> {
    loop {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "the other process ended");
        if let Some(at) = line.find("IBV ") {
            return line[at + 4..].split_whitespace().map(str::to_owned).collect();
        }
    }
}

/// The peer: publishes its QP and buffer, connects, then only watches its memory.
fn peer() {
    let b = End::new(Cfg::default());
    let buf = Buf::new(4096);
    let mr = reg(b.pd, &buf, ALL_ACCESS);
    println!("IBV {} {} {} {}", b.qpn(), hex(&b.gid()), buf.addr(), v!((*mr).rkey));
    let theirs = tagged(&mut std::io::stdin().lock());
    connect(&b, theirs[0].parse().unwrap(), unhex(&theirs[1]));
    println!("IBV ready");
    // No verbs call from here on: the NIC places the bytes.
    wait_for("the write", Duration::from_secs(10), || buf.get(0) == 0xab && buf.get(4095) == 0xab);
    println!("IBV landed");
    std::thread::sleep(Duration::from_secs(30)); // killed by the parent
}

#[test]
fn a_dead_peer_exhausts_the_retries() {
    if child_body().is_some() {
        peer();
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["a_dead_peer_exhausts_the_retries", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "peer")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let peer = tagged(&mut out);
    let (qpn, gid, addr, rkey): (u32, _, u64, u32) =
        (peer[0].parse().unwrap(), unhex(&peer[1]), peer[2].parse().unwrap(), peer[3].parse().unwrap());
    // timeout 12: 4.096 µs × 2^12 = 16.8 ms; retry_cnt 3: four tries, ~67 ms.
    let a = End::new(Cfg { timeout: 12, retry_cnt: 3, ..Cfg::default() });
    connect(&a, qpn, gid);
    writeln!(child.stdin.as_mut().unwrap(), "IBV {} {}", a.qpn(), hex(&a.gid())).unwrap();
    assert_eq!(tagged(&mut out), ["ready"]);

    let src = Buf::new(4096);
    src.fill(0xab);
    let smr = reg(a.pd, &src, ALL_ACCESS);
    let mut sg = [sge(&src, 0, 4096, smr)];
    assert_eq!(post_send(a.qp, &mut [write_wr(1, &mut sg, addr, rkey, None)]).0, 0);
    assert_eq!(poll_one(a.scq).status, WC_SUCCESS);
    assert_eq!(tagged(&mut out), ["landed"]);

    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    let mut wrs: Vec<_> = (2..5).map(|i| write_wr(i, &mut sg, addr, rkey, None)).collect();
    assert_eq!(post_send(a.qp, &mut wrs).0, 0);
    let got = poll_n(a.scq, 3, Duration::from_secs(5));
    let took = start.elapsed();
    assert_eq!((got[0].wr_id, got[0].status), (2, WC_RETRY_EXC_ERR), "{}", status(&got[0]));
    assert!(got[1..].iter().all(|w| w.status == WC_WR_FLUSH_ERR));
    assert_eq!(a.state(), QPS_ERR);
    assert!(took >= Duration::from_micros(4 * 16_777) && took < Duration::from_secs(2), "{took:?}");
}

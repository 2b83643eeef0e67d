//! The data path between two QPs of this process: writes land without the target calling
//! verbs, in shuffled 64-byte units but whole 8-byte words, in order per QP; inline data is
//! copied at post time; immediates consume receives (RNR otherwise) and pass through
//! unchanged; sends scatter into receive SGEs.

#[macro_use]
mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;

/// A pair with a registered source at `a` and destination at `b`.
struct Setup {
    a: End,
    b: End,
    src: Buf,
    dst: Buf,
    smr: *mut ibv_mr,
    dmr: *mut ibv_mr,
}

impl Setup {
    fn new(len: usize, a: Cfg, b: Cfg) -> Setup {
        let (a, b) = pair(a, b);
        let (src, dst) = (Buf::new(len), Buf::new(len));
        let smr = reg(a.pd, &src, ALL_ACCESS);
        let dmr = reg(b.pd, &dst, ALL_ACCESS);
        Setup { a, b, src, dst, smr, dmr }
    }

    fn rkey(&self) -> u32 {
        v!((*self.dmr).rkey)
    }

    /// Posts a write of `len` bytes from `off` to the same offset at `b`.
    fn write(&self, wr_id: u64, off: usize, len: usize, imm: Option<u32>, flags: u32) -> i32 {
        let mut s = [sge(&self.src, off, len, self.smr)];
        let mut wr = write_wr(wr_id, &mut s, self.dst.addr() + off as u64, self.rkey(), imm);
        wr.send_flags = flags;
        post_send(self.a.qp, &mut [wr]).0
    }
}

#[test]
fn write_lands_without_the_target_polling() {
    let s = Setup::new(4096, Cfg::default(), Cfg::default());
    s.src.fill(0x5a);
    assert_eq!(s.write(1, 0, 4096, None, 0), 0);
    // Neither side calls verbs: the NIC threads move the bytes.
    wait_for("the write to land", Duration::from_secs(5), || (0..4096).all(|i| s.dst.get(i) == 0x5a));
}

/// Units placed, as the placement hook reports them (every test's, filtered by range).
static PLACED: Mutex<Vec<(u64, usize)>> = Mutex::new(Vec::new());

fn record(addr: u64, len: usize) {
    PLACED.lock().unwrap().push((addr, len));
}

#[test]
fn bytes_of_a_write_land_shuffled_in_64_byte_units() {
    memio::set_place_hook(Some(record));
    let s = Setup::new(1 << 16, Cfg::default(), Cfg::default());
    s.src.fill(1);
    // Aligned, and unaligned at both ends.
    for (off, len) in [(0usize, 1usize << 16), (3, 1000)] {
        PLACED.lock().unwrap().clear();
        assert_eq!(s.write(1, off, len, None, SEND_SIGNALED), 0);
        assert_eq!(poll_one(s.a.scq).status, WC_SUCCESS);
        let (lo, hi) = (s.dst.addr() + off as u64, s.dst.addr() + (off + len) as u64);
        let units: Vec<_> = PLACED.lock().unwrap().iter().copied().filter(|&(a, _)| a >= lo && a < hi).collect();
        // Every byte exactly once, no unit across a 64-byte boundary.
        let mut sorted = units.clone();
        sorted.sort();
        let mut at = lo;
        for &(a, l) in &sorted {
            assert_eq!(a, at, "a gap or an overlap");
            assert_eq!(a / 64, (a + l as u64 - 1) / 64, "unit {a:#x}+{l} crosses a boundary");
            at += l as u64;
        }
        assert_eq!(at, hi);
        assert_ne!(units, sorted, "{} units placed in address order", units.len());
    }
}

#[test]
fn aligned_words_land_whole() {
    const LEN: usize = 1 << 20;
    let s = Setup::new(LEN, Cfg::default(), Cfg::default());
    let pattern = |w: usize| 0x0101_0101_0101_0101u64.wrapping_mul(w as u64 % 251 + 1) | 0x8080_8080_8080_8080;
    for w in 0..LEN / 8 {
        for (j, b) in pattern(w).to_ne_bytes().iter().enumerate() {
            s.src.set(w * 8 + j, *b);
        }
    }
    for round in 0..5u64 {
        assert_eq!(s.write(round, 0, LEN, None, SEND_SIGNALED), 0);
        // A concurrent reader sees every word all old or all new.
        let mut k = round as usize * 7919;
        let start = Instant::now();
        while (0..LEN / 8).step_by(4096).any(|w| s.dst.word(w * 8) == 0) {
            k = (k + 4099) % (LEN / 8);
            let w = s.dst.word(k * 8);
            assert!(w == 0 || w == pattern(k), "torn word {k}: {w:#x}");
            assert!(start.elapsed() < Duration::from_secs(5));
        }
        assert_eq!(poll_one(s.a.scq).status, WC_SUCCESS);
        assert!((0..LEN / 8).all(|w| s.dst.word(w * 8) == pattern(w)));
        s.dst.fill(0);
    }
}

#[test]
fn writes_of_a_qp_land_in_order() {
    const BIG: usize = 1 << 20;
    let s = Setup::new(BIG + 64, Cfg::default(), Cfg::default());
    for round in 1..=3u8 {
        s.src.fill(round);
        assert_eq!(s.write(1, 0, BIG, None, 0), 0);
        assert_eq!(s.write(2, BIG, 64, None, SEND_SIGNALED), 0);
        wait_for("the second write", Duration::from_secs(5), || s.dst.get(BIG) == round);
        // The first write was fully placed before the second started.
        assert!((0..BIG / 8).all(|w| s.dst.word(w * 8) == u64::from_ne_bytes([round; 8])));
        assert_eq!(poll_one(s.a.scq).wr_id, 2);
    }
}

#[test]
fn inline_data_is_copied_at_post_time() {
    let s = Setup::new(4096, Cfg::default(), Cfg::default());
    s.src.fill(1);
    assert_eq!(s.write(1, 0, 64, None, SEND_SIGNALED | SEND_INLINE), 0);
    s.src.fill(2);
    assert_eq!(poll_one(s.a.scq).status, WC_SUCCESS);
    assert!((0..64).all(|i| s.dst.get(i) == 1), "inline data must be the bytes at post time");
    // Over max_inline_data (64): refused at post.
    assert_eq!(s.write(2, 0, 65, None, SEND_SIGNALED | SEND_INLINE), libc::EINVAL);
}

#[test]
fn write_with_imm_completes_a_receive_with_the_immediate_unchanged() {
    let s = Setup::new(4096, Cfg::default(), Cfg::default());
    s.src.fill(0x77);
    assert_eq!(post_recv(s.b.qp, 77, &mut []), 0);
    assert_eq!(post_recv(s.b.qp, 78, &mut []), 0);
    let imm = u32::from_ne_bytes([0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(s.write(5, 0, 100, Some(imm), SEND_SIGNALED), 0);
    let wc = poll_one(s.b.rcq);
    // All of the write is placed before its receive completion.
    assert!((0..100).all(|i| s.dst.get(i) == 0x77) && s.dst.get(100) == 0);
    assert_eq!((wc.status, wc.opcode, wc.wr_id, wc.byte_len), (WC_SUCCESS, WC_RECV_RDMA_WITH_IMM, 77, 100));
    assert_eq!(wc.imm_data.to_ne_bytes(), [0xde, 0xad, 0xbe, 0xef]);
    assert_eq!((wc.wc_flags & WC_WITH_IMM, wc.qp_num, wc.src_qp), (WC_WITH_IMM, s.b.qpn(), s.a.qpn()));
    let wc = poll_one(s.a.scq);
    assert_eq!((wc.status, wc.opcode, wc.wr_id, wc.qp_num), (WC_SUCCESS, WC_RDMA_WRITE, 5, s.a.qpn()));
    // Zero bytes, no SGE: still a receive completion.
    let mut wr = write_wr(6, &mut [], 0, 0, Some(7u32.to_be()));
    assert_eq!(post_send(s.a.qp, std::slice::from_mut(&mut wr)).0, 0);
    let wc = poll_one(s.b.rcq);
    assert_eq!((wc.status, wc.wr_id, wc.byte_len, u32::from_be(wc.imm_data)), (WC_SUCCESS, 78, 0, 7));
}

#[test]
fn sends_scatter_into_the_receive_sges() {
    let s = Setup::new(4096, Cfg::default(), Cfg::default());
    for i in 0..50 {
        s.src.set(i, i as u8 + 1);
    }
    let mut rs = [sge(&s.dst, 1000, 10, s.dmr), sge(&s.dst, 2000, 100, s.dmr)];
    assert_eq!(post_recv(s.b.qp, 9, &mut rs), 0);
    let mut ss = [sge(&s.src, 0, 20, s.smr), sge(&s.src, 20, 30, s.smr)];
    let mut wr = send_wr(3, WR_SEND_WITH_IMM, &mut ss, SEND_SIGNALED);
    wr.imm_data = 0x0102_0304;
    assert_eq!(post_send(s.a.qp, &mut [wr]).0, 0);
    let wc = poll_one(s.b.rcq);
    assert_eq!((wc.status, wc.opcode, wc.byte_len, wc.wr_id, wc.imm_data), (WC_SUCCESS, WC_RECV, 50, 9, 0x0102_0304));
    assert_eq!(wc.wc_flags & WC_WITH_IMM, WC_WITH_IMM);
    assert_eq!(s.dst.to_vec()[1000..1010], (1..=10).collect::<Vec<u8>>()[..]);
    assert_eq!(s.dst.to_vec()[2000..2040], (11..=50).collect::<Vec<u8>>()[..]);
    assert_eq!(poll_one(s.a.scq).opcode, WC_SEND);
    // A plain send carries no immediate.
    let mut rs = [sge(&s.dst, 0, 64, s.dmr)];
    assert_eq!(post_recv(s.b.qp, 10, &mut rs), 0);
    let mut ss = [sge(&s.src, 0, 8, s.smr)];
    assert_eq!(post_send(s.a.qp, &mut [send_wr(4, WR_SEND, &mut ss, 0)]).0, 0);
    let wc = poll_one(s.b.rcq);
    assert_eq!((wc.status, wc.byte_len, wc.wc_flags & WC_WITH_IMM), (WC_SUCCESS, 8, 0));
}

#[test]
fn a_send_longer_than_the_receive_is_a_length_error() {
    let s = Setup::new(4096, Cfg::default(), Cfg::default());
    let mut rs = [sge(&s.dst, 0, 16, s.dmr)];
    assert_eq!(post_recv(s.b.qp, 1, &mut rs), 0);
    assert_eq!(post_recv(s.b.qp, 2, &mut rs), 0);
    let mut ss = [sge(&s.src, 0, 17, s.smr)];
    assert_eq!(post_send(s.a.qp, &mut [send_wr(3, WR_SEND, &mut ss, SEND_SIGNALED)]).0, 0);
    let got = poll_n(s.b.rcq, 2, Duration::from_secs(5));
    assert_eq!((got[0].wr_id, got[0].status), (1, WC_LOC_LEN_ERR), "{}", status(&got[0]));
    assert_eq!((got[1].wr_id, got[1].status), (2, WC_WR_FLUSH_ERR));
    assert_eq!(poll_one(s.a.scq).status, WC_REM_INV_REQ_ERR);
    assert_eq!((s.a.state(), s.b.state()), (QPS_ERR, QPS_ERR));
}

#[test]
fn rnr_naks_are_retried_until_a_receive_is_posted() {
    let s = Setup::new(4096, Cfg::default(), Cfg { min_rnr_timer: 4, ..Cfg::default() });
    s.src.fill(3);
    let before = stats().rnr_naks;
    assert_eq!(s.write(1, 0, 64, Some(1), SEND_SIGNALED), 0);
    poll_none(s.a.scq, Duration::from_millis(30));
    assert!(stats().rnr_naks > before + 2, "the responder must NAK while no receive is posted");
    assert_eq!(post_recv(s.b.qp, 5, &mut []), 0);
    assert_eq!(poll_one(s.a.scq).status, WC_SUCCESS);
    let wc = poll_one(s.b.rcq);
    assert_eq!((wc.status, wc.wr_id, wc.byte_len), (WC_SUCCESS, 5, 64));
}

#[test]
fn rnr_retries_run_out() {
    let s = Setup::new(4096, Cfg { rnr_retry: 2, ..Cfg::default() }, Cfg::default());
    let start = Instant::now();
    assert_eq!(s.write(1, 0, 64, Some(1), SEND_SIGNALED), 0);
    assert_eq!(s.write(2, 0, 64, None, 0), 0);
    let got = poll_n(s.a.scq, 2, Duration::from_secs(5));
    assert_eq!(got[0].status, WC_RNR_RETRY_EXC_ERR, "{}", status(&got[0]));
    assert_eq!((got[1].wr_id, got[1].status), (2, WC_WR_FLUSH_ERR));
    assert_eq!(s.a.state(), QPS_ERR);
    assert!(start.elapsed() < Duration::from_secs(1));
    // The responder is fine: an RNR NAK is no error there.
    assert_eq!(s.b.state(), QPS_RTS);
}

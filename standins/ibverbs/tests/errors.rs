//! Key, bounds and access checks, and what an error does: the failing work request completes
//! with its status, the rest of the QP's requests are flushed, the QP goes to the error state.
//! Also requests nobody answers: to a destroyed QP, or answered to the wrong QP.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;

struct Setup {
    a: End,
    b: End,
    src: Buf,
    dst: Buf,
    smr: *mut ibv_mr,
    dmr: *mut ibv_mr,
}

fn setup(a: Cfg, b: Cfg, dst_access: i32) -> Setup {
    let (a, b) = pair(a, b);
    let (src, dst) = (Buf::new(4096), Buf::new(4096));
    src.fill(0xee);
    let smr = reg(a.pd, &src, ALL_ACCESS);
    let dmr = reg(b.pd, &dst, dst_access);
    Setup { a, b, src, dst, smr, dmr }
}

/// Posts `[the write under test, a good signaled write, a good unsignaled write]` and checks
/// the completions: `status` for the first, flushes for the others; the requester in ERR;
/// nothing written.
fn expect_failure(s: &Setup, first: ibv_send_wr, status_want: u32) {
    let mut good = [sge(&s.src, 0, 64, s.smr)];
    let rkey = v!((*s.dmr).rkey);
    let mut wrs =
        [first, write_wr(2, &mut good, s.dst.addr(), rkey, None), write_wr(3, &mut good, s.dst.addr(), rkey, None)];
    wrs[2].send_flags = 0;
    assert_eq!(post_send(s.a.qp, &mut wrs).0, 0);
    let got = poll_n(s.a.scq, 3, Duration::from_secs(5));
    assert_eq!(got[0].status, status_want, "got {}", status(&got[0]));
    assert_eq!((got[0].wr_id, got[0].qp_num), (1, s.a.qpn()));
    // Flushed, the unsignaled one included.
    assert_eq!([got[1].wr_id, got[2].wr_id], [2, 3]);
    assert!(got[1..].iter().all(|w| w.status == WC_WR_FLUSH_ERR));
    assert_eq!(s.a.state(), QPS_ERR);
    assert!(s.dst.to_vec().iter().all(|&b| b == 0), "nothing may be written");
}

#[test]
fn bad_lkeys_are_local_protection_errors() {
    // Unknown lkey.
    let s = setup(Cfg::default(), Cfg::default(), ALL_ACCESS);
    let mut bad = [ibv_sge { lkey: v!((*s.smr).lkey) ^ 0x5555, ..sge(&s.src, 0, 64, s.smr) }];
    expect_failure(&s, write_wr(1, &mut bad, s.dst.addr(), v!((*s.dmr).rkey), None), WC_LOC_PROT_ERR);
    assert_eq!(s.b.state(), QPS_RTS, "a local error stays local");

    // Beyond the MR.
    let s = setup(Cfg::default(), Cfg::default(), ALL_ACCESS);
    let mut bad = [sge(&s.src, 4090, 64, s.smr)];
    expect_failure(&s, write_wr(1, &mut bad, s.dst.addr(), v!((*s.dmr).rkey), None), WC_LOC_PROT_ERR);

    // An MR of another PD.
    let s = setup(Cfg::default(), Cfg::default(), ALL_ACCESS);
    let other = v!(ibv_alloc_pd(s.a.ctx));
    let omr = reg(other, &s.src, ALL_ACCESS);
    let mut bad = [sge(&s.src, 0, 64, omr)];
    expect_failure(&s, write_wr(1, &mut bad, s.dst.addr(), v!((*s.dmr).rkey), None), WC_LOC_PROT_ERR);

    // The rkey is not the lkey.
    let s = setup(Cfg::default(), Cfg::default(), ALL_ACCESS);
    let mut bad = [ibv_sge { lkey: v!((*s.smr).rkey), ..sge(&s.src, 0, 64, s.smr) }];
    expect_failure(&s, write_wr(1, &mut bad, s.dst.addr(), v!((*s.dmr).rkey), None), WC_LOC_PROT_ERR);
}

/// Where a case writes: (remote address, rkey).
type Target = fn(&Setup) -> (u64, u32);

#[test]
fn bad_rkeys_bounds_and_rights_are_remote_access_errors() {
    let cases: [(&str, Cfg, i32, Target); 5] = [
        ("unknown rkey", Cfg::default(), ALL_ACCESS, |s| (s.dst.addr(), v!((*s.dmr).rkey) ^ 0x00ff_0000)),
        ("the lkey as rkey", Cfg::default(), ALL_ACCESS, |s| (s.dst.addr(), v!((*s.dmr).lkey))),
        ("beyond the MR", Cfg::default(), ALL_ACCESS, |s| (s.dst.addr() + 4096 - 63, v!((*s.dmr).rkey))),
        ("MR without remote write", Cfg::default(), ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ, |s| {
            (s.dst.addr(), v!((*s.dmr).rkey))
        }),
        ("QP without remote write", Cfg { qp_access: ACCESS_REMOTE_READ as u32, ..Cfg::default() }, ALL_ACCESS, |s| {
            (s.dst.addr(), v!((*s.dmr).rkey))
        }),
    ];
    for (what, b_cfg, access, target) in cases {
        let s = setup(Cfg::default(), b_cfg, access);
        let (addr, rkey) = target(&s);
        let mut sg = [sge(&s.src, 0, 64, s.smr)];
        let wr = write_wr(1, &mut sg, addr, rkey, None);
        eprintln!("case: {what}");
        expect_failure(&s, wr, WC_REM_ACCESS_ERR);
        // The responder raised a local access violation: its QP is in error too.
        wait_for("the responder in ERR", Duration::from_secs(1), || s.b.state() == QPS_ERR);
    }
}

#[test]
fn zero_length_writes_check_no_key() {
    let s = setup(Cfg::default(), Cfg::default(), ALL_ACCESS);
    assert_eq!(post_recv(s.b.qp, 1, &mut []), 0);
    let mut sg = [ibv_sge { addr: 0, length: 0, lkey: 0xdead }];
    let mut wr = write_wr(1, &mut sg, 0x10, 0xbad, Some(5));
    assert_eq!(post_send(s.a.qp, std::slice::from_mut(&mut wr)).0, 0);
    assert_eq!(poll_one(s.a.scq).status, WC_SUCCESS);
    assert_eq!(poll_one(s.b.rcq).byte_len, 0);
}

#[test]
fn receive_sges_are_checked_at_the_responder() {
    let s = setup(Cfg::default(), Cfg::default(), ALL_ACCESS);
    let ro = Buf::new(4096);
    let romr = reg(s.b.pd, &ro, ACCESS_REMOTE_READ); // no local write
    let mut rs = [sge(&ro, 0, 64, romr)];
    assert_eq!(post_recv(s.b.qp, 1, &mut rs), 0);
    let mut ss = [sge(&s.src, 0, 8, s.smr)];
    assert_eq!(post_send(s.a.qp, &mut [send_wr(2, WR_SEND, &mut ss, SEND_SIGNALED)]).0, 0);
    assert_eq!(poll_one(s.b.rcq).status, WC_LOC_PROT_ERR);
    assert_eq!(poll_one(s.a.scq).status, WC_REM_OP_ERR);
    assert_eq!((s.a.state(), s.b.state()), (QPS_ERR, QPS_ERR));
}

#[test]
fn requests_to_a_destroyed_qp_time_out() {
    // timeout 10: 4.2 ms per try, 3 tries.
    let s = setup(Cfg { timeout: 10, retry_cnt: 2, ..Cfg::default() }, Cfg::default(), ALL_ACCESS);
    assert_eq!(v!(ibv_destroy_qp(s.b.qp)), 0);
    let start = Instant::now();
    let mut sg = [sge(&s.src, 0, 64, s.smr)];
    let mut wrs = [write_wr(1, &mut sg, s.dst.addr(), v!((*s.dmr).rkey), None)];
    assert_eq!(post_send(s.a.qp, &mut wrs).0, 0);
    let wc = poll_one(s.a.scq);
    assert_eq!(wc.status, WC_RETRY_EXC_ERR, "{}", status(&wc));
    let took = start.elapsed();
    assert!(took >= Duration::from_micros(3 * 4194) && took < Duration::from_secs(1), "{took:?}");
    assert_eq!(s.a.state(), QPS_ERR);
}

#[test]
fn answers_go_where_the_responder_qp_points() {
    // b's QP is connected to a third QP, not to a: a's write executes, but its ACK is lost.
    let (a, b, c) = (
        End::new(Cfg { timeout: 10, retry_cnt: 1, ..Cfg::default() }),
        End::new(Cfg::default()),
        End::new(Cfg::default()),
    );
    connect(&a, b.qpn(), b.gid());
    connect(&b, c.qpn(), c.gid());
    let (src, dst) = (Buf::new(64), Buf::new(64));
    src.fill(9);
    let smr = reg(a.pd, &src, ALL_ACCESS);
    let dmr = reg(b.pd, &dst, ALL_ACCESS);
    let mut sg = [sge(&src, 0, 64, smr)];
    assert_eq!(post_send(a.qp, &mut [write_wr(1, &mut sg, dst.addr(), v!((*dmr).rkey), None)]).0, 0);
    assert_eq!(poll_one(a.scq).status, WC_RETRY_EXC_ERR);
    assert!(dst.to_vec().iter().all(|&x| x == 9), "the write itself landed");
}

#[test]
fn mismatched_psns_misbehave_as_on_hardware() {
    // b expects PSN 0x1234 (common::rtr_attr); a starts ahead, then behind.
    for (sq_psn, want) in [(0x1234 + 5, WC_RETRY_EXC_ERR), (0x1234 - 5, WC_SUCCESS)] {
        let cfg = Cfg { timeout: 10, retry_cnt: 2, ..Cfg::default() };
        let (a, b) = (End::new(cfg), End::new(Cfg::default()));
        connect(&b, a.qpn(), a.gid());
        let (x, m) = init_attr(cfg.qp_access);
        assert_eq!(modify(a.qp, &x, m), 0);
        let (x, m) = rtr_attr(b.qpn(), b.gid(), 1);
        assert_eq!(modify(a.qp, &x, m), 0);
        let (mut x, m) = rts_attr(cfg.timeout, cfg.retry_cnt, 7);
        x.sq_psn = sq_psn;
        assert_eq!(modify(a.qp, &x, m), 0);
        let (src, dst) = (Buf::new(64), Buf::new(64));
        src.fill(1);
        let smr = reg(a.pd, &src, ALL_ACCESS);
        let dmr = reg(b.pd, &dst, ALL_ACCESS);
        let mut sg = [sge(&src, 0, 64, smr)];
        assert_eq!(post_send(a.qp, &mut [write_wr(1, &mut sg, dst.addr(), v!((*dmr).rkey), None)]).0, 0);
        assert_eq!(poll_one(a.scq).status, want);
        // Ahead: NAKed until the retries run out. Behind: taken for a duplicate, acknowledged
        // and never applied — silent loss.
        assert!(dst.to_vec().iter().all(|&x| x == 0));
    }
}

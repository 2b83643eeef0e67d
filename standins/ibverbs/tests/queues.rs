//! Queue depths counted until completions are polled, SGE caps, CQ overflow, posting in the
//! error state, and objects that are still in use.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;

fn cfg(send: u32, recv: u32) -> Cfg {
    let mut c = Cfg::default();
    c.cap.max_send_wr = send;
    c.cap.max_recv_wr = recv;
    c
}

#[test]
fn send_slots_are_held_until_a_completion_is_polled() {
    let (a, b) = pair(cfg(4, 4), Cfg::default());
    let (src, dst) = (Buf::new(64), Buf::new(64));
    src.fill(1);
    let smr = reg(a.pd, &src, ALL_ACCESS);
    let dmr = reg(b.pd, &dst, ALL_ACCESS);
    let rkey = v!((*dmr).rkey);
    let mut sg = [sge(&src, 0, 8, smr)];
    let mut w = |id, flags| {
        let mut wr = write_wr(id, &mut sg, dst.addr(), rkey, None);
        wr.send_flags = flags;
        wr
    };
    // Three unsignaled, one signaled, and a fifth that does not fit.
    let mut wrs = [w(1, 0), w(2, 0), w(3, 0), w(4, SEND_SIGNALED), w(5, SEND_SIGNALED)];
    assert_eq!(post_send(a.qp, &mut wrs), (libc::ENOMEM, Some(4)));
    // Executed, but not polled: still full.
    wait_for("the writes", Duration::from_secs(5), || dst.get(0) == 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(post_send(a.qp, &mut [w(6, SEND_SIGNALED)]), (libc::ENOMEM, Some(0)));
    // Polling the signaled one frees it and the unsignaled ones before it.
    assert_eq!(poll_one(a.scq).wr_id, 4);
    let mut four = [w(7, 0), w(8, 0), w(9, 0), w(10, SEND_SIGNALED)];
    assert_eq!(post_send(a.qp, &mut four), (0, None));
    assert_eq!(poll_one(a.scq).wr_id, 10);
}

#[test]
fn receive_slots_are_held_until_a_completion_is_polled() {
    let (a, b) = pair(Cfg::default(), cfg(4, 2));
    assert_eq!(post_recv(b.qp, 1, &mut []), 0);
    assert_eq!(post_recv(b.qp, 2, &mut []), 0);
    assert_eq!(post_recv(b.qp, 3, &mut []), libc::ENOMEM);
    let mut wr = write_wr(1, &mut [], 0, 0, Some(1));
    assert_eq!(post_send(a.qp, std::slice::from_mut(&mut wr)).0, 0);
    assert_eq!(poll_one(a.scq).status, WC_SUCCESS);
    // Consumed, but its completion is not polled yet.
    assert_eq!(post_recv(b.qp, 3, &mut []), libc::ENOMEM);
    assert_eq!(poll_one(b.rcq).wr_id, 1);
    assert_eq!(post_recv(b.qp, 3, &mut []), 0);
}

#[test]
fn too_many_sges_are_refused() {
    let (a, b) = pair(Cfg::default(), Cfg::default()); // 4 SGEs each way
    let buf = Buf::new(64);
    let mr = reg(a.pd, &buf, ALL_ACCESS);
    let mut five = [sge(&buf, 0, 8, mr); 5];
    let mut wrs = [write_wr(1, &mut five[..4], buf.addr(), 0, None), write_wr(2, &mut five, buf.addr(), 0, None)];
    assert_eq!(post_send(a.qp, &mut wrs), (libc::EINVAL, Some(1)));
    assert_eq!(post_recv(b.qp, 1, &mut five), libc::EINVAL);
}

#[test]
fn cq_overflow_is_fatal() {
    if child_body().is_none() {
        // In a child, to see its standard error.
        let out = run_child("cq_overflow_is_fatal", "overflow", &[]);
        assert!(out.contains("CQ overrun"), "no overrun line on stderr:\n{out}");
        return;
    }
    let mut small = Cfg { cqe: 2, ..Cfg::default() };
    small.cap.max_send_wr = 8;
    let (a, b) = pair(small, Cfg::default());
    let (src, dst) = (Buf::new(64), Buf::new(64));
    let smr = reg(a.pd, &src, ALL_ACCESS);
    let dmr = reg(b.pd, &dst, ALL_ACCESS);
    let mut sg = [sge(&src, 0, 8, smr)];
    let rkey = v!((*dmr).rkey);
    let mut wrs: Vec<_> = (1..=3).map(|i| write_wr(i, &mut sg, dst.addr(), rkey, None)).collect();
    assert_eq!(post_send(a.qp, &mut wrs).0, 0);
    wait_for("the overflow", Duration::from_secs(5), || poll(a.scq, 0).is_err());
    assert!(poll(a.scq, 4).unwrap_err() < 0);
    assert_eq!(poll(a.rcq, 4).map(|w| w.len()), Ok(0), "the other CQ is fine");
    wait_for("the QP in ERR", Duration::from_secs(5), || a.state() == QPS_ERR);
    assert_eq!(b.state(), QPS_RTS);
}

#[test]
fn posting_in_the_error_state_flushes() {
    let (a, _b) = pair(Cfg::default(), Cfg::default());
    let err = ibv_qp_attr { qp_state: QPS_ERR, ..Default::default() };
    assert_eq!(modify(a.qp, &err, QP_STATE), 0);
    let mut wr = write_wr(7, &mut [], 0, 0, None);
    assert_eq!(post_send(a.qp, std::slice::from_mut(&mut wr)).0, 0);
    let wc = poll_one(a.scq);
    assert_eq!((wc.wr_id, wc.status), (7, WC_WR_FLUSH_ERR));
    assert_eq!(post_recv(a.qp, 8, &mut []), 0);
    let wc = poll_one(a.rcq);
    assert_eq!((wc.wr_id, wc.status), (8, WC_WR_FLUSH_ERR));
    // Back to RESET: nothing more completes, and posting is refused again.
    let reset = ibv_qp_attr { qp_state: QPS_RESET, ..Default::default() };
    assert_eq!(modify(a.qp, &reset, QP_STATE), 0);
    assert_eq!(post_recv(a.qp, 9, &mut []), libc::EINVAL);
}

#[test]
fn objects_in_use_cannot_go() {
    let ctx = open(0);
    let pd = v!(ibv_alloc_pd(ctx));
    let buf = Buf::new(64);
    let mr = reg(pd, &buf, ACCESS_LOCAL_WRITE);
    assert_eq!(v!(ibv_dealloc_pd(pd)), libc::EBUSY);
    assert_eq!(v!(ibv_dereg_mr(mr)), 0);
    assert_eq!(v!(ibv_dereg_mr(mr)), libc::EINVAL);
    assert_eq!(v!(ibv_dealloc_pd(pd)), 0);
    assert_eq!(v!(ibv_close_device(ctx)), 0);
}

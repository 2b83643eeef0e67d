//! The QP state machine: IB's exact attribute masks per transition, value checks, the states
//! posting needs, and what `ibv_create_qp` / `ibv_query_qp` hand back.

#[macro_use]
mod common;

use common::*;

/// Every required bit of `mask` (besides `QP_STATE`) missing in turn gives `EINVAL`; so does
/// each unexpected bit added.
fn check_masks(qp: *mut ibv_qp, attr: &ibv_qp_attr, mask: i32, unexpected: &[i32]) {
    for bit in (0..21).map(|b| 1 << b).filter(|b| mask & b != 0) {
        assert_eq!(modify(qp, attr, mask & !bit), libc::EINVAL, "mask {mask:#x} without {bit:#x}");
    }
    for &bit in unexpected {
        assert_eq!(modify(qp, attr, mask | bit), libc::EINVAL, "mask {mask:#x} with {bit:#x}");
    }
}

#[test]
fn each_transition_needs_exactly_its_attributes() {
    let (a, b) = (End::new(Cfg::default()), End::new(Cfg::default()));
    let (init, m) = init_attr(a.cfg.qp_access);
    check_masks(a.qp, &init, m, &[QP_AV, QP_PATH_MTU, QP_SQ_PSN, QP_CAP, QP_QKEY]);
    assert_eq!(a.state(), QPS_RESET);
    assert_eq!(modify(a.qp, &init, m), 0);
    assert_eq!(a.state(), QPS_INIT);
    // INIT → INIT: optional attributes only (no state bit needed).
    assert_eq!(modify(a.qp, &init, QP_ACCESS_FLAGS), 0);
    assert_eq!(modify(a.qp, &init, QP_STATE | QP_PORT | QP_PKEY_INDEX), 0);
    assert_eq!(modify(a.qp, &init, QP_STATE | QP_TIMEOUT), libc::EINVAL);

    let (rtr, m) = rtr_attr(b.qpn(), b.gid(), 12);
    check_masks(a.qp, &rtr, m, &[QP_SQ_PSN, QP_TIMEOUT, QP_RETRY_CNT, QP_RNR_RETRY, QP_MAX_QP_RD_ATOMIC, QP_CUR_STATE]);
    assert_eq!(a.state(), QPS_INIT);
    assert_eq!(modify(a.qp, &rtr, m | QP_ACCESS_FLAGS | QP_PKEY_INDEX), 0);
    assert_eq!(a.state(), QPS_RTR);

    let (rts, m) = rts_attr(14, 7, 7);
    check_masks(a.qp, &rts, m, &[QP_AV, QP_DEST_QPN, QP_RQ_PSN, QP_PATH_MTU, QP_PORT, QP_MAX_DEST_RD_ATOMIC]);
    assert_eq!(a.state(), QPS_RTR);
    assert_eq!(modify(a.qp, &rts, m | QP_MIN_RNR_TIMER | QP_ACCESS_FLAGS), 0);
    assert_eq!(a.state(), QPS_RTS);
    // RTS → RTS: optional attributes only.
    assert_eq!(modify(a.qp, &rts, QP_MIN_RNR_TIMER | QP_ACCESS_FLAGS), 0);
    assert_eq!(modify(a.qp, &rts, QP_TIMEOUT), libc::EINVAL);

    // Any state → ERR and → RESET: the state bit alone.
    let err = ibv_qp_attr { qp_state: QPS_ERR, ..Default::default() };
    assert_eq!(modify(a.qp, &err, QP_STATE | QP_ACCESS_FLAGS), libc::EINVAL);
    assert_eq!(modify(a.qp, &err, QP_STATE), 0);
    assert_eq!(a.state(), QPS_ERR);
    let reset = ibv_qp_attr { qp_state: QPS_RESET, ..Default::default() };
    assert_eq!(modify(a.qp, &reset, QP_STATE | QP_PORT), libc::EINVAL);
    assert_eq!(modify(a.qp, &reset, QP_STATE), 0);
    assert_eq!(a.state(), QPS_RESET);
}

#[test]
fn transitions_out_of_order_are_refused() {
    let (a, b) = (End::new(Cfg::default()), End::new(Cfg::default()));
    let (rtr, rtr_m) = rtr_attr(b.qpn(), b.gid(), 12);
    let (rts, rts_m) = rts_attr(14, 7, 7);
    assert_eq!(modify(a.qp, &rtr, rtr_m), libc::EINVAL, "RESET → RTR");
    assert_eq!(modify(a.qp, &rts, rts_m), libc::EINVAL, "RESET → RTS");
    let (init, m) = init_attr(a.cfg.qp_access);
    // Without QP_STATE the target is the current state: RESET → RESET takes no attributes.
    assert_eq!(modify(a.qp, &init, m & !QP_STATE), libc::EINVAL);
    assert_eq!(modify(a.qp, &init, m), 0);
    assert_eq!(modify(a.qp, &rts, rts_m), libc::EINVAL, "INIT → RTS");
    assert_eq!(modify(a.qp, &rtr, rtr_m), 0);
    assert_eq!(modify(a.qp, &init, m), libc::EINVAL, "RTR → INIT");
    assert_eq!(modify(a.qp, &rtr, rtr_m), libc::EINVAL, "RTR → RTR");
    // A stale current state is refused.
    let mut stale = rts;
    stale.cur_qp_state = QPS_INIT;
    assert_eq!(modify(a.qp, &stale, rts_m | QP_CUR_STATE), libc::EINVAL);
    stale.cur_qp_state = QPS_RTR;
    assert_eq!(modify(a.qp, &stale, rts_m | QP_CUR_STATE), 0);
}

#[test]
fn attribute_values_are_checked() {
    let (a, b) = (End::new(Cfg::default()), End::new(Cfg::default()));
    let (init, m) = init_attr(a.cfg.qp_access);
    for bad in [ibv_qp_attr { port_num: 2, ..init }, ibv_qp_attr { pkey_index: 1, ..init }] {
        assert_eq!(modify(a.qp, &bad, m), libc::EINVAL);
    }
    assert_eq!(modify(a.qp, &init, m), 0);

    let (rtr, m) = rtr_attr(b.qpn(), b.gid(), 12);
    let mut bad = vec![
        ibv_qp_attr { path_mtu: 6, ..rtr },
        ibv_qp_attr { path_mtu: 0, ..rtr },
        ibv_qp_attr { min_rnr_timer: 32, ..rtr },
        ibv_qp_attr { dest_qp_num: 1 << 24, ..rtr },
    ];
    let mut av = |f: &dyn Fn(&mut ibv_ah_attr)| {
        let mut x = rtr;
        f(&mut x.ah_attr);
        bad.push(x);
    };
    av(&|ah| ah.is_global = 0); // RoCE needs a GRH
    av(&|ah| ah.port_num = 0);
    av(&|ah| ah.grh.sgid_index = 2); // gid_tbl_len is 2
    av(&|ah| ah.grh.dgid = ibv_gid::default()); // not a GID of the fabric
    av(&|ah| ah.grh.dgid.raw[15] ^= 0xff); // a node that does not exist
    for (i, x) in bad.iter().enumerate() {
        assert_eq!(modify(a.qp, x, m), libc::EINVAL, "bad RTR attributes #{i}");
    }
    assert_eq!(a.state(), QPS_INIT);
    // The link-local GID names the same node.
    let mut link_local = rtr;
    assert_eq!(v!(ibv_query_gid(b.ctx, 1, 0, &mut link_local.ah_attr.grh.dgid)), 0);
    assert_eq!(link_local.ah_attr.grh.dgid.raw[..2], [0xfe, 0x80]);
    assert_eq!(modify(a.qp, &link_local, m), 0);

    let (rts, m) = rts_attr(14, 7, 7);
    for bad in [
        ibv_qp_attr { timeout: 32, ..rts },
        ibv_qp_attr { retry_cnt: 8, ..rts },
        ibv_qp_attr { rnr_retry: 8, ..rts },
        ibv_qp_attr { max_rd_atomic: 17, ..rts },
    ] {
        assert_eq!(modify(a.qp, &bad, m), libc::EINVAL);
    }
    assert_eq!(modify(a.qp, &rts, m), 0);
}

#[test]
fn posting_needs_the_right_state() {
    let (a, b) = (End::new(Cfg::default()), End::new(Cfg::default()));
    let buf = Buf::new(64);
    let mr = reg(a.pd, &buf, ALL_ACCESS);
    let try_send = || {
        let mut s = [sge(&buf, 0, 8, mr)];
        let mut wrs = [write_wr(1, &mut s, buf.addr(), v!((*mr).rkey), None)];
        post_send(a.qp, &mut wrs)
    };
    let mut s = [sge(&buf, 0, 8, mr)];
    assert_eq!(try_send(), (libc::EINVAL, Some(0)), "post_send in RESET");
    assert_eq!(post_recv(a.qp, 1, &mut s), libc::EINVAL, "post_recv in RESET");
    let (init, m) = init_attr(a.cfg.qp_access);
    assert_eq!(modify(a.qp, &init, m), 0);
    assert_eq!(try_send(), (libc::EINVAL, Some(0)), "post_send in INIT");
    assert_eq!(post_recv(a.qp, 1, &mut s), 0, "post_recv in INIT");
    let (rtr, m) = rtr_attr(b.qpn(), b.gid(), 12);
    assert_eq!(modify(a.qp, &rtr, m), 0);
    assert_eq!(try_send(), (libc::EINVAL, Some(0)), "post_send in RTR");
    // RDMA read and atomics are not emulated.
    let (rts, m) = rts_attr(14, 7, 7);
    assert_eq!(modify(a.qp, &rts, m), 0);
    let mut s = [sge(&buf, 0, 8, mr)];
    let mut read = write_wr(1, &mut s, buf.addr(), v!((*mr).rkey), None);
    read.opcode = WR_RDMA_READ;
    assert_eq!(post_send(a.qp, &mut [read]), (libc::EINVAL, Some(0)));
}

#[test]
fn create_qp_checks_and_grants_caps_and_query_reads_back() {
    let ctx = open(0);
    let pd = v!(ibv_alloc_pd(ctx));
    let cq = v!(ibv_create_cq(ctx, 16, std::ptr::null_mut(), std::ptr::null_mut(), 0));
    let cap = ibv_qp_cap { max_send_wr: 100, max_recv_wr: 50, max_send_sge: 3, max_recv_sge: 2, max_inline_data: 100 };
    let mut init = ibv_qp_init_attr {
        qp_context: 0x1234 as *mut _,
        send_cq: cq,
        recv_cq: cq,
        srq: std::ptr::null_mut(),
        cap,
        qp_type: QPT_RC,
        sq_sig_all: 1,
    };
    let too_big = [
        ibv_qp_cap { max_inline_data: 257, ..cap },
        ibv_qp_cap { max_send_sge: 17, ..cap },
        ibv_qp_cap { max_recv_sge: 17, ..cap },
        ibv_qp_cap { max_send_wr: 16385, ..cap },
        ibv_qp_cap { max_recv_wr: 16385, ..cap },
    ];
    for c in too_big {
        let mut x = ibv_qp_init_attr { cap: c, ..init };
        assert!(v!(ibv_create_qp(pd, &mut x)).is_null());
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EINVAL));
    }
    let mut ud = ibv_qp_init_attr { qp_type: 4, ..init };
    assert!(v!(ibv_create_qp(pd, &mut ud)).is_null());
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EOPNOTSUPP));

    let qp = v!(ibv_create_qp(pd, &mut init));
    assert!(!qp.is_null());
    assert_eq!(init.cap, cap);
    v!({
        let q = &*qp;
        assert_eq!((q.context, q.pd, q.send_cq, q.recv_cq, q.qp_context), (ctx, pd, cq, cq, 0x1234 as *mut _));
        assert_eq!((q.state, q.qp_type), (QPS_RESET, QPT_RC));
        assert!(q.qp_num > 1 && q.qp_num < 1 << 24);
        assert_eq!((*cq).cqe, 16);
        assert_eq!((*cq).context, ctx);
        assert_eq!((*pd).context, ctx);
    });
    let fill = |a: &mut ibv_qp_attr, i: &mut ibv_qp_init_attr| v!(ibv_query_qp(qp, a, 0, i));
    let (mut attr, mut got) = (ibv_qp_attr::default(), ibv_qp_init_attr { cap: Default::default(), ..init });
    assert_eq!(fill(&mut attr, &mut got), 0);
    assert_eq!((attr.qp_state, attr.cap, got.cap, got.sq_sig_all), (QPS_RESET, cap, cap, 1));
    let other = End::new(Cfg::default());
    let (a, m) = init_attr(ACCESS_REMOTE_WRITE as u32);
    assert_eq!(modify(qp, &a, m), 0);
    let (a, m) = rtr_attr(other.qpn(), other.gid(), 12);
    assert_eq!(modify(qp, &a, m), 0);
    let (a, m) = rts_attr(17, 6, 5);
    assert_eq!(modify(qp, &a, m), 0);
    assert_eq!(fill(&mut attr, &mut got), 0);
    assert_eq!((attr.qp_state, attr.dest_qp_num, attr.path_mtu), (QPS_RTS, other.qpn(), MTU_4096));
    assert_eq!((attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer), (17, 6, 5, 12));
    assert_eq!((attr.sq_psn, attr.rq_psn, attr.qp_access_flags), (0x1234, 0x1234, ACCESS_REMOTE_WRITE as u32));
    assert_eq!(attr.ah_attr.grh.dgid, other.gid());
    // In use: the PD and the CQ cannot go yet.
    assert_eq!(v!(ibv_dealloc_pd(pd)), libc::EBUSY);
    assert_eq!(v!(ibv_destroy_cq(cq)), libc::EBUSY);
    assert_eq!(v!(ibv_destroy_qp(qp)), 0);
    assert_eq!(v!(ibv_destroy_qp(qp)), libc::EINVAL, "a destroyed QP is refused");
    assert_eq!(v!(ibv_destroy_cq(cq)), 0);
    assert_eq!(v!(ibv_dealloc_pd(pd)), 0);
    assert_eq!(v!(ibv_close_device(ctx)), 0);
}

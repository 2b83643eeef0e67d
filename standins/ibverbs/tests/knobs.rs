//! The knobs, each in a child process (they are read once per process): device lists, the
//! InfiniBand link, the lazy source read (a long delay), lost packets and their
//! retransmission, a corrupted rkey.

#[macro_use]
mod common;

use std::ffi::CStr;
use std::time::Duration;

use common::*;

fn errno() -> Option<i32> {
    std::io::Error::last_os_error().raw_os_error()
}

/// A pair with `len`-byte source and destination MRs.
fn setup(a: Cfg, b: Cfg, len: usize) -> (End, End, Buf, Buf, *mut ibv_mr, *mut ibv_mr) {
    let (a, b) = pair(a, b);
    let (src, dst) = (Buf::new(len), Buf::new(len));
    let smr = reg(a.pd, &src, ALL_ACCESS);
    let dmr = reg(b.pd, &dst, ALL_ACCESS);
    (a, b, src, dst, smr, dmr)
}

#[test]
fn device_lists() {
    match child_body().as_deref() {
        None => {
            run_child("device_lists", "none", &[(DEVICES_VAR, "0")]);
            run_child("device_lists", "enosys", &[(DEVICES_VAR, "enosys")]);
            run_child("device_lists", "two", &[(DEVICES_VAR, "2")]);
        }
        Some("none") => {
            let mut n = -1;
            let list = v!(ibv_get_device_list(&mut n));
            assert!(!list.is_null(), "an empty list, not NULL");
            assert_eq!(n, 0);
            assert!(v!(*list).is_null());
            v!(ibv_free_device_list(list));
        }
        Some("enosys") => {
            let mut n = -1;
            assert!(v!(ibv_get_device_list(&mut n)).is_null());
            assert_eq!(errno(), Some(libc::ENOSYS));
        }
        Some(_) => {
            let mut n = 0;
            let list = v!(ibv_get_device_list(&mut n));
            assert_eq!(n, 2);
            let name = |i: usize| v!(CStr::from_ptr(ibv_get_device_name(*list.add(i)))).to_str().unwrap().to_owned();
            assert_eq!((name(0), name(1)), ("mlx5_0".to_owned(), "mlx5_1".to_owned()));
            v!(ibv_free_device_list(list));
            // A QP of each device, connected across them.
            let (a, b) = (End::on(0, Cfg::default()), End::on(1, Cfg::default()));
            assert_ne!(a.gid(), b.gid());
            connect(&a, b.qpn(), b.gid());
            connect(&b, a.qpn(), a.gid());
            assert_eq!(post_recv(b.qp, 1, &mut []), 0);
            let mut wr = write_wr(1, &mut [], 0, 0, Some(3));
            assert_eq!(post_send(a.qp, std::slice::from_mut(&mut wr)).0, 0);
            assert_eq!(poll_one(b.rcq).status, WC_SUCCESS);
        }
    }
}

#[test]
fn infiniband_link() {
    if child_body().is_none() {
        run_child("infiniband_link", "ib", &[(LINK_VAR, "ib")]);
        return;
    }
    let (a, b) = (End::new(Cfg::default()), End::new(Cfg::default()));
    let mut port = ibv_port_attr::default();
    assert_eq!(v!(ibv_query_port(a.ctx, 1, &mut port)), 0);
    assert_eq!(port.link_layer, LINK_LAYER_INFINIBAND);
    assert_eq!(u32::from(port.lid), 1 + (std::process::id() % 0x2ffe) * 4);
    let (init, m) = init_attr(a.cfg.qp_access);
    for e in [&a, &b] {
        assert_eq!(modify(e.qp, &init, m), 0);
    }
    // A non-global address vector routes by LID; LID 0 is no destination.
    let rtr = |dest: u32| {
        let (mut x, m) = rtr_attr(dest, ibv_gid::default(), 1);
        x.ah_attr.is_global = 0;
        x.ah_attr.dlid = port.lid;
        (x, m)
    };
    let (mut bad, m) = rtr(b.qpn());
    bad.ah_attr.dlid = 0;
    assert_eq!(modify(a.qp, &bad, m), libc::EINVAL);
    for (e, other) in [(&a, &b), (&b, &a)] {
        let (x, m) = rtr(other.qpn());
        assert_eq!(modify(e.qp, &x, m), 0);
        let (x, m) = rts_attr(14, 7, 7);
        assert_eq!(modify(e.qp, &x, m), 0);
    }
    let (src, dst) = (Buf::new(64), Buf::new(64));
    src.fill(4);
    let smr = reg(a.pd, &src, ALL_ACCESS);
    let dmr = reg(b.pd, &dst, ALL_ACCESS);
    let mut sg = [sge(&src, 0, 64, smr)];
    assert_eq!(post_send(a.qp, &mut [write_wr(1, &mut sg, dst.addr(), v!((*dmr).rkey), None)]).0, 0);
    assert_eq!(poll_one(a.scq).status, WC_SUCCESS);
    assert!(dst.to_vec().iter().all(|&x| x == 4));
}

#[test]
fn the_source_is_read_lazily() {
    if child_body().is_none() {
        run_child("the_source_is_read_lazily", "lazy", &[(DELAY_VAR, "20000")]);
        return;
    }
    let (a, _b, src, dst, smr, dmr) = setup(Cfg::default(), Cfg::default(), 4096);
    let mut fresh = 0;
    for round in 0..3u8 {
        src.fill(2 * round + 1);
        let mut sg = [sge(&src, 0, 4096, smr)];
        assert_eq!(post_send(a.qp, &mut [write_wr(1, &mut sg, dst.addr(), v!((*dmr).rkey), None)]).0, 0);
        // The sender reuses its buffer before the completion: the new bytes go out.
        src.fill(2 * round + 2);
        assert_eq!(poll_one(a.scq).status, WC_SUCCESS);
        fresh += usize::from(dst.to_vec().iter().all(|&x| x == 2 * round + 2));
    }
    assert!(fresh > 0, "the NIC read the source at post time");
}

#[test]
fn deregistering_before_the_nic_reads_is_a_protection_error() {
    if child_body().is_none() {
        run_child("deregistering_before_the_nic_reads_is_a_protection_error", "dereg", &[(DELAY_VAR, "20000")]);
        return;
    }
    // The NIC waits 0..20 ms before reading: an MR deregistered right after the post is gone
    // by then (three tries, should the random delay be nearly zero).
    let caught = (0..3).any(|_| {
        let (a, _b, src, dst, smr, dmr) = setup(Cfg::default(), Cfg::default(), 4096);
        let mut sg = [sge(&src, 0, 4096, smr)];
        assert_eq!(post_send(a.qp, &mut [write_wr(1, &mut sg, dst.addr(), v!((*dmr).rkey), None)]).0, 0);
        assert_eq!(v!(ibv_dereg_mr(smr)), 0);
        let st = poll_one(a.scq).status;
        assert!(st == WC_LOC_PROT_ERR || st == WC_SUCCESS, "{}", wc_status_name(st));
        st == WC_LOC_PROT_ERR
    });
    assert!(caught, "the source MR was checked at post time");
}

#[test]
fn lost_packets_are_retransmitted_and_applied_once() {
    if child_body().is_none() {
        let env = [(DROP_VAR, "0.1"), (SEED_VAR, "7"), (DELAY_VAR, "0")];
        let out = run_child("lost_packets_are_retransmitted_and_applied_once", "drop", &env);
        eprintln!("{}", out.lines().filter(|l| l.contains("stats Stats")).collect::<String>());
        return;
    }
    const N: usize = 200;
    let mut cfg = Cfg { cqe: 1024, timeout: 8, retry_cnt: 7, sq_sig_all: true, ..Cfg::default() };
    cfg.cap.max_send_wr = 512;
    cfg.cap.max_recv_wr = 512;
    let (a, b, src, dst, smr, dmr) = setup(cfg, cfg, N * 64);
    for i in 0..N * 64 {
        src.set(i, (i / 64) as u8 ^ 0x5a);
    }
    for i in 0..N + 10 {
        assert_eq!(post_recv(b.qp, i as u64, &mut []), 0);
    }
    let mut sgs: Vec<_> = (0..N).map(|i| [sge(&src, i * 64, 64, smr)]).collect();
    let rkey = v!((*dmr).rkey);
    let mut wrs: Vec<_> = sgs
        .iter_mut()
        .enumerate()
        .map(|(i, s)| write_wr(i as u64, s, dst.addr() + i as u64 * 64, rkey, Some((i as u32).to_be())))
        .collect();
    assert_eq!(post_send(a.qp, &mut wrs).0, 0);
    let sent = poll_n(a.scq, N, Duration::from_secs(10));
    assert!(sent.iter().enumerate().all(|(i, w)| w.status == WC_SUCCESS && w.wr_id == i as u64));
    let got = poll_n(b.rcq, N, Duration::from_secs(10));
    for (i, w) in got.iter().enumerate() {
        assert_eq!((w.status, w.wr_id, u32::from_be(w.imm_data)), (WC_SUCCESS, i as u64, i as u32));
    }
    // Each write consumed exactly one receive.
    poll_none(b.rcq, Duration::from_millis(20));
    assert_eq!(src.to_vec(), dst.to_vec());
    let s = stats();
    println!("stats {s:?}");
    assert!(s.dropped > 0 && s.retransmits > 0, "{s:?}");
    assert!(s.duplicates > 0, "no lost ACK made a duplicate: {s:?}");
}

#[test]
fn the_nth_write_goes_out_with_a_corrupted_rkey() {
    if child_body().is_none() {
        run_child("the_nth_write_goes_out_with_a_corrupted_rkey", "rkey", &[(BAD_RKEY_VAR, "2")]);
        return;
    }
    let (a, _b, src, dst, smr, dmr) = setup(Cfg::default(), Cfg::default(), 64);
    let mut sg = [sge(&src, 0, 64, smr)];
    let rkey = v!((*dmr).rkey);
    assert_eq!(post_send(a.qp, &mut [write_wr(1, &mut sg, dst.addr(), rkey, None)]).0, 0);
    assert_eq!(poll_one(a.scq).status, WC_SUCCESS);
    assert_eq!(post_send(a.qp, &mut [write_wr(2, &mut sg, dst.addr(), rkey, None)]).0, 0);
    assert_eq!(poll_one(a.scq).status, WC_REM_ACCESS_ERR);
}

#[test]
fn on_demand_registrations_follow_the_knob() {
    match child_body().as_deref() {
        None => {
            run_child("on_demand_registrations_follow_the_knob", "on", &[]);
            run_child("on_demand_registrations_follow_the_knob", "off", &[(ODP_VAR, "0")]);
        }
        Some(which) => {
            let ctx = open(0);
            let pd = v!(ibv_alloc_pd(ctx));
            let odp = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_ON_DEMAND;
            // Nothing is mapped at 4096: on-demand paging pins nothing, so it registers.
            let mr = v!(ibv_reg_mr(pd, 4096 as *mut _, 4096, odp));
            if which == "on" {
                assert!(!mr.is_null(), "an on-demand region of unmapped memory registers");
                assert_eq!(v!(ibv_dereg_mr(mr)), 0);
            } else {
                assert!(mr.is_null(), "a device without on-demand paging refuses the flag");
                assert_eq!(errno(), Some(libc::EINVAL));
            }
            assert_eq!(v!(ibv_dealloc_pd(pd)), 0);
        }
    }
}

#[test]
fn dma_buf_registrations_reach_the_buffer_through_its_descriptor() {
    match child_body().as_deref() {
        None => {
            run_child("dma_buf_registrations_reach_the_buffer_through_its_descriptor", "on", &[]);
            run_child("dma_buf_registrations_reach_the_buffer_through_its_descriptor", "off", &[(DMABUF_VAR, "0")]);
        }
        Some("off") => {
            let pd = v!(ibv_alloc_pd(open(0)));
            assert!(v!(ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0)).is_null());
            assert_eq!(errno(), Some(libc::EOPNOTSUPP), "NCCL's probe reads this as no dma-buf");
        }
        Some(_) => {
            let (a, b) = pair(Cfg::default(), Cfg::default());
            // NCCL's probe: a bad descriptor is EBADF where dma-buf is supported.
            assert!(v!(ibv_reg_dmabuf_mr(b.pd, 0, 0, 0, -1, 0)).is_null());
            assert_eq!(errno(), Some(libc::EBADF));
            // A memfd standing in for device memory, positioned at its second page.
            let page = 4096usize;
            // SAFETY: a fresh memfd, sized, positioned and mapped below; closed at the end.
            let fd = unsafe { libc::memfd_create(c"dmabuf".as_ptr(), 0) };
            assert!(fd >= 0);
            // SAFETY: the memfd made above.
            assert_eq!(unsafe { libc::ftruncate(fd, 3 * page as i64) }, 0);
            // SAFETY: as above.
            assert_eq!(unsafe { libc::lseek(fd, page as i64, libc::SEEK_SET) }, page as i64);
            // SAFETY: a new shared mapping of the memfd's three pages, unmapped at the end.
            let view = unsafe {
                libc::mmap(std::ptr::null_mut(), 3 * page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
            };
            assert_ne!(view, libc::MAP_FAILED);
            // SAFETY: the mapping just made.
            let file = unsafe { std::slice::from_raw_parts_mut(view.cast::<u8>(), 3 * page) };
            let iova = 0x7000_0000_0000u64;
            // Beyond the file: refused; ODP makes no sense for a dma-buf.
            assert!(v!(ibv_reg_dmabuf_mr(b.pd, 16, 2 * page, iova, fd, ALL_ACCESS)).is_null());
            assert!(v!(ibv_reg_dmabuf_mr(b.pd, 16, page, iova, fd, ALL_ACCESS | ACCESS_ON_DEMAND)).is_null());
            let dmr = v!(ibv_reg_dmabuf_mr(b.pd, 16, page, iova, fd, ALL_ACCESS));
            assert!(!dmr.is_null(), "ibv_reg_dmabuf_mr: {}", std::io::Error::last_os_error());
            assert_eq!(v!((*dmr).addr) as u64, iova);
            // A write to iova + 8 lands at the file's page + 16 + 8.
            let src = Buf::new(100);
            for i in 0..100 {
                src.set(i, i as u8 + 1);
            }
            let smr = reg(a.pd, &src, ALL_ACCESS);
            let rkey = v!((*dmr).rkey);
            let mut sg = [sge(&src, 0, 100, smr)];
            assert_eq!(post_send(a.qp, &mut [write_wr(1, &mut sg, iova + 8, rkey, None)]).0, 0);
            assert_eq!(poll_one(a.scq).status, WC_SUCCESS);
            let at = page + 16 + 8;
            assert_eq!(&file[at..at + 100], &src.to_vec()[..]);
            // Past the region's end: a remote access error, nothing written.
            let mut sg = [sge(&src, 0, 100, smr)];
            assert_eq!(post_send(a.qp, &mut [write_wr(2, &mut sg, iova + page as u64 - 50, rkey, None)]).0, 0);
            assert_eq!(poll_one(a.scq).status, WC_REM_ACCESS_ERR);
            assert!(file[2 * page..].iter().all(|&x| x == 0));
            // SAFETY: unmapping and closing what this test made (the region keeps its own mapping).
            unsafe {
                libc::munmap(view, 3 * page);
                libc::close(fd);
            }
            assert_eq!(v!(ibv_dereg_mr(dmr)), 0);
        }
    }
}

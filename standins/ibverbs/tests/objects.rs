//! Devices, ports, GIDs, memory registration rules, status strings, and pointers that are not
//! live objects of ours.

#[macro_use]
mod common;

use std::ffi::CStr;

use common::*;

fn errno() -> Option<i32> {
    std::io::Error::last_os_error().raw_os_error()
}

#[test]
fn the_device_its_port_and_gids() {
    let mut n = -1;
    let list = v!(ibv_get_device_list(&mut n));
    assert_eq!(n, 1);
    let dev = v!(*list);
    assert!(v!(*list.add(1)).is_null(), "the list is NULL-terminated");
    assert_eq!(v!(CStr::from_ptr(ibv_get_device_name(dev))).to_str(), Ok("mlx5_0"));
    let guid = v!(ibv_get_device_guid(dev)).to_ne_bytes();
    assert_eq!(guid[4..], std::process::id().to_be_bytes(), "the GUID carries the node (big-endian)");
    let ctx = v!(ibv_open_device(dev));
    v!(ibv_free_device_list(list));
    assert!(!ctx.is_null());
    let ops = v!(&(*ctx).ops);
    assert!(ops.poll_cq.is_some() && ops.post_send.is_some() && ops.post_recv.is_some() && ops.req_notify_cq.is_some());
    assert_eq!(v!((*ctx).device), dev);

    let mut attr: ibv_device_attr = v!(std::mem::zeroed());
    assert_eq!(v!(ibv_query_device(ctx, &mut attr)), 0);
    assert_eq!((attr.phys_port_cnt, attr.max_qp_wr, attr.max_sge), (1, 16384, 16));
    assert_eq!(attr.node_guid.to_ne_bytes(), guid);

    let mut port = ibv_port_attr::default();
    assert_eq!(v!(ibv_query_port(ctx, 1, &mut port)), 0);
    assert_eq!((port.state, port.active_mtu, port.gid_tbl_len), (PORT_ACTIVE, MTU_4096, 2));
    assert_eq!((port.link_layer, port.lid), (LINK_LAYER_ETHERNET, 0));
    assert_eq!(v!(ibv_query_port(ctx, 2, &mut port)), libc::EINVAL);

    let mut g = ibv_gid::default();
    assert_eq!(v!(ibv_query_gid(ctx, 1, 0, &mut g)), 0);
    assert_eq!(g.raw[..8], [0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
    assert_eq!(g.raw[8..], guid);
    assert_eq!(v!(ibv_query_gid(ctx, 1, 1, &mut g)), 0);
    assert_eq!(g.raw[..13], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10], "::ffff:10.x.y.z");
    let low = u32::from_be_bytes([0, g.raw[13], g.raw[14], g.raw[15]]);
    assert_eq!(low & 0x3f_ffff, std::process::id());
    assert_eq!(v!(ibv_query_gid(ctx, 1, 2, &mut g)), -1);
    assert_eq!(errno(), Some(libc::EINVAL));
    assert_eq!(v!(ibv_fork_init()), 0);
    assert_eq!(v!(ibv_close_device(ctx)), 0);
}

#[test]
fn memory_registration_rules() {
    let ctx = open(0);
    let pd = v!(ibv_alloc_pd(ctx));
    let buf = Buf::new(8192);
    // Remote write (or atomic) needs local write.
    assert!(v!(ibv_reg_mr(pd, buf.ptr(), buf.len, ACCESS_REMOTE_WRITE)).is_null());
    assert_eq!(errno(), Some(libc::EINVAL));
    assert!(v!(ibv_reg_mr(pd, buf.ptr(), buf.len, ACCESS_REMOTE_ATOMIC | ACCESS_REMOTE_READ)).is_null());
    assert_eq!(errno(), Some(libc::EINVAL));
    // Nothing mapped there, or not writable with write access: pinning fails.
    assert!(v!(ibv_reg_mr(pd, 4096 as *mut _, 4096, ACCESS_LOCAL_WRITE)).is_null());
    assert_eq!(errno(), Some(libc::EFAULT));
    let text = ibv_reg_mr as *const () as *mut std::ffi::c_void;
    assert!(v!(ibv_reg_mr(pd, text, 16, ACCESS_LOCAL_WRITE)).is_null());
    assert_eq!(errno(), Some(libc::EFAULT));
    let ro = v!(ibv_reg_mr(pd, text, 16, 0));
    assert!(!ro.is_null(), "read-only memory registers without write access");
    // dma-buf: a bad descriptor is EBADF (the rest: knobs::dma_buf_registrations_reach_the_buffer_through_its_descriptor).
    assert!(v!(ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, ACCESS_LOCAL_WRITE)).is_null());
    assert_eq!(errno(), Some(libc::EBADF));
    // iova2: only iova == addr.
    let a = v!(ibv_reg_mr_iova2(pd, buf.ptr(), 4096, buf.addr(), ALL_ACCESS as u32));
    assert!(!a.is_null());
    assert!(v!(ibv_reg_mr_iova2(pd, buf.ptr(), 4096, 0, ALL_ACCESS as u32)).is_null());
    // Fields filled, keys distinct.
    let b = reg(pd, &buf, ALL_ACCESS);
    v!({
        let m = &*b;
        assert_eq!((m.context, m.pd, m.addr, m.length), (ctx, pd, buf.ptr(), buf.len));
        let keys = [(*a).lkey, (*a).rkey, m.lkey, m.rkey, (*ro).lkey, (*ro).rkey];
        let set: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(set.len(), keys.len(), "keys are never reused: {keys:x?}");
    });
    for mr in [a, b, ro] {
        assert_eq!(v!(ibv_dereg_mr(mr)), 0);
    }
    // A later MR never gets an old key back.
    let c = reg(pd, &buf, ALL_ACCESS);
    assert!(v!((*c).lkey != (*b).lkey && (*c).rkey != (*b).rkey));
    assert_eq!(v!(ibv_dereg_mr(c)), 0);
    assert_eq!(v!(ibv_dealloc_pd(pd)), 0);
}

#[test]
fn status_strings() {
    let s = |st| v!(CStr::from_ptr(ibv_wc_status_str(st as i32))).to_str().unwrap();
    assert_eq!(s(WC_SUCCESS), "success");
    assert_eq!(s(WC_RETRY_EXC_ERR), "transport retry counter exceeded");
    assert_eq!(s(WC_WR_FLUSH_ERR), "Work Request Flushed Error");
    assert_eq!(s(999), "unknown");
}

#[test]
fn foreign_pointers_are_refused() {
    let ctx = open(0);
    let cq = v!(ibv_create_cq(ctx, 4, std::ptr::null_mut(), std::ptr::null_mut(), 0));
    assert!(!cq.is_null());
    assert!(v!(ibv_create_cq(ctx, 0, std::ptr::null_mut(), std::ptr::null_mut(), 0)).is_null());
    assert_eq!(v!(ibv_destroy_cq(cq)), 0);
    // A destroyed CQ: poll_cq answers an error rather than touching freed memory.
    let poll_fn = v!((*ctx).ops.poll_cq).unwrap();
    let mut wc = [ibv_wc::default()];
    assert!(v!(poll_fn(cq, 1, wc.as_mut_ptr())) < 0);
    let bogus = 0x1000 as *mut ibv_context;
    assert!(v!(ibv_alloc_pd(bogus)).is_null());
    assert_eq!(errno(), Some(libc::EINVAL));
    assert_eq!(v!(ibv_close_device(bogus)), libc::EINVAL);
    assert_eq!(v!(ibv_dereg_mr(0x2000 as *mut _)), libc::EINVAL);
    assert!(v!(ibv_open_device(0x3000 as *mut _)).is_null());
}

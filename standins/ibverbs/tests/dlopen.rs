//! The built library as the transport finds it: a child process `dlopen`s
//! `target/<profile>/ibverbs-standin/libibverbs.so.1`, finds every exported function with
//! `dlsym`, checks the soname, and moves bytes between two QPs through the loaded copy alone
//! (`context->ops` included).

#[macro_use]
mod common;

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

const SYMBOLS: &[&str] = &[
    "ibv_get_device_list",
    "ibv_free_device_list",
    "ibv_get_device_name",
    "ibv_get_device_guid",
    "ibv_open_device",
    "ibv_close_device",
    "ibv_query_device",
    "ibv_query_port",
    "ibv_query_gid",
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_reg_mr",
    "ibv_reg_mr_iova2",
    "ibv_reg_dmabuf_mr",
    "ibv_dereg_mr",
    "ibv_create_cq",
    "ibv_destroy_cq",
    "ibv_create_qp",
    "ibv_modify_qp",
    "ibv_query_qp",
    "ibv_destroy_qp",
    "ibv_fork_init",
    "ibv_wc_status_str",
    "ibv_get_async_event",
    "ibv_ack_async_event",
    "ibv_event_type_str",
];

/// `target/<profile>/ibverbs-standin/libibverbs.so.1` (build.rs's link to the cdylib).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().and_then(|d| d.parent()).unwrap().join("ibverbs-standin/libibverbs.so.1");
    assert!(lib.exists(), "no stand-in library at {}", lib.display());
    lib
}

struct Lib(*mut c_void);

impl Lib {
    fn sym(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).unwrap();
        // SAFETY: a live handle and a C string.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        assert!(!p.is_null(), "missing symbol {name}");
        p
    }
}

/// A function of the loaded library with the C signature `$t`.
macro_rules! f {
    ($lib:expr, $name:literal, $t:ty) => {{
        let p = $lib.sym($name);
        // SAFETY: the symbol is the exported function with this C signature.
        unsafe { std::mem::transmute::<*mut c_void, $t>(p) }
    }};
}

#[test]
fn the_built_library_loads_and_works_as_libibverbs_so_1() {
    if child_body().is_none() {
        run_child("the_built_library_loads_and_works_as_libibverbs_so_1", "dlopen", &[]);
        return;
    }
    let path = CString::new(library().to_str().unwrap()).unwrap();
    // SAFETY: dlopen with a C string; the handle is checked.
    let lib = Lib(unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) });
    assert!(!lib.0.is_null(), "dlopen failed");
    for s in SYMBOLS {
        lib.sym(s);
    }
    // The soname is libibverbs.so.1: the loaded object answers to that name.
    // SAFETY: as above; RTLD_NOLOAD loads nothing.
    let again = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert_eq!(again, lib.0, "soname");

    let get_list = f!(lib, "ibv_get_device_list", unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device);
    let name = f!(lib, "ibv_get_device_name", unsafe extern "C" fn(*mut ibv_device) -> *const i8);
    let open = f!(lib, "ibv_open_device", unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context);
    let alloc_pd = f!(lib, "ibv_alloc_pd", unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd);
    let reg_mr = f!(lib, "ibv_reg_mr", unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr);
    type CreateCq =
        unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
    let create_cq = f!(lib, "ibv_create_cq", CreateCq);
    let create_qp = f!(lib, "ibv_create_qp", unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp);
    let modify_qp = f!(lib, "ibv_modify_qp", unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int);
    let query_gid = f!(lib, "ibv_query_gid", unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int);

    let mut n = 0;
    let list = v!(get_list(&mut n));
    assert_eq!(n, 1);
    assert_eq!(v!(CStr::from_ptr(name(*list))).to_str(), Ok("mlx5_0"));
    let ctx = v!(open(*list));
    assert!(!ctx.is_null());
    let pd = v!(alloc_pd(ctx));
    let cq = v!(create_cq(ctx, 16, std::ptr::null_mut(), std::ptr::null_mut(), 0));
    let mut gid = ibv_gid::default();
    assert_eq!(v!(query_gid(ctx, 1, 1, &mut gid)), 0);
    let cfg = Cfg::default();
    let qps: Vec<*mut ibv_qp> = (0..2)
        .map(|_| {
            let mut init = ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq,
                recv_cq: cq,
                srq: std::ptr::null_mut(),
                cap: cfg.cap,
                qp_type: QPT_RC,
                sq_sig_all: 0,
            };
            v!(create_qp(pd, &mut init))
        })
        .collect();
    for (me, peer) in [(qps[0], qps[1]), (qps[1], qps[0])] {
        for (mut a, m) in [init_attr(cfg.qp_access), rtr_attr(v!((*peer).qp_num), gid, 1), rts_attr(14, 7, 7)] {
            assert_eq!(v!(modify_qp(me, &mut a, m)), 0);
        }
    }
    let (src, dst) = (Buf::new(256), Buf::new(256));
    src.fill(0x42);
    let smr = v!(reg_mr(pd, src.ptr(), 256, ALL_ACCESS));
    let dmr = v!(reg_mr(pd, dst.ptr(), 256, ALL_ACCESS));
    let mut sg = [sge(&src, 0, 256, smr)];
    let mut wr = [write_wr(9, &mut sg, dst.addr(), v!((*dmr).rkey), None)];
    // Through the loaded library's ops only.
    assert_eq!(post_send(qps[0], &mut wr), (0, None));
    let start = Instant::now();
    let wc = loop {
        let got = poll(cq, 1).unwrap();
        if let Some(w) = got.first() {
            break *w;
        }
        assert!(start.elapsed() < Duration::from_secs(5));
    };
    assert_eq!((wc.wr_id, wc.status), (9, WC_SUCCESS));
    assert!(dst.to_vec().iter().all(|&b| b == 0x42));
}

//! What the stand-in's integration tests share: calls through the rlib's exported functions and
//! through `context->ops` (as rdma-core's inline `ibv_post_send` & co. do), page-aligned
//! buffers, a connected pair of QPs in this process (the NIC connects to its own node), and
//! child processes running a named body of the same test binary with their own environment
//! (the knobs are read once per process).

#![allow(dead_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::c_int;
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

pub use ibverbs_standin::config::*;
pub use ibverbs_standin::sys::*;
pub use ibverbs_standin::*;

/// Calls a verbs function: `unsafe`, because verbs trusts its pointers. This macro is the
/// tests' one unsafe block around verbs calls (`#[macro_use] mod common;`).
/// SAFETY (for every use): the tests pass live objects and correctly sized, live buffers.
macro_rules! v {
    ($call:expr) => {{
        #[allow(unused_unsafe)]
        // SAFETY: see the macro's documentation.
        let r = unsafe { $call };
        r
    }};
}

/// The environment variable that makes a test binary run a child body.
pub const CHILD: &str = "TOPOCCL_STANDIN_IB_TEST_CHILD";

/// Runs `body` of this test binary in a child process (the test named `entry` dispatches on
/// `CHILD`) with extra environment; panics with the child's output if it fails. Returns the
/// child's output.
pub fn run_child(entry: &str, body: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([entry, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD, body);
    for var in [DEVICES_VAR, LINK_VAR, SEED_VAR, DELAY_VAR, DROP_VAR, BAD_RKEY_VAR, ODP_VAR, DMABUF_VAR] {
        cmd.env_remove(var);
    }
    for (k, val) in env {
        cmd.env(k, val);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child body {body} failed ({}):\n{text}", out.status);
    assert!(text.contains("1 passed"), "child body {body} did not run:\n{text}");
    text
}

/// The child body this process was started for, if any.
pub fn child_body() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// A zeroed, page-aligned buffer.
pub struct Buf {
    ptr: *mut u8,
    pub len: usize,
}

// SAFETY: the buffer is plain memory; the tests share it with the NIC threads on purpose and
// access it concurrently only through atomics.
unsafe impl Send for Buf {}
// SAFETY: as for Send.
unsafe impl Sync for Buf {}

impl Buf {
    pub fn new(len: usize) -> Buf {
        let layout = Layout::from_size_align(len.max(1), 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Buf { ptr, len }
    }

    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    pub fn ptr(&self) -> *mut std::ffi::c_void {
        self.ptr.cast()
    }

    /// Byte `i`, read atomically (the NIC may be writing it).
    pub fn get(&self, i: usize) -> u8 {
        assert!(i < self.len);
        // SAFETY: in bounds; all concurrent accesses are atomic.
        unsafe { AtomicU8::from_ptr(self.ptr.add(i)) }.load(Ordering::Acquire)
    }

    /// The aligned word at byte offset `i` (a multiple of 8).
    pub fn word(&self, i: usize) -> u64 {
        assert!(i % 8 == 0 && i + 8 <= self.len);
        // SAFETY: in bounds and 8-aligned (the buffer is page-aligned).
        unsafe { AtomicU64::from_ptr(self.ptr.add(i).cast()) }.load(Ordering::Acquire)
    }

    pub fn set(&self, i: usize, b: u8) {
        assert!(i < self.len);
        // SAFETY: in bounds; all concurrent accesses are atomic.
        unsafe { AtomicU8::from_ptr(self.ptr.add(i)) }.store(b, Ordering::Release);
    }

    pub fn fill(&self, b: u8) {
        for i in 0..self.len {
            self.set(i, b);
        }
    }

    pub fn to_vec(&self) -> Vec<u8> {
        (0..self.len).map(|i| self.get(i)).collect()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, Layout::from_size_align(self.len.max(1), 4096).unwrap()) };
    }
}

pub fn open(index: usize) -> *mut ibv_context {
    let mut n = 0;
    let list = v!(ibv_get_device_list(&mut n));
    assert!(!list.is_null() && n as usize > index, "no device {index}");
    let ctx = v!(ibv_open_device(*list.add(index)));
    v!(ibv_free_device_list(list));
    assert!(!ctx.is_null());
    ctx
}

pub fn reg(pd: *mut ibv_pd, buf: &Buf, access: c_int) -> *mut ibv_mr {
    let mr = v!(ibv_reg_mr(pd, buf.ptr(), buf.len, access));
    assert!(!mr.is_null(), "ibv_reg_mr: {}", std::io::Error::last_os_error());
    mr
}

pub const ALL_ACCESS: c_int = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;

/// How a test QP is made and connected.
#[derive(Clone, Copy)]
pub struct Cfg {
    pub cqe: c_int,
    pub cap: ibv_qp_cap,
    pub sq_sig_all: bool,
    pub qp_access: u32,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

impl Default for Cfg {
    fn default() -> Cfg {
        Cfg {
            cqe: 256,
            cap: ibv_qp_cap { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 },
            sq_sig_all: false,
            qp_access: (ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ) as u32,
            min_rnr_timer: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

/// One side: a context, a PD, a send and a receive CQ, a QP.
pub struct End {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub scq: *mut ibv_cq,
    pub rcq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub cfg: Cfg,
}

impl End {
    pub fn new(cfg: Cfg) -> End {
        End::on(0, cfg)
    }

    /// On device `index`.
    pub fn on(index: usize, cfg: Cfg) -> End {
        let ctx = open(index);
        let pd = v!(ibv_alloc_pd(ctx));
        let scq = v!(ibv_create_cq(ctx, cfg.cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0));
        let rcq = v!(ibv_create_cq(ctx, cfg.cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0));
        assert!(!pd.is_null() && !scq.is_null() && !rcq.is_null());
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: scq,
            recv_cq: rcq,
            srq: std::ptr::null_mut(),
            cap: cfg.cap,
            qp_type: QPT_RC,
            sq_sig_all: c_int::from(cfg.sq_sig_all),
        };
        let qp = v!(ibv_create_qp(pd, &mut init));
        assert!(!qp.is_null(), "ibv_create_qp: {}", std::io::Error::last_os_error());
        End { ctx, pd, scq, rcq, qp, cfg }
    }

    pub fn qpn(&self) -> u32 {
        v!((*self.qp).qp_num)
    }

    pub fn state(&self) -> u32 {
        qp_state(self.qp)
    }

    pub fn gid(&self) -> ibv_gid {
        let mut g = ibv_gid::default();
        assert_eq!(v!(ibv_query_gid(self.ctx, 1, 1, &mut g)), 0);
        g
    }
}

pub fn qp_state(qp: *mut ibv_qp) -> u32 {
    // SAFETY: a live QP; the NIC stores the field atomically.
    unsafe { std::sync::atomic::AtomicU32::from_ptr(std::ptr::addr_of_mut!((*qp).state)) }.load(Ordering::Acquire)
}

pub fn modify(qp: *mut ibv_qp, attr: &ibv_qp_attr, mask: c_int) -> c_int {
    let mut a = *attr;
    v!(ibv_modify_qp(qp, &mut a, mask))
}

pub fn init_attr(access: u32) -> (ibv_qp_attr, c_int) {
    let a =
        ibv_qp_attr { qp_state: QPS_INIT, pkey_index: 0, port_num: 1, qp_access_flags: access, ..Default::default() };
    (a, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS)
}

pub fn rtr_attr(dest_qpn: u32, dgid: ibv_gid, min_rnr_timer: u8) -> (ibv_qp_attr, c_int) {
    let mut a = ibv_qp_attr {
        qp_state: QPS_RTR,
        path_mtu: MTU_4096,
        dest_qp_num: dest_qpn,
        rq_psn: 0x1234,
        max_dest_rd_atomic: 1,
        min_rnr_timer,
        ..Default::default()
    };
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = dgid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 255;
    let mask = QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
    (a, mask)
}

pub fn rts_attr(timeout: u8, retry_cnt: u8, rnr_retry: u8) -> (ibv_qp_attr, c_int) {
    let a = ibv_qp_attr {
        qp_state: QPS_RTS,
        timeout,
        retry_cnt,
        rnr_retry,
        sq_psn: 0x1234,
        max_rd_atomic: 1,
        ..Default::default()
    };
    (a, QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC)
}

/// Takes `e` through INIT, RTR (to `dest_qpn` at `dgid`) and RTS.
pub fn connect(e: &End, dest_qpn: u32, dgid: ibv_gid) {
    let (a, m) = init_attr(e.cfg.qp_access);
    assert_eq!(modify(e.qp, &a, m), 0);
    let (a, m) = rtr_attr(dest_qpn, dgid, e.cfg.min_rnr_timer);
    assert_eq!(modify(e.qp, &a, m), 0);
    let (a, m) = rts_attr(e.cfg.timeout, e.cfg.retry_cnt, e.cfg.rnr_retry);
    assert_eq!(modify(e.qp, &a, m), 0);
    assert_eq!(e.state(), QPS_RTS);
}

/// Two QPs of this process connected to each other.
pub fn pair(a: Cfg, b: Cfg) -> (End, End) {
    let (a, b) = (End::new(a), End::new(b));
    connect(&a, b.qpn(), b.gid());
    connect(&b, a.qpn(), a.gid());
    (a, b)
}

pub fn sge(buf: &Buf, off: usize, len: usize, mr: *mut ibv_mr) -> ibv_sge {
    ibv_sge { addr: buf.addr() + off as u64, length: len as u32, lkey: v!((*mr).lkey) }
}

/// A send work request (`sges` must outlive the post).
pub fn send_wr(wr_id: u64, opcode: u32, sges: &mut [ibv_sge], flags: u32) -> ibv_send_wr {
    ibv_send_wr {
        wr_id,
        sg_list: if sges.is_empty() { std::ptr::null_mut() } else { sges.as_mut_ptr() },
        num_sge: sges.len() as c_int,
        opcode,
        send_flags: flags,
        ..Default::default()
    }
}

/// An RDMA write (with immediate when `imm` is given) to `remote_addr` under `rkey`.
pub fn write_wr(wr_id: u64, sges: &mut [ibv_sge], remote_addr: u64, rkey: u32, imm: Option<u32>) -> ibv_send_wr {
    let opcode = if imm.is_some() { WR_RDMA_WRITE_WITH_IMM } else { WR_RDMA_WRITE };
    let mut wr = send_wr(wr_id, opcode, sges, SEND_SIGNALED);
    wr.imm_data = imm.unwrap_or(0);
    wr.wr.remote_addr = remote_addr;
    wr.wr.rkey = rkey;
    wr
}

/// `ibv_post_send` as rdma-core's inline function does it: through `context->ops`. Returns the
/// result and the index of `*bad_wr` in the chain, if set.
pub fn post_send(qp: *mut ibv_qp, wrs: &mut [ibv_send_wr]) -> (c_int, Option<usize>) {
    for i in 1..wrs.len() {
        let next: *mut ibv_send_wr = &mut wrs[i];
        wrs[i - 1].next = next;
    }
    let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
    let f = v!((*(*qp).context).ops.post_send).unwrap();
    let rc = v!(f(qp, wrs.as_mut_ptr(), &mut bad));
    let idx = (!bad.is_null()).then(|| (bad as usize - wrs.as_ptr() as usize) / std::mem::size_of::<ibv_send_wr>());
    (rc, idx)
}

/// `ibv_post_recv` of one receive, through `context->ops`.
pub fn post_recv(qp: *mut ibv_qp, wr_id: u64, sges: &mut [ibv_sge]) -> c_int {
    let mut wr = ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: if sges.is_empty() { std::ptr::null_mut() } else { sges.as_mut_ptr() },
        num_sge: sges.len() as c_int,
    };
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    let f = v!((*(*qp).context).ops.post_recv).unwrap();
    v!(f(qp, &mut wr, &mut bad))
}

/// `ibv_poll_cq` through `context->ops`.
pub fn poll(cq: *mut ibv_cq, max: usize) -> Result<Vec<ibv_wc>, c_int> {
    let mut wc = vec![ibv_wc::default(); max];
    let f = v!((*(*cq).context).ops.poll_cq).unwrap();
    let n = v!(f(cq, max as c_int, wc.as_mut_ptr()));
    if n < 0 {
        return Err(n);
    }
    wc.truncate(n as usize);
    Ok(wc)
}

/// Polls until `n` completions arrived (panics after `limit`).
pub fn poll_n(cq: *mut ibv_cq, n: usize, limit: Duration) -> Vec<ibv_wc> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < n {
        got.extend(poll(cq, n - got.len()).expect("CQ in error"));
        assert!(start.elapsed() < limit, "{} of {n} completions after {limit:?}: {got:?}", got.len());
        std::thread::yield_now();
    }
    got
}

pub fn poll_one(cq: *mut ibv_cq) -> ibv_wc {
    poll_n(cq, 1, Duration::from_secs(5))[0]
}

/// Asserts that no completion arrives for `d`.
pub fn poll_none(cq: *mut ibv_cq, d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        let got = poll(cq, 4).expect("CQ in error");
        assert!(got.is_empty(), "unexpected completions {got:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until `f` holds (panics after `limit`).
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

pub fn status(wc: &ibv_wc) -> &'static str {
    wc_status_name(wc.status)
}

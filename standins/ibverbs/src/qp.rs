//! Queue pairs (RC only): the object, its work queues, completions and the error state; the
//! state machine is `modify.rs`, posting `ops.rs`, the wire `engine.rs` and `responder.rs`.
//!
//! Queue depths are counted until completions are **polled**: a work request holds its slot
//! until a completion of it, or of a later request of the same queue, has been polled (an
//! unsignaled send is freed by the next signaled one). `sq_freed`/`rq_freed` are the numbers
//! of freed slots, raised by `poll_cq`.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::cq::{Cq, Entry};
use crate::device::{NodeAddr, MAX_INLINE, MAX_QP_WR, MAX_SGE};
use crate::mr::Pd;
use crate::registry::{self, reg_mut};
use crate::sys::*;
use crate::util::{self, lock, Public};

/// A posted send work request.
pub struct SendWqe {
    pub seq: u64,
    pub wr_id: u64,
    pub opcode: u32,
    pub signaled: bool,
    pub sges: Vec<ibv_sge>,
    /// `IBV_SEND_INLINE`: the bytes, copied at post time.
    pub inline: Option<Vec<u8>>,
    pub imm: [u8; 4],
    pub remote_addr: u64,
    pub rkey: u32,
    /// Not read before this instant (the random delay of `TOPOCCL_STANDIN_IB_DELAY_US`).
    pub ready_at: Instant,
}

/// A posted receive work request.
pub struct RecvWqe {
    pub seq: u64,
    pub wr_id: u64,
    pub sges: Vec<ibv_sge>,
}

/// Where the head of the send queue stands on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// Not sent yet.
    Waiting,
    /// Sent; retransmitted at the deadline (none: local ACK timeout 0, infinite).
    InFlight { deadline: Option<Instant> },
    /// RNR NAKed; sent again at `until`.
    RnrWait { until: Instant },
}

pub struct QpState {
    pub state: u32,
    /// The attributes set so far (`ibv_query_qp` reads them back).
    pub attr: ibv_qp_attr,
    /// The remote node of the address vector (from RTR on).
    pub remote: Option<NodeAddr>,
    pub sq: VecDeque<SendWqe>,
    pub sq_posted: u64,
    /// PSN of the head request.
    pub psn: u32,
    pub head: Head,
    pub head_npkts: u32,
    /// Transport retries (timeouts, sequence NAKs) and RNR retries spent on the head.
    pub retries: u32,
    pub rnr_tries: u32,
    pub rq: VecDeque<RecvWqe>,
    pub rq_posted: u64,
    /// The responder's expected PSN.
    pub epsn: u32,
    pub destroyed: bool,
}

pub struct Qp {
    public: Public<ibv_qp>,
    pub num: u32,
    pub dev: u8,
    pub pd: Arc<Pd>,
    pub send_cq: Arc<Cq>,
    pub recv_cq: Arc<Cq>,
    pub cap: ibv_qp_cap,
    pub sq_sig_all: bool,
    qp_context: usize,
    pub sq_freed: AtomicU64,
    pub rq_freed: AtomicU64,
    inner: Mutex<QpState>,
}

impl Qp {
    pub fn ptr(&self) -> *mut ibv_qp {
        self.public.ptr()
    }

    pub fn lock(&self) -> MutexGuard<'_, QpState> {
        lock(&self.inner)
    }

    /// Changes the state, in our record and in the caller's `qp->state`.
    pub fn set_state(&self, st: &mut QpState, s: u32) {
        st.state = s;
        // SAFETY: the public struct lives inside this object (so the pointer is valid while
        // `self` is), `state` is 4-aligned, and it is only ever accessed atomically by us.
        let field = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.ptr()).state)) };
        field.store(s, Ordering::Release);
    }

    fn wc(&self, wr_id: u64, status: u32) -> ibv_wc {
        ibv_wc {
            wr_id,
            status,
            qp_num: self.num,
            vendor_err: if status == WC_SUCCESS { 0 } else { 0x80 + status },
            ..Default::default()
        }
    }

    /// The completion of a send work request: always for an error, for a success only when the
    /// request was signaled.
    pub fn complete_send(self: &Arc<Self>, wqe: &SendWqe, status: u32) {
        if status == WC_SUCCESS && !wqe.signaled {
            return;
        }
        let mut wc = self.wc(wqe.wr_id, status);
        if status == WC_SUCCESS {
            let write = matches!(wqe.opcode, WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM);
            wc.opcode = if write { WC_RDMA_WRITE } else { WC_SEND };
        }
        self.send_cq.push(Entry { wc, qp: Arc::downgrade(self), send: true, seq: wqe.seq });
    }

    /// The completion of a receive work request (`done` for a success).
    pub fn complete_recv(self: &Arc<Self>, wqe: &RecvWqe, status: u32, done: Option<RecvDone>) {
        let mut wc = self.wc(wqe.wr_id, status);
        if let Some(d) = done {
            wc.opcode = d.opcode;
            wc.byte_len = d.byte_len;
            wc.src_qp = d.src_qp;
            if let Some(imm) = d.imm {
                wc.imm_data = u32::from_ne_bytes(imm);
                wc.wc_flags = WC_WITH_IMM;
            }
        }
        self.recv_cq.push(Entry { wc, qp: Arc::downgrade(self), send: false, seq: wqe.seq });
    }

    /// The head of the send queue fails with `status`; the QP goes to the error state.
    pub fn fail_head(self: &Arc<Self>, st: &mut QpState, status: u32) {
        if let Some(wqe) = st.sq.pop_front() {
            self.complete_send(&wqe, status);
        }
        self.enter_error(st);
    }

    /// The error state: every outstanding work request completes with `WR_FLUSH_ERR`.
    pub fn enter_error(self: &Arc<Self>, st: &mut QpState) {
        self.set_state(st, QPS_ERR);
        st.head = Head::Waiting;
        for wqe in std::mem::take(&mut st.sq) {
            self.complete_send(&wqe, WC_WR_FLUSH_ERR);
        }
        for wqe in std::mem::take(&mut st.rq) {
            self.complete_recv(&wqe, WC_WR_FLUSH_ERR, None);
        }
    }

    /// Send-queue slots in use.
    pub fn sq_used(&self, st: &QpState) -> u64 {
        st.sq_posted.saturating_sub(self.sq_freed.load(Ordering::Acquire))
    }

    pub fn rq_used(&self, st: &QpState) -> u64 {
        st.rq_posted.saturating_sub(self.rq_freed.load(Ordering::Acquire))
    }
}

/// What a successful receive completion reports.
pub struct RecvDone {
    pub opcode: u32,
    pub byte_len: u32,
    /// The immediate, bytes as the sender's work request held them.
    pub imm: Option<[u8; 4]>,
    pub src_qp: u32,
}

/// A QP number never handed out before in this process (24 bits, not 0 or 1).
fn new_qpn() -> u32 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicU32::new(0x100 + util::with_rng(|r| r.upto(0x7f_0000)) as u32));
    loop {
        let n = next.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
        if n > 1 {
            return n;
        }
    }
}

pub fn create_qp(pd_ptr: *const ibv_pd, init: &mut ibv_qp_init_attr) -> Result<*mut ibv_qp, c_int> {
    let pd = registry::pd(pd_ptr).ok_or(libc::EINVAL)?;
    let send_cq = registry::cq(init.send_cq).ok_or(libc::EINVAL)?;
    let recv_cq = registry::cq(init.recv_cq).ok_or(libc::EINVAL)?;
    if !Arc::ptr_eq(&send_cq.ctx, &pd.ctx) || !Arc::ptr_eq(&recv_cq.ctx, &pd.ctx) {
        return Err(libc::EINVAL);
    }
    if init.qp_type != QPT_RC {
        return Err(libc::EOPNOTSUPP);
    }
    // Shared receive queues are not emulated.
    if !init.srq.is_null() {
        return Err(libc::EINVAL);
    }
    let cap = init.cap;
    if cap.max_send_wr > MAX_QP_WR
        || cap.max_recv_wr > MAX_QP_WR
        || cap.max_send_sge > MAX_SGE
        || cap.max_recv_sge > MAX_SGE
        || cap.max_inline_data > MAX_INLINE
    {
        return Err(libc::EINVAL);
    }
    let num = new_qpn();
    let public = ibv_qp {
        context: pd.ctx.ptr(),
        qp_context: init.qp_context,
        pd: pd.ptr(),
        send_cq: send_cq.ptr(),
        recv_cq: recv_cq.ptr(),
        srq: std::ptr::null_mut(),
        handle: num,
        qp_num: num,
        state: QPS_RESET,
        qp_type: QPT_RC,
        mutex: [0; 5],
        cond: [0; 6],
        events_completed: 0,
    };
    pd.users.fetch_add(1, Ordering::Relaxed);
    send_cq.users.fetch_add(1, Ordering::Relaxed);
    recv_cq.users.fetch_add(1, Ordering::Relaxed);
    let qp = Arc::new(Qp {
        public: Public::new(public),
        num,
        dev: pd.ctx.dev,
        pd,
        send_cq,
        recv_cq,
        cap,
        sq_sig_all: init.sq_sig_all != 0,
        qp_context: init.qp_context as usize,
        sq_freed: AtomicU64::new(0),
        rq_freed: AtomicU64::new(0),
        inner: Mutex::new(reset_state()),
    });
    // The granted capabilities: exactly those asked for (and enforced).
    init.cap = cap;
    let p = qp.ptr();
    let mut reg = reg_mut();
    reg.qpns.insert(num, qp.clone());
    reg.qps.insert(registry::key(p), qp);
    Ok(p)
}

/// A QP's record in the RESET state.
pub fn reset_state() -> QpState {
    QpState {
        state: QPS_RESET,
        attr: ibv_qp_attr::default(),
        remote: None,
        sq: VecDeque::new(),
        sq_posted: 0,
        psn: 0,
        head: Head::Waiting,
        head_npkts: 0,
        retries: 0,
        rnr_tries: 0,
        rq: VecDeque::new(),
        rq_posted: 0,
        epsn: 0,
        destroyed: false,
    }
}

/// Back to RESET: queues emptied without completions, their completions purged from the CQs,
/// attributes forgotten.
pub fn reset(qp: &Qp, st: &mut QpState) {
    let (sq_posted, rq_posted, destroyed) = (st.sq_posted, st.rq_posted, st.destroyed);
    *st = reset_state();
    st.sq_posted = sq_posted;
    st.rq_posted = rq_posted;
    st.destroyed = destroyed;
    qp.sq_freed.fetch_max(sq_posted, Ordering::AcqRel);
    qp.rq_freed.fetch_max(rq_posted, Ordering::AcqRel);
    qp.set_state(st, QPS_RESET);
    qp.send_cq.purge(qp);
    qp.recv_cq.purge(qp);
}

pub fn destroy_qp(p: *const ibv_qp) -> c_int {
    let qp = {
        let mut reg = reg_mut();
        let Some(qp) = reg.qps.remove(&registry::key(p)) else { return libc::EINVAL };
        reg.qpns.remove(&qp.num);
        qp
    };
    {
        let mut st = qp.lock();
        st.destroyed = true;
        reset(&qp, &mut st);
    }
    qp.pd.users.fetch_sub(1, Ordering::Relaxed);
    qp.send_cq.users.fetch_sub(1, Ordering::Relaxed);
    qp.recv_cq.users.fetch_sub(1, Ordering::Relaxed);
    0
}

pub fn query_qp(p: *const ibv_qp, attr: &mut ibv_qp_attr, init: &mut ibv_qp_init_attr) -> c_int {
    let Some(qp) = registry::qp(p) else { return libc::EINVAL };
    let st = qp.lock();
    *attr = st.attr;
    attr.qp_state = st.state;
    attr.cur_qp_state = st.state;
    attr.cap = qp.cap;
    attr.rq_psn = st.epsn;
    attr.sq_psn = st.psn;
    init.qp_context = qp.qp_context as *mut c_void;
    init.send_cq = qp.send_cq.ptr();
    init.recv_cq = qp.recv_cq.ptr();
    init.srq = std::ptr::null_mut();
    init.cap = qp.cap;
    init.qp_type = QPT_RC;
    init.sq_sig_all = c_int::from(qp.sq_sig_all);
    0
}

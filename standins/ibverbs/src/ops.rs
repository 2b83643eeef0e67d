//! The data-path calls reached through `context->ops` (rdma-core's `ibv_post_send`,
//! `ibv_post_recv` and `ibv_poll_cq` are inline functions calling these): checks made at post
//! time, with `*bad_wr` set to the first rejected work request.
//!
//! - `post_send` needs RTS (RESET, INIT, RTR: `EINVAL`); in the error state requests are
//!   accepted and complete at once with `WR_FLUSH_ERR` (IB spec C10-42). `post_recv` needs
//!   INIT or later (RESET: `EINVAL`), likewise flushed in the error state.
//! - Opcodes: RDMA write (with immediate) and send (with immediate). RDMA read and atomics are
//!   not emulated: `EINVAL`.
//! - More SGEs than the QP's cap, or inline data over `max_inline_data`: `EINVAL`. A full queue
//!   (slots are held until completions are polled): `ENOMEM`.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::config;
use crate::qp::{Qp, QpState, RecvWqe, SendWqe};
use crate::sys::*;
use crate::util::{fence, with_rng};
use crate::{engine, memio, registry};

/// RDMA writes posted by this process (for `TOPOCCL_STANDIN_IB_BAD_RKEY`).
static WRITES_POSTED: AtomicU64 = AtomicU64::new(0);

/// The xor a corrupted rkey gets.
pub const RKEY_CORRUPTION: u32 = 0x0bad_0bad;

/// # Safety
/// `wc` must have room for `num_entries` completions (rdma-core's contract).
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    fence("poll_cq", -1, || {
        let Some(cq) = registry::cq(cq) else { return -1 };
        if num_entries < 0 || (num_entries > 0 && wc.is_null()) {
            return -1;
        }
        let Some(entries) = cq.take(num_entries as usize) else { return -1 };
        for (i, e) in entries.iter().enumerate() {
            // SAFETY: the caller gave room for `num_entries` completions and i < num_entries.
            unsafe { wc.add(i).write(e.wc) };
            if let Some(qp) = e.qp.upgrade() {
                let freed = if e.send { &qp.sq_freed } else { &qp.rq_freed };
                freed.fetch_max(e.seq + 1, Ordering::AcqRel);
            }
        }
        entries.len() as c_int
    })
}

/// Completion events are not emulated; arming a CQ succeeds and does nothing.
///
/// # Safety
/// None beyond rdma-core's contract.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    fence("req_notify_cq", libc::EIO, || if registry::cq(cq).is_some() { 0 } else { libc::EINVAL })
}

fn sges<'a>(list: *mut ibv_sge, n: c_int) -> Result<&'a [ibv_sge], c_int> {
    if n == 0 {
        return Ok(&[]);
    }
    if list.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's work request names `n` SGEs at `list` (rdma-core's contract).
    Ok(unsafe { std::slice::from_raw_parts(list, n as usize) })
}

fn build_send(qp: &Qp, st: &QpState, w: &ibv_send_wr) -> Result<SendWqe, c_int> {
    if !matches!(st.state, QPS_RTS | QPS_ERR) {
        return Err(libc::EINVAL);
    }
    let write = matches!(w.opcode, WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM);
    if !write && !matches!(w.opcode, WR_SEND | WR_SEND_WITH_IMM) {
        return Err(libc::EINVAL);
    }
    if w.num_sge < 0 || w.num_sge as u32 > qp.cap.max_send_sge {
        return Err(libc::EINVAL);
    }
    let list = sges(w.sg_list, w.num_sge)?;
    if qp.sq_used(st) >= u64::from(qp.cap.max_send_wr) {
        return Err(libc::ENOMEM);
    }
    let inline = if w.send_flags & SEND_INLINE != 0 {
        let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(qp.cap.max_inline_data) {
            return Err(libc::EINVAL);
        }
        let mut bytes = Vec::with_capacity(total as usize);
        for s in list {
            if !memio::read_into(s.addr, u64::from(s.length), &mut bytes) {
                return Err(libc::EFAULT);
            }
        }
        Some(bytes)
    } else {
        None
    };
    let mut rkey = w.wr.rkey;
    if write {
        let n = WRITES_POSTED.fetch_add(1, Ordering::Relaxed) + 1;
        if config().bad_rkey == Some(n) {
            rkey ^= RKEY_CORRUPTION;
        }
    }
    let delay = with_rng(|r| r.upto(config().delay_us));
    Ok(SendWqe {
        seq: st.sq_posted,
        wr_id: w.wr_id,
        opcode: w.opcode,
        signaled: w.send_flags & SEND_SIGNALED != 0 || qp.sq_sig_all,
        sges: if inline.is_some() { Vec::new() } else { list.to_vec() },
        inline,
        imm: w.imm_data.to_ne_bytes(),
        remote_addr: w.wr.remote_addr,
        rkey,
        ready_at: Instant::now() + Duration::from_micros(delay),
    })
}

fn set_bad<T>(bad: *mut *mut T, wr: *mut T) {
    if !bad.is_null() {
        // SAFETY: a non-null `bad_wr` points at the caller's pointer to fill.
        unsafe { *bad = wr };
    }
}

/// # Safety
/// `wr` must be a valid chain of send work requests (rdma-core's contract).
pub unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    fence("post_send", libc::EIO, || {
        let Some(qp) = registry::qp(qp) else {
            set_bad(bad_wr, wr);
            return libc::EINVAL;
        };
        let rc = post_send_chain(&qp, wr, bad_wr);
        engine::kick(&qp);
        rc
    })
}

fn post_send_chain(qp: &Arc<Qp>, mut wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    let mut st = qp.lock();
    while !wr.is_null() {
        // SAFETY: `wr` is a non-null element of the caller's chain (rdma-core's contract).
        let w = unsafe { &*wr };
        let wqe = match build_send(qp, &st, w) {
            Ok(wqe) => wqe,
            Err(e) => {
                set_bad(bad_wr, wr);
                return e;
            }
        };
        st.sq_posted += 1;
        if st.state == QPS_ERR {
            qp.complete_send(&wqe, WC_WR_FLUSH_ERR);
        } else {
            st.sq.push_back(wqe);
        }
        wr = w.next;
    }
    0
}

/// # Safety
/// `wr` must be a valid chain of receive work requests (rdma-core's contract).
pub unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    fence("post_recv", libc::EIO, || {
        let Some(qp) = registry::qp(qp) else {
            set_bad(bad_wr, wr);
            return libc::EINVAL;
        };
        let mut st = qp.lock();
        let mut wr = wr;
        while !wr.is_null() {
            // SAFETY: `wr` is a non-null element of the caller's chain (rdma-core's contract).
            let w = unsafe { &*wr };
            if st.state == QPS_RESET || w.num_sge < 0 || w.num_sge as u32 > qp.cap.max_recv_sge {
                set_bad(bad_wr, wr);
                return libc::EINVAL;
            }
            let list = match sges(w.sg_list, w.num_sge) {
                Ok(l) => l,
                Err(e) => {
                    set_bad(bad_wr, wr);
                    return e;
                }
            };
            if qp.rq_used(&st) >= u64::from(qp.cap.max_recv_wr) {
                set_bad(bad_wr, wr);
                return libc::ENOMEM;
            }
            let wqe = RecvWqe { seq: st.rq_posted, wr_id: w.wr_id, sges: list.to_vec() };
            st.rq_posted += 1;
            if st.state == QPS_ERR {
                qp.complete_recv(&wqe, WC_WR_FLUSH_ERR, None);
            } else {
                st.rq.push_back(wqe);
            }
            wr = w.next;
        }
        0
    })
}

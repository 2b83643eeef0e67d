//! The responder side of the NIC: executes an arriving request against this process's memory
//! and receive queues, and says what to answer.
//!
//! - A request for a QP number that does not exist here, of another device, or of a QP not in
//!   RTR/RTS is dropped silently (the requester times out).
//! - PSN: the expected one executes; an older one is a duplicate (a retransmission whose ACK
//!   was lost), acknowledged again without executing; a newer one is NAKed (sequence error).
//! - RDMA write: with a non-zero length, the rkey must name a live MR of the QP's PD covering
//!   `[remote_addr, +len)` with `REMOTE_WRITE`, and the QP's `qp_access_flags` must allow
//!   remote write; otherwise nothing is written, the requester gets `REM_ACCESS_ERR`, and this
//!   QP goes to the error state (hardware raises a local access violation there). A
//!   zero-length write checks no key (IB spec).
//! - Write with immediate and sends consume a posted receive; with none the answer is an RNR
//!   NAK. All bytes of a write are placed before its receive completion is generated.
//! - Sends scatter into the receive's SGEs (lkeys of live MRs of the PD with `LOCAL_WRITE`);
//!   too small: `LOC_LEN_ERR` here and `REM_INV_REQ_ERR` at the requester; a bad SGE:
//!   `LOC_PROT_ERR` here, `REM_OP_ERR` there. Both put this QP in the error state.
//! - The answer goes where this QP's own address vector and `dest_qp_num` point: a request
//!   from another QP is executed, but its answer is lost (as on hardware).

use std::sync::Arc;

use crate::mr::{self, Mr};
use crate::qp::{Qp, QpState, RecvDone};
use crate::sys::*;
use crate::util::{self, count, with_rng, Rng, COUNTERS};
use crate::wire::{Request, Response, Syndrome, PSN_MASK};
use crate::{memio, registry};

/// Executes a request; the response to send back, if any.
pub fn handle(req: &Request) -> Option<Response> {
    let qp = registry::qp_by_num(req.dst_qpn)?;
    if qp.dev != req.dst_dev {
        return None;
    }
    let mut st = qp.lock();
    if st.destroyed || !matches!(st.state, QPS_RTR | QPS_RTS) {
        return None;
    }
    let routed = st.remote == Some(req.src) && st.attr.dest_qp_num == req.src_qpn;
    let diff = req.psn.wrapping_sub(st.epsn) & PSN_MASK;
    let syndrome = if diff == 0 {
        execute(&qp, &mut st, req)
    } else if diff >= 1 << 23 {
        count(&COUNTERS.duplicates);
        Syndrome::Ack
    } else {
        Syndrome::SeqNak
    };
    if syndrome == Syndrome::RnrNak {
        count(&COUNTERS.rnr_naks);
    }
    let rnr_timer = st.attr.min_rnr_timer;
    routed.then_some(Response { qpn: req.src_qpn, psn: req.psn, syndrome, rnr_timer })
}

fn execute(qp: &Arc<Qp>, st: &mut QpState, req: &Request) -> Syndrome {
    let len = req.payload.len() as u64;
    let write = matches!(req.opcode, WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM);
    let target = if write && len > 0 {
        let allowed = st.attr.qp_access_flags & ACCESS_REMOTE_WRITE as u32 != 0;
        match mr::check_rkey(&qp.pd, req.rkey, req.remote_addr, len, ACCESS_REMOTE_WRITE) {
            Ok(mr) if allowed => Some(mr),
            _ => return access_error(qp, st),
        }
    } else {
        None
    };
    if req.opcode != WR_RDMA_WRITE && st.rq.is_empty() {
        return Syndrome::RnrNak;
    }
    let mut rng = Rng::new(with_rng(|r| r.next_u64()));
    let src_qp = st.attr.dest_qp_num;
    if write {
        if let Some(mr) = target {
            let live = util::read(&mr.live);
            if !*live {
                drop(live);
                return access_error(qp, st);
            }
            if !memio::place(&[(mr.host(req.remote_addr), len)], &req.payload, &mut rng) {
                drop(live);
                unmapped(qp, req.remote_addr, len);
                return access_error(qp, st);
            }
        }
        if req.opcode == WR_RDMA_WRITE_WITH_IMM {
            if let Some(rwqe) = st.rq.pop_front() {
                let done = RecvDone { opcode: WC_RECV_RDMA_WITH_IMM, byte_len: len as u32, imm: Some(req.imm), src_qp };
                qp.complete_recv(&rwqe, WC_SUCCESS, Some(done));
            }
        }
    } else {
        let Some(rwqe) = st.rq.pop_front() else { return Syndrome::RnrNak };
        let capacity: u64 = rwqe.sges.iter().map(|s| u64::from(s.length)).sum();
        if capacity < len {
            qp.complete_recv(&rwqe, WC_LOC_LEN_ERR, None);
            qp.enter_error(st);
            return Syndrome::InvReqNak;
        }
        // The receive's SGEs that take bytes, each checked and held live while placing.
        let mut segments = Vec::new();
        let mut mrs: Vec<Arc<Mr>> = Vec::new();
        let mut left = len;
        for s in rwqe.sges.iter().filter(|s| s.length > 0) {
            if left == 0 {
                break;
            }
            let take = left.min(u64::from(s.length));
            match mr::check_lkey(&qp.pd, s.lkey, s.addr, take, ACCESS_LOCAL_WRITE) {
                Ok(mr) => {
                    segments.push((mr.host(s.addr), take));
                    mrs.push(mr);
                }
                Err(_) => {
                    qp.complete_recv(&rwqe, WC_LOC_PROT_ERR, None);
                    qp.enter_error(st);
                    return Syndrome::OpNak;
                }
            }
            left -= take;
        }
        let guards: Vec<_> = mrs.iter().map(|m| util::read(&m.live)).collect();
        if guards.iter().any(|g| !**g) || !memio::place(&segments, &req.payload, &mut rng) {
            drop(guards);
            qp.complete_recv(&rwqe, WC_LOC_PROT_ERR, None);
            qp.enter_error(st);
            return Syndrome::OpNak;
        }
        drop(guards);
        let imm = (req.opcode == WR_SEND_WITH_IMM).then_some(req.imm);
        qp.complete_recv(&rwqe, WC_SUCCESS, Some(RecvDone { opcode: WC_RECV, byte_len: len as u32, imm, src_qp }));
    }
    st.epsn = (st.epsn + req.npkts) & PSN_MASK;
    Syndrome::Ack
}

fn access_error(qp: &Arc<Qp>, st: &mut QpState) -> Syndrome {
    qp.enter_error(st);
    Syndrome::AccessNak
}

fn unmapped(qp: &Qp, addr: u64, len: u64) {
    eprintln!(
        "topoccl ibverbs stand-in: QP {:#x}: target {addr:#x}+{len} of a live MR is not mapped (freed before \
         ibv_dereg_mr?)",
        qp.num
    );
}

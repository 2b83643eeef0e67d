//! `ibv_modify_qp`: the RC state machine with the attribute masks of the IB spec (the kernel's
//! `ib_modify_qp_is_ok` table): a required attribute missing, or one not allowed for the
//! transition, is `EINVAL`, as are values out of range and an address vector that names no
//! node of the fabric.

use std::ffi::c_int;

use crate::config::config;
use crate::device::{self, NodeAddr, ACTIVE_MTU, GID_TBL_LEN, MAX_RD_ATOMIC, PKEY_TBL_LEN};
use crate::nic;
use crate::qp::{self, Head};
use crate::registry;
use crate::sys::*;
use crate::wire::PSN_MASK;

const RTR_REQ: c_int = QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
const RTS_REQ: c_int = QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC;
const RTS_OPT: c_int = QP_CUR_STATE | QP_ACCESS_FLAGS | QP_MIN_RNR_TIMER | QP_ALT_PATH | QP_PATH_MIG_STATE;

/// The (required, optional) attributes of a transition, besides `QP_STATE`; `None`: not a
/// transition of an RC QP.
pub fn transition(cur: u32, next: u32) -> Option<(c_int, c_int)> {
    match (cur, next) {
        (_, QPS_RESET) | (_, QPS_ERR) if cur <= QPS_ERR => Some((0, 0)),
        (QPS_RESET, QPS_INIT) => Some((QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS, 0)),
        (QPS_INIT, QPS_INIT) => Some((0, QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS)),
        (QPS_INIT, QPS_RTR) => Some((RTR_REQ, QP_ALT_PATH | QP_ACCESS_FLAGS | QP_PKEY_INDEX)),
        (QPS_RTR, QPS_RTS) => Some((RTS_REQ, RTS_OPT)),
        (QPS_RTS, QPS_RTS) => Some((0, RTS_OPT)),
        _ => None,
    }
}

/// Checks an address vector; the node it names.
fn check_av(ah: &ibv_ah_attr) -> Result<NodeAddr, c_int> {
    if ah.port_num != 1 {
        return Err(libc::EINVAL);
    }
    if (ah.is_global != 0 || !config().ib) && c_int::from(ah.grh.sgid_index) >= GID_TBL_LEN {
        return Err(libc::EINVAL);
    }
    let addr = if config().ib {
        // Within a subnet the LID routes, global or not.
        device::addr_of_lid(ah.dlid).ok_or(libc::EINVAL)?
    } else {
        // RoCE: the address vector must carry a GRH whose GID resolves.
        if ah.is_global == 0 {
            return Err(libc::EINVAL);
        }
        device::addr_of_gid(&ah.grh.dgid).ok_or(libc::EINVAL)?
    };
    if !config().ib && !nic::reachable(addr.key) {
        return Err(libc::EINVAL);
    }
    Ok(addr)
}

fn check_values(a: &ibv_qp_attr, mask: c_int) -> Result<Option<NodeAddr>, c_int> {
    let has = |bit| mask & bit != 0;
    let ok = (!has(QP_PORT) || a.port_num == 1)
        && (!has(QP_PKEY_INDEX) || a.pkey_index < PKEY_TBL_LEN)
        && (!has(QP_ACCESS_FLAGS)
            || a.qp_access_flags
                & !((ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC) as u32)
                == 0)
        && (!has(QP_PATH_MTU) || (1..=ACTIVE_MTU).contains(&a.path_mtu))
        && (!has(QP_DEST_QPN) || a.dest_qp_num <= PSN_MASK)
        && (!has(QP_MAX_DEST_RD_ATOMIC) || a.max_dest_rd_atomic <= MAX_RD_ATOMIC)
        && (!has(QP_MAX_QP_RD_ATOMIC) || a.max_rd_atomic <= MAX_RD_ATOMIC)
        && (!has(QP_MIN_RNR_TIMER) || a.min_rnr_timer <= 31)
        && (!has(QP_TIMEOUT) || a.timeout <= 31)
        && (!has(QP_RETRY_CNT) || a.retry_cnt <= 7)
        && (!has(QP_RNR_RETRY) || a.rnr_retry <= 7);
    if !ok {
        return Err(libc::EINVAL);
    }
    if has(QP_AV) {
        return check_av(&a.ah_attr).map(Some);
    }
    Ok(None)
}

/// Copies the attributes `mask` names into the QP's record.
fn store(to: &mut ibv_qp_attr, a: &ibv_qp_attr, mask: c_int) {
    let has = |bit| mask & bit != 0;
    if has(QP_PKEY_INDEX) {
        to.pkey_index = a.pkey_index;
    }
    if has(QP_PORT) {
        to.port_num = a.port_num;
    }
    if has(QP_ACCESS_FLAGS) {
        to.qp_access_flags = a.qp_access_flags;
    }
    if has(QP_AV) {
        to.ah_attr = a.ah_attr;
    }
    if has(QP_PATH_MTU) {
        to.path_mtu = a.path_mtu;
    }
    if has(QP_DEST_QPN) {
        to.dest_qp_num = a.dest_qp_num;
    }
    if has(QP_RQ_PSN) {
        to.rq_psn = a.rq_psn & PSN_MASK;
    }
    if has(QP_SQ_PSN) {
        to.sq_psn = a.sq_psn & PSN_MASK;
    }
    if has(QP_MAX_DEST_RD_ATOMIC) {
        to.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
    if has(QP_MAX_QP_RD_ATOMIC) {
        to.max_rd_atomic = a.max_rd_atomic;
    }
    if has(QP_MIN_RNR_TIMER) {
        to.min_rnr_timer = a.min_rnr_timer;
    }
    if has(QP_TIMEOUT) {
        to.timeout = a.timeout;
    }
    if has(QP_RETRY_CNT) {
        to.retry_cnt = a.retry_cnt;
    }
    if has(QP_RNR_RETRY) {
        to.rnr_retry = a.rnr_retry;
    }
    if has(QP_ALT_PATH) {
        // Accepted and kept; automatic path migration is not emulated.
        to.alt_ah_attr = a.alt_ah_attr;
        to.alt_pkey_index = a.alt_pkey_index;
        to.alt_port_num = a.alt_port_num;
        to.alt_timeout = a.alt_timeout;
    }
    if has(QP_PATH_MIG_STATE) {
        to.path_mig_state = a.path_mig_state;
    }
}

pub fn modify_qp(p: *const ibv_qp, attr: &ibv_qp_attr, mask: c_int) -> c_int {
    let Some(qp) = registry::qp(p) else { return libc::EINVAL };
    let cur = qp.lock().state;
    let next = if mask & QP_STATE != 0 { attr.qp_state } else { cur };
    if mask & QP_CUR_STATE != 0 && attr.cur_qp_state != cur {
        return libc::EINVAL;
    }
    let Some((req, opt)) = transition(cur, next) else { return libc::EINVAL };
    if mask & !(req | opt | QP_STATE) != 0 || mask & req != req {
        return libc::EINVAL;
    }
    let remote = match check_values(attr, mask) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let mut st = qp.lock();
    if st.state != cur {
        // The NIC moved it (to the error state) meanwhile.
        return libc::EINVAL;
    }
    match next {
        QPS_RESET => qp::reset(&qp, &mut st),
        QPS_ERR => qp.enter_error(&mut st),
        _ => {
            store(&mut st.attr, attr, mask);
            if next == QPS_RTR && cur == QPS_INIT {
                st.remote = remote;
                st.epsn = st.attr.rq_psn;
            }
            if next == QPS_RTS && cur == QPS_RTR {
                st.psn = st.attr.sq_psn;
                st.head = Head::Waiting;
            }
            qp.set_state(&mut st, next);
        }
    }
    0
}

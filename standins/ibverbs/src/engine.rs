//! The requester side of the NIC: one thread that sends the head work request of every active
//! QP, one at a time per QP (so the writes of a QP land in order), and handles the responses.
//!
//! - The source is read **lazily**: a work request waits its random delay (from `post_send`),
//!   then its SGEs are checked (lkey of a live MR of the QP's PD covering the range, else
//!   `LOC_PROT_ERR`) and read; a retransmission reads them again.
//! - Local ACK timeout: 4.096 µs × 2^timeout (0: infinite). After `retry_cnt` retransmissions
//!   the next timeout completes the request with `RETRY_EXC_ERR` (NCCL's timeout 20 and
//!   retry_cnt 7: 8 × 4.3 s ≈ 34 s).
//! - RNR NAK: wait 10 µs × 2^(min_rnr_timer / 4) (a small real delay instead of the IB table's
//!   0.01–655 ms) and send again, up to `rnr_retry` times (7: forever), then
//!   `RNR_RETRY_EXC_ERR`.
//! - Any error completes the head request with its status, flushes the rest (`WR_FLUSH_ERR`)
//!   and puts the QP in the error state.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::config::config;
use crate::cq::Cq;
use crate::device::{self, MAX_MSG};
use crate::mr;
use crate::qp::{Head, Qp, QpState};
use crate::registry::{self, reg};
use crate::sys::*;
use crate::util::{self, count, fence, lock, with_rng, COUNTERS};
use crate::wire::{self, Request, Response, Syndrome, PSN_MASK};
use crate::{memio, nic};

/// Work for the engine thread that must run with no other lock held.
pub enum Task {
    /// A CQ overflowed: its QPs go to the error state.
    CqBroken(Arc<Cq>),
}

struct State {
    active: Vec<Arc<Qp>>,
    tasks: Vec<Task>,
    woken: bool,
}

static STATE: Mutex<State> = Mutex::new(State { active: Vec::new(), tasks: Vec::new(), woken: false });
static WAKE: Condvar = Condvar::new();

/// The local ACK timeout of attribute `timeout` (`None`: infinite).
pub fn ack_timeout(timeout: u8) -> Option<Duration> {
    (timeout != 0).then(|| Duration::from_nanos(4096u64 << timeout.min(31)))
}

/// The wait after an RNR NAK from a responder with this `min_rnr_timer`.
pub fn rnr_delay(timer: u8) -> Duration {
    Duration::from_secs_f64(10e-6 * 2f64.powf(f64::from(timer.min(31)) / 4.0))
}

/// Makes the engine look at a QP (after a post or a response).
pub fn kick(qp: &Arc<Qp>) {
    let mut g = lock(&STATE);
    if !g.active.iter().any(|q| Arc::ptr_eq(q, qp)) {
        g.active.push(qp.clone());
    }
    g.woken = true;
    WAKE.notify_one();
}

pub fn defer(task: Task) {
    let mut g = lock(&STATE);
    g.tasks.push(task);
    g.woken = true;
    WAKE.notify_one();
}

pub fn start() -> std::io::Result<()> {
    std::thread::Builder::new().name("ibv-standin-engine".into()).spawn(run).map(drop)
}

enum Step {
    /// Nothing to do until kicked.
    Idle,
    /// Look again at this instant (`None`: only when kicked).
    Wait(Option<Instant>),
}

fn run() {
    loop {
        let (tasks, qps) = {
            let mut g = lock(&STATE);
            g.woken = false;
            (std::mem::take(&mut g.tasks), g.active.clone())
        };
        for task in tasks {
            fence("engine task", (), || run_task(task));
        }
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut idle = Vec::new();
        for qp in &qps {
            match fence("engine step", Step::Idle, || step(qp, now)) {
                Step::Idle => idle.push(qp.clone()),
                Step::Wait(Some(at)) => next = Some(next.map_or(at, |n| n.min(at))),
                Step::Wait(None) => {}
            }
        }
        let mut g = lock(&STATE);
        if g.woken {
            continue;
        }
        g.active.retain(|q| !idle.iter().any(|i| Arc::ptr_eq(i, q)));
        match next {
            None => drop(WAKE.wait_while(g, |s| !s.woken).unwrap_or_else(|e| e.into_inner())),
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now());
                drop(WAKE.wait_timeout_while(g, wait, |s| !s.woken).unwrap_or_else(|e| e.into_inner()));
            }
        }
    }
}

fn run_task(task: Task) {
    match task {
        Task::CqBroken(cq) => {
            let qps: Vec<Arc<Qp>> = reg()
                .qps
                .values()
                .filter(|q| Arc::ptr_eq(&q.send_cq, &cq) || Arc::ptr_eq(&q.recv_cq, &cq))
                .cloned()
                .collect();
            for qp in qps {
                let mut st = qp.lock();
                if !st.destroyed && st.state != QPS_ERR {
                    qp.enter_error(&mut st);
                }
            }
        }
    }
}

fn step(qp: &Arc<Qp>, now: Instant) -> Step {
    let (req, to, deadline) = {
        let mut st = qp.lock();
        if st.destroyed || st.state != QPS_RTS {
            return Step::Idle;
        }
        let Some(head) = st.sq.front() else { return Step::Idle };
        match st.head {
            Head::Waiting if now < head.ready_at => return Step::Wait(Some(head.ready_at)),
            Head::Waiting => {}
            Head::InFlight { deadline: None } => return Step::Wait(None),
            Head::InFlight { deadline: Some(d) } if now < d => return Step::Wait(Some(d)),
            Head::InFlight { .. } => {
                st.retries += 1;
                if st.retries > u32::from(st.attr.retry_cnt) {
                    qp.fail_head(&mut st, WC_RETRY_EXC_ERR);
                    return Step::Idle;
                }
                count(&COUNTERS.retransmits);
            }
            Head::RnrWait { until } if now < until => return Step::Wait(Some(until)),
            Head::RnrWait { .. } => count(&COUNTERS.retransmits),
        }
        let req = match build_request(qp, &mut st) {
            Ok(r) => r,
            Err(status) => {
                qp.fail_head(&mut st, status);
                return Step::Idle;
            }
        };
        let deadline = ack_timeout(st.attr.timeout).map(|t| now + t);
        st.head = Head::InFlight { deadline };
        (req, st.remote, deadline)
    };
    if let Some(to) = to {
        count(&COUNTERS.transmits);
        if with_rng(|r| r.chance(config().drop)) {
            count(&COUNTERS.dropped);
        } else {
            // A failure (the node is gone) is a lost packet: the timeout handles it.
            nic::send(to.key, &[&wire::encode_request_head(&req), &req.payload]);
        }
    }
    Step::Wait(deadline)
}

/// Reads the head request's source and builds its packet; the failure status otherwise.
fn build_request(qp: &Arc<Qp>, st: &mut QpState) -> Result<Request, u32> {
    let remote = st.remote.ok_or(WC_GENERAL_ERR)?;
    let wqe = st.sq.front().ok_or(WC_GENERAL_ERR)?;
    let payload = match &wqe.inline {
        Some(bytes) => bytes.clone(),
        None => {
            let total: u64 = wqe.sges.iter().map(|s| u64::from(s.length)).sum();
            if total > u64::from(MAX_MSG) {
                return Err(WC_LOC_LEN_ERR);
            }
            let mut payload = Vec::with_capacity(total as usize);
            for s in wqe.sges.iter().filter(|s| s.length > 0) {
                let len = u64::from(s.length);
                let mr = mr::check_lkey(&qp.pd, s.lkey, s.addr, len, 0).map_err(|_| WC_LOC_PROT_ERR)?;
                let live = util::read(&mr.live);
                if !*live {
                    return Err(WC_LOC_PROT_ERR);
                }
                if !memio::read_into(mr.host(s.addr), len, &mut payload) {
                    eprintln!(
                        "topoccl ibverbs stand-in: QP {:#x}: source {:#x}+{len} of a live MR is not mapped \
                         (freed before ibv_dereg_mr?)",
                        qp.num, s.addr
                    );
                    return Err(WC_LOC_PROT_ERR);
                }
            }
            payload
        }
    };
    let mtu = u64::from(device::mtu_bytes(st.attr.path_mtu));
    let npkts = (payload.len() as u64).div_ceil(mtu).max(1) as u32;
    st.head_npkts = npkts;
    Ok(Request {
        src: device::local_addr(qp.dev),
        dst_dev: remote.dev,
        opcode: wqe.opcode,
        src_qpn: qp.num,
        dst_qpn: st.attr.dest_qp_num,
        psn: st.psn,
        npkts,
        imm: wqe.imm,
        rkey: wqe.rkey,
        remote_addr: wqe.remote_addr,
        payload,
    })
}

/// A response arrived for one of our QPs.
pub fn on_response(resp: Response) {
    let Some(qp) = registry::qp_by_num(resp.qpn) else { return };
    {
        let mut st = qp.lock();
        let in_flight = matches!(st.head, Head::InFlight { .. });
        if st.destroyed || st.state != QPS_RTS || !in_flight || resp.psn != st.psn || st.sq.is_empty() {
            return; // stale: an earlier transmission's answer
        }
        match resp.syndrome {
            Syndrome::Ack => {
                if let Some(wqe) = st.sq.pop_front() {
                    st.psn = (st.psn + st.head_npkts) & PSN_MASK;
                    st.head = Head::Waiting;
                    st.retries = 0;
                    st.rnr_tries = 0;
                    qp.complete_send(&wqe, WC_SUCCESS);
                }
            }
            Syndrome::RnrNak => {
                st.rnr_tries += 1;
                if st.attr.rnr_retry != 7 && st.rnr_tries > u32::from(st.attr.rnr_retry) {
                    qp.fail_head(&mut st, WC_RNR_RETRY_EXC_ERR);
                } else {
                    st.head = Head::RnrWait { until: Instant::now() + rnr_delay(resp.rnr_timer) };
                }
            }
            Syndrome::SeqNak => {
                st.retries += 1;
                if st.retries > u32::from(st.attr.retry_cnt) {
                    qp.fail_head(&mut st, WC_RETRY_EXC_ERR);
                } else {
                    st.head = Head::RnrWait { until: Instant::now() };
                }
            }
            Syndrome::AccessNak => qp.fail_head(&mut st, WC_REM_ACCESS_ERR),
            Syndrome::InvReqNak => qp.fail_head(&mut st, WC_REM_INV_REQ_ERR),
            Syndrome::OpNak => qp.fail_head(&mut st, WC_REM_OP_ERR),
        }
    }
    kick(&qp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_follow_the_spec() {
        // NCCL's defaults: timeout 20, retry_cnt 7 → 8 × 4.096 µs × 2^20 ≈ 34.4 s.
        let total = ack_timeout(20).unwrap() * 8;
        assert!((total.as_secs_f64() - 34.36).abs() < 0.01, "{total:?}");
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(rnr_delay(0), Duration::from_micros(10));
        assert!(rnr_delay(12) > Duration::from_micros(79) && rnr_delay(12) < Duration::from_micros(81));
    }
}

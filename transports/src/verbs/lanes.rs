//! The extra queue pairs of a connection (`NCCL_IB_QPS_PER_CONNECTION` − 1), which its large
//! one-sided writes are striped over, as NCCL splits a message across its queue pairs: on a
//! RoCE fabric each queue pair is its own flow (its own UDP source port), so ECMP spreads them
//! over more links than one flow gets.
//!
//! Queue pairs are not ordered with one another, so a frame on the first one saying "written"
//! could overtake a part on another: the connection sends that frame only once every lane's
//! part has completed here (an RC write completes once the peer's NIC has placed it). The
//! receiver needs nothing: lanes carry plain writes, no immediates, and it posts no receives
//! on them.

use std::collections::VecDeque;
use std::sync::Arc;

use super::device::{CompletionQueue, Endpoint, MemoryRegion, PathSettings, ProtectionDomain, QueuePair};
use super::sys::*;
use crate::error::{Error, Result};

/// Queue pairs per connection at most (the first and 15 lanes).
pub const MAX_QPS: u8 = 16;
/// Writes in flight per lane.
const LANE_DEPTH: u32 = 32;
/// The smallest part of a striped write (smaller messages go on the first queue pair alone).
pub(crate) const MIN_PART: usize = 32 << 10;
/// Parts are multiples of this (NCCL aligns its chunks the same way).
const PART_ALIGN: usize = 128;

struct Lane {
    qp: QueuePair,
    /// The length and source of each write in flight, in posting order (a queue pair
    /// completes its sends in order).
    in_flight: VecDeque<(usize, Arc<MemoryRegion>)>,
    posted: u64,
    completed: u64,
}

/// A connection's lanes.
pub(crate) struct Lanes {
    lanes: Vec<Lane>,
    unacked: usize,
    failed: Option<String>,
    wcs: Vec<ibv_wc>,
}

/// `count` new queue pairs of `pd` in INIT, each with its own completion queue.
pub(crate) fn prepare(pd: &Arc<ProtectionDomain>, path: &PathSettings, count: usize) -> Result<Vec<QueuePair>> {
    (0..count)
        .map(|_| {
            let cq = CompletionQueue::new(pd.ctx.clone(), LANE_DEPTH as usize + 4)?;
            let qp = QueuePair::new(pd.clone(), Arc::new(cq), LANE_DEPTH, 1)?;
            qp.init(path)?;
            Ok(qp)
        })
        .collect()
}

/// How a message of `len` bytes is split over the first queue pair and `lanes` lanes: the
/// part length (every part but the last), and how many parts.
pub(crate) fn split(len: usize, lanes: usize) -> (usize, usize) {
    let parts = (lanes + 1).min(len / MIN_PART);
    if parts <= 1 {
        return (len, 1);
    }
    let part = len.div_ceil(parts).next_multiple_of(PART_ALIGN);
    (part, len.div_ceil(part))
}

impl Lanes {
    /// Lanes over `qps`, each connected to the peer's lane of the same index.
    pub(crate) fn connect(
        qps: Vec<QueuePair>,
        theirs: &[u32],
        path: &PathSettings,
        mine: &Endpoint,
        remote: &Endpoint,
    ) -> Result<Lanes> {
        let mut lanes = Vec::with_capacity(qps.len());
        for (qp, &qpn) in qps.into_iter().zip(theirs) {
            let local = Endpoint { qpn: qp.qpn, ..*mine };
            qp.connect(path, &local, &Endpoint { qpn, ..*remote })?;
            lanes.push(Lane { qp, in_flight: VecDeque::new(), posted: 0, completed: 0 });
        }
        Ok(Lanes { lanes, unacked: 0, failed: None, wcs: vec![ibv_wc::default(); 16] })
    }

    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Whether lanes `0..n` each have room for a write now.
    pub(crate) fn room(&self, n: usize) -> bool {
        self.failed.is_none() && self.lanes.iter().take(n).all(|l| l.in_flight.len() < LANE_DEPTH as usize)
    }

    /// Posts a write of `len` bytes at `addr` (inside `source`) to the peer's `raddr` (`rkey`)
    /// on lane `i`; the lane's count of writes posted, for [`Lanes::done`].
    ///
    /// # Safety
    /// The bytes must stay unchanged until the write has completed (`done`).
    pub(crate) unsafe fn write(
        &mut self,
        i: usize,
        addr: usize,
        len: usize,
        source: &Arc<MemoryRegion>,
        raddr: u64,
        rkey: u32,
    ) -> Result<u64> {
        let lane = self.lanes.get_mut(i).ok_or_else(|| Error::Protocol(format!("no lane {i}")))?;
        let mut sge = ibv_sge { addr: addr as u64, length: len as u32, lkey: source.lkey };
        let mut wr = ibv_send_wr {
            wr_id: 1,
            sg_list: &mut sge,
            num_sge: i32::from(len > 0),
            opcode: WR_RDMA_WRITE,
            send_flags: SEND_SIGNALED,
            ..Default::default()
        };
        wr.wr.remote_addr = raddr;
        wr.wr.rkey = rkey;
        // SAFETY: the gather element lies in `source`, kept (in `in_flight`) until the write
        // completes; the bytes stay unchanged until then (this fn's contract).
        unsafe { lane.qp.post_send(&mut wr)? };
        lane.in_flight.push_back((len, source.clone()));
        lane.posted += 1;
        self.unacked += len;
        Ok(lane.posted)
    }

    /// Takes the lanes' completions; the first failure, as the reason the peer is lost.
    pub(crate) fn poll(&mut self) -> std::result::Result<(), String> {
        if let Some(why) = &self.failed {
            return Err(why.clone());
        }
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            loop {
                let n = lane.qp.cq.poll(&mut self.wcs).map_err(|e| e.to_string())?;
                for wc in &self.wcs[..n] {
                    let Some((len, _)) = lane.in_flight.pop_front() else {
                        return Err(format!("a completion on lane {i} with no write in flight"));
                    };
                    lane.completed += 1;
                    self.unacked -= len;
                    if wc.status != WC_SUCCESS && self.failed.is_none() {
                        let why = format!("an RDMA write on lane {i} failed: {}", wc_status_name(wc.status));
                        self.failed = Some(why);
                    }
                }
                if n < self.wcs.len() {
                    break;
                }
            }
        }
        self.failed.clone().map_or(Ok(()), Err)
    }

    /// Whether lane `i` has completed `marks[i]` writes, for every `i`.
    pub(crate) fn done(&self, marks: &[u64]) -> bool {
        self.lanes.iter().zip(marks).all(|(l, &m)| l.completed >= m)
    }

    /// Bytes written on the lanes and not yet acknowledged.
    pub(crate) fn unacked(&self) -> usize {
        self.unacked
    }

    /// Stops every lane (their writes are flushed) and waits briefly for the flushes, so that
    /// no source is read after the connection closes.
    pub(crate) fn stop(&mut self) {
        for lane in &self.lanes {
            let _ = lane.qp.to_error();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.lanes.iter().any(|l| !l.in_flight.is_empty()) && std::time::Instant::now() < deadline {
            if self.poll().is_err() && self.lanes.iter().all(|l| l.in_flight.is_empty()) {
                break;
            }
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_split_into_aligned_parts_of_at_least_the_minimum() {
        assert_eq!(split(0, 3), (0, 1));
        assert_eq!(split(64 << 10, 0), (64 << 10, 1));
        assert_eq!(split(40 << 10, 3), (40 << 10, 1), "too small to split");
        assert_eq!(split(64 << 10, 3), (32 << 10, 2));
        assert_eq!(split(1 << 20, 3), (256 << 10, 4));
        let (part, parts) = split((1 << 20) + 3, 3);
        assert_eq!((part % PART_ALIGN, parts), (0, 4));
        assert!(part * (parts - 1) < (1 << 20) + 3 && part * parts >= (1 << 20) + 3);
    }
}

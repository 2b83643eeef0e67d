//! Running what the C API asks for on a communicator: collectives (with NCCL's in-place
//! aliasing, staging where the caller's buffers overlap otherwise, and PreMulSum) and batches
//! of point-to-point transfers (a group's, or a lone call's).

use topoccl::{CollectiveCall, CollectiveKind, Dtype, ReduceOp};

use crate::error::{usage, Result};
use crate::handle::{Handle, PreMulSum, Scalar};
use crate::log::{self, Subsys};
use crate::raw::{self, Region};

/// The reduction a call asked for.
#[derive(Clone, Copy)]
pub enum Op {
    Builtin(ReduceOp),
    PreMulSum(PreMulSum),
}

/// One collective call, checked, with its buffers as the API defines them.
#[derive(Clone, Copy)]
pub struct Collective {
    pub kind: CollectiveKind,
    pub send: Region,
    pub recv: Region,
    pub count: usize,
    pub dtype: Dtype,
    pub op: Op,
    pub root: u32,
}

/// One send (`send`) or receive.
#[derive(Clone, Copy)]
pub struct Transfer {
    pub send: bool,
    pub buf: Region,
    pub dtype: Dtype,
    pub peer: u32,
}

impl Collective {
    /// How NCCL aliases an in-place call: the one buffer to run on, if this call is in place.
    fn in_place(&self, rank: u32) -> Option<Region> {
        let block = self.count * self.dtype.size();
        let (s, r) = (self.send, self.recv);
        if s.len == 0 || r.len == 0 {
            return None;
        }
        match self.kind {
            CollectiveKind::AllGather => (s.addr == r.addr + rank as usize * block).then_some(r),
            CollectiveKind::ReduceScatter => (r.addr == s.addr + rank as usize * block).then_some(s),
            _ => (s.addr == r.addr).then_some(r),
        }
    }
}

fn scalar_bytes(p: &PreMulSum) -> Result<Vec<u8>> {
    let n = p.dtype.size();
    match p.scalar {
        Scalar::Value(v) => Ok(v[..n].to_vec()),
        Scalar::At(addr) => raw::read_bytes(addr, n),
    }
}

/// Runs a collective to completion.
pub fn run_collective(h: &Handle, c: &Collective) -> Result<()> {
    if c.count == 0 {
        // NCCL returns at once for empty calls; every rank passes the same count.
        return Ok(());
    }
    h.with_comm(|comm| {
        let op = match c.op {
            Op::Builtin(op) => op,
            Op::PreMulSum(_) => ReduceOp::Sum,
        };
        let call = CollectiveCall { kind: c.kind, dtype: c.dtype, op, root: c.root, count: c.count };
        if log::info_enabled(Subsys::Tuning) {
            if let Ok(choice) = comm.algorithm_for(&call) {
                let bytes = c.count * c.dtype.size();
                log::info(Subsys::Tuning, Some(comm.rank()), format_args!("{} {bytes} bytes: {choice}", c.kind));
            }
        }
        let in_place = c.in_place(comm.rank());
        let result = if let Op::PreMulSum(p) = c.op {
            // SAFETY: the send buffer is the caller's, readable for the call (NCCL's contract).
            let mut input = unsafe { c.send.bytes() }.to_vec();
            topoccl::types::premultiply(c.dtype, &mut input, &scalar_bytes(&p)?)?;
            // In place or not, the output is the receive buffer (for an in-place reduce-scatter
            // the rank's block of the one buffer) and the staged input aliases nothing.
            // SAFETY: the receive buffer is the caller's, writable for the call.
            comm.collective_bytes(&call, &input, unsafe { c.recv.bytes_mut() })
        } else if let Some(buf) = in_place {
            // SAFETY: the one buffer of an in-place call, the caller's for the whole call.
            comm.collective_bytes_in_place(&call, unsafe { buf.bytes_mut() })
        } else if c.send.overlaps(&c.recv) {
            // Overlapping otherwise than NCCL's in-place layouts: stage the input.
            // SAFETY: as above; the staged copy ends the overlap before anything is written.
            let input = unsafe { c.send.bytes() }.to_vec();
            comm.collective_bytes(&call, &input, unsafe { c.recv.bytes_mut() })
        } else {
            // SAFETY: two disjoint buffers of the caller, each valid for the call.
            comm.collective_bytes(&call, unsafe { c.send.bytes() }, unsafe { c.recv.bytes_mut() })
        };
        result.map_err(Into::into)
    })
}

/// Runs sends and receives together (`ncclGroupEnd`, or a lone `ncclSend`/`ncclRecv`).
/// Transfers to this rank itself pair up in order, sends with receives, and are copies.
pub fn run_transfers(h: &Handle, transfers: &[Transfer]) -> Result<()> {
    h.with_comm(|comm| {
        let me = comm.rank();
        let own_sends: Vec<&Transfer> = transfers.iter().filter(|t| t.peer == me && t.send).collect();
        let own_recvs: Vec<&Transfer> = transfers.iter().filter(|t| t.peer == me && !t.send).collect();
        if own_sends.len() != own_recvs.len() {
            return Err(usage(format!(
                "{} sends to this rank itself but {} receives from it in one group: each needs its partner",
                own_sends.len(),
                own_recvs.len()
            )));
        }
        for (s, r) in own_sends.iter().zip(&own_recvs) {
            if s.buf.len != r.buf.len || s.dtype != r.dtype {
                return Err(usage(format!(
                    "a send of {} bytes to this rank itself met a receive of {} bytes",
                    s.buf.len, r.buf.len
                )));
            }
            // SAFETY: both are the caller's buffers for the call; `copy` allows overlap.
            unsafe { std::ptr::copy(s.buf.addr as *const u8, r.buf.addr as *mut u8, s.buf.len) };
        }
        let mut group = comm.group();
        for t in transfers.iter().filter(|t| t.peer != me) {
            if t.send {
                // SAFETY: a send buffer of the caller, readable until the group ends.
                group.send_bytes(unsafe { t.buf.bytes() }, t.dtype, t.peer)?;
            } else {
                // SAFETY: a receive buffer of the caller, writable until the group ends; NCCL
                // forbids receive buffers of one group to overlap.
                group.recv_bytes(unsafe { t.buf.bytes_mut() }, t.dtype, t.peer)?;
            }
        }
        group.end().map_err(Into::into)
    })
}

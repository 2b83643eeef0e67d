//! Collectives, point-to-point transfers and groups.

use std::ffi::{c_int, c_void};

use topoccl::{CollectiveKind, Dtype, ReduceOp};

use super::{export, guard};
use crate::abi::*;
use crate::call::{self, Collective, Op, Transfer};
use crate::error::{invalid, Result};
use crate::group::{self, Work};
use crate::handle::{self, Handle};
use crate::log::{self, Subsys};
use crate::raw::Region;

fn dtype_of(datatype: ncclDataType_t) -> Result<Dtype> {
    Dtype::from_raw(i64::from(datatype))
        .ok_or_else(|| invalid(format!("datatype {datatype} is not an ncclDataType_t (0..9)")))
}

fn op_of(h: &Handle, op: ncclRedOp_t, dtype: Dtype) -> Result<Op> {
    if let Some(builtin) = ReduceOp::from_raw(i64::from(op)) {
        return Ok(Op::Builtin(builtin));
    }
    let index = usize::try_from(op - BUILTIN_OPS).map_err(|_| invalid(format!("op {op} is not an ncclRedOp_t")))?;
    let ops = h.ops.lock().unwrap_or_else(|p| p.into_inner());
    match ops.get(index).copied().flatten() {
        Some(p) if p.dtype == dtype => Ok(Op::PreMulSum(p)),
        Some(p) => Err(invalid(format!("op {op} was made for {}, the call is {}", p.dtype, dtype))),
        None => Err(invalid(format!("op {op} is not an operator of this communicator"))),
    }
}

fn no_stream(stream: cudaStream_t) -> Result<()> {
    if stream.is_null() {
        Ok(())
    } else {
        Err(invalid("stream must be NULL: topoccl was built without CUDA, buffers are host memory"))
    }
}

/// What every collective entry point does.
#[allow(clippy::too_many_arguments)]
fn collective(
    name: &str,
    kind: CollectiveKind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(name, || {
        let h = handle::lookup(comm)?;
        no_stream(stream)?;
        let dtype = dtype_of(datatype)?;
        let reduction = if kind.reduces() { op_of(&h, op, dtype)? } else { Op::Builtin(ReduceOp::Sum) };
        let (rank, n) = h.identity()?;
        if kind.rooted() && (root < 0 || root as u32 >= n) {
            return Err(invalid(format!("root {root} is out of range for {n} ranks")));
        }
        let root = if kind.rooted() { root as u32 } else { 0 };
        let (in_blocks, out_blocks) = kind.blocks(n as usize);
        let block = count.checked_mul(dtype.size()).ok_or_else(|| invalid(format!("count {count} is too large")))?;
        let bytes =
            |blocks: usize| block.checked_mul(blocks).ok_or_else(|| invalid(format!("count {count} is too large")));
        // Buffers only the root uses are not looked at elsewhere (NULL is fine there).
        let send = if kind == CollectiveKind::Broadcast && rank != root {
            Region::empty()
        } else {
            Region::new(send, bytes(in_blocks)?, "sendbuff")?
        };
        let recv = if kind == CollectiveKind::Reduce && rank != root {
            Region::empty()
        } else {
            Region::new(recv, bytes(out_blocks)?, "recvbuff")?
        };
        let seq = h.op_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        log::info(
            Subsys::Coll,
            Some(rank),
            format_args!(
                "{name}: opCount {seq:x} sendbuff {:#x} recvbuff {:#x} count {count} datatype {datatype} op {op} root {root} comm {comm:p} [nranks={n}] stream {stream:p}",
                send.addr, recv.addr
            ),
        );
        let call = Collective { kind, send, recv, count, dtype, op: reduction, root };
        if group::active() {
            group::push(Work::Collective { handle: h, call });
        } else {
            call::run_collective(&h, &call)?;
        }
        Ok(NCCL_SUCCESS)
    })
}

#[allow(clippy::too_many_arguments)]
fn transfer(
    name: &str,
    send: bool,
    buf: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(name, || {
        let h = handle::lookup(comm)?;
        no_stream(stream)?;
        let dtype = dtype_of(datatype)?;
        let (rank, n) = h.identity()?;
        if peer < 0 || peer as u32 >= n {
            return Err(invalid(format!("peer {peer} is out of range for {n} ranks")));
        }
        let bytes = count.checked_mul(dtype.size()).ok_or_else(|| invalid(format!("count {count} is too large")))?;
        let buf = Region::new(buf, bytes, if send { "sendbuff" } else { "recvbuff" })?;
        log::info(
            Subsys::P2p,
            Some(rank),
            format_args!("{name}: buff {:#x} count {count} datatype {datatype} peer {peer} comm {comm:p}", buf.addr),
        );
        let t = Transfer { send, buf, dtype, peer: peer as u32 };
        if group::active() {
            group::push(Work::Transfer { handle: h, transfer: t });
        } else {
            call::run_transfers(&h, &[t])?;
        }
        Ok(NCCL_SUCCESS)
    })
}

fn all_reduce(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    collective("ncclAllReduce", CollectiveKind::AllReduce, s, r, n, t, op, 0, comm, st)
}

fn reduce_scatter(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    collective("ncclReduceScatter", CollectiveKind::ReduceScatter, s, r, n, t, op, 0, comm, st)
}

fn all_gather(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: ncclDataType_t,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    collective("ncclAllGather", CollectiveKind::AllGather, s, r, n, t, 0, 0, comm, st)
}

fn broadcast(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    collective("ncclBroadcast", CollectiveKind::Broadcast, s, r, n, t, 0, root, comm, st)
}

fn bcast(b: *mut c_void, n: usize, t: ncclDataType_t, root: c_int, comm: ncclComm_t, st: cudaStream_t) -> ncclResult_t {
    collective("ncclBcast", CollectiveKind::Broadcast, b, b, n, t, 0, root, comm, st)
}

#[allow(clippy::too_many_arguments)]
fn reduce(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    collective("ncclReduce", CollectiveKind::Reduce, s, r, n, t, op, root, comm, st)
}

fn send(
    b: *const c_void,
    n: usize,
    t: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    transfer("ncclSend", true, b, n, t, peer, comm, st)
}

fn recv(b: *mut c_void, n: usize, t: ncclDataType_t, peer: c_int, comm: ncclComm_t, st: cudaStream_t) -> ncclResult_t {
    transfer("ncclRecv", false, b, n, t, peer, comm, st)
}

fn group_start() -> ncclResult_t {
    guard("ncclGroupStart", || {
        group::start();
        Ok(NCCL_SUCCESS)
    })
}

fn group_end() -> ncclResult_t {
    guard("ncclGroupEnd", || {
        group::end()?;
        Ok(NCCL_SUCCESS)
    })
}

export! {
    /// Sums (or reduces with `op`) every rank's `count` elements; every rank gets the result.
    ncclAllReduce / pncclAllReduce (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = all_reduce
}
export! {
    /// Reduces `nranks × recvcount` elements; rank r gets block r.
    ncclReduceScatter / pncclReduceScatter (sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = reduce_scatter
}
export! {
    /// Gathers every rank's `sendcount` elements, in rank order, on every rank.
    ncclAllGather / pncclAllGather (sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = all_gather
}
export! {
    /// Copies the root's buffer to every rank.
    ncclBroadcast / pncclBroadcast (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = broadcast
}
export! {
    /// In-place broadcast.
    ncclBcast / pncclBcast (buff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = bcast
}
export! {
    /// Reduces every rank's buffer onto the root.
    ncclReduce / pncclReduce (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = reduce
}
export! {
    /// Sends to `peer` (pair with its `ncclRecv`; group exchanges).
    ncclSend / pncclSend (sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = send
}
export! {
    /// Receives from `peer`.
    ncclRecv / pncclRecv (recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = recv
}
export! {
    /// Starts (or nests) a group on this thread.
    ncclGroupStart / pncclGroupStart () -> ncclResult_t = group_start
}
export! {
    /// Ends a group; the outermost runs everything queued and returns when it is done.
    ncclGroupEnd / pncclGroupEnd () -> ncclResult_t = group_end
}

//! Collectives, point-to-point transfers and groups.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use topoccl::{Buffer, Collective, CollectiveCall, Dtype, ReduceOp, Reduction, Source};

use topoccl::cuda::StreamRef;

use super::{dtype_of, export, guard, rank_of, root_arg};
use crate::abi::*;
use crate::call::{self, CollectiveArgs, TransferArgs};
use crate::error::{invalid, Result};
use crate::group::{self, Deferred};
use crate::handle::{self, Handle};
use crate::log::{self, Subsys};
use crate::raw;

fn op_of(h: &Handle, op: ncclRedOp_t, dtype: Dtype) -> Result<Reduction> {
    if let Some(builtin) = ReduceOp::from_raw(i64::from(op)) {
        return Ok(Reduction::Op(builtin));
    }
    let index = usize::try_from(op - BUILTIN_OPS).map_err(|_| invalid(format!("op {op} is not an ncclRedOp_t")))?;
    let ops = h.ops.lock().unwrap_or_else(|p| p.into_inner());
    match ops.get(index).copied().flatten() {
        Some(p) if p.dtype == dtype => Ok(Reduction::PreMulSum(p.scalar)),
        Some(p) => Err(invalid(format!("op {op} was made for {}, the call is {}", p.dtype, dtype))),
        None => Err(invalid(format!("op {op} is not an operator of this communicator"))),
    }
}

/// What every collective entry point does.
#[allow(clippy::too_many_arguments)]
fn collective(
    name: &str,
    kind: Collective,
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
        let dtype = dtype_of(datatype)?;
        let reduction = if kind.reduces() { op_of(&h, op, dtype)? } else { Reduction::Op(ReduceOp::Sum) };
        let (rank, n) = h.identity()?;
        let kind = if kind.rooted() { kind.with_root(root_arg(root)?) } else { kind };
        let call = CollectiveCall::new(kind, dtype, count).reduced_with(reduction);
        let seq = h.op_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        log::info(
            Subsys::Coll,
            Some(rank),
            format_args!(
                "{name}: opCount {seq:x} sendbuff {send:p} recvbuff {recv:p} count {count} datatype {datatype} op {op} root {root} comm {comm:p} [nranks={n}] stream {stream:p}"
            ),
        );
        let call = CollectiveArgs {
            call,
            send: Buffer::at(send),
            recv: Buffer::at(recv),
            stream: StreamRef::from_raw(stream),
        };
        if group::active() {
            group::push(Deferred::Collective { handle: h, call });
        } else {
            call::run_collective(&h, &call)?;
        }
        Ok(NCCL_SUCCESS)
    })
}

/// What topoccl.h's tagged calls add to a send or receive (`None`: NCCL's own call, tag 0).
#[derive(Clone, Copy)]
pub(super) struct Tagged {
    pub tag: c_int,
    /// Where a receive writes its source rank (NULL: nowhere).
    pub source: *mut c_int,
}

/// `TOPOCCL_ANY_SOURCE`: the peer of a tagged receive that takes any rank's message.
pub const ANY_SOURCE: c_int = -1;

fn tag_of(tag: c_int) -> Result<u32> {
    u32::try_from(tag)
        .ok()
        .filter(|t| *t <= topoccl::MAX_TAG)
        .ok_or_else(|| invalid(format!("tag {tag} is outside 0..={} (TOPOCCL_MAX_TAG)", topoccl::MAX_TAG)))
}

/// A send or receive: NCCL's, or a tagged one (whose receive may take any source).
#[allow(clippy::too_many_arguments)]
pub(super) fn transfer(
    name: &str,
    send: bool,
    buf: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    tagged: Option<Tagged>,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(name, || {
        let h = handle::lookup(comm)?;
        let dtype = dtype_of(datatype)?;
        let (rank, n) = h.identity()?;
        let tag = tagged.map_or(Ok(0), |t| tag_of(t.tag))?;
        let peer = match peer {
            ANY_SOURCE if !send && tagged.is_some() => Source::Any,
            p => Source::Rank(rank_of("peer", p, n)?),
        };
        if log::info_enabled(Subsys::P2p) {
            // NCCL's line; a tagged call's names its tag.
            let peer = match peer {
                Source::Rank(r) => r.to_string(),
                Source::Any => "any".to_string(),
            };
            let tag = tagged.map(|_| format!(" tag {tag}")).unwrap_or_default();
            log::info(
                Subsys::P2p,
                Some(rank),
                format_args!("{name}: buff {buf:p} count {count} datatype {datatype} peer {peer}{tag} comm {comm:p}"),
            );
        }
        let t = TransferArgs {
            send,
            buf: Buffer::at(buf),
            dtype,
            count,
            peer,
            tag,
            source: tagged.map_or(0, |t| t.source as usize),
            stream: StreamRef::from_raw(stream),
        };
        submit_transfers(&h, vec![t])?;
        Ok(NCCL_SUCCESS)
    })
}

/// Transfers join the open group, or run now.
fn submit_transfers(h: &Arc<Handle>, list: Vec<TransferArgs>) -> Result<()> {
    if group::active() {
        list.into_iter().for_each(|transfer| group::push(Deferred::Transfer { handle: h.clone(), transfer }));
    } else if !list.is_empty() {
        call::run_transfers(h, &list)?;
    }
    Ok(())
}

/// What `ncclGather` and `ncclScatter` are: point-to-point transfers between the root and
/// every rank (as NCCL runs them), grouped like any other.
#[allow(clippy::too_many_arguments)]
fn rooted_transfers(
    name: &str,
    gather: bool,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(name, || {
        let h = handle::lookup(comm)?;
        let dtype = dtype_of(datatype)?;
        let (rank, n) = h.identity()?;
        let root = rank_of("root", root, n)?;
        let stream = StreamRef::from_raw(stream);
        log::info(
            Subsys::Coll,
            Some(rank),
            format_args!("{name}: sendbuff {send:p} recvbuff {recv:p} count {count} datatype {datatype} root {root} comm {comm:p} [nranks={n}]"),
        );
        let block = count
            .checked_mul(dtype.size())
            .filter(|b| b.checked_mul(n as usize).is_some())
            .ok_or_else(|| invalid(format!("count {count} × {n} ranks overflows the address space")))?;
        // The root's side: one block per rank of the spread buffer (recv for gather, send for
        // scatter); everyone's: one block of the other.
        let (spread, single) = if gather { (recv as usize, send as usize) } else { (send as usize, recv as usize) };
        let block_of = |r: u32| Buffer::at((spread + r as usize * block) as *const c_void);
        let mut list = Vec::new();
        let t = |send: bool, buf: Buffer, peer: u32| TransferArgs::plain(send, buf, dtype, count, peer, stream);
        if count > 0 {
            if rank == root {
                for r in 0..n {
                    // In place: the root's own block already is where it belongs.
                    if r == root && spread + root as usize * block == single {
                        continue;
                    }
                    if r == root {
                        let own = Buffer::at(single as *const c_void);
                        list.push(t(true, if gather { own } else { block_of(r) }, r));
                        list.push(t(false, if gather { block_of(r) } else { own }, r));
                    } else {
                        list.push(t(!gather, block_of(r), r));
                    }
                }
            } else {
                list.push(t(gather, Buffer::at(single as *const c_void), root));
            }
        }
        submit_transfers(&h, list)?;
        Ok(NCCL_SUCCESS)
    })
}

#[allow(clippy::too_many_arguments)]
fn gather(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    rooted_transfers("ncclGather", true, s, r, n, t, root, comm, st)
}

#[allow(clippy::too_many_arguments)]
fn scatter(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    rooted_transfers("ncclScatter", false, s, r, n, t, root, comm, st)
}

fn all_to_all(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: ncclDataType_t,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    collective("ncclAlltoAll", Collective::AllToAll, s, r, n, t, 0, 0, comm, st)
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
    collective("ncclAllReduce", Collective::AllReduce, s, r, n, t, op, 0, comm, st)
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
    collective("ncclReduceScatter", Collective::ReduceScatter, s, r, n, t, op, 0, comm, st)
}

fn all_gather(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: ncclDataType_t,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    collective("ncclAllGather", Collective::AllGather, s, r, n, t, 0, 0, comm, st)
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
    collective("ncclBroadcast", Collective::Broadcast { root: 0 }, s, r, n, t, 0, root, comm, st)
}

fn bcast(b: *mut c_void, n: usize, t: ncclDataType_t, root: c_int, comm: ncclComm_t, st: cudaStream_t) -> ncclResult_t {
    collective("ncclBcast", Collective::Broadcast { root: 0 }, b, b, n, t, 0, root, comm, st)
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
    collective("ncclReduce", Collective::Reduce { root: 0 }, s, r, n, t, op, root, comm, st)
}

fn send(
    b: *const c_void,
    n: usize,
    t: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    st: cudaStream_t,
) -> ncclResult_t {
    transfer("ncclSend", true, b, n, t, peer, None, comm, st)
}

fn recv(b: *mut c_void, n: usize, t: ncclDataType_t, peer: c_int, comm: ncclComm_t, st: cudaStream_t) -> ncclResult_t {
    transfer("ncclRecv", false, b, n, t, peer, None, comm, st)
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

fn group_simulate_end(info: *mut ncclSimInfo_t) -> ncclResult_t {
    guard("ncclGroupSimulateEnd", || {
        // SAFETY: `info` is NULL or the caller's valid struct, used during this call only (the API's contract).
        let Some(info) = (unsafe { raw::get_mut(info) }) else { return Err(invalid("simInfo is NULL")) };
        if info.magic != SIM_INFO_MAGIC || info.size < std::mem::size_of::<ncclSimInfo_t>() {
            return Err(invalid(
                "ncclSimInfo_t was not initialised with NCCL_SIM_INFO_INITIALIZER (bad magic or size)",
            ));
        }
        info.estimated_time = group::simulate_end()? as f32;
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
    /// Every rank sends block j of its buffer to rank j (blocks of `count`).
    ncclAlltoAll / pncclAlltoAll (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = all_to_all
}
export! {
    /// The root gets every rank's `count` elements, in rank order.
    ncclGather / pncclGather (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = gather
}
export! {
    /// Rank i gets block i of the root's buffer.
    ncclScatter / pncclScatter (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t = scatter
}
export! {
    /// Ends the group without running it: the simulator's estimate of its time.
    ncclGroupSimulateEnd / pncclGroupSimulateEnd (info: *mut ncclSimInfo_t) -> ncclResult_t = group_simulate_end
}
export! {
    /// Starts (or nests) a group on this thread.
    ncclGroupStart / pncclGroupStart () -> ncclResult_t = group_start
}
export! {
    /// Ends a group; the outermost runs everything queued and returns when it is done.
    ncclGroupEnd / pncclGroupEnd () -> ncclResult_t = group_end
}

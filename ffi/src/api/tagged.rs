//! topoccl's tagged point-to-point calls (`include/topoccl.h`): `ncclSend`/`ncclRecv` with a
//! tag, and a receive from any source that reports the rank its message came from (what
//! Gloo's and MPI's users, PyTorch's `recv(src=None)` among them, need and NCCL lacks).

use std::ffi::{c_int, c_void};

use topoccl::cuda::StreamRef;
use topoccl::{Buffer, Source, MAX_TAG};

use super::coll::submit_transfers;
use super::{dtype_of, extension, guard, rank_of};
use crate::abi::*;
use crate::call::TransferArgs;
use crate::error::{invalid, Result};
use crate::handle;
use crate::log::{self, Subsys};

/// `TOPOCCL_ANY_SOURCE`.
pub const ANY_SOURCE: c_int = -1;

fn tag_of(tag: c_int) -> Result<u32> {
    u32::try_from(tag)
        .ok()
        .filter(|t| *t <= MAX_TAG)
        .ok_or_else(|| invalid(format!("tag {tag} is outside 0..={MAX_TAG} (TOPOCCL_MAX_TAG)")))
}

#[allow(clippy::too_many_arguments)]
fn tagged(
    name: &str,
    send: bool,
    buf: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    tag: c_int,
    source: *mut c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(name, || {
        let h = handle::lookup(comm)?;
        let dtype = dtype_of(datatype)?;
        let (rank, n) = h.identity()?;
        let tag = tag_of(tag)?;
        let peer = match peer {
            ANY_SOURCE if !send => Source::Any,
            p => Source::Rank(rank_of("peer", p, n)?),
        };
        log::info(
            Subsys::P2p,
            Some(rank),
            format_args!(
                "{name}: buff {buf:p} count {count} datatype {datatype} peer {peer:?} tag {tag} comm {comm:p}"
            ),
        );
        let t = TransferArgs {
            send,
            buf: Buffer::at(buf),
            dtype,
            count,
            peer,
            tag,
            source: source as usize,
            stream: StreamRef::from_raw(stream),
        };
        submit_transfers(&h, vec![t])?;
        Ok(NCCL_SUCCESS)
    })
}

#[allow(clippy::too_many_arguments)]
fn send_tagged(
    buf: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    tag: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    tagged("topocclSendTagged", true, buf, count, datatype, peer, tag, std::ptr::null_mut(), comm, stream)
}

#[allow(clippy::too_many_arguments)]
fn recv_tagged(
    buf: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    tag: c_int,
    source: *mut c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    tagged("topocclRecvTagged", false, buf, count, datatype, peer, tag, source, comm, stream)
}

extension! {
    /// `ncclSend` with a tag.
    topocclSendTagged(
        sendbuff: *const c_void,
        count: usize,
        datatype: ncclDataType_t,
        peer: c_int,
        tag: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) = send_tagged
}
extension! {
    /// `ncclRecv` with a tag, from `peer` or from any source (`TOPOCCL_ANY_SOURCE`), writing
    /// the rank the message came from to `source` unless it is NULL.
    topocclRecvTagged(
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        peer: c_int,
        tag: c_int,
        source: *mut c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) = recv_tagged
}

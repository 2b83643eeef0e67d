//! topoccl's tagged point-to-point calls (`include/topoccl.h`): `ncclSend`/`ncclRecv` with a
//! tag, and a receive from any source that reports the rank its message came from (what
//! Gloo's and MPI's users, PyTorch's `recv(src=None)` among them, need and NCCL lacks).

use std::ffi::{c_int, c_void};

use super::coll::{transfer, Tagged};
use super::extension;
use crate::abi::*;

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
    let tagged = Tagged { tag, source: std::ptr::null_mut() };
    transfer("topocclSendTagged", true, buf, count, datatype, peer, Some(tagged), comm, stream)
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
    let tagged = Tagged { tag, source };
    transfer("topocclRecvTagged", false, buf, count, datatype, peer, Some(tagged), comm, stream)
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

#![allow(non_camel_case_types)]

//! NCCL 2.28–2.30's device API, host side. Its device communicators, load/store-accessible
//! (LSA) and multimem pointers and GPU-initiated networking (GIN) resources are GPU memory that
//! kernels address directly; without CUDA there is none, so those entry points return
//! `ncclInvalidUsage` and log why. The team arithmetic and the property query have a meaning on
//! host memory and are answered: every rank is its own LSA team (no two ranks share GPU
//! memory), so the rail team is the world.

use std::ffi::{c_int, c_uint, c_void};

use super::{export, guard};
use crate::abi::*;
use crate::error::{invalid, usage, Result};
use crate::handle;
use crate::log;
use crate::raw;

/// `ncclTeam_t`: `nRanks` ranks, this one at `rank`, world ranks `stride` apart.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ncclTeam_t {
    pub n_ranks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

/// `ncclCommProperties_t` (2.30).
#[repr(C)]
pub struct ncclCommProperties_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub rank: c_int,
    pub n_ranks: c_int,
    pub cuda_dev: c_int,
    pub nvml_dev: c_int,
    pub device_api_support: bool,
    pub multimem_support: bool,
    pub gin_type: c_int,
    pub n_lsa_teams: c_int,
    pub host_rma_support: bool,
    pub railed_gin_type: c_int,
}

/// `ncclMultimemHandle_t`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclMultimemHandle_t {
    pub mc_base_ptr: *mut c_void,
}

const NO_DEVICE_API: &str =
    "NCCL's device API needs GPU memory: topoccl was built without the `cuda` feature, so buffers are host memory";

fn unsupported(what: &str) -> Result<ncclResult_t> {
    Err(usage(format!("{what}: {NO_DEVICE_API}")))
}

fn query_properties(comm: ncclComm_t, props: *mut ncclCommProperties_t) -> ncclResult_t {
    guard("ncclCommQueryProperties", || {
        let h = handle::lookup(comm)?;
        let (rank, n) = h.identity()?;
        // SAFETY: `props` is NULL or a struct initialised with NCCL_COMM_PROPERTIES_INITIALIZER
        // (the API's contract), whose first field, `size`, says how much of it the caller has
        // (read first, alone); only that much is written.
        let size = unsafe { raw::array(props.cast::<usize>(), 1, "props") }?[0];
        let full = ncclCommProperties_t {
            size,
            magic: CONFIG_MAGIC,
            version: VERSION_CODE as c_uint,
            rank: rank as c_int,
            n_ranks: n as c_int,
            cuda_dev: -1,
            nvml_dev: -1,
            device_api_support: false,
            multimem_support: false,
            gin_type: 0,
            n_lsa_teams: n as c_int,
            host_rma_support: true,
            railed_gin_type: 0,
        };
        let header = std::mem::offset_of!(ncclCommProperties_t, rank);
        let len = size.min(std::mem::size_of::<ncclCommProperties_t>());
        if len < header {
            return Err(invalid("ncclCommProperties_t was not initialised with NCCL_COMM_PROPERTIES_INITIALIZER"));
        }
        // SAFETY: ours is valid for its size, whole.
        let ours = unsafe {
            std::slice::from_raw_parts(&full as *const ncclCommProperties_t as *const u8, std::mem::size_of_val(&full))
        };
        // SAFETY: the caller's struct has `size` >= `len` bytes (the API's contract, above); its
        // header (size, magic, version) is left as it is.
        unsafe { raw::write_bytes((props as *mut u8).add(header), &ours[header..len], "props") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn dev_comm_create(comm: ncclComm_t, _reqs: *const c_void, _out: *mut c_void) -> ncclResult_t {
    guard("ncclDevCommCreate", || {
        handle::lookup(comm)?;
        unsupported("ncclDevCommCreate")
    })
}

fn dev_comm_destroy(comm: ncclComm_t, _dev: *const c_void) -> ncclResult_t {
    guard("ncclDevCommDestroy", || {
        handle::lookup(comm)?;
        unsupported("ncclDevCommDestroy")
    })
}

fn lsa_multimem_pointer(_win: ncclWindow_t, _offset: usize, _out: *mut *mut c_void) -> ncclResult_t {
    guard("ncclGetLsaMultimemDevicePointer", || unsupported("ncclGetLsaMultimemDevicePointer"))
}

fn multimem_pointer(
    _win: ncclWindow_t,
    _offset: usize,
    _multimem: ncclMultimemHandle_t,
    _out: *mut *mut c_void,
) -> ncclResult_t {
    guard("ncclGetMultimemDevicePointer", || unsupported("ncclGetMultimemDevicePointer"))
}

fn lsa_pointer(_win: ncclWindow_t, _offset: usize, _lsa_rank: c_int, _out: *mut *mut c_void) -> ncclResult_t {
    guard("ncclGetLsaDevicePointer", || unsupported("ncclGetLsaDevicePointer"))
}

fn peer_pointer(_win: ncclWindow_t, _offset: usize, _peer: c_int, _out: *mut *mut c_void) -> ncclResult_t {
    guard("ncclGetPeerDevicePointer", || unsupported("ncclGetPeerDevicePointer"))
}

fn gin_barrier_requirement(
    _comm: ncclComm_t,
    _team: ncclTeam_t,
    _n: c_int,
    _handle: *mut c_void,
    _req: *mut c_void,
) -> ncclResult_t {
    guard("ncclGinBarrierCreateRequirement", || unsupported("ncclGinBarrierCreateRequirement"))
}

fn lsa_barrier_requirement(_team: ncclTeam_t, _n: c_int, _handle: *mut c_void, _req: *mut c_void) -> ncclResult_t {
    guard("ncclLsaBarrierCreateRequirement", || unsupported("ncclLsaBarrierCreateRequirement"))
}

fn gin_outbox_requirement(_blocks: c_int, _log2: c_int, _handle: *mut c_void, _req: *mut c_void) -> ncclResult_t {
    guard("ncclGinOutboxCreateRequirement", || unsupported("ncclGinOutboxCreateRequirement"))
}

fn gin_inbox_requirement(
    _peers: ncclTeam_t,
    _blocks: c_int,
    _log2: c_int,
    _handle: *mut c_void,
    _req: *mut c_void,
) -> ncclResult_t {
    guard("ncclGinInboxA2ACreateRequirement", || unsupported("ncclGinInboxA2ACreateRequirement"))
}

fn ll_a2a_requirement(_blocks: c_int, _slots: c_int, _handle: *mut c_void, _req: *mut c_void) -> ncclResult_t {
    guard("ncclLLA2ACreateRequirement", || unsupported("ncclLLA2ACreateRequirement"))
}

/// Slots of NCCL's low-latency all-to-all: a device-kernel resource; 0 (none) here.
fn ll_a2a_slots(_max_elts: c_int, _max_elt_size: c_int) -> c_int {
    log::warn(None, format_args!("ncclLLA2ACalcSlots: {NO_DEVICE_API}; 0 slots"));
    0
}

/// This rank and the rank count, or (0, 0) for a bad communicator (the team functions return
/// values, not result codes, as NCCL's do; the error is logged and kept for ncclGetLastError).
fn identity(name: &str, comm: ncclComm_t) -> (c_int, c_int) {
    let mut id = (0, 0);
    guard(name, || {
        let (r, n) = handle::lookup(comm)?.identity()?;
        id = (r as c_int, n as c_int);
        Ok(NCCL_SUCCESS)
    });
    id
}

fn team_world(comm: ncclComm_t) -> ncclTeam_t {
    let (rank, n) = identity("ncclTeamWorld", comm);
    ncclTeam_t { n_ranks: n, rank, stride: 1 }
}

fn team_lsa(comm: ncclComm_t) -> ncclTeam_t {
    identity("ncclTeamLsa", comm);
    ncclTeam_t { n_ranks: 1, rank: 0, stride: 1 }
}

fn team_rail(comm: ncclComm_t) -> ncclTeam_t {
    let (rank, n) = identity("ncclTeamRail", comm);
    ncclTeam_t { n_ranks: n, rank, stride: 1 }
}

/// The world rank of `rank` of `team` (NCCL's formula), or -1 outside the team.
fn team_rank_to_world(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
    let (me, _) = identity("ncclTeamRankToWorld", comm);
    if !(0..team.n_ranks).contains(&rank) {
        return -1;
    }
    me + (rank - team.rank) * team.stride
}

/// The LSA rank of `rank` of `team`: only this rank itself is load/store accessible (0).
fn team_rank_to_lsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
    if team_rank_to_world(comm, team, rank) == identity("ncclTeamRankToLsa", comm).0 {
        0
    } else {
        -1
    }
}

export! {
    /// What this communicator supports: no device API, host one-sided operations.
    ncclCommQueryProperties / pncclCommQueryProperties (comm: ncclComm_t, props: *mut ncclCommProperties_t) -> ncclResult_t = query_properties
}
export! {
    /// Device communicators need GPU memory: `ncclInvalidUsage`.
    ncclDevCommCreate / pncclDevCommCreate (comm: ncclComm_t, reqs: *const c_void, out_dev_comm: *mut c_void) -> ncclResult_t = dev_comm_create
}
export! {
    /// `ncclInvalidUsage` (no device communicators).
    ncclDevCommDestroy / pncclDevCommDestroy (comm: ncclComm_t, dev_comm: *const c_void) -> ncclResult_t = dev_comm_destroy
}
export! {
    /// `ncclInvalidUsage` (no multimem).
    ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer (window: ncclWindow_t, offset: usize, out_ptr: *mut *mut c_void) -> ncclResult_t = lsa_multimem_pointer
}
export! {
    /// `ncclInvalidUsage` (no multimem).
    ncclGetMultimemDevicePointer / pncclGetMultimemDevicePointer (window: ncclWindow_t, offset: usize, multimem: ncclMultimemHandle_t, out_ptr: *mut *mut c_void) -> ncclResult_t = multimem_pointer
}
export! {
    /// `ncclInvalidUsage` (no peer GPU memory).
    ncclGetLsaDevicePointer / pncclGetLsaDevicePointer (window: ncclWindow_t, offset: usize, lsa_rank: c_int, out_ptr: *mut *mut c_void) -> ncclResult_t = lsa_pointer
}
export! {
    /// `ncclInvalidUsage` (no peer GPU memory).
    ncclGetPeerDevicePointer / pncclGetPeerDevicePointer (window: ncclWindow_t, offset: usize, peer: c_int, out_ptr: *mut *mut c_void) -> ncclResult_t = peer_pointer
}
export! {
    /// `ncclInvalidUsage` (no GIN).
    ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement (comm: ncclComm_t, team: ncclTeam_t, n_barriers: c_int, out_handle: *mut c_void, out_req: *mut c_void) -> ncclResult_t = gin_barrier_requirement
}
export! {
    /// `ncclInvalidUsage` (no LSA barriers).
    ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement (team: ncclTeam_t, n_barriers: c_int, out_handle: *mut c_void, out_req: *mut c_void) -> ncclResult_t = lsa_barrier_requirement
}
export! {
    /// `ncclInvalidUsage` (no GIN).
    ncclGinOutboxCreateRequirement / pncclGinOutboxCreateRequirement (n_blocks: c_int, size_log2: c_int, out_handle: *mut c_void, out_req: *mut c_void) -> ncclResult_t = gin_outbox_requirement
}
export! {
    /// `ncclInvalidUsage` (no GIN).
    ncclGinInboxA2ACreateRequirement / pncclGinInboxA2ACreateRequirement (peers: ncclTeam_t, n_blocks: c_int, size_log2: c_int, out_handle: *mut c_void, out_req: *mut c_void) -> ncclResult_t = gin_inbox_requirement
}
export! {
    /// `ncclInvalidUsage` (no device kernels).
    ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement (n_blocks: c_int, n_slots: c_int, out_handle: *mut c_void, out_req: *mut c_void) -> ncclResult_t = ll_a2a_requirement
}
export! {
    /// 0: the low-latency all-to-all is a device kernel.
    ncclLLA2ACalcSlots / pncclLLA2ACalcSlots (max_elts: c_int, max_elt_size: c_int) -> c_int = ll_a2a_slots
}
export! {
    /// Every rank of the communicator.
    ncclTeamWorld / pncclTeamWorld (comm: ncclComm_t) -> ncclTeam_t = team_world
}
export! {
    /// This rank alone: no two ranks share GPU memory here.
    ncclTeamLsa / pncclTeamLsa (comm: ncclComm_t) -> ncclTeam_t = team_lsa
}
export! {
    /// The ranks at this rank's place in every LSA team: the world.
    ncclTeamRail / pncclTeamRail (comm: ncclComm_t) -> ncclTeam_t = team_rail
}
export! {
    /// A team rank's world rank (-1 outside the team).
    ncclTeamRankToWorld / pncclTeamRankToWorld (comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int = team_rank_to_world
}
export! {
    /// A team rank's LSA rank (0 for this rank, -1 otherwise).
    ncclTeamRankToLsa / pncclTeamRankToLsa (comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int = team_rank_to_lsa
}

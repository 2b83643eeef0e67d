//! Communicators made from running ones (shrink, grow), revocation, suspension and memory
//! statistics: NCCL 2.23–2.30's additions to the communicator's life.

use std::ffi::c_int;

use topoccl::{Communicator, UniqueId};

use super::{export, guard};
use crate::abi::*;
use crate::error::{invalid, usage, Error, Result};
use crate::handle::{self, Handle};
use crate::log::{self, Subsys};
use crate::raw;
use crate::settings;

fn id_from_c(id: &ncclUniqueId) -> Result<UniqueId> {
    let bytes: Vec<u8> = id.internal.iter().map(|&b| b as u8).collect();
    Ok(UniqueId::from_bytes(&bytes)?)
}

fn id_to_c(id: &UniqueId) -> ncclUniqueId {
    let mut c = ncclUniqueId { internal: [0; topoccl::comm::UNIQUE_ID_BYTES] };
    for (d, s) in c.internal.iter_mut().zip(id.to_bytes()) {
        *d = s as std::ffi::c_char;
    }
    c
}

/// Publishes a communicator made here as a new handle in `out`.
fn publish(out: *mut ncclComm_t, made: Result<Communicator>) -> Result<ncclResult_t> {
    let comm = made?;
    let h = Handle::starting(comm.rank(), comm.nranks());
    let (rank, n) = (comm.rank(), comm.nranks());
    h.finish_start(Ok(comm));
    let ptr = h.publish();
    // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
    unsafe { raw::put(out, ptr, "newcomm") }?;
    log::info(Subsys::Init, Some(rank), format_args!("comm {ptr:p} rank {rank} nranks {n} - Init COMPLETE"));
    Ok(NCCL_SUCCESS)
}

fn init_scalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    rank: c_int,
    n_id: c_int,
    ids: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    let mut first = None;
    let checked = guard("ncclCommInitRankScalable", || {
        if n_id < 1 {
            return Err(invalid(format!("nId = {n_id}: need at least one id")));
        }
        // SAFETY: `ids` is NULL or an array of `nId` ids, at least one (the API's contract).
        let first_id = unsafe { raw::array(ids, 1, "commIds") }?[0];
        if n_id > 1 {
            log::info(
                Subsys::Init,
                Some(rank.max(0) as u32),
                format_args!(
                    "ncclCommInitRankScalable: {n_id} ids; topoccl's rendezvous serves every rank from the first"
                ),
            );
        }
        first = Some(first_id);
        Ok(NCCL_SUCCESS)
    });
    match first {
        Some(id) => super::comm::init_rank_config(newcomm, nranks, id, rank, config),
        None => checked,
    }
}

fn shrink(
    comm: ncclComm_t,
    exclude: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    flags: c_int,
) -> ncclResult_t {
    guard("ncclCommShrink", || {
        let parent = handle::lookup(comm)?;
        // SAFETY: `newcomm` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(newcomm, std::ptr::null_mut(), "newcomm") }?;
        if flags != SHRINK_DEFAULT && flags != SHRINK_ABORT {
            return Err(invalid(format!("shrinkFlags {flags}: NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT")));
        }
        let n = usize::try_from(exclude_count).map_err(|_| invalid(format!("excludeRanksCount {exclude_count}")))?;
        // SAFETY: `exclude` is NULL or an array of that many ints (the API's contract).
        let list = if n == 0 { Vec::new() } else { unsafe { raw::array(exclude, n, "excludeRanksList") }? };
        let (rank, nranks) = parent.identity()?;
        let mut excluded = Vec::with_capacity(list.len());
        for r in list {
            match u32::try_from(r).ok().filter(|r| *r < nranks) {
                Some(r) => excluded.push(r),
                None => return Err(invalid(format!("excluded rank {r} is out of range for {nranks} ranks"))),
            }
        }
        // SAFETY: `config` is NULL or the caller's valid struct, used during this call only (the API's contract).
        settings::requested(unsafe { raw::get(config) })?;
        if flags == SHRINK_ABORT {
            parent.abort_calls();
        }
        log::info(
            Subsys::Init,
            Some(rank),
            format_args!("ncclCommShrink: comm {comm:p} without ranks {excluded:?} (flags {flags})"),
        );
        publish(newcomm, parent.with_comm_any(|c| Ok(c.shrink(&excluded)?)))
    })
}

fn comm_unique_id(comm: ncclComm_t, out: *mut ncclUniqueId) -> ncclResult_t {
    guard("ncclCommGetUniqueId", || {
        let h = handle::lookup(comm)?;
        h.identity()?;
        let mut pending = h.grow_id.lock().unwrap_or_else(|p| p.into_inner());
        if pending.is_some() {
            return Err(usage("an id made for a grow has not been used yet: grow first"));
        }
        let id = UniqueId::new()?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, id_to_c(&id), "uniqueId") }?;
        *pending = Some(id);
        Ok(NCCL_SUCCESS)
    })
}

fn grow(
    comm: ncclComm_t,
    nranks: c_int,
    id: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    guard("ncclCommGrow", || {
        // SAFETY: `newcomm` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(newcomm, std::ptr::null_mut(), "newcomm") }?;
        // SAFETY: `config` is NULL or the caller's valid struct, used during this call only (the API's contract).
        settings::requested(unsafe { raw::get(config) })?;
        let n = u32::try_from(nranks).ok().filter(|n| *n > 0).ok_or_else(|| invalid(format!("nRanks {nranks}")))?;
        // SAFETY: `id` is NULL or the caller's valid struct, used during this call only (the API's contract).
        let id = unsafe { raw::get(id) }.map(id_from_c).transpose()?;
        if comm.is_null() {
            // A new rank.
            let id = id.ok_or_else(|| invalid("a new rank (comm NULL) needs the unique id"))?;
            let rank = u32::try_from(rank)
                .ok()
                .filter(|r| *r < n)
                .ok_or_else(|| invalid(format!("a new rank needs its assigned rank (0 <= rank < {n}), got {rank}")))?;
            return publish(
                newcomm,
                Communicator::init_with(&id, rank, n, settings::rank_config()?).map_err(Error::from),
            );
        }
        let parent = handle::lookup(comm)?;
        if rank != -1 {
            return Err(invalid(format!("an existing rank passes rank = -1 (keeps its rank), got {rank}")));
        }
        let made = parent.with_comm(|c| Ok(c.grow(n, id.as_ref())?));
        *parent.grow_id.lock().unwrap_or_else(|p| p.into_inner()) = None;
        publish(newcomm, made)
    })
}

fn revoke(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
    guard("ncclCommRevoke", || {
        let h = handle::lookup(comm)?;
        if flags != 0 {
            return Err(invalid(format!("revokeFlags {flags}: must be NCCL_REVOKE_DEFAULT (0)")));
        }
        h.revoke();
        log::info(Subsys::Init, Some(h.rank_hint()), format_args!("comm {comm:p} revoked: calls in flight stopped"));
        Ok(NCCL_SUCCESS)
    })
}

fn suspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
    guard("ncclCommSuspend", || {
        let h = handle::lookup(comm)?;
        if flags & !SUSPEND_MEM != 0 {
            return Err(invalid(format!("flags {flags:#x}: only NCCL_SUSPEND_MEM")));
        }
        h.identity()?;
        if h.set_suspended(true) {
            return Err(usage("the communicator is suspended already"));
        }
        log::info(
            Subsys::Init,
            Some(h.rank_hint()),
            format_args!("comm {comm:p} suspended (it holds no GPU memory to release)"),
        );
        Ok(NCCL_SUCCESS)
    })
}

fn resume(comm: ncclComm_t) -> ncclResult_t {
    guard("ncclCommResume", || {
        let h = handle::lookup(comm)?;
        if !h.set_suspended(false) {
            return Err(usage("the communicator is not suspended"));
        }
        Ok(NCCL_SUCCESS)
    })
}

fn mem_stats(comm: ncclComm_t, stat: c_int, value: *mut u64) -> ncclResult_t {
    guard("ncclCommMemStats", || {
        let h = handle::lookup(comm)?;
        let v = match stat {
            // Host memory only: the communicator holds no GPU memory.
            STAT_GPU_MEM_SUSPEND | STAT_GPU_MEM_PERSIST | STAT_GPU_MEM_TOTAL => 0,
            STAT_GPU_MEM_SUSPENDED => u64::from(h.is_suspended()),
            other => return Err(invalid(format!("stat {other} is not an ncclCommMemStat_t (0..3)"))),
        };
        // SAFETY: `value` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(value, v, "value") }?;
        Ok(NCCL_SUCCESS)
    })
}

export! {
    /// `ncclCommInitRankConfig` given several ids (topoccl's rendezvous needs only the first).
    ncclCommInitRankScalable / pncclCommInitRankScalable (newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, n_id: c_int, comm_ids: *mut ncclUniqueId, config: *mut ncclConfig_t) -> ncclResult_t = init_scalable
}
export! {
    /// The communicator without the excluded ranks (which need not be alive).
    ncclCommShrink / pncclCommShrink (comm: ncclComm_t, exclude_ranks_list: *mut c_int, exclude_ranks_count: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrink_flags: c_int) -> ncclResult_t = shrink
}
export! {
    /// An id for growing this communicator (one unused at a time).
    ncclCommGetUniqueId / pncclCommGetUniqueId (comm: ncclComm_t, unique_id: *mut ncclUniqueId) -> ncclResult_t = comm_unique_id
}
export! {
    /// The communicator with new ranks added.
    ncclCommGrow / pncclCommGrow (comm: ncclComm_t, n_ranks: c_int, unique_id: *const ncclUniqueId, rank: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t = grow
}
export! {
    /// Stops every call in flight; afterwards only destroy, split and shrink.
    ncclCommRevoke / pncclCommRevoke (comm: ncclComm_t, revoke_flags: c_int) -> ncclResult_t = revoke
}
export! {
    /// Refuses calls until `ncclCommResume`.
    ncclCommSuspend / pncclCommSuspend (comm: ncclComm_t, flags: c_int) -> ncclResult_t = suspend
}
export! {
    /// Allows calls again.
    ncclCommResume / pncclCommResume (comm: ncclComm_t) -> ncclResult_t = resume
}
export! {
    /// GPU memory held (none: host memory) and whether the communicator is suspended.
    ncclCommMemStats / pncclCommMemStats (comm: ncclComm_t, stat: c_int, value: *mut u64) -> ncclResult_t = mem_stats
}

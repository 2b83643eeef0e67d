//! Creating, splitting, querying and ending communicators.

use std::ffi::c_int;
use std::sync::Arc;

use topoccl::{Communicator, UniqueId};

use super::{export, guard};
use crate::abi::*;
use crate::error::{invalid, Error, Result};
use crate::group::{self, Deferred};
use crate::handle::{self, Handle};
use crate::log::{self, Subsys};
use crate::raw;
use crate::settings;

fn unique_id(out: *mut ncclUniqueId) -> ncclResult_t {
    guard("ncclGetUniqueId", || {
        log::init();
        let id = UniqueId::new()?;
        let mut c = ncclUniqueId { internal: [0; topoccl::comm::UNIQUE_ID_BYTES] };
        for (d, s) in c.internal.iter_mut().zip(id.to_bytes()) {
            *d = s as std::ffi::c_char;
        }
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, c, "uniqueId") }?;
        log::info(Subsys::Bootstrap, None, format_args!("unique id: rendezvous at {}", id.root_addr()));
        Ok(NCCL_SUCCESS)
    })
}

fn log_ready(h: &Handle, ptr: ncclComm_t) {
    if log::info_enabled(Subsys::Init) {
        let described = h.with_comm(|c| {
            let transports: Vec<&str> = c.transports().into_iter().flatten().collect();
            Ok(format!("topology {} transports {}", c.topology().name(), transports.join(",")))
        });
        if let (Ok(what), Ok((rank, n))) = (described, h.identity()) {
            log::info(
                Subsys::Init,
                Some(rank),
                format_args!("comm {ptr:p} rank {rank} nranks {n} {what} - Init COMPLETE"),
            );
        }
    }
}

pub(super) fn init_rank_config(
    comm: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    guard("ncclCommInitRank", || {
        log::init();
        // SAFETY: `comm` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(comm, std::ptr::null_mut(), "comm") }?;
        if nranks < 1 || rank < 0 || rank >= nranks {
            return Err(invalid(format!("rank {rank} of {nranks} ranks: need 0 <= rank < nranks")));
        }
        // SAFETY: `config` is NULL or the caller's valid struct, used during this call only (the API's contract).
        let requested = settings::requested(unsafe { raw::get(config) })?;
        let core = settings::rank_config()?;
        let bytes: Vec<u8> = id.internal.iter().map(|&b| b as u8).collect();
        let id = UniqueId::from_bytes(&bytes)?;
        let (rank, nranks) = (rank as u32, nranks as u32);
        let h = Handle::starting(rank, nranks);
        let ptr = h.clone().publish();
        // SAFETY: `comm` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(comm, ptr, "comm") }?;
        log::info(Subsys::Init, Some(rank), format_args!("comm {ptr:p} rank {rank} nranks {nranks} - Init START"));
        if group::active() {
            group::push(Deferred::Init { handle: h, id, rank, nranks, config: Box::new(core) });
            return Ok(NCCL_SUCCESS);
        }
        if !requested.blocking {
            let worker = h.clone();
            let address = ptr as usize;
            std::thread::Builder::new()
                .name("topoccl-init".into())
                .spawn(move || {
                    worker.finish_start(Communicator::init_with(&id, rank, nranks, core).map_err(Error::from));
                    log_ready(&worker, address as ncclComm_t);
                })
                .map_err(|e| Error::System(format!("starting the init thread: {e}")))?;
            return Ok(NCCL_IN_PROGRESS);
        }
        match Communicator::init_with(&id, rank, nranks, core) {
            Ok(c) => {
                h.finish_start(Ok(c));
                log_ready(&h, ptr);
                Ok(NCCL_SUCCESS)
            }
            Err(e) => {
                let e = Error::from(e);
                h.finish_start(Err(e.clone()));
                let _ = handle::release(ptr);
                // SAFETY: `comm` is this entry point's out-parameter: NULL or writable (the API's contract).
                unsafe { raw::put(comm, std::ptr::null_mut(), "comm") }?;
                Err(e)
            }
        }
    })
}

fn init_rank_plain(comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int) -> ncclResult_t {
    init_rank_config(comm, nranks, id, rank, std::ptr::null_mut())
}

fn init_all(comms: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
    guard("ncclCommInitAll", || {
        log::init();
        if comms.is_null() {
            return Err(invalid("comm is NULL"));
        }
        if ndev < 1 {
            return Err(invalid(format!("ndev = {ndev}: need at least one")));
        }
        if !devlist.is_null() {
            // SAFETY: `devlist` is NULL or an array of that many ints (the API's contract).
            let devs = unsafe { raw::array(devlist, ndev as usize, "devlist") }?;
            if let Some((i, d)) = devs.iter().enumerate().find(|(_, d)| **d < 0) {
                return Err(invalid(format!("devlist[{i}] = {d}: devices are >= 0")));
            }
        }
        let config = settings::core_config()?;
        let id = UniqueId::new()?;
        let n = ndev as u32;
        // With a driver, rank i works on device devlist[i] (or i), as NCCL's do; a device may
        // repeat (several ranks on one GPU), which NCCL refuses and topoccl allows.
        let devices: Vec<u32> = match devlist.is_null() {
            true => (0..n).collect(),
            // SAFETY: `devlist` is NULL or an array of that many ints (the API's contract).
            false => unsafe { raw::array(devlist, ndev as usize, "devlist") }?.iter().map(|d| *d as u32).collect(),
        };
        let cuda = topoccl::cuda::driver().is_ok();
        let made: Vec<topoccl::Result<Communicator>> = std::thread::scope(|s| {
            let running: Vec<_> = (0..n)
                .map(|r| {
                    let id = &id;
                    let mut config = config.clone();
                    config.cuda_device = cuda.then(|| devices[r as usize]);
                    s.spawn(move || Communicator::init_with(id, r, n, config))
                })
                .collect();
            running
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|_| Err(topoccl::Error::Internal("init thread panicked".into()))))
                .collect()
        });
        let mut comms_made = Vec::with_capacity(made.len());
        for m in made {
            comms_made.push(m?);
        }
        for (i, c) in comms_made.into_iter().enumerate() {
            let h = Handle::starting(i as u32, n);
            h.finish_start(Ok(c));
            let ptr = h.clone().publish();
            // SAFETY: `comms` is non-NULL and, by the API's contract, an array of `ndev`
            // writable handles, so its `i`-th is one.
            unsafe { raw::put(comms.add(i), ptr, "comm") }?;
            log_ready(&h, ptr);
        }
        Ok(NCCL_SUCCESS)
    })
}

fn split(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    guard("ncclCommSplit", || {
        let parent = handle::lookup(comm)?;
        // SAFETY: `newcomm` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(newcomm, std::ptr::null_mut(), "newcomm") }?;
        if color < 0 && color != SPLIT_NOCOLOR {
            return Err(invalid(format!("color {color}: need >= 0 or NCCL_SPLIT_NOCOLOR")));
        }
        // SAFETY: `config` is NULL or the caller's valid struct, used during this call only (the API's contract).
        settings::requested(unsafe { raw::get(config) })?;
        let color = (color >= 0).then_some(color as u32);
        let child = color.map(|_| Handle::starting(u32::MAX, 0));
        if let Some(h) = &child {
            // SAFETY: `newcomm` is this entry point's out-parameter: NULL or writable (the API's contract).
            unsafe { raw::put(newcomm, h.clone().publish(), "newcomm") }?;
        }
        if group::active() {
            group::push(Deferred::Split { parent, child, color, key });
            return Ok(NCCL_SUCCESS);
        }
        let result = group::split(&parent, child.clone(), color, key);
        if result.is_err() {
            if let Some(h) = child {
                let _ = handle::release(Arc::as_ptr(&h) as ncclComm_t);
                // SAFETY: `newcomm` is this entry point's out-parameter: NULL or writable (the API's contract).
                unsafe { raw::put(newcomm, std::ptr::null_mut(), "newcomm") }?;
            }
        }
        result.map(|_| NCCL_SUCCESS)
    })
}

fn finalize(comm: ncclComm_t) -> ncclResult_t {
    guard("ncclCommFinalize", || {
        handle::lookup(comm)?.finalize()?;
        Ok(NCCL_SUCCESS)
    })
}

fn destroy(comm: ncclComm_t) -> ncclResult_t {
    guard("ncclCommDestroy", || {
        let h = handle::release(comm)?;
        h.close(false)?;
        log::info(Subsys::Init, Some(h.rank_hint()), format_args!("comm {comm:p} - Destroy COMPLETE"));
        // NCCL's invariant, as a debug counter for tests and users: a device call's completion
        // never waits on a driver call from another host thread (0 unless the old host-driven
        // path, TOPOCCL_DEVICE_STAGED=0, ran).
        log::info(
            Subsys::Init,
            Some(h.rank_hint()),
            format_args!(
                "driver calls by the executor while device calls were outstanding: {}",
                topoccl::cuda::foreign_driver_calls()
            ),
        );
        Ok(NCCL_SUCCESS)
    })
}

fn abort(comm: ncclComm_t) -> ncclResult_t {
    guard("ncclCommAbort", || {
        let h = handle::release(comm)?;
        h.close(true)?;
        log::info(Subsys::Init, Some(h.rank_hint()), format_args!("comm {comm:p} - Abort COMPLETE"));
        Ok(NCCL_SUCCESS)
    })
}

fn async_error(comm: ncclComm_t, out: *mut ncclResult_t) -> ncclResult_t {
    guard("ncclCommGetAsyncError", || {
        let h = handle::lookup(comm)?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, h.async_error(), "asyncError") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn count(comm: ncclComm_t, out: *mut c_int) -> ncclResult_t {
    guard("ncclCommCount", || {
        let (_, n) = handle::lookup(comm)?.identity()?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, n as c_int, "count") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn user_rank(comm: ncclComm_t, out: *mut c_int) -> ncclResult_t {
    guard("ncclCommUserRank", || {
        let (r, _) = handle::lookup(comm)?.identity()?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, r as c_int, "rank") }?;
        Ok(NCCL_SUCCESS)
    })
}

fn cu_device(comm: ncclComm_t, out: *mut c_int) -> ncclResult_t {
    guard("ncclCommCuDevice", || -> Result<ncclResult_t> {
        let h = handle::lookup(comm)?;
        if out.is_null() {
            return Err(invalid("device is NULL"));
        }
        let device = h.with_comm(|c| Ok(c.cuda_device()?))?;
        // SAFETY: `out` is this entry point's out-parameter: NULL or writable (the API's contract).
        unsafe { raw::put(out, device as c_int, "device") }?;
        Ok(NCCL_SUCCESS)
    })
}

export! {
    /// Makes the id every rank passes to `ncclCommInitRank` (starts its rendezvous service).
    ncclGetUniqueId / pncclGetUniqueId (out: *mut ncclUniqueId) -> ncclResult_t = unique_id
}
export! {
    /// Joins a communicator with settings (`blocking = 0`: returns `ncclInProgress` at once).
    ncclCommInitRankConfig / pncclCommInitRankConfig (comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) -> ncclResult_t = init_rank_config
}
export! {
    /// Joins a communicator as `rank` of `nranks`.
    ncclCommInitRank / pncclCommInitRank (comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int) -> ncclResult_t = init_rank_plain
}
export! {
    /// Creates `ndev` communicators in this process, one thread each while they connect.
    ncclCommInitAll / pncclCommInitAll (comms: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t = init_all
}
export! {
    /// Splits a communicator by color, ordered by key.
    ncclCommSplit / pncclCommSplit (comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t = split
}
export! {
    /// Completes the communicator's work; only destroy may follow.
    ncclCommFinalize / pncclCommFinalize (comm: ncclComm_t) -> ncclResult_t = finalize
}
export! {
    /// Frees a communicator.
    ncclCommDestroy / pncclCommDestroy (comm: ncclComm_t) -> ncclResult_t = destroy
}
export! {
    /// Frees a communicator at once, stopping a call running in another thread.
    ncclCommAbort / pncclCommAbort (comm: ncclComm_t) -> ncclResult_t = abort
}
export! {
    /// The communicator's asynchronous state (never waits on a running call).
    ncclCommGetAsyncError / pncclCommGetAsyncError (comm: ncclComm_t, out: *mut ncclResult_t) -> ncclResult_t = async_error
}
export! {
    /// The number of ranks.
    ncclCommCount / pncclCommCount (comm: ncclComm_t, out: *mut c_int) -> ncclResult_t = count
}
export! {
    /// The CUDA device: `ncclInvalidUsage` without CUDA.
    ncclCommCuDevice / pncclCommCuDevice (comm: ncclComm_t, out: *mut c_int) -> ncclResult_t = cu_device
}
export! {
    /// This rank.
    ncclCommUserRank / pncclCommUserRank (comm: ncclComm_t, out: *mut c_int) -> ncclResult_t = user_rank
}

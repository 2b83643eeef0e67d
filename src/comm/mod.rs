//! The communicator: a group of ranks that run collectives together.
//!
//! Creation follows NCCL: [`UniqueId::new`] on one rank, the id passed to every rank out of
//! band, then [`Communicator::init`] everywhere; or [`Communicator::from_env`] under torchrun,
//! mpirun or srun. Every call is validated once ([`CollectiveCall`]'s check), planned (the
//! tuner's schedule, its chunk layout and this rank's program, in one plan cache), and queued in
//! call order for the one executor, which the communicator's progress thread or a waiting
//! caller runs ([`Work`]). The typed and byte-level calls are blocking (queued, then waited for);
//! [`Communicator::submit`] and the `*_async` calls return a [`Work`] at once.
//!
//! Failure is never silent: a call that stops progressing fails after `TOPOCCL_TIMEOUT`, a
//! peer that dies fails the call at once, ranks that call different things get a
//! [`Error::Mismatch`] naming both calls, and after any such error the communicator closes its
//! connections (so the failure reaches every rank quickly) and refuses further calls.
//!
//! ```no_run
//! use topoccl::{Communicator, ReduceOp};
//! // Under torchrun/mpirun/srun, or with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set:
//! let mut comm = Communicator::from_env()?;
//! let send = vec![comm.rank() as f32; 1024];
//! let mut recv = vec![0f32; 1024];
//! comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
//! # Ok::<(), topoccl::Error>(())
//! ```

pub(crate) mod agree;
pub(crate) mod bootstrap;
mod bytes;
mod config;
mod connect;
#[cfg(feature = "cuda")]
mod device;
mod group;
mod netif;
pub(crate) mod plan;
mod rdma;
mod resident;
mod resize;
mod staged;
mod stream;
mod submit;
mod typed;
pub(crate) mod work;

use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use topoccl_synth::hash::fnv64;
use topoccl_synth::sim::SimConfig;
use topoccl_synth::topology::Topology;

pub use crate::call::CollectiveCall;
use bootstrap::PeerInfo;
pub use bootstrap::{UniqueId, UNIQUE_ID_BYTES};
pub use config::{Config, TransportPolicy};
use connect::Auth;
pub use group::{Group, Lane, Source};
pub use rdma::port as rdma_port;
pub use submit::Pending;
pub use work::Work;

use crate::diag::{Board, Identity};
use crate::error::{Error, Result};
use crate::exec::{Executor, Settings};
use crate::tuner::cache::DiskCache;
use crate::tuner::{Selector, SelectorOptions};
use plan::Planner;
use work::Runner;

/// Stops a communicator's running call from another thread.
#[derive(Clone, Debug)]
pub struct AbortHandle(Arc<AtomicBool>);

impl AbortHandle {
    /// The running (or next) call fails with [`Error::Aborted`] within milliseconds; the
    /// communicator then closes its connections, so its peers fail too.
    pub fn abort(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Whether a communicator has failed, readable from any thread ([`Communicator::health`]).
#[derive(Clone)]
pub struct Health(Arc<Runner>);

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").finish_non_exhaustive()
    }
}

impl Health {
    /// The error that broke the communicator, if one did.
    pub fn failure(&self) -> Option<Error> {
        self.0.failure()
    }
}

/// A group of ranks that communicate. See the module documentation. Calls take `&self`: a
/// communicator may be shared between threads, its calls running in the order they were made.
pub struct Communicator {
    rank: u32,
    nranks: u32,
    peers: Vec<PeerInfo>,
    auth: Auth,
    config: Config,
    topology: Topology,
    transports: Vec<Option<&'static str>>,
    /// The CUDA IPC transport, when this rank's table has one (its counters).
    /// The CUDA IPC and RDMA verbs transports this communicator connected with, for their
    /// counters.
    counted: connect::Counted,
    /// Where calls are checked, planned and numbered; held while a call is admitted to the
    /// queue, so the queue's order is the call order.
    calls: Mutex<CallState>,
    runner: Arc<Runner>,
    progress: Option<JoinHandle<()>>,
    /// The listening socket the peers dialled (its address is in their `peers`), kept open so
    /// that a shrink can connect the survivors without a working data path (`resize.rs`).
    listener: Mutex<Option<TcpListener>>,
}

/// What calls are checked, planned and numbered with, under one lock: the tuner and plans, the
/// collective call sequence, the device binding.
struct CallState {
    planner: Planner,
    /// When the ranks next agree on switching sizes to the tuner's background decisions.
    checkpoints: agree::Checkpoints,
    /// Collective calls so far (identical on every rank when they agree).
    seq: u32,
    splits: u32,
    /// The CUDA context and completion word of calls on streams, once bound.
    binding: Option<Arc<crate::cuda::Binding>>,
    /// Device-resident calls' links, where every rank reaches every other by CUDA IPC.
    resident: Option<resident::ResidentSide>,
    /// The stream and ticket of the last device call queued on a stream (device-resident or
    /// staged): a call on another stream waits for it, as calls share the workspaces and slots.
    device_last: Option<(crate::cuda::StreamRef, u32)>,
    /// Another rank of this communicator may share this rank's CUDA context (same process, same
    /// or unknown device): its staged calls then wait for their output on the caller's thread,
    /// not on the stream (`staged`).
    shares_context: bool,
    /// Device calls (collectives and groups) staged so far.
    staged: u64,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator").field("rank", &self.rank).field("nranks", &self.nranks).finish_non_exhaustive()
    }
}

fn comm_id(parts: &[&[u8]]) -> [u8; 16] {
    let joined: Vec<u8> = parts.concat();
    let mut id = [0u8; 16];
    for (i, word) in id.chunks_exact_mut(8).enumerate() {
        let mut salted = joined.clone();
        salted.push(i as u8);
        word.copy_from_slice(&fnv64(&salted).to_le_bytes());
    }
    id
}

/// The address this rank advertises: the interface the user named, else the local address
/// that routes toward `toward`.
fn advertised_ip(toward: SocketAddr) -> Result<IpAddr> {
    if let Some(filter) = netif::interface_filter() {
        return netif::interface_ip(Some(&filter))
            .ok_or_else(|| Error::Bootstrap(format!("no up IPv4 interface matches TOPOCCL_SOCKET_IFNAME={filter}")));
    }
    if toward.ip().is_loopback() {
        return Ok(toward.ip());
    }
    // Connecting a UDP socket sends nothing; it only asks the kernel for the route.
    let probe = UdpSocket::bind(SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0))
        .and_then(|s| s.connect(toward).and_then(|_| s.local_addr()));
    match probe {
        Ok(a) if !a.ip().is_unspecified() => Ok(a.ip()),
        _ => netif::interface_ip(None).ok_or_else(|| Error::Bootstrap("no usable network interface".into())),
    }
}

/// The cost model of topoccl's own executor, which the tuner prices with and `collbench
/// --compare-sim` predicts with: one CPU thread per rank posting messages one at a time, and
/// one connection per peer (a shared link is split by rank pair) whose messages leave one
/// after another from a send queue of at most `max_backlog` bytes.
pub fn runtime_sim_config(config: &Config) -> SimConfig {
    SimConfig {
        rank_message_us: config.tuner_message_us,
        pair_sharing: true,
        pair_queue_bytes: Some(config.max_backlog as f64),
        // TCP and shared memory have one path per peer.
        follow_paths: false,
        ..SimConfig::default()
    }
}

fn data_listener(ip: IpAddr) -> Result<(TcpListener, SocketAddr)> {
    let any = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);
    let l = TcpListener::bind(any).map_err(|e| Error::io("opening the data listener", e))?;
    let port = l.local_addr().map_err(|e| Error::io("data listener address", e))?.port();
    Ok((l, SocketAddr::new(ip, port)))
}

impl Communicator {
    /// Joins the communicator `id` names as `rank` of `nranks` (`ncclCommInitRank`). Blocks
    /// until every rank has joined, or fails after `TOPOCCL_TIMEOUT` naming who is missing.
    pub fn init(id: &UniqueId, rank: u32, nranks: u32) -> Result<Communicator> {
        Communicator::init_with(id, rank, nranks, Config::from_env()?)
    }

    /// [`Communicator::init`] with explicit settings instead of the environment's.
    pub fn init_with(id: &UniqueId, rank: u32, nranks: u32, config: Config) -> Result<Communicator> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::InvalidArgument(format!("rank {rank} is out of range for {nranks} ranks")));
        }
        let deadline = Instant::now() + config.timeout;
        let (listener, addr) = data_listener(advertised_ip(id.root_addr())?)?;
        let device = crate::cuda::device_at_init(config.cuda_device);
        let rdma = rdma::transport(&config, connect::nic_choice(device))?.is_some();
        let me = PeerInfo {
            addr,
            host: netif::host_id(),
            watch_port: crate::diag::service::port()?,
            pid: std::process::id(),
            device,
            rdma,
        };
        // Before the rendezvous: binding loads the device's kernels, which may wait for all of
        // the context's work, and no call of this communicator may be waiting by then.
        let binding = device_binding(&config)?;
        let peers = bootstrap::rendezvous(id, rank, nranks, me, deadline)?;
        let auth = Auth { secret: id.secret(), comm_id: comm_id(&[&id.to_bytes()]) };
        Communicator::connect(rank, peers, listener, auth, config, binding, deadline)
    }

    /// Joins the job the launcher started: torchrun (`RANK`, `WORLD_SIZE`), mpirun
    /// (`OMPI_COMM_WORLD_RANK`/`SIZE`, `PMI_RANK`/`SIZE`) or srun (`SLURM_PROCID`,
    /// `SLURM_NTASKS`), meeting at `TOPOCCL_ROOT=host:port` or `MASTER_ADDR`:`MASTER_PORT`,
    /// where rank 0 runs the rendezvous.
    pub fn from_env() -> Result<Communicator> {
        Communicator::from_env_with(Config::from_env()?)
    }

    /// [`Communicator::from_env`] with explicit settings.
    pub fn from_env_with(config: Config) -> Result<Communicator> {
        let job = crate::env::LaunchEnv::detect()?;
        let id = if job.rank == 0 {
            UniqueId::serve(job.root, job.secret, config.timeout)?
        } else {
            UniqueId::remote(job.root, job.secret)
        };
        Communicator::init_with(&id, job.rank, job.size, config)
    }

    fn connect(
        rank: u32,
        peers: Vec<PeerInfo>,
        listener: TcpListener,
        auth: Auth,
        config: Config,
        binding: Option<Arc<crate::cuda::Binding>>,
        deadline: Instant,
    ) -> Result<Communicator> {
        let nranks = peers.len() as u32;
        let (links, counted) = connect::connect_all(rank, &peers, &listener, auth, &config, deadline)?;
        let local = peers.iter().filter(|p| p.host == peers[rank as usize].host).count();
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let host_model = if local == nranks as usize {
            format!("host:{nranks}")
        } else if nranks <= 64 {
            format!("full:{nranks}")
        } else {
            format!("ring:{nranks}")
        };
        // `detect` asks NVML, falling back to the host model where it cannot.
        let (spec, topology) = crate::detect::resolve_setting(config.topology.as_deref(), &host_model)?;
        if topology.nranks() != nranks as usize {
            return Err(Error::InvalidArgument(format!(
                "TOPOCCL_TOPOLOGY={spec} has {} ranks, the communicator {nranks}",
                topology.nranks()
            )));
        }
        let options = SelectorOptions {
            forced: config.algo.clone(),
            sim: runtime_sim_config(&config),
            cache: DiskCache::from_env(),
            background: config.tune_background,
            background_delay: config.tune_delay,
        };
        let tuner = Selector::new(topology.clone(), options)?;
        let settings = Settings::new(config.slice_bytes, config.max_backlog, config.timeout, local > cores);
        let device_peers: Vec<_> = links.iter().map(|l| l.as_ref().and_then(|c| c.device_peer())).collect();
        let mut exec = Executor::new(rank, links, settings, Arc::new(AtomicBool::new(false)));
        let board = Board::new(Identity {
            rank,
            secret: auth.secret,
            comm_id: auth.comm_id,
            watch: peers.iter().map(PeerInfo::watch_addr).collect(),
            answer_within: crate::diag::answer_within(config.timeout),
        });
        crate::diag::service::register(&board)?;
        exec.board = Some(board);
        let transports = exec.transports();
        let runner = Runner::new(exec);
        let progress_runner = runner.clone();
        let progress = std::thread::Builder::new()
            .name(format!("topoccl-r{rank}"))
            .spawn(move || progress_runner.progress_loop())
            .map_err(|e| Error::io("starting the progress thread", e))?;
        let calls = CallState {
            planner: Planner::new(rank, nranks, tuner),
            checkpoints: agree::Checkpoints::default(),
            seq: 0,
            splits: 0,
            binding,
            resident: None,
            device_last: None,
            shares_context: shares_context(rank, &peers),
            staged: 0,
        };
        // Whether any rank brought a device to init (what the rendezvous told every rank
        // alike, so all or none of them wait below).
        let device = peers.iter().any(|p| p.device.is_some());
        let comm = Communicator {
            rank,
            nranks,
            peers,
            auth,
            config,
            topology,
            transports,
            counted,
            calls: Mutex::new(calls),
            runner,
            progress: Some(progress),
            listener: Mutex::new(Some(listener)),
        };
        if device {
            // As NCCL's init, return only once every rank has connected: a rank still making
            // its device resources (CUDA IPC streams) would wait, on a GPU, for another rank
            // thread of this process sitting in a blocking copy that waits for a first call
            // needing this rank (`crate::cuda::Binding` says why). The same all-reduce agrees
            // on whether calls may run device-resident: only if every rank reaches every other
            // by CUDA IPC, so that all ranks of a call take the same path.
            let side = if comm.config.device_resident {
                resident::ResidentSide::new(rank, device_peers, comm.config.device_ll)
            } else {
                None
            };
            // And on whether small calls may run as one kernel: a rank's own links may allow it
            // where another rank's do not (a pair sharing a device that this rank is not in).
            let mut all = [u8::from(side.is_some()), u8::from(side.as_ref().is_some_and(|s| s.ll))];
            comm.all_reduce_in_place(&mut all, crate::ReduceOp::Min)?;
            if all[0] == 1 {
                comm.calls().resident = side.map(|mut s| {
                    s.ll = all[1] == 1;
                    s
                });
            }
        }
        Ok(comm)
    }

    fn calls(&self) -> MutexGuard<'_, CallState> {
        // Every critical section leaves `CallState` consistent, so a poisoned lock is usable.
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The transport to each rank (`None` for this rank): `tcp`, `shm`, or a user's.
    pub fn transports(&self) -> Vec<Option<&'static str>> {
        self.transports.clone()
    }

    /// What the CUDA IPC connections have done so far (device messages through windows and
    /// straight into offered buffers, registrations): `None` when this rank has no CUDA IPC
    /// transport.
    pub fn ipc_counts(&self) -> Option<topoccl_transports::ipc::IpcCounts> {
        self.counted.ipc.as_ref().map(|t| t.counts())
    }

    /// What this communicator's RDMA verbs connections have done so far (messages through the
    /// peers' rings and written straight into offered buffers, offers; registrations are the
    /// port's, shared by the process's communicators): `None` when it has no verbs transport.
    pub fn verbs_counts(&self) -> Option<topoccl_transports::verbs::VerbsCounts> {
        self.counted.verbs.as_ref().map(|t| t.counts())
    }

    /// A handle that aborts this communicator's calls from another thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.runner.abort.clone())
    }

    /// The error that made the communicator unusable, if any (`ncclCommGetAsyncError`).
    pub fn error(&self) -> Option<String> {
        self.runner.broken()
    }

    /// A handle that reads whether the communicator has failed, from any thread, without
    /// waiting for a running call (a failure of a call queued on a stream shows only there).
    pub fn health(&self) -> Health {
        Health(self.runner.clone())
    }

    /// Waits until every call queued so far has completed on the host (`ncclCommFinalize`);
    /// the error that broke the communicator, if one did.
    pub fn flush(&self) -> Result<()> {
        self.runner.flush();
        match self.runner.failure() {
            Some(e) => Err(Error::Broken(e.to_string())),
            None => Ok(()),
        }
    }

    /// Splits into sub-communicators (`ncclCommSplit`): ranks passing the same `color` form
    /// one, ordered by `key` then by rank here; `None` takes part but joins none. Every rank
    /// must call it.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        self.usable()?;
        let deadline = Instant::now() + self.config.timeout;
        let ip = self.peers[self.rank as usize].addr.ip();
        let (listener, addr) = data_listener(ip)?;
        let mut record = Vec::with_capacity(SPLIT_RECORD);
        record.extend_from_slice(&color.unwrap_or(u32::MAX).to_le_bytes());
        record.extend_from_slice(&key.to_le_bytes());
        let mine = self.peers[self.rank as usize];
        bootstrap::encode_peer(&PeerInfo { addr, ..mine }, &mut record);
        record.resize(SPLIT_RECORD, 0);
        let binding = if color.is_some() { device_binding(&self.config)? } else { None };
        let mut all = vec![0u8; SPLIT_RECORD * self.nranks as usize];
        self.all_gather(&record, &mut all)?;
        let split_no = {
            let mut calls = self.calls();
            calls.splits += 1;
            calls.splits - 1
        };
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i32, u32, PeerInfo)> = all
            .chunks_exact(SPLIT_RECORD)
            .enumerate()
            .filter(|(_, r)| r[..4] == color.to_le_bytes())
            .map(|(r, rec)| {
                let key = i32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
                (key, r as u32, bootstrap::decode_peer(&rec[8..8 + bootstrap::PEER_BYTES]))
            })
            .collect();
        members.sort_by_key(|&(key, r, _)| (key, r));
        let new_rank = members.iter().position(|m| m.1 == self.rank).unwrap_or(0) as u32;
        let peers = members.into_iter().map(|m| m.2).collect();
        let id = comm_id(&[&self.auth.comm_id, &split_no.to_le_bytes(), &color.to_le_bytes()]);
        let auth = Auth { secret: self.auth.secret, comm_id: id };
        Communicator::connect(new_rank, peers, listener, auth, self.config.clone(), binding, deadline).map(Some)
    }

    /// Ends the communicator at once (`ncclCommAbort`): the running call fails with
    /// [`Error::Aborted`] within milliseconds, queued ones fail without running, and the
    /// connections close, so peers see this rank gone and fail their calls.
    pub fn abort(mut self) {
        self.shutdown(true);
    }

    /// Releases the communicator (`ncclCommDestroy`) once every queued call has completed;
    /// connections are closed. The error that broke it, if one did.
    pub fn destroy(mut self) -> Result<()> {
        self.runner.flush();
        let broken = self.runner.broken();
        self.shutdown(false);
        match broken {
            Some(why) => Err(Error::Broken(why)),
            None => Ok(()),
        }
    }

    /// Stops the progress thread (aborting what runs or waits, with `abort`) and closes the
    /// connections.
    fn shutdown(&mut self, abort: bool) {
        let Some(progress) = self.progress.take() else { return };
        if abort {
            self.runner.abort.store(true, Ordering::Relaxed);
            self.runner.drain(|| Error::Aborted);
        }
        self.runner.close();
        // The thread ends once the queue is empty; a running call ends within the deadline
        // (or at once, aborted).
        let _ = progress.join();
        self.runner.with_executor(|e| e.close_links());
    }

    fn usable(&self) -> Result<()> {
        match self.runner.unusable() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Forces an algorithm for later calls (`None` or `auto`: the tuner's choice), as
    /// `TOPOCCL_ALGO` does at start-up. Every rank must make the same choice before its next
    /// call (calls with different schedules are reported as mismatched). An algorithm that
    /// cannot build a collective leaves that collective to the tuner.
    pub fn set_algorithm(&mut self, algo: Option<&str>) -> Result<()> {
        let mut calls = self.calls();
        calls.planner.tuner.set_forced(algo)?;
        let forced = calls.planner.tuner.forced().map(str::to_string);
        calls.planner.clear();
        drop(calls);
        self.config.algo = forced;
        Ok(())
    }

    /// Adds a user tuner (see [`crate::tuner::Tuner`]); every rank must add the same one.
    pub fn add_tuner(&mut self, tuner: Box<dyn crate::tuner::Tuner>) -> Result<()> {
        let mut calls = self.calls();
        calls.planner.tuner.add_tuner(tuner)?;
        calls.planner.clear();
        Ok(())
    }

    /// The topology the tuner reasons about (`TOPOCCL_TOPOLOGY`, else `host:N` for ranks of
    /// one host, `full:N` across hosts).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }
}

/// Whether another of `peers` may share `rank`'s CUDA context: one in the same process whose
/// device is the same, or where either is not known yet.
fn shares_context(rank: u32, peers: &[bootstrap::PeerInfo]) -> bool {
    let me = &peers[rank as usize];
    peers.iter().enumerate().any(|(r, p)| {
        r as u32 != rank
            && p.host == me.host
            && p.pid == me.pid
            && (p.device.is_none() || me.device.is_none() || p.device == me.device)
    })
}

/// The device binding [`Config::cuda_device`] asks for at init (`None`: the first call on a
/// stream binds to the stream's context).
fn device_binding(config: &Config) -> Result<Option<Arc<crate::cuda::Binding>>> {
    match config.cuda_device {
        Some(d) => Ok(Some(crate::cuda::Binding::new(crate::cuda::Context::primary(d)?)?)),
        None => Ok(None),
    }
}

/// Color, key, the rank's entry.
const SPLIT_RECORD: usize = 8 + bootstrap::PEER_BYTES;

impl Drop for Communicator {
    /// Without [`Communicator::destroy`]: calls still queued or running are aborted (nothing
    /// waits on a peer that may never come), then the connections close.
    fn drop(&mut self) {
        let busy = self.runner.busy();
        self.shutdown(busy);
    }
}

//! # topoccl-transports
//!
//! Moving bytes between two ranks, and nothing else: this crate knows no collective, schedule
//! or topology (it must never depend on `topoccl-synth`). The executor in the core crate talks
//! to every backend through one small trait, [`Connection`]:
//!
//! - `send` queues a message (a tag, a 24-byte opaque `meta` the executor uses for its checks,
//!   and a [`Region`] of payload) and returns at once with a [`Ticket`]. Sends are **eager**: a
//!   send never waits for the matching receive. The payload is read from where the caller has
//!   it, now or as the connection drains (`sent(ticket)` says when the memory is free again),
//!   never copied into a pending buffer when large.
//! - `progress` moves bytes both ways without blocking. Arriving messages are drained into
//!   pooled buffers, so a sender never waits on a receiver that is busy elsewhere (this is what
//!   makes every deadlock-free schedule of the IR deadlock-free on the wire). The one exception
//!   saves a copy: shared memory leaves a large message where it lies in the ring while the
//!   ring has room, and moves it out as soon as the ring fills up.
//! - `recv_with(tag, f)` hands the next complete message of a tag (messages of one tag stay in
//!   order) to a closure, in place where the backend can.
//! - `offer(tag, dst)` is the one-sided half: the receiver exposes where the next message of a
//!   tag should land, and a backend that can write the receiver's memory puts the payload
//!   there and signals (shared memory with cross-memory attach, CUDA IPC through
//!   [`registration`]s, RDMA verbs where the ports register memory on demand).
//!   Others ignore it: TCP keeps two-sided messages underneath the same interface.
//! - `backlog` says how many bytes wait to be handed over, so the executor can apply
//!   back-pressure; `wait_fds`/`needs_spin` tell it how to sleep when nothing moves.
//!
//! Backends mirror one shape (as Gloo's `transport/tcp` and `transport/ibverbs` do): [`tcp`]
//! sockets, and [`shm`] rings in shared memory, each ring a window the receiver exposes and the
//! sender writes into (with head and tail counters as the signals), under one framing layer. A
//! [`Transport`] turns the TCP streams the bootstrap opened to a peer into a [`Connection`] when
//! it [can connect](Transport::can_connect) the two; the [`TransportTable`] asks the registered
//! ones in order (NCCL's `canConnect` table) and may wrap every connection ([`fault`] injects
//! faults that way). [`ipc`] (CUDA IPC, device buffers GPU to GPU within a host) plugs in there
//! ahead of shared memory; [`verbs`] (RDMA, across hosts) ahead of TCP. Tags with bits 29 or 31 set are the backends'
//! own (the executor's stay below).
//! [`TRANSPORT_API_VERSION`] is bumped on incompatible changes, as NCCL versions its net
//! plugins.

pub mod error;
pub mod fault;
mod framing;
pub mod ipc;
// The fuzz harnesses (fuzz/): compiled only by cargo-fuzz, never into the library.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod memory;
mod numbered;
mod pool;
pub mod registration;
pub mod shm;
pub mod table;
pub mod tcp;
pub mod verbs;
pub mod wait;

use std::net::TcpStream;
use std::os::fd::RawFd;
use std::time::Duration;

pub use error::{Error, Result};
pub use memory::{MemSpace, Region};
pub use table::{ConnectionWrapper, TransportTable};

/// Version of the [`Transport`] and [`Connection`] interfaces.
pub const TRANSPORT_API_VERSION: u32 = 5;

/// Bytes of per-message metadata carried for the user of the connection.
pub const META_BYTES: usize = 24;

/// Opaque per-message metadata (the executor stores the collective's sequence number, kind,
/// datatype, count and root there, to detect mismatched calls).
pub type Meta = [u8; META_BYTES];

/// Largest payload of one message (the executor slices larger transfers).
pub const MAX_MESSAGE_BYTES: usize = u32::MAX as usize;

/// A received message, as the framing layer queues it until a receive takes it.
#[derive(Debug)]
pub struct Message {
    pub tag: u32,
    pub meta: Meta,
    pub data: Vec<u8>,
}

/// A file descriptor to wait on, and whether writability is of interest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitFd {
    pub fd: RawFd,
    pub write: bool,
}

/// Names one send until it no longer needs its memory ([`Connection::sent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(pub u64);

impl Ticket {
    /// A send whose memory was free again when `send` returned.
    pub const DONE: Ticket = Ticket(u64::MAX);
}

/// A point-to-point connection to one peer. See the crate documentation for the semantics.
pub trait Connection: Send {
    /// The backend's name (`tcp`, `shm`).
    fn transport(&self) -> &'static str;
    /// Whether the connection reads and writes memory of `space` itself: sends from it (the
    /// executor stages other memory through host memory) and offers into it.
    fn reaches(&self, space: MemSpace) -> bool {
        space == MemSpace::Host
    }
    /// Whether a send of `data` under `tag`, made after `ahead` more sends of the tag that the
    /// caller has yet to hand over, reads `data` itself (else the caller stages it through host
    /// memory): where the connection [reaches](Connection::reaches) its memory; a backend that
    /// reads some memory only for some sends (RDMA verbs: device memory straight into the
    /// peer's offer) answers for this one, and a yes holds until that send.
    fn sends_from(&mut self, _tag: u32, data: Region, _ahead: u32) -> bool {
        self.reaches(data.space)
    }
    /// Whether [`Connection::offer`] can take memory of `space` (where [`Connection::one_sided`]).
    /// A backend may write memory it does not send from: RDMA verbs receives into device memory
    /// through dma-buf while its sends read host memory.
    fn offers_into(&self, space: MemSpace) -> bool {
        self.reaches(space)
    }
    /// Queues one message and returns at once; never blocks. Fails if the peer has gone.
    ///
    /// # Safety
    /// `data` must be memory the connection [reaches](Connection::reaches) (or said it sends
    /// from, [`Connection::sends_from`], for this send), valid for reads,
    /// and left unchanged until [`Connection::sent`] says so for the returned ticket (or the
    /// connection is closed or dropped).
    unsafe fn send(&mut self, tag: u32, meta: &Meta, data: Region) -> Result<Ticket>;
    /// Whether the send `ticket` names is done with its memory.
    fn sent(&self, ticket: Ticket) -> bool;
    /// Bytes accepted by `send` but not yet handed to the kernel or the peer's memory.
    fn backlog(&self) -> usize;
    /// Moves bytes without blocking; true when anything moved. A peer that closes is recorded
    /// (see [`Connection::closed`]), not reported here: it may have closed after sending all
    /// this side still needs.
    fn progress(&mut self) -> Result<bool>;
    /// Hands the next complete message of `tag` to `f`, where it lies (host memory, valid for
    /// the call), and consumes it; false when none has arrived.
    fn recv_with(&mut self, tag: u32, f: &mut dyn FnMut(&Meta, Region)) -> Result<bool>;
    /// Offers `dst` as where the next message of `tag` to arrive may be put: a backend that
    /// can write this rank's memory from the peer's side (one-sided: shared memory with
    /// cross-memory attach for host memory, CUDA IPC for device memory through a
    /// [`registration`](mod@crate::registration); RDMA verbs) tells the peer, which then writes the
    /// payload straight there and signals; the message then comes through
    /// [`Connection::recv_with`] as `dst` itself, already written. Other backends ignore it,
    /// and an offer the peer sees too late goes unused (the message comes the usual way).
    ///
    /// # Safety
    /// `dst` must be valid memory the connection [offers into](Connection::offers_into), of exactly the
    /// message's length to be used, that nothing else — this rank's asynchronous device work
    /// included — reads or writes until that message has been received or the connection is
    /// closed (closing revokes every offer before it returns).
    unsafe fn offer(&mut self, _tag: u32, _dst: Region) -> Result<()> {
        Ok(())
    }
    /// Whether a message [`Connection::recv_with`] hands over stays lent after the callback
    /// returns, until [`Connection::release`]: device memory the receiver's asynchronous
    /// operations still read (CUDA IPC). Then every message received must be released, in the
    /// order received, once nothing reads it any more.
    fn lends(&self) -> bool {
        false
    }
    /// Gives back the oldest message still lent (see [`Connection::lends`]).
    fn release(&mut self) {}
    /// Whether [`Connection::offer`] can do anything on this connection (the executor skips
    /// the call otherwise).
    fn one_sided(&self) -> bool {
        false
    }
    /// The backlog at which the executor should hold further sends back, if the connection
    /// wants a lower one than the executor's own: shared memory holds back as soon as anything
    /// waits, since each byte that waits costs a copy more than one written to the ring.
    fn backlog_limit(&self) -> Option<usize> {
        None
    }
    /// Why the peer is gone, once it is.
    fn closed(&self) -> Option<&str>;
    /// What the pair lends to device-resident calls, where it lends anything (CUDA IPC: see
    /// [`ipc::resident`]). Asked once, when the communicator is made.
    fn device_peer(&self) -> Option<std::sync::Arc<ipc::DevicePeer>> {
        None
    }
    /// Descriptors whose readiness means this connection may progress.
    fn wait_fds(&self, out: &mut Vec<WaitFd>);
    /// True when progress can come without any descriptor becoming ready (shared memory):
    /// the waiter must poll rather than sleep in `poll(2)` indefinitely.
    fn needs_spin(&self) -> bool;
    /// Shuts the connection down; the peer sees it closed. Memory of sends not yet done is no
    /// longer read once this returns.
    fn close(&mut self);
}

/// Where a rank runs, as backends judge whether they can reach it (NCCL's peer info: the host,
/// the process, the GPU it drives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Locality {
    /// The host's identity (equal on ranks of one host, across containers sharing its kernel).
    pub host: u64,
    /// The rank's process id (on its host).
    pub pid: u32,
    /// The GPU the rank drives, if it drives one.
    pub device: Option<ipc::DeviceId>,
    /// Whether the rank has an RDMA port it can talk through (the verbs transport loaded).
    pub rdma: bool,
}

impl Locality {
    /// A rank on `host` that drives no GPU (in an unnamed process).
    pub fn host(host: u64) -> Locality {
        Locality { host, pid: 0, device: None, rdma: false }
    }
}

/// What the bootstrap hands a [`Transport`] to build a connection to one peer.
#[derive(Debug)]
pub struct PeerSetup {
    /// Connected TCP streams to the peer, already authenticated. The first is the control
    /// stream; a TCP connection uses all of them, shared memory only for set-up and liveness.
    pub streams: Vec<TcpStream>,
    /// True on exactly one side of the pair (the lower rank): that side creates shared state.
    pub creator: bool,
    /// The peer's rank, and a label for error messages (`rank 3`).
    pub rank: u32,
    pub peer: String,
    /// Deadline for the set-up handshake.
    pub timeout: Duration,
}

/// How a [`Transport::connect`] ended.
pub enum Connected {
    Connection(Box<dyn Connection>),
    /// Both sides found during set-up that this backend cannot serve the pair after all (the
    /// peer could not map shared memory, say): the streams go to the next backend in the table.
    Declined {
        setup: PeerSetup,
        why: String,
    },
}

/// A backend: builds connections. Versioned by [`Transport::api_version`].
pub trait Transport: Send + Sync {
    fn api_version(&self) -> u32 {
        TRANSPORT_API_VERSION
    }
    fn name(&self) -> &'static str;
    /// Whether this backend can connect a rank at `me` to one at `peer` (NCCL's
    /// `canConnect`). Both ranks of a pair ask, with the roles swapped, and must agree.
    fn can_connect(&self, me: &Locality, peer: &Locality) -> bool;
    /// TCP streams the bootstrap opens for the set-up (at least one).
    fn streams(&self) -> usize {
        1
    }
    fn connect(&self, setup: PeerSetup) -> Result<Connected>;
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Payloads kept alive for a whole test, so that connections may read them after `send`
    /// returns. Declare it before the connections: it is then dropped after them.
    #[derive(Default)]
    pub(crate) struct Kept(Vec<Vec<u8>>);

    impl Kept {
        pub(crate) fn send(&mut self, c: &mut dyn Connection, tag: u32, meta: &Meta, data: &[u8]) -> Result<Ticket> {
            let v = data.to_vec();
            let r = Region::of(&v);
            // Moving the Vec into the list does not move its heap block.
            self.0.push(v);
            // SAFETY: the bytes live in `self` until the end of the test, unchanged.
            unsafe { c.send(tag, meta, r) }
        }
    }

    /// The next message of `tag`, copied.
    pub(crate) fn recv(c: &mut dyn Connection, tag: u32) -> Option<Message> {
        let mut got = None;
        c.recv_with(tag, &mut |meta, data| {
            got = Some(Message { tag, meta: *meta, data: bytes(data) });
        })
        .expect("recv");
        got
    }

    /// The bytes a `recv_with` callback was handed.
    pub(crate) fn bytes(r: Region) -> Vec<u8> {
        // SAFETY: `recv_with` hands over host memory valid for the callback, where this runs.
        unsafe { r.bytes() }.to_vec()
    }
}

//! Grouped point-to-point calls (`ncclGroupStart` … `ncclGroupEnd`): the sends and receives
//! of a group run together, so exchanges that would deadlock one by one (two ranks both
//! sending first) complete. As in NCCL, a rank may send to itself within a group: the send
//! pairs, in order, with a receive from itself, and is a local copy.

use super::work::Work;
use super::{CallState, Communicator};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::exec::job::{Job, Transfer, TransferJob};
use crate::exec::p2p::{send_recv_tag, ANY_SOURCE, MAX_TAG};
use crate::exec::program::PUT_TAG;
use crate::types::{Dtype, Element, ReduceOp, Reduction};
use crate::wire::{reduction_code, CallHeader, Called};

/// Which stream of point-to-point messages a group's transfers use. Each is matched in order
/// per pair of ranks, and the two never mix, so one-sided puts (received when the target asks
/// for them) cannot pair with a send/recv the program makes meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lane {
    #[default]
    SendRecv,
    Put,
}

/// The rank a receive takes its message from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This one.
    Rank(u32),
    /// Whichever other rank's message of the receive's tag comes first (MPI's
    /// `MPI_ANY_SOURCE`, Gloo's `recvFromAny`); the receive says which ([`Group::recv_tagged`]).
    Any,
}

/// One call of the group, checked.
#[derive(Debug, Clone, Copy)]
struct P2p {
    send: bool,
    /// [`ANY_SOURCE`] for a receive from any source.
    peer: u32,
    /// The user's tag (0: untagged).
    tag: u32,
    dtype: Dtype,
    count: usize,
    buf: Buffer,
    /// Where the receive writes its source rank.
    source: Option<usize>,
}

/// Sends and receives collected until [`Group::end`] runs them all.
///
/// ```no_run
/// # fn f(comm: &mut topoccl::Communicator) -> topoccl::Result<()> {
/// let (n, r) = (comm.nranks(), comm.rank());
/// let mine = vec![r as i64; 8];
/// let mut theirs = vec![0i64; 8];
/// let mut g = comm.group();
/// g.send(&mine, (r + 1) % n)?;
/// g.recv(&mut theirs, (r + n - 1) % n)?;
/// g.end()?;
/// # Ok(()) }
/// ```
pub struct Group<'c, 'b> {
    comm: &'c Communicator,
    lane: Lane,
    ops: Vec<P2p>,
    _buffers: std::marker::PhantomData<&'b mut [u8]>,
}

impl Communicator {
    /// Starts a group of point-to-point calls.
    pub fn group<'b>(&self) -> Group<'_, 'b> {
        self.group_on(Lane::SendRecv)
    }

    /// Starts a group of point-to-point calls on `lane`.
    pub fn group_on<'b>(&self, lane: Lane) -> Group<'_, 'b> {
        Group { comm: self, lane, ops: Vec::new(), _buffers: std::marker::PhantomData }
    }
}

impl<'c, 'b> Group<'c, 'b> {
    /// The communicator the group belongs to.
    pub(super) fn comm(&self) -> &'c Communicator {
        self.comm
    }

    fn push(&mut self, send: bool, buf: Buffer, dtype: Dtype, count: usize, peer: u32) -> Result<()> {
        self.push_tagged(P2p { send, peer, tag: 0, dtype, count, buf, source: None })
    }

    fn push_tagged(&mut self, op: P2p) -> Result<()> {
        let P2p { send, peer, tag, dtype, count, buf, .. } = op;
        let n = self.comm.nranks;
        // Any source: a receive's only.
        let any_source = peer == ANY_SOURCE && !send;
        if peer >= n && !any_source {
            return Err(Error::InvalidArgument(format!("peer {peer} is out of range for {n} ranks")));
        }
        if tag > MAX_TAG {
            return Err(Error::InvalidArgument(format!("tag {tag} is above the largest, {MAX_TAG}")));
        }
        if (tag != 0 || peer == ANY_SOURCE) && self.lane != Lane::SendRecv {
            return Err(Error::InvalidArgument("only send/recv calls take tags or receive from any source".into()));
        }
        let bytes = count
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::InvalidArgument(format!("count {count} overflows the address space")))?;
        if bytes > 0 && buf.is_null() {
            let what = if send { "send" } else { "receive" };
            return Err(Error::InvalidArgument(format!("the {what} buffer is NULL")));
        }
        if buf.region(bytes).end().is_none() {
            return Err(Error::InvalidArgument(format!("a buffer of {bytes} bytes runs past the address space")));
        }
        self.ops.push(op);
        Ok(())
    }

    pub fn send<T: Element>(&mut self, data: &'b [T], peer: u32) -> Result<()> {
        self.push(true, Buffer::host(data.as_ptr()), T::DTYPE, data.len(), peer)
    }

    pub fn recv<T: Element>(&mut self, data: &'b mut [T], peer: u32) -> Result<()> {
        self.push(false, Buffer::host(data.as_mut_ptr()), T::DTYPE, data.len(), peer)
    }

    /// Sends `data` tagged `tag` (at most [`MAX_TAG`]): only a receive of the same tag takes
    /// it. Messages of one tag between two ranks match in order; of different tags, in any.
    pub fn send_tagged<T: Element>(&mut self, data: &'b [T], peer: u32, tag: u32) -> Result<()> {
        let buf = Buffer::host(data.as_ptr());
        self.push_tagged(P2p { send: true, peer, tag, dtype: T::DTYPE, count: data.len(), buf, source: None })
    }

    /// Receives into `data` a message tagged `tag` from `from`, and writes the rank it came
    /// from to `source` once the group has ended (the only way to learn it for
    /// [`Source::Any`]).
    pub fn recv_tagged<T: Element>(
        &mut self,
        data: &'b mut [T],
        from: Source,
        tag: u32,
        source: Option<&'b mut u32>,
    ) -> Result<()> {
        let buf = Buffer::host(data.as_mut_ptr());
        let source = source.map(|s| s as *mut u32 as usize);
        let peer = from.peer();
        self.push_tagged(P2p { send: false, peer, tag, dtype: T::DTYPE, count: data.len(), buf, source })
    }

    /// Sends `data`, `dtype` elements as bytes (the byte-level twin of [`Group::send`]).
    pub fn send_bytes(&mut self, data: &'b [u8], dtype: Dtype, peer: u32) -> Result<()> {
        let count = whole_elements(data.len(), dtype)?;
        self.push(true, Buffer::host(data.as_ptr()), dtype, count, peer)
    }

    /// Receives into `data`, `dtype` elements as bytes.
    pub fn recv_bytes(&mut self, data: &'b mut [u8], dtype: Dtype, peer: u32) -> Result<()> {
        let count = whole_elements(data.len(), dtype)?;
        self.push(false, Buffer::host(data.as_mut_ptr()), dtype, count, peer)
    }

    /// Sends `count` elements at `buf` (NCCL's `ncclSend`).
    ///
    /// # Safety
    /// `buf` must be valid for reads of `count` elements, and nothing may write it until the
    /// group has ended.
    pub unsafe fn send_raw(&mut self, buf: Buffer, dtype: Dtype, count: usize, peer: u32) -> Result<()> {
        self.push(true, buf, dtype, count, peer)
    }

    /// Receives `count` elements into `buf` (NCCL's `ncclRecv`).
    ///
    /// # Safety
    /// `buf` must be valid for writes of `count` elements, and nothing else may use it until
    /// the group has ended; receive buffers of one group must not overlap.
    pub unsafe fn recv_raw(&mut self, buf: Buffer, dtype: Dtype, count: usize, peer: u32) -> Result<()> {
        self.push(false, buf, dtype, count, peer)
    }

    /// Sends `count` elements at `buf` tagged `tag` ([`Group::send_tagged`]).
    ///
    /// # Safety
    /// As for [`Group::send_raw`].
    pub unsafe fn send_raw_tagged(
        &mut self,
        buf: Buffer,
        dtype: Dtype,
        count: usize,
        peer: u32,
        tag: u32,
    ) -> Result<()> {
        self.push_tagged(P2p { send: true, peer, tag, dtype, count, buf, source: None })
    }

    /// Receives `count` elements into `buf` tagged `tag` from `from`, writing the rank they
    /// came from to `source` unless it is NULL ([`Group::recv_tagged`]).
    ///
    /// # Safety
    /// As for [`Group::recv_raw`]; `source`, unless NULL, must be valid for writes of a `u32`
    /// (on the host) until the group's transfers have completed.
    pub unsafe fn recv_raw_tagged(
        &mut self,
        buf: Buffer,
        dtype: Dtype,
        count: usize,
        from: Source,
        tag: u32,
        source: *mut u32,
    ) -> Result<()> {
        let source = (!source.is_null()).then_some(source as usize);
        self.push_tagged(P2p { send: false, peer: from.peer(), tag, dtype, count, buf, source })
    }

    /// Runs every collected transfer; returns when all are done.
    pub fn end(self) -> Result<()> {
        let comm = self.comm;
        let mut calls = comm.calls();
        match self.prepare(&mut calls)? {
            Some(job) => comm.runner.run_blocking(calls, job.into()),
            None => Ok(()),
        }
    }

    /// Queues every collected transfer and returns at once; the [`Work`] says when they are
    /// done (`ncclGroupEnd` with a stream).
    ///
    /// # Safety
    /// Every buffer of the group must stay valid (and receive buffers unused by anything else)
    /// until the work has completed, not only until this returns.
    pub unsafe fn submit(self) -> Result<Work> {
        let comm = self.comm;
        let mut calls = comm.calls();
        Ok(match self.prepare(&mut calls)? {
            Some(job) => comm.runner.submit(job.into()),
            None => Work::done(&comm.runner),
        })
    }

    /// Checks the group and makes its job, under the `CallState` lock (`calls`), which the caller
    /// holds until the job is admitted so the queue's order is the call order. (The executor
    /// numbers the messages as they run: see [`crate::exec::p2p`].)
    pub(super) fn prepare(self, _calls: &mut CallState) -> Result<Option<Job>> {
        let Group { comm, ops, lane, .. } = self;
        comm.usable()?;
        if ops.is_empty() {
            return Ok(None);
        }
        let me = comm.rank;
        let own = |send: bool| ops.iter().filter(move |o| o.peer == me && o.send == send);
        let (sends, recvs) = (own(true).count(), own(false).count());
        if sends != recvs {
            return Err(Error::InvalidArgument(format!(
                "{sends} sends to this rank itself but {recvs} receives from it in one group: each needs its partner"
            )));
        }
        for (s, r) in own(true).zip(own(false)) {
            if s.count != r.count || s.dtype != r.dtype || s.tag != r.tag {
                return Err(Error::InvalidArgument(format!(
                    "a send of {} × {} tagged {} to this rank itself met a receive of {} × {} tagged {} (they pair in order)",
                    s.count, s.dtype, s.tag, r.count, r.dtype, r.tag
                )));
            }
        }
        if comm.nranks == 1 && ops.iter().any(|o| o.peer == ANY_SOURCE) {
            return Err(Error::InvalidArgument(
                "a receive from any source on a communicator of one rank: no other rank can send it a message".into(),
            ));
        }
        // A receive from any source must not race a receive from a given rank for one message.
        let any_tags = ops.iter().filter(|o| o.peer == ANY_SOURCE).map(|o| o.tag);
        for tag in any_tags {
            if ops.iter().any(|o| !o.send && o.peer != ANY_SOURCE && o.tag == tag) {
                return Err(Error::InvalidArgument(format!(
                    "a receive from any source and a receive from one rank share tag {tag} in one group: which \
                     message each takes would be a race"
                )));
            }
        }
        let transfers = ops
            .iter()
            .map(|o| Transfer {
                send: o.send,
                peer: o.peer,
                region: o.buf.region(o.count * o.dtype.size()),
                header: CallHeader {
                    seq: 0,
                    called: Called::SendRecv,
                    dtype: o.dtype,
                    op: reduction_code(Reduction::Op(ReduceOp::Sum)),
                    count: o.count as u64,
                    schedule: 0,
                },
                tag: match lane {
                    Lane::SendRecv => send_recv_tag(o.tag),
                    Lane::Put => PUT_TAG,
                },
                source: o.source,
            })
            .collect();
        // The buffers are the caller's, valid (and, to receive into, exclusive) until the
        // transfers complete: borrowed for `'b` by the safe methods, which wait; promised by
        // the callers of the raw ones and of `submit`.
        Ok(Some(Job::Transfers(TransferJob { transfers, sync: None })))
    }
}

impl Source {
    fn peer(self) -> u32 {
        match self {
            Source::Rank(r) => r,
            Source::Any => ANY_SOURCE,
        }
    }
}

fn whole_elements(bytes: usize, dtype: Dtype) -> Result<usize> {
    if bytes % dtype.size() != 0 {
        return Err(Error::InvalidArgument(format!("{bytes} bytes are not whole {} elements", dtype.name())));
    }
    Ok(bytes / dtype.size())
}

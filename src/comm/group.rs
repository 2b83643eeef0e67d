//! Grouped point-to-point calls (`ncclGroupStart` … `ncclGroupEnd`): the sends and receives
//! of a group run together, so exchanges that would deadlock one by one (two ranks both
//! sending first) complete. As in NCCL, a rank may send to itself within a group: the send
//! pairs, in order, with a receive from itself, and is a local copy.

use super::work::Work;
use super::{CallState, Communicator};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::exec::job::{Job, Transfer, TransferJob};
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

/// One call of the group, checked.
#[derive(Debug, Clone, Copy)]
struct P2p {
    send: bool,
    peer: u32,
    dtype: Dtype,
    count: usize,
    buf: Buffer,
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
        let n = self.comm.nranks;
        if peer >= n {
            return Err(Error::InvalidArgument(format!("peer {peer} is out of range for {n} ranks")));
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
        self.ops.push(P2p { send, peer, dtype, count, buf });
        Ok(())
    }

    pub fn send<T: Element>(&mut self, data: &'b [T], peer: u32) -> Result<()> {
        self.push(true, Buffer::host(data.as_ptr()), T::DTYPE, data.len(), peer)
    }

    pub fn recv<T: Element>(&mut self, data: &'b mut [T], peer: u32) -> Result<()> {
        self.push(false, Buffer::host(data.as_mut_ptr()), T::DTYPE, data.len(), peer)
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

    /// Checks the group and numbers its transfers, under the `CallState` lock (`calls`), which the
    /// caller holds until the job is admitted so the queue's order is the call order.
    pub(super) fn prepare(self, calls: &mut CallState) -> Result<Option<Job>> {
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
            if s.count != r.count || s.dtype != r.dtype {
                return Err(Error::InvalidArgument(format!(
                    "a send of {} × {} to this rank itself met a receive of {} × {}",
                    s.count, s.dtype, r.count, r.dtype
                )));
            }
        }
        let CallState { p2p_sent, p2p_received, put_sent, put_received, .. } = calls;
        let (sent, received, tag) = match lane {
            Lane::SendRecv => (p2p_sent, p2p_received, crate::exec::program::P2P_TAG),
            Lane::Put => (put_sent, put_received, crate::exec::program::PUT_TAG),
        };
        let transfers = ops
            .iter()
            .map(|o| {
                let counter = if o.send { &mut sent[o.peer as usize] } else { &mut received[o.peer as usize] };
                let header = CallHeader {
                    seq: *counter,
                    called: Called::SendRecv,
                    dtype: o.dtype,
                    op: reduction_code(Reduction::Op(ReduceOp::Sum)),
                    count: o.count as u64,
                    schedule: 0,
                };
                if o.peer != me {
                    *counter = counter.wrapping_add(1);
                }
                Transfer {
                    send: o.send,
                    peer: o.peer,
                    region: o.buf.region(o.count * o.dtype.size()),
                    meta: header.encode(),
                    tag,
                }
            })
            .collect();
        // The buffers are the caller's, valid (and, to receive into, exclusive) until the
        // transfers complete: borrowed for `'b` by the safe methods, which wait; promised by
        // the callers of the raw ones and of `submit`.
        Ok(Some(Job::Transfers(TransferJob { transfers, sync: None })))
    }
}

fn whole_elements(bytes: usize, dtype: Dtype) -> Result<usize> {
    if bytes % dtype.size() != 0 {
        return Err(Error::InvalidArgument(format!("{bytes} bytes are not whole {} elements", dtype.name())));
    }
    Ok(bytes / dtype.size())
}

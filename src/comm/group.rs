//! Grouped point-to-point calls (`ncclGroupStart` … `ncclGroupEnd`): the sends and receives
//! of a group run together, so exchanges that would deadlock one by one (two ranks both
//! sending first) complete.

use super::Communicator;
use crate::error::{Error, Result};
use crate::exec::engine::{self, RunConfig};
use crate::exec::memory::{MemId, Memory, Span};
use crate::exec::program::Program;
use crate::exec::wire::{CallHeader, CallKind};
use crate::types::{DataType, Dtype, ReduceOp};

enum Transfer<'b> {
    Send(&'b [u8]),
    Recv(&'b mut [u8]),
}

struct P2p<'b> {
    peer: u32,
    dtype: Dtype,
    count: usize,
    data: Transfer<'b>,
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
    comm: &'c mut Communicator,
    ops: Vec<P2p<'b>>,
}

impl Communicator {
    /// Starts a group of point-to-point calls.
    pub fn group<'b>(&mut self) -> Group<'_, 'b> {
        Group { comm: self, ops: Vec::new() }
    }
}

impl<'b> Group<'_, 'b> {
    fn check_peer(&self, peer: u32) -> Result<()> {
        if peer >= self.comm.nranks || peer == self.comm.rank {
            return Err(Error::InvalidArgument(format!(
                "peer {peer} is not another rank of this {}-rank communicator",
                self.comm.nranks
            )));
        }
        Ok(())
    }

    pub fn send<T: DataType>(&mut self, data: &'b [T], peer: u32) -> Result<()> {
        self.check_peer(peer)?;
        let d = Transfer::Send(bytemuck::cast_slice(data));
        self.ops.push(P2p { peer, dtype: T::DTYPE, count: data.len(), data: d });
        Ok(())
    }

    pub fn recv<T: DataType>(&mut self, data: &'b mut [T], peer: u32) -> Result<()> {
        self.check_peer(peer)?;
        let count = data.len();
        self.ops.push(P2p { peer, dtype: T::DTYPE, count, data: Transfer::Recv(bytemuck::cast_slice_mut(data)) });
        Ok(())
    }

    /// Sends `data`, `dtype` elements as bytes (the byte-level twin of [`Group::send`]).
    pub fn send_bytes(&mut self, data: &'b [u8], dtype: Dtype, peer: u32) -> Result<()> {
        self.check_peer(peer)?;
        let count = whole_elements(data.len(), dtype)?;
        self.ops.push(P2p { peer, dtype, count, data: Transfer::Send(data) });
        Ok(())
    }

    /// Receives into `data`, `dtype` elements as bytes.
    pub fn recv_bytes(&mut self, data: &'b mut [u8], dtype: Dtype, peer: u32) -> Result<()> {
        self.check_peer(peer)?;
        let count = whole_elements(data.len(), dtype)?;
        self.ops.push(P2p { peer, dtype, count, data: Transfer::Recv(data) });
        Ok(())
    }

    /// Runs every collected transfer; returns when all are done.
    pub fn end(self) -> Result<()> {
        let Group { comm, ops } = self;
        comm.usable()?;
        if ops.is_empty() {
            return Ok(());
        }
        let mut prog = Program::default();
        let mut mem = Memory::new();
        let mut sent = comm.p2p_sent.clone();
        let mut received = comm.p2p_received.clone();
        for (i, op) in ops.into_iter().enumerate() {
            let id =
                MemId::try_from(3 + i).map_err(|_| Error::InvalidArgument("too many calls in one group".into()))?;
            let counter = match op.data {
                Transfer::Send(_) => &mut sent[op.peer as usize],
                Transfer::Recv(_) => &mut received[op.peer as usize],
            };
            let header = CallHeader {
                seq: *counter,
                kind: CallKind::SendRecv,
                dtype: op.dtype,
                op: ReduceOp::Sum,
                root: 0,
                count: op.count as u64,
                schedule: 0,
            };
            *counter = counter.wrapping_add(1);
            let (is_send, len) = match op.data {
                Transfer::Send(d) => {
                    mem.readable(id, d);
                    (true, d.len())
                }
                Transfer::Recv(d) => {
                    let len = d.len();
                    mem.writable(id, d);
                    (false, len)
                }
            };
            prog.add_p2p(is_send, op.peer, Span::new(id, 0, len), header.encode());
        }
        let cfg = RunConfig {
            rank: comm.rank,
            dtype: Dtype::Uint8,
            op: ReduceOp::Sum,
            slice_bytes: comm.config.slice_bytes,
            max_backlog: comm.config.max_backlog,
            timeout: comm.config.timeout,
            abort: &comm.abort,
            call: None,
            oversubscribed: comm.oversubscribed,
        };
        let result = engine::run(&prog, &mut mem, &mut comm.links, &cfg, &mut comm.slice_tmp);
        match result {
            Ok(()) => {
                comm.p2p_sent = sent;
                comm.p2p_received = received;
                Ok(())
            }
            Err(e) => Err(comm.fail(e)),
        }
    }
}

fn whole_elements(bytes: usize, dtype: Dtype) -> Result<usize> {
    if bytes % dtype.size() != 0 {
        return Err(Error::InvalidArgument(format!("{bytes} bytes are not whole {} elements", dtype.name())));
    }
    Ok(bytes / dtype.size())
}

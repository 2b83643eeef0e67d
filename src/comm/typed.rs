//! The typed API: slices of any [`Element`], checked lengths, NCCL's semantics.
//!
//! ```
//! use topoccl::{Communicator, ReduceOp, UniqueId};
//! // Four ranks as threads of one process, each with its own communicator.
//! let id = UniqueId::new()?;
//! let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let ranks: Vec<_> = (0..4u32)
//!         .map(|r| {
//!             let id = id.clone();
//!             s.spawn(move || {
//!                 let mut comm = Communicator::init(&id, r, 4)?;
//!                 let mut data = vec![r as f32 + 1.0; 3];
//!                 comm.all_reduce_in_place(&mut data, ReduceOp::Sum)?;
//!                 Ok::<_, topoccl::Error>(data)
//!             })
//!         })
//!         .collect();
//!     ranks.into_iter().map(|h| h.join().unwrap_or(Err(topoccl::Error::Internal("a rank panicked".into())))).collect::<Result<_, _>>()
//! })?;
//! assert!(sums.iter().all(|v| v == &[10.0; 3]));
//! # Ok::<(), topoccl::Error>(())
//! ```

use topoccl_synth::schedule::Collective;

use super::Communicator;
use crate::call::CollectiveCall;
use crate::error::Result;
use crate::types::{Element, ReduceOp};

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

fn call<T: Element>(collective: Collective, op: ReduceOp, count: usize) -> CollectiveCall {
    CollectiveCall::new(collective, T::DTYPE, count).reduced_with(op)
}

impl Communicator {
    /// `recv[i] = Σ over ranks of send[i]` (with `op` for Σ). Equal lengths.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let c = call::<T>(Collective::AllReduce, op, send.len());
        self.collective_bytes(&c, bytes(send), bytes_mut(recv))
    }

    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let c = call::<T>(Collective::AllReduce, op, buf.len());
        self.collective_bytes_in_place(&c, bytes_mut(buf))
    }

    /// Rank r receives block r of the reduction: `send.len() == nranks × recv.len()`.
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let c = call::<T>(Collective::ReduceScatter, op, recv.len());
        self.collective_bytes(&c, bytes(send), bytes_mut(recv))
    }

    /// In place: rank r's result lands in block r of `buf` (NCCL's in-place layout).
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.block_len(buf.len())?;
        self.collective_bytes_in_place(&call::<T>(Collective::ReduceScatter, op, count), bytes_mut(buf))
    }

    /// `recv` is every rank's `send`, in rank order: `recv.len() == nranks × send.len()`.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let c = call::<T>(Collective::AllGather, ReduceOp::Sum, send.len());
        self.collective_bytes(&c, bytes(send), bytes_mut(recv))
    }

    /// In place: each rank's contribution is already in its block of `buf`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.block_len(buf.len())?;
        self.collective_bytes_in_place(&call::<T>(Collective::AllGather, ReduceOp::Sum, count), bytes_mut(buf))
    }

    /// `recv = root's send`. `send` is read on the root only (pass `&[]` elsewhere).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<()> {
        let c = call::<T>(Collective::Broadcast { root }, ReduceOp::Sum, recv.len());
        self.collective_bytes(&c, bytes(send), bytes_mut(recv))
    }

    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: u32) -> Result<()> {
        let c = call::<T>(Collective::Broadcast { root }, ReduceOp::Sum, buf.len());
        self.collective_bytes_in_place(&c, bytes_mut(buf))
    }

    /// The root's `recv` gets the reduction; `recv` is written on the root only (pass
    /// `&mut []` elsewhere).
    pub fn reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp, root: u32) -> Result<()> {
        let c = call::<T>(Collective::Reduce { root }, op, send.len());
        self.collective_bytes(&c, bytes(send), bytes_mut(recv))
    }

    pub fn reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: u32) -> Result<()> {
        let c = call::<T>(Collective::Reduce { root }, op, buf.len());
        self.collective_bytes_in_place(&c, bytes_mut(buf))
    }

    /// Block j of `send` goes to rank j, landing in block `rank` there:
    /// `send.len() == recv.len() == nranks × block`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = self.block_len(send.len())?;
        let c = call::<T>(Collective::AllToAll, ReduceOp::Sum, count);
        self.collective_bytes(&c, bytes(send), bytes_mut(recv))
    }

    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.block_len(buf.len())?;
        self.collective_bytes_in_place(&call::<T>(Collective::AllToAll, ReduceOp::Sum, count), bytes_mut(buf))
    }

    /// Sends `data` to `peer`, which must call [`Communicator::recv`] with as many elements.
    pub fn send<T: Element>(&self, data: &[T], peer: u32) -> Result<()> {
        let mut g = self.group();
        g.send(data, peer)?;
        g.end()
    }

    pub fn recv<T: Element>(&self, data: &mut [T], peer: u32) -> Result<()> {
        let mut g = self.group();
        g.recv(data, peer)?;
        g.end()
    }

    /// Receives into `data` the first message tagged `tag` that any other rank sends
    /// ([`Group::send_tagged`](super::Group::send_tagged)); the rank it came from.
    pub fn recv_from_any<T: Element>(&self, data: &mut [T], tag: u32) -> Result<u32> {
        let mut source = u32::MAX;
        let mut g = self.group();
        g.recv_tagged(data, super::Source::Any, tag, Some(&mut source))?;
        g.end()?;
        Ok(source)
    }

    fn block_len(&self, len: usize) -> Result<usize> {
        let n = self.nranks as usize;
        if len % n != 0 {
            return Err(crate::Error::InvalidArgument(format!(
                "a buffer of {len} elements does not split into {n} equal blocks"
            )));
        }
        Ok(len / n)
    }
}

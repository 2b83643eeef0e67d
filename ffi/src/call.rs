//! Running what the C API asks for on a communicator: collectives, and batches of
//! point-to-point transfers (a group's, or a lone call's). The core checks everything about a
//! call (counts, roots, NULL buffers where they are used, in-place and overlapping buffers);
//! this layer only carries the caller's pointers to it.
//!
//! A call given a stream, or device buffers, is NCCL's kind: queued and ordered by the stream
//! (the legacy default stream for NULL), returning at once. A call on host buffers with a NULL
//! stream has completed when it returns (or when its group ends).

use topoccl::cuda::StreamRef;
use topoccl::{Buffer, CollectiveCall, Dtype, MemSpace, Source};

use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::log::{self, Subsys};

/// One collective call, the caller's buffers and its stream.
#[derive(Clone, Copy)]
pub struct CollectiveArgs {
    pub call: CollectiveCall,
    pub send: Buffer,
    pub recv: Buffer,
    pub stream: StreamRef,
}

/// One send (`send`) or receive, and its stream.
#[derive(Clone, Copy)]
pub struct TransferArgs {
    pub send: bool,
    pub buf: Buffer,
    pub dtype: Dtype,
    pub count: usize,
    /// The peer; a receive's may be any ([`Source::Any`]), through topoccl.h only.
    pub peer: Source,
    /// The message's tag (0: untagged, NCCL's only kind).
    pub tag: u32,
    /// Where a receive writes its source rank (a host `int`; 0: nowhere).
    pub source: usize,
    pub stream: StreamRef,
}

/// Whether a call is ordered by its stream (see the module documentation).
fn on_stream(stream: StreamRef, buffers: &[Buffer]) -> bool {
    stream != StreamRef::LEGACY || buffers.iter().any(|b| !b.is_null() && b.space != MemSpace::Host)
}

impl CollectiveArgs {
    pub fn on_stream(&self) -> bool {
        on_stream(self.stream, &[self.send, self.recv])
    }
}

impl TransferArgs {
    /// An untagged send or receive with `peer` (NCCL's).
    pub fn plain(send: bool, buf: Buffer, dtype: Dtype, count: usize, peer: u32, stream: StreamRef) -> TransferArgs {
        TransferArgs { send, buf, dtype, count, peer: Source::Rank(peer), tag: 0, source: 0, stream }
    }

    pub fn on_stream(&self) -> bool {
        on_stream(self.stream, &[self.buf])
    }
}

/// Runs a collective: to completion, or queued on its stream.
pub fn run_collective(h: &Handle, c: &CollectiveArgs) -> Result<()> {
    h.with_comm(|comm| {
        if log::info_enabled(Subsys::Tuning) && c.call.count > 0 {
            if let Ok(choice) = comm.algorithm_for(&c.call) {
                let bytes = c.call.count.saturating_mul(c.call.dtype.size());
                log::info(
                    Subsys::Tuning,
                    Some(comm.rank()),
                    format_args!("{} {bytes} bytes: {choice}", c.call.collective),
                );
            }
        }
        if c.on_stream() {
            // SAFETY: the buffers are the caller's, valid as the call implies until the stream
            // has passed it (NCCL's contract); the stream is the caller's.
            return unsafe { comm.submit_on(&c.call, c.send, c.recv, c.stream) }.map(drop).map_err(Into::into);
        }
        // SAFETY: the buffers are the caller's, valid as the call implies until it returns
        // (NCCL's contract for a call on host memory without a stream).
        unsafe { comm.collective_raw(&c.call, c.send, c.recv) }.map_err(Into::into)
    })
}

/// Runs sends and receives together (a lone `ncclSend`/`ncclRecv`, as a group of one).
pub fn run_transfers(h: &Handle, transfers: &[TransferArgs]) -> Result<()> {
    for w in submit_all(h, transfers, &[])? {
        finish(h, &w)?;
    }
    Ok(())
}

/// Queues a communicator's share of a group: its sends and receives as one batch, then its
/// collectives in call order. The works to wait for ([`finish`]): those not ordered by a
/// stream.
pub fn submit_all(
    h: &Handle,
    transfers: &[TransferArgs],
    collectives: &[CollectiveArgs],
) -> Result<Vec<topoccl::Work>> {
    h.with_comm(|comm| {
        let mut works = Vec::with_capacity(collectives.len() + 1);
        let mut streams = transfers.iter().filter(|t| t.on_stream()).map(|t| t.stream);
        let stream = streams.next();
        if let Some(s) = stream {
            if streams.any(|o| o != s) {
                return Err(crate::error::usage(
                    "the sends and receives of one communicator in a group use several streams; topoccl runs them as \
                     one batch on one stream",
                ));
            }
        }
        // Everything that can refuse a call is asked before anything is queued: a bad call
        // fails the group whole.
        for s in stream.into_iter().chain(collectives.iter().filter(|c| c.on_stream()).map(|c| c.stream)) {
            comm.check_stream(s)?;
        }
        for c in collectives {
            comm.check_call(&c.call, c.send, c.recv)?;
        }
        if !transfers.is_empty() {
            let mut group = comm.group();
            for t in transfers {
                // SAFETY: the caller's buffers, valid until the group's end returns (NCCL's
                // contract), which waits for these works first.
                unsafe {
                    match (t.send, t.peer) {
                        (true, Source::Rank(peer)) => group.send_raw_tagged(t.buf, t.dtype, t.count, peer, t.tag)?,
                        (true, Source::Any) => return Err(crate::error::invalid("a send needs a peer")),
                        // The source too, unless NULL: the caller's `int`, valid as the buffer is.
                        (false, from) => {
                            group.recv_raw_tagged(t.buf, t.dtype, t.count, from, t.tag, t.source as *mut u32)?
                        }
                    }
                }
            }
            match stream {
                // SAFETY: as above, until the stream has passed the transfers.
                Some(s) => drop(unsafe { group.submit_on(s)? }),
                // SAFETY: as above.
                None => works.push(unsafe { group.submit()? }),
            }
        }
        for c in collectives {
            if c.on_stream() {
                // SAFETY: as above, until the stream has passed the call.
                drop(unsafe { comm.submit_on(&c.call, c.send, c.recv, c.stream)? });
            } else {
                // SAFETY: as above.
                works.push(unsafe { comm.submit(&c.call, c.send, c.recv)? });
            }
        }
        Ok(works)
    })
}

/// Waits for a queued work; a failure that broke the communicator becomes its asynchronous
/// error.
pub fn finish(h: &Handle, w: &topoccl::Work) -> Result<()> {
    let r = w.wait().map_err(Error::from);
    if let Err(e) = &r {
        h.note_failure(e.code());
    }
    r
}

//! Running what the C API asks for on a communicator: collectives, and batches of
//! point-to-point transfers (a group's, or a lone call's). The core checks everything about a
//! call (counts, roots, NULL buffers where they are used, in-place and overlapping buffers);
//! this layer only carries the caller's pointers to it.

use topoccl::{Buffer, CollectiveCall, Dtype};

use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::log::{self, Subsys};

/// One collective call and the caller's buffers.
#[derive(Clone, Copy)]
pub struct Collective {
    pub call: CollectiveCall,
    pub send: Buffer,
    pub recv: Buffer,
}

/// One send (`send`) or receive.
#[derive(Clone, Copy)]
pub struct Transfer {
    pub send: bool,
    pub buf: Buffer,
    pub dtype: Dtype,
    pub count: usize,
    pub peer: u32,
}

/// Runs a collective to completion.
pub fn run_collective(h: &Handle, c: &Collective) -> Result<()> {
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
        // SAFETY: the buffers are the caller's, valid as the call implies until it returns
        // (NCCL's contract for every collective).
        unsafe { comm.collective_raw(&c.call, c.send, c.recv) }.map_err(Into::into)
    })
}

/// Runs sends and receives together (a lone `ncclSend`/`ncclRecv`, as a group of one).
pub fn run_transfers(h: &Handle, transfers: &[Transfer]) -> Result<()> {
    for w in submit_all(h, transfers, &[])? {
        finish(h, &w)?;
    }
    Ok(())
}

/// Queues a communicator's share of a group: its sends and receives as one batch, then its
/// collectives in call order. The works to wait for ([`finish`]).
pub fn submit_all(h: &Handle, transfers: &[Transfer], collectives: &[Collective]) -> Result<Vec<topoccl::Work>> {
    h.with_comm(|comm| {
        let mut works = Vec::with_capacity(collectives.len() + 1);
        if !transfers.is_empty() {
            let mut group = comm.group();
            for t in transfers {
                // SAFETY: the caller's buffers, valid until the group's end returns (NCCL's
                // contract), which waits for these works first.
                unsafe {
                    if t.send {
                        group.send_raw(t.buf, t.dtype, t.count, t.peer)?;
                    } else {
                        group.recv_raw(t.buf, t.dtype, t.count, t.peer)?;
                    }
                }
            }
            // SAFETY: as above.
            works.push(unsafe { group.submit()? });
        }
        for c in collectives {
            // SAFETY: as above.
            works.push(unsafe { comm.submit(&c.call, c.send, c.recv)? });
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

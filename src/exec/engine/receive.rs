//! The receiving half of a step: taking a slice's message from its peer (for a receive from
//! any source, from whichever peer's came first) and using it where the transport holds it.

use topoccl_transports::{MemSpace, Meta, Region};

use super::{check, link, spans, transport_error, Run};
use crate::error::{Error, Result};
use crate::exec::p2p::ANY_SOURCE;
use crate::exec::program::{Action, ProgramStep};
use crate::ops::{Fence, LocalOps};
use crate::types::{Dtype, ReduceOp};

impl Run<'_> {
    /// The peer receiving step `st` takes its messages from: its own, or for a receive from
    /// any source the peer its first slice came from ([`ANY_SOURCE`] until then).
    pub(super) fn source(&self, st: &ProgramStep) -> u32 {
        match st.from {
            ANY_SOURCE => self.sources.get(st.meta as usize).copied().unwrap_or(ANY_SOURCE),
            from => from,
        }
    }

    /// Receives bytes `[off, off + n)` of step `st` from `from` if its message has come: the
    /// spans it used. The receiving half runs on the message where the transport holds it (in
    /// the shared ring, for large shared-memory messages); the sending half follows. The spans
    /// are worked out once the message is there (a waiting receive is polled often).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn receive_from(
        &mut self,
        st: &ProgramStep,
        from: u32,
        meta: &Meta,
        tag: u32,
        off: usize,
        n: usize,
        tmp: Region,
    ) -> Result<Option<(Region, Region)>> {
        let (dtype, op, action) = (self.cfg.dtype, self.cfg.op, st.action);
        // A receive from any source learns the number of the stream it matched only now.
        let any = st.from == ANY_SOURCE;
        let mut failed: Option<Error> = None;
        let mut spans_used = (Region::EMPTY, Region::EMPTY);
        let mut read = Fence::DONE;
        let (cfg, ops, mem) = (self.cfg, &mut *self.ops, self.mem);
        let l = link(self.links, from)?;
        let got = l
            .recv_with(tag, &mut |m, data| {
                let r = check(cfg, from, meta, m, data.len, n, any).and_then(|()| {
                    // Every implementation reads host memory; device memory only its own.
                    if data.space != MemSpace::Host && !ops.reaches(data.space) {
                        return Err(Error::Mismatch {
                            rank: cfg.rank,
                            peer: from,
                            theirs: format!("a call whose messages lie in {}", data.space),
                            ours: format!("a call on {} operations, which cannot read them", ops.name()),
                        });
                    }
                    let (src, dst) = spans(mem, st, off, n)?;
                    spans_used = (src, dst);
                    read = receive(action, dtype, op, ops, src, dst, tmp, data)?;
                    Ok(())
                });
                if let Err(e) = r {
                    failed = Some(e);
                }
            })
            .map_err(transport_error(from))?;
        if got && l.lends() {
            // The operation reading the message may still run: the message stays the
            // connection's until it is done (released in `run`'s loop).
            self.inflight.lend(from, read);
        }
        if read != Fence::DONE {
            self.last = read;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(got.then_some(spans_used))
    }

    /// The first slice of a receive from any source: the first message of `tag` any peer has
    /// sent (peers asked in turn, starting one further each time, so none is always last),
    /// which fixes the step's source.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn receive_any(
        &mut self,
        st: &ProgramStep,
        meta: &Meta,
        tag: u32,
        off: usize,
        n: usize,
        tmp: Region,
    ) -> Result<Option<(Region, Region)>> {
        let k = self.prog.peers.len();
        self.any_turn = self.any_turn.wrapping_add(1);
        for i in 0..k {
            let p = self.prog.peers[(self.any_turn + i) % k];
            if let Some(spans) = self.receive_from(st, p, meta, tag, off, n, tmp)? {
                if let Some(s) = self.sources.get_mut(st.meta as usize) {
                    *s = p;
                }
                return Ok(Some(spans));
            }
        }
        // Only a peer that is still there can send one.
        let mut why = None;
        for &p in &self.prog.peers {
            match link(self.links, p)?.closed() {
                Some(w) => why = Some((p, w.to_string())),
                None => return Ok(None),
            }
        }
        match why {
            Some((peer, why)) => Err(Error::PeerFailed {
                peer,
                reason: format!("every peer has gone, so a receive from any source can get no message ({why})"),
            }),
            None => Ok(None),
        }
    }
}

/// The receiving half of a step: `data` is the message (possibly in the transport's memory).
/// A receive-reduce-send reduces into `tmp`, which the sending half then sends. Returns the
/// fence of the operation (which reads `data` until then, if the connection lends it).
#[allow(clippy::too_many_arguments)]
fn receive(
    action: Action,
    dtype: Dtype,
    op: ReduceOp,
    ops: &mut dyn LocalOps,
    src: Region,
    dst: Region,
    tmp: Region,
    data: Region,
) -> Result<Fence> {
    // SAFETY: `src` and `dst` are spans of the run's buffers (valid and ours for the run,
    // `run`'s contract), `tmp` its workspace, `data` the message the transport lends for this
    // call (or until released, for a connection that lends); lengths were checked against the
    // step. Host memory the operations did not allocate is read before they return.
    Ok(unsafe {
        match action {
            Action::Recv | Action::RecvCopySend => ops.copy(dst, data)?,
            Action::RecvReduce | Action::RecvReduceCopySend => ops.reduce(dtype, op, dst, src, data)?,
            Action::RecvReduceSend => {
                let out = tmp.sub(0, data.len).ok_or_else(|| Error::Internal("workspace too small".into()))?;
                ops.reduce(dtype, op, out, src, data)?
            }
            Action::Send | Action::Copy | Action::Reduce => Fence::DONE,
        }
    })
}

//! Communicators made from a running one without a split's full participation: a shrink (the
//! survivors of excluded, perhaps dead, ranks: `ncclCommShrink`) and a grow (more ranks joining
//! through a new unique id: `ncclCommGrow`).
//!
//! A shrink must work when the parent's data path is broken (the reason to shrink is usually
//! a rank that died mid-call), so it exchanges nothing over it: every rank kept the listening
//! socket its peers dialled at init, whose address they all know, so the survivors dial each
//! other there again under a new communicator id, exactly as at init. The child inherits the
//! socket, so it can shrink in turn; the parent therefore shrinks once.

use std::time::Instant;

use super::bootstrap::UniqueId;
use super::connect::Auth;
use super::{comm_id, Communicator};
use crate::error::{Error, Result};

impl Communicator {
    /// The communicator of every rank but `exclude` (`ncclCommShrink`): ranks keep their
    /// order and close the gaps. Every surviving rank calls it with the same list; excluded
    /// ranks do not call it. Works on a communicator that failed or was aborted.
    pub fn shrink(&self, exclude: &[u32]) -> Result<Communicator> {
        let mut excluded = exclude.to_vec();
        excluded.sort_unstable();
        excluded.dedup();
        if let Some(r) = excluded.iter().find(|&&r| r >= self.nranks) {
            return Err(Error::InvalidArgument(format!("excluded rank {r} is out of range for {} ranks", self.nranks)));
        }
        if excluded.contains(&self.rank) {
            return Err(Error::InvalidArgument(format!(
                "rank {} is in its own exclusion list: excluded ranks do not call shrink",
                self.rank
            )));
        }
        let listener = self.listener.lock().unwrap_or_else(|p| p.into_inner()).take().ok_or_else(|| {
            Error::InvalidArgument(
                "this communicator was shrunk (or the attempt failed) already: shrink the communicator that made instead"
                    .into(),
            )
        })?;
        let survivors: Vec<u32> = (0..self.nranks).filter(|r| !excluded.contains(r)).collect();
        let new_rank = survivors.iter().position(|&r| r == self.rank).unwrap_or(0) as u32;
        let peers = survivors.iter().map(|&r| self.peers[r as usize]).collect();
        let list: Vec<u8> = excluded.iter().flat_map(|r| r.to_le_bytes()).collect();
        let auth = Auth { secret: self.auth.secret, comm_id: comm_id(&[&self.auth.comm_id, b"shrink", &list]) };
        let deadline = Instant::now() + self.config.timeout;
        let binding = super::device_binding(&self.config)?;
        Communicator::connect(new_rank, peers, listener, auth, self.config.clone(), binding, deadline)
    }

    /// This communicator's ranks, with the same numbers, joined by new ranks into a
    /// communicator of `nranks` (`ncclCommGrow`). Exactly one existing rank passes the id made
    /// for the grow (its rendezvous); the others pass `None` and learn it from that rank over
    /// this communicator. The new ranks call [`Communicator::init_with`] with the id and their
    /// assigned ranks (from this communicator's size up).
    pub fn grow(&self, nranks: u32, id: Option<&UniqueId>) -> Result<Communicator> {
        if nranks <= self.nranks {
            return Err(Error::InvalidArgument(format!(
                "grow to {nranks} ranks: the communicator has {} already",
                self.nranks
            )));
        }
        const RECORD: usize = 1 + super::UNIQUE_ID_BYTES;
        let mut mine = vec![0u8; RECORD];
        if let Some(id) = id {
            mine[0] = 1;
            mine[1..].copy_from_slice(&id.to_bytes());
        }
        let mut all = vec![0u8; RECORD * self.nranks as usize];
        self.all_gather(&mine, &mut all)?;
        let givers: Vec<usize> =
            all.chunks_exact(RECORD).enumerate().filter(|(_, r)| r[0] == 1).map(|(i, _)| i).collect();
        let [giver] = givers[..] else {
            return Err(Error::InvalidArgument(format!(
                "grow: exactly one existing rank passes the unique id, {} did ({givers:?})",
                givers.len()
            )));
        };
        let id = UniqueId::from_bytes(&all[giver * RECORD + 1..(giver + 1) * RECORD])?;
        Communicator::init_with(&id, self.rank, nranks, self.config.clone())
    }
}

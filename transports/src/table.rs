//! Which backend connects a pair of ranks: the registered transports, asked in priority order
//! whether they can connect the two (NCCL's `canConnect` table), the first that can doing so.
//! Both ranks of a pair consult the same table with the same localities and pick alike.
//!
//! A backend may still decline during set-up (both sides learn it together, as shared memory
//! does when the peer cannot map its segment); the pair then goes on down the table with the
//! same streams. Every connection made can be wrapped ([`ConnectionWrapper`]): tracing, or the
//! fault injection of [`crate::fault`].

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::{Connected, Connection, Locality, PeerSetup, Transport, TRANSPORT_API_VERSION};

/// Wraps each connection a communicator makes.
pub trait ConnectionWrapper: Send + Sync {
    /// `conn` connects to rank `peer`; the result is used in its place.
    fn wrap(&self, peer: u32, conn: Box<dyn Connection>) -> Box<dyn Connection>;
}

impl<F> ConnectionWrapper for F
where
    F: Fn(u32, Box<dyn Connection>) -> Box<dyn Connection> + Send + Sync,
{
    fn wrap(&self, peer: u32, conn: Box<dyn Connection>) -> Box<dyn Connection> {
        self(peer, conn)
    }
}

/// Transports in priority order, and an optional wrapper for what they connect.
#[derive(Clone, Default)]
pub struct TransportTable {
    entries: Vec<Arc<dyn Transport>>,
    wrapper: Option<Arc<dyn ConnectionWrapper>>,
}

impl std::fmt::Debug for TransportTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|t| t.name()).collect();
        f.debug_struct("TransportTable").field("entries", &names).field("wrapped", &self.wrapper.is_some()).finish()
    }
}

impl TransportTable {
    /// No transport at all.
    pub fn new() -> TransportTable {
        TransportTable::default()
    }

    /// Adds `t` after the transports already there (a lower priority). A transport written for
    /// another interface version is refused.
    pub fn try_with(mut self, t: Arc<dyn Transport>) -> Result<TransportTable> {
        if t.api_version() != TRANSPORT_API_VERSION {
            return Err(Error::Unsupported(format!(
                "transport `{}` implements transport API v{}, topoccl speaks v{TRANSPORT_API_VERSION}",
                t.name(),
                t.api_version()
            )));
        }
        self.entries.push(t);
        Ok(self)
    }

    /// The transports of `self`, then those of `other`.
    pub fn then(mut self, other: &TransportTable) -> TransportTable {
        self.entries.extend(other.entries.iter().cloned());
        if self.wrapper.is_none() {
            self.wrapper = other.wrapper.clone();
        }
        self
    }

    /// Wraps every connection the table makes.
    pub fn wrapped(mut self, wrapper: Arc<dyn ConnectionWrapper>) -> TransportTable {
        self.wrapper = Some(wrapper);
        self
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|t| t.name()).collect()
    }

    /// The transport that connects `me` to `peer`: the first that can.
    pub fn select(&self, me: &Locality, peer: &Locality) -> Option<&Arc<dyn Transport>> {
        self.entries.iter().find(|t| t.can_connect(me, peer))
    }

    /// Connects to the peer of `setup`: the first transport that can connect the pair, or the
    /// next ones that can if it declines; then the wrapper.
    pub fn connect(&self, me: &Locality, peer: &Locality, mut setup: PeerSetup) -> Result<Box<dyn Connection>> {
        let rank = setup.rank;
        let mut declined = Vec::new();
        for t in self.entries.iter().filter(|t| t.can_connect(me, peer)) {
            match t.connect(setup)? {
                Connected::Connection(c) => {
                    return Ok(match &self.wrapper {
                        Some(w) => w.wrap(rank, c),
                        None => c,
                    })
                }
                Connected::Declined { setup: s, why } => {
                    declined.push(format!("{} declined: {why}", t.name()));
                    setup = s;
                }
            }
        }
        let tried = if self.entries.is_empty() {
            "the table is empty".to_string()
        } else {
            format!("the table holds {}", self.names().join(", "))
        };
        let declined = if declined.is_empty() { String::new() } else { format!("; {}", declined.join("; ")) };
        Err(Error::Unsupported(format!("no transport connects to {} ({tried}){declined}", setup.peer)))
    }
}

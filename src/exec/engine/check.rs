//! Checking a message before its bytes are used: it must carry this very call's header and
//! the length the step expects (a peer's message is never trusted).

use topoccl_transports::Meta;

use super::RunConfig;
use crate::error::{Error, Result};
use crate::wire::{CallHeader, SEQ_BYTES};

/// A message must belong to this very call and have the expected length. A receive from any
/// source (`any_seq`) takes its number from the message: it learns which stream it matched
/// only from the message.
pub(crate) fn check(
    cfg: &RunConfig<'_>,
    from: u32,
    expected: &Meta,
    meta: &Meta,
    got: usize,
    want: usize,
    any_seq: bool,
) -> Result<()> {
    let same = if any_seq { meta[SEQ_BYTES..] == expected[SEQ_BYTES..] } else { meta == expected };
    if !same {
        let ours = CallHeader::decode(expected).map(|h| h.describe()).unwrap_or_default();
        let theirs = CallHeader::decode(expected).map(|h| h.mismatch(meta)).unwrap_or_default();
        return Err(Error::Mismatch { rank: cfg.rank, peer: from, theirs, ours });
    }
    if got != want {
        return Err(Error::Mismatch {
            rank: cfg.rank,
            peer: from,
            theirs: format!("a message of {got} bytes"),
            ours: format!("{} expecting {want} bytes (is TOPOCCL_SLICE_BYTES set alike everywhere?)", cfg.what()),
        });
    }
    Ok(())
}

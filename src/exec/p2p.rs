//! How point-to-point messages find their receives. A message stream is one pair of ranks and
//! one transport tag, matched in order (the transports keep a tag's messages in order and
//! hold every arrived message until a receive takes it, so streams of different tags match
//! independently: a receive of tag 7 takes its message past an earlier one of tag 5, which
//! waits). The user's tags map onto transport tags of their own; a receive from any source
//! takes the first message of its tag that any peer has sent, decided when it runs.
//!
//! Each stream's messages are numbered (the call header's `seq`) by the executor as the calls
//! run, not when they are made: a receive from any source consumes a number of the stream it
//! turns out to match only then, and calls made meanwhile must number after it.

use std::collections::HashMap;

use super::program::P2P_TAG;

/// The peer of a receive that matches whichever peer's message comes first.
pub(crate) const ANY_SOURCE: u32 = u32::MAX;

/// The largest tag a point-to-point call may carry (tags take 28 bits of the transport's).
pub const MAX_TAG: u32 = (1 << 28) - 1;

/// Marks the transport tags of the user's tags (below the backends' bits 29 and 31, beside
/// [`P2P_TAG`]'s bit 30).
const USER_TAG_BIT: u32 = 1 << 28;

/// The transport tag of send/recv calls tagged `tag` (at most [`MAX_TAG`]): tag 0, NCCL's only
/// one, is the untagged stream.
pub(crate) fn send_recv_tag(tag: u32) -> u32 {
    if tag == 0 {
        P2P_TAG
    } else {
        P2P_TAG | USER_TAG_BIT | (tag & MAX_TAG)
    }
}

/// Per stream (transport tag, peer): messages sent and received so far.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    streams: HashMap<(u32, u32), [u32; 2]>,
}

impl Counters {
    /// The number of the next message this rank sends (`send`) or receives on a stream, which
    /// it then counts.
    pub(crate) fn take(&mut self, tag: u32, peer: u32, send: bool) -> u32 {
        let c = &mut self.streams.entry((tag, peer)).or_default()[usize::from(send)];
        let n = *c;
        *c = c.wrapping_add(1);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::program::PUT_TAG;

    #[test]
    fn user_tags_map_onto_streams_of_their_own() {
        assert_eq!(send_recv_tag(0), P2P_TAG);
        let tags = [send_recv_tag(1), send_recv_tag(2), send_recv_tag(MAX_TAG)];
        for (i, t) in tags.iter().enumerate() {
            assert!(*t != P2P_TAG && *t != PUT_TAG, "{t:#x}");
            // The backends' bits stay clear.
            assert_eq!(t & (1 << 29 | 1 << 31), 0);
            assert!(tags[i + 1..].iter().all(|o| o != t));
        }
    }

    #[test]
    fn streams_count_apart() {
        let mut c = Counters::default();
        assert_eq!(c.take(P2P_TAG, 1, true), 0);
        assert_eq!(c.take(P2P_TAG, 1, true), 1);
        assert_eq!(c.take(P2P_TAG, 1, false), 0);
        assert_eq!(c.take(P2P_TAG, 2, true), 0);
        assert_eq!(c.take(send_recv_tag(5), 1, true), 0);
    }
}

//! Messages numbered per tag, and the destinations a receiver offers for them: the
//! bookkeeping of every one-sided path (shared memory's direct puts, RDMA writes). The n-th
//! message of a tag is the n-th sent and the n-th received (messages of one tag stay in
//! order), so an offer names its message by number, and an offer the sender sees after it
//! sent that message is simply not used.

use crate::error::{Error, Result};
use crate::framing::{ByteStream, Framed};
use crate::{Meta, Region, MAX_MESSAGE_BYTES, META_BYTES};

/// The tag offers travel under.
pub(crate) const OFFER_TAG: u32 = u32::MAX;
/// Marks a message that was put straight into its offered destination (its frame carries no
/// payload, only the tag with this bit).
pub(crate) const DIRECT_BIT: u32 = 1 << 31;

/// Refuses the tags the one-sided paths reserve (the top bit set).
pub(crate) fn reserved(tag: u32) -> Result<()> {
    if tag & DIRECT_BIT != 0 {
        return Err(Error::Unsupported(format!("tag {tag:#x}: tags with the top bit set are reserved")));
    }
    Ok(())
}

/// The count of `tag` in `counts`.
pub(crate) fn count(counts: &mut Vec<(u32, u32)>, tag: u32) -> &mut u32 {
    let i = match counts.iter().position(|(t, _)| *t == tag) {
        Some(i) => i,
        None => {
            counts.push((tag, 0));
            counts.len() - 1
        }
    };
    &mut counts[i].1
}

/// An offer of `dst` for message `message` of `tag`, with the backend's `key` for it (an
/// rkey; 0 where there is none), as a frame's metadata (no payload: an offer frame is always
/// queued, never left where it arrived). `dst` is at most [`MAX_MESSAGE_BYTES`] long.
pub(crate) fn encode_offer(tag: u32, message: u32, dst: Region, key: u32) -> Meta {
    let mut m = [0u8; META_BYTES];
    m[0..4].copy_from_slice(&tag.to_le_bytes());
    m[4..8].copy_from_slice(&message.to_le_bytes());
    m[8..16].copy_from_slice(&(dst.addr as u64).to_le_bytes());
    m[16..20].copy_from_slice(&(dst.len.min(MAX_MESSAGE_BYTES) as u32).to_le_bytes());
    m[20..24].copy_from_slice(&key.to_le_bytes());
    m
}

/// The offer [`encode_offer`] wrote: tag, message, destination (in the receiver's address
/// space) and key.
pub(crate) fn decode_offer(m: &Meta) -> (u32, u32, Region, u32) {
    let word = |i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
    let mut q = [0u8; 8];
    q.copy_from_slice(&m[8..16]);
    let addr = u64::from_le_bytes(q) as usize;
    (word(0), word(4), Region::host(addr, word(16) as usize), word(20))
}

/// Both sides' numbering of one connection, and the offers made each way; `D` is what an
/// offer names (a region, a registration).
pub(crate) struct Numbered<D> {
    sent: Vec<(u32, u32)>,
    received: Vec<(u32, u32)>,
    /// Destinations the peer offered and this side has not used: (tag, message, destination).
    offers: Vec<(u32, u32, D)>,
    /// Destinations this side offered for messages not yet received.
    offered: Vec<(u32, u32, D)>,
}

impl<D> Default for Numbered<D> {
    fn default() -> Numbered<D> {
        Numbered { sent: Vec::new(), received: Vec::new(), offers: Vec::new(), offered: Vec::new() }
    }
}

impl<D> Numbered<D> {
    /// Numbers the next message of `tag` sent.
    pub(crate) fn next_sent(&mut self, tag: u32) -> u32 {
        let n = count(&mut self.sent, tag);
        let message = *n;
        *n = n.wrapping_add(1);
        message
    }

    /// The number the next message of `tag` sent will have.
    pub(crate) fn next_to_send(&mut self, tag: u32) -> u32 {
        *count(&mut self.sent, tag)
    }

    /// Whether the peer offered a destination that `fits` for message `message` of `tag`.
    pub(crate) fn has_offer(&self, tag: u32, message: u32, fits: impl Fn(&D) -> bool) -> bool {
        self.offers.iter().any(|o| o.0 == tag && o.1 == message && fits(&o.2))
    }

    /// Records the peer's offer of `dst` for message `message` of `tag`.
    pub(crate) fn peer_offered(&mut self, tag: u32, message: u32, dst: D) {
        self.offers.push((tag, message, dst));
    }

    /// The peer's offer for message `message` of `tag`, if it made one that `fits`; offers for
    /// earlier messages of the tag (seen too late) are dropped.
    pub(crate) fn take_offer(&mut self, tag: u32, message: u32, fits: impl Fn(&D) -> bool) -> Option<D> {
        self.offers.retain(|o| o.0 != tag || o.1 >= message);
        let i = self.offers.iter().position(|o| o.0 == tag && o.1 == message && fits(&o.2))?;
        Some(self.offers.swap_remove(i).2)
    }

    /// The number of the next message of `tag` to be received.
    pub(crate) fn receiving(&mut self, tag: u32) -> u32 {
        *count(&mut self.received, tag)
    }

    /// What this side offered for the next message of `tag`, if anything.
    pub(crate) fn offered_for_next(&mut self, tag: u32) -> Option<&D> {
        let message = self.receiving(tag);
        self.offered.iter().find(|o| o.0 == tag && o.1 == message).map(|o| &o.2)
    }

    /// The next message of `tag` was received (its offer, if any, is used up).
    pub(crate) fn received(&mut self, tag: u32) {
        let n = count(&mut self.received, tag);
        let message = *n;
        *n = n.wrapping_add(1);
        self.offered.retain(|o| o.0 != tag || o.1 != message);
    }

    /// Offers `dst` for the next message of `tag`: its number, or `None` where that message
    /// already has an offer (earlier offers of the tag, for messages received since, go).
    pub(crate) fn offer(&mut self, tag: u32, dst: D) -> Option<u32> {
        let message = self.receiving(tag);
        if self.offered.iter().any(|o| o.0 == tag && o.1 == message) {
            return None;
        }
        self.offered.retain(|o| o.0 != tag);
        self.offered.push((tag, message, dst));
        Some(message)
    }

    /// Hands the next message of `tag` to `f`, from `framed`: where this side offered a
    /// destination for it, the message comes either through the stream or, put straight into
    /// that destination (`dst_of`), as a frame under `tag | DIRECT_BIT` — whichever of the two
    /// comes first in the stream is this message (the next one of the tag comes after it).
    pub(crate) fn recv<S: ByteStream>(
        &mut self,
        framed: &mut Framed<S>,
        tag: u32,
        dst_of: impl Fn(&D) -> Region,
        f: &mut dyn FnMut(&Meta, Region),
    ) -> Result<bool> {
        let got = match self.offered_for_next(tag).map(dst_of) {
            Some(dst) => {
                framed.recv_first(&[tag, tag | DIRECT_BIT], &mut |t, m, r| f(m, if t == tag { r } else { dst }))?
            }
            None => framed.recv_with(tag, f)?,
        };
        if got {
            self.received(tag);
        }
        Ok(got)
    }

    /// Forgets every offer this side made (the connection closes).
    pub(crate) fn clear_offered(&mut self) {
        self.offered.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_name_messages_by_number_and_late_ones_go_unused() {
        let mut receiver = Numbered::<u8>::default();
        let mut sender = Numbered::<u8>::default();
        assert_eq!(receiver.offer(7, 1), Some(0));
        assert_eq!(receiver.offer(7, 2), None, "one offer per message");
        sender.peer_offered(7, 0, 1);
        assert_eq!(sender.next_sent(7), 0);
        assert_eq!(sender.take_offer(7, 0, |_| true), Some(1));
        assert_eq!(receiver.offered_for_next(7), Some(&1));
        receiver.received(7);
        assert_eq!(receiver.offered_for_next(7), None);
        // An offer for message 1 that arrives after message 1 was sent is dropped at message 2.
        assert_eq!(receiver.offer(7, 3), Some(1));
        sender.peer_offered(7, 1, 3);
        assert_eq!(sender.next_sent(7), 1);
        assert_eq!(sender.next_sent(7), 2);
        assert_eq!(sender.take_offer(7, 2, |_| true), None);
        assert_eq!(sender.take_offer(7, 1, |_| true), None, "dropped as stale");
        // Another tag is numbered apart; an offer that does not fit is not taken.
        sender.peer_offered(9, 0, 4);
        assert_eq!(sender.take_offer(9, 0, |d| *d == 5), None);
        assert_eq!(sender.take_offer(9, 0, |d| *d == 4), Some(4));
    }
}

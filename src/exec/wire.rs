//! What every message says about the call it belongs to, so that ranks which disagree (a
//! different collective, count, datatype, root or algorithm, or a call skipped) get an error
//! naming both calls instead of corrupted results.
//!
//! The header rides in the transport's 24-byte `meta` of every message; the receiver compares
//! it with the header of the call it is running before it touches the payload.

use topoccl_transports::{Meta, META_BYTES};

use crate::types::{Dtype, ReduceOp};

/// What kind of call a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum CallKind {
    AllReduce = 0,
    ReduceScatter = 1,
    AllGather = 2,
    Broadcast = 3,
    Reduce = 4,
    AllToAll = 5,
    SendRecv = 6,
}

impl CallKind {
    const ALL: [CallKind; 7] = [
        CallKind::AllReduce,
        CallKind::ReduceScatter,
        CallKind::AllGather,
        CallKind::Broadcast,
        CallKind::Reduce,
        CallKind::AllToAll,
        CallKind::SendRecv,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            CallKind::AllReduce => "all_reduce",
            CallKind::ReduceScatter => "reduce_scatter",
            CallKind::AllGather => "all_gather",
            CallKind::Broadcast => "broadcast",
            CallKind::Reduce => "reduce",
            CallKind::AllToAll => "all_to_all",
            CallKind::SendRecv => "send/recv",
        }
    }

    fn reduces(self) -> bool {
        matches!(self, CallKind::AllReduce | CallKind::ReduceScatter | CallKind::Reduce)
    }

    fn rooted(self) -> bool {
        matches!(self, CallKind::Broadcast | CallKind::Reduce)
    }
}

/// The identity of one call (or, for send/recv, of one message stream between two ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallHeader {
    /// Collectives: the communicator's call counter. Send/recv: the pair's message counter.
    pub seq: u32,
    pub kind: CallKind,
    pub dtype: Dtype,
    pub op: ReduceOp,
    pub root: u32,
    /// Elements, as the user passed them.
    pub count: u64,
    /// A hash of the schedule (algorithm and chunking) the sender runs.
    pub schedule: u32,
}

impl CallHeader {
    pub(crate) fn encode(&self) -> Meta {
        let mut m = [0u8; META_BYTES];
        m[0..4].copy_from_slice(&self.seq.to_le_bytes());
        m[4] = self.kind as u8;
        m[5] = self.dtype as u8;
        m[6] = self.op as u8;
        m[8..12].copy_from_slice(&self.root.to_le_bytes());
        m[12..20].copy_from_slice(&self.count.to_le_bytes());
        m[20..24].copy_from_slice(&self.schedule.to_le_bytes());
        m
    }

    pub(crate) fn decode(m: &Meta) -> Option<CallHeader> {
        let u32_at = |i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
        let mut count = [0u8; 8];
        count.copy_from_slice(&m[12..20]);
        Some(CallHeader {
            seq: u32_at(0),
            kind: *CallKind::ALL.get(usize::from(m[4]))?,
            dtype: Dtype::from_raw(i64::from(m[5]))?,
            op: ReduceOp::from_raw(i64::from(m[6]))?,
            root: u32_at(8),
            count: u64::from_le_bytes(count),
            schedule: u32_at(20),
        })
    }

    /// `call #7: all_reduce of 1024 × float (sum)`.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!("call #{}: {} of {} × {}", self.seq, self.kind.name(), self.count, self.dtype);
        if self.kind.reduces() {
            s += &format!(" ({})", self.op);
        }
        if self.kind.rooted() {
            s += &format!(" with root {}", self.root);
        }
        s
    }

    /// How `theirs` differs from this header, for the error message.
    pub(crate) fn mismatch(&self, theirs: &Meta) -> String {
        match CallHeader::decode(theirs) {
            None => "a message that is not from a topoccl call of this version".to_string(),
            Some(t)
                if t.kind == self.kind && t.seq == self.seq && t.count == self.count && t.schedule != self.schedule =>
            {
                format!("{} with a different algorithm or chunking (schedule {:08x} vs {:08x}; is TOPOCCL_ALGO set alike everywhere?)", t.describe(), t.schedule, self.schedule)
            }
            Some(t) => t.describe(),
        }
    }
}

/// FNV-1a, for schedule identities: stable across processes, hosts and builds.
pub(crate) fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_describe_differences() {
        let h = CallHeader {
            seq: 7,
            kind: CallKind::Reduce,
            dtype: Dtype::Bfloat16,
            op: ReduceOp::Max,
            root: 3,
            count: 1 << 40,
            schedule: 0xdead_beef,
        };
        assert_eq!(CallHeader::decode(&h.encode()), Some(h));
        assert_eq!(h.describe(), "call #7: reduce of 1099511627776 × bfloat16 (max) with root 3");
        let other = CallHeader { kind: CallKind::AllGather, ..h };
        assert!(h.mismatch(&other.encode()).contains("all_gather"));
        let algo = CallHeader { schedule: 1, ..h };
        assert!(h.mismatch(&algo.encode()).contains("TOPOCCL_ALGO"));
        assert!(h.mismatch(&[0xff; 24]).contains("not from a topoccl call"));
    }
}

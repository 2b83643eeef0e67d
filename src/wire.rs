//! What every message says about the call it belongs to, so that ranks which disagree (a
//! different collective, count, datatype, root or algorithm, or a call skipped) get an error
//! naming both calls instead of corrupted results.
//!
//! The header rides in the transport's 24-byte `meta` of every message; the receiver compares
//! it with the header of the call it is running before it touches the payload.

use topoccl_transports::{Meta, META_BYTES};

use topoccl_synth::schedule::Collective;

use crate::types::{Dtype, ReduceOp, Reduction};

/// What a message belongs to: a collective, or a stream of point-to-point messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Called {
    Collective(Collective),
    SendRecv,
}

impl Called {
    /// The kind byte on the wire: the collective's place in [`Collective::ALL`], or one past.
    fn code(self) -> u8 {
        match self {
            Called::Collective(c) => {
                Collective::ALL.iter().position(|k| k.name() == c.name()).map_or(u8::MAX, |i| i as u8)
            }
            Called::SendRecv => Collective::ALL.len() as u8,
        }
    }

    fn decode(code: u8, root: u32) -> Option<Called> {
        match Collective::ALL.get(usize::from(code)) {
            Some(c) => Some(Called::Collective(c.with_root(root))),
            None if usize::from(code) == Collective::ALL.len() => Some(Called::SendRecv),
            None => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Called::Collective(c) => c.name(),
            Called::SendRecv => "send/recv",
        }
    }
}

/// The reduction's code on the wire: NCCL's operator number, PreMulSum after them.
pub(crate) fn reduction_code(r: Reduction) -> u8 {
    match r {
        Reduction::Op(op) => op as u8,
        Reduction::PreMulSum(_) => PREMULSUM_CODE,
    }
}

const PREMULSUM_CODE: u8 = ReduceOp::ALL.len() as u8;

fn reduction_name(code: u8) -> Option<&'static str> {
    match ReduceOp::from_raw(i64::from(code)) {
        Some(op) => Some(op.name()),
        None if code == PREMULSUM_CODE => Some("premulsum"),
        None => None,
    }
}

/// The identity of one call (or, for send/recv, of one message stream between two ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallHeader {
    /// Collectives: the communicator's call counter. Send/recv: the pair's message counter.
    pub seq: u32,
    pub called: Called,
    pub dtype: Dtype,
    /// [`reduction_code`] of the call's reduction.
    pub op: u8,
    /// Elements, as the user passed them.
    pub count: u64,
    /// A hash of the schedule (algorithm and chunking) the sender runs.
    pub schedule: u32,
}

/// The header's first bytes: its number (`seq`).
pub(crate) const SEQ_BYTES: usize = 4;

impl CallHeader {
    pub(crate) fn encode(&self) -> Meta {
        let mut m = [0u8; META_BYTES];
        m[0..SEQ_BYTES].copy_from_slice(&self.seq.to_le_bytes());
        m[4] = self.called.code();
        m[5] = self.dtype as u8;
        m[6] = self.op;
        let root = match self.called {
            Called::Collective(c) => c.root().unwrap_or(0),
            Called::SendRecv => 0,
        };
        m[8..12].copy_from_slice(&root.to_le_bytes());
        m[12..20].copy_from_slice(&self.count.to_le_bytes());
        m[20..24].copy_from_slice(&self.schedule.to_le_bytes());
        m
    }

    pub(crate) fn decode(m: &Meta) -> Option<CallHeader> {
        let u32_at = |i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
        let mut count = [0u8; 8];
        count.copy_from_slice(&m[12..20]);
        reduction_name(m[6])?;
        Some(CallHeader {
            seq: u32_at(0),
            called: Called::decode(m[4], u32_at(8))?,
            dtype: Dtype::from_raw(i64::from(m[5]))?,
            op: m[6],
            count: u64::from_le_bytes(count),
            schedule: u32_at(20),
        })
    }

    /// `call #7: all_reduce of 1024 × float (sum)`.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!("call #{}: {} of {} × {}", self.seq, self.called.name(), self.count, self.dtype);
        if let Called::Collective(c) = self.called {
            if c.reduces() {
                s += &format!(" ({})", reduction_name(self.op).unwrap_or("?"));
            }
            if let Some(root) = c.root() {
                s += &format!(" with root {root}");
            }
        }
        s
    }

    /// How `theirs` differs from this header, for the error message.
    pub(crate) fn mismatch(&self, theirs: &Meta) -> String {
        match CallHeader::decode(theirs) {
            None => "a message that is not from a topoccl call of this version".to_string(),
            Some(t)
                if t.called.code() == self.called.code()
                    && t.seq == self.seq
                    && t.count == self.count
                    && t.schedule != self.schedule =>
            {
                format!("{} with a different algorithm or chunking (schedule {:08x} vs {:08x}; is TOPOCCL_ALGO set alike everywhere?)", t.describe(), t.schedule, self.schedule)
            }
            Some(t) => t.describe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_describe_differences() {
        let h = CallHeader {
            seq: 7,
            called: Called::Collective(Collective::Reduce { root: 3 }),
            dtype: Dtype::Bfloat16,
            op: ReduceOp::Max as u8,
            count: 1 << 40,
            schedule: 0xdead_beef,
        };
        assert_eq!(CallHeader::decode(&h.encode()), Some(h));
        assert_eq!(h.describe(), "call #7: reduce of 1099511627776 × bfloat16 (max) with root 3");
        let other = CallHeader { called: Called::Collective(Collective::AllGather), ..h };
        assert!(h.mismatch(&other.encode()).contains("all_gather"));
        let algo = CallHeader { schedule: 1, ..h };
        assert!(h.mismatch(&algo.encode()).contains("TOPOCCL_ALGO"));
        assert!(h.mismatch(&[0xff; 24]).contains("not from a topoccl call"));
        let p2p = CallHeader { called: Called::SendRecv, op: reduction_code(Reduction::Op(ReduceOp::Sum)), ..h };
        assert_eq!(CallHeader::decode(&p2p.encode()), Some(p2p));
        assert!(p2p.describe().contains("send/recv"));
    }
}

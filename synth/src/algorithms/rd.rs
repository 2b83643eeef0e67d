//! Recursive doubling all-reduce: log₂ p exchanges of the whole buffer, each partner reducing
//! what the other sends. It moves more bytes than a ring (S·log₂ p against 2S) but in log₂ p
//! hops instead of 2(n − 1), which wins for small messages, where latency is everything. For n
//! that is not a power of two, the first n − p even ranks fold into their odd neighbour first
//! and get the result back at the end (the same layout as halving-doubling).
//!
//! Every rank ends with bitwise the same result: each exchange combines the same two partial
//! sums on both partners, in one commutative operation.

use super::rhd::Layout;
use crate::error::Result;
use crate::generate::{unsupported, Request, ScheduleGenerator};
use crate::schedule::{Collective, Op, Schedule, ScheduleBuilder, Slot};

pub struct RecursiveDoubling;

impl ScheduleGenerator for RecursiveDoubling {
    fn name(&self) -> &'static str {
        "rd"
    }

    fn describe(&self) -> &'static str {
        "recursive doubling: log2(n) whole-buffer exchanges (latency-optimal all-reduce for small messages)"
    }

    fn supports(&self, c: Collective) -> bool {
        c == Collective::AllReduce
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        if req.collective != Collective::AllReduce {
            return Err(unsupported(self.name(), req.collective, "all-reduce only"));
        }
        let l = Layout::new(req.nranks());
        let mut b = ScheduleBuilder::new("rd", Collective::AllReduce, l.n, 1);
        b.in_place(true);
        let (input, output) = (Slot::input(0), Slot::output(0));
        for me in 0..l.n {
            let Some(v) = l.virt(me) else {
                b.push(me, 0, Op::Send { to: me + 1, src: input }, 1);
                b.push(me, 0, Op::Recv { from: me + 1, dst: output }, 1);
                continue;
            };
            let mut cur = input;
            if v < l.extra {
                b.push(me, 0, Op::RecvReduce { from: me - 1, src: input, dst: output }, 1);
                cur = output;
            }
            for d in l.distances().rev() {
                let partner = l.real(v ^ d);
                b.push(me, 0, Op::Send { to: partner, src: cur }, 1);
                b.push(me, 0, Op::RecvReduce { from: partner, src: cur, dst: output }, 1);
                cur = output;
            }
            if cur == input {
                b.push(me, 0, Op::Copy { src: input, dst: output }, 1);
            }
            if v < l.extra {
                b.push(me, 0, Op::Send { to: me - 1, src: output }, 1);
            }
        }
        Ok(b.build())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology;
    use crate::verify::verify;

    #[test]
    fn verifies_for_every_size_up_to_17() {
        for n in 1..=17 {
            let t = topology::resolve(&format!("full:{n}")).unwrap();
            let s = RecursiveDoubling.generate(&Request::new(&t, Collective::AllReduce)).unwrap();
            verify(&s).unwrap_or_else(|e| panic!("n={n}: {e}"));
            let sends = s.stats().sends;
            let l = Layout::new(n);
            assert_eq!(sends, u64::from(l.p * l.p.trailing_zeros() + 2 * l.extra), "n={n}");
        }
    }
}

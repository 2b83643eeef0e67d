//! Pairwise all-to-all: in step s every rank sends its block for rank r+s and receives the block
//! from rank r−s, so each step is a permutation and no link sees two flows from one sender.
//! A rank posts all its sends before its first receive (sends are eager), so it never waits for
//! a receive to send on, and every input block is read before any output block is written:
//! the schedule is also correct in place.

use crate::error::Result;
use crate::generate::{unsupported, Request, ScheduleGenerator};
use crate::schedule::{Collective, Op, Schedule, ScheduleBuilder, Slot};

pub struct PairwiseAllToAll;

impl ScheduleGenerator for PairwiseAllToAll {
    fn name(&self) -> &'static str {
        "pairwise"
    }
    fn describe(&self) -> &'static str {
        "pairwise exchange all-to-all (n−1 permutation steps)"
    }
    fn supports(&self, c: Collective) -> bool {
        c == Collective::AllToAll
    }

    fn generate(&self, req: &Request) -> Result<Schedule> {
        if req.collective != Collective::AllToAll {
            return Err(unsupported("pairwise", req.collective, "pairwise builds all-to-all only"));
        }
        let n = req.nranks();
        let k = req.pipeline.max(1);
        let mut b = ScheduleBuilder::new("pairwise", Collective::AllToAll, n, n * k);
        b.in_place(true);
        for r in 0..n {
            b.push(r, 0, Op::Copy { src: Slot::input(r * k), dst: Slot::output(r * k) }, k);
            for s in 1..n {
                let to = (r + s) % n;
                b.push(r, 0, Op::Send { to, src: Slot::input(to * k) }, k);
            }
            for s in 1..n {
                let from = (r + n - s) % n;
                b.push(r, 0, Op::Recv { from, dst: Slot::output(from * k) }, k);
            }
        }
        Ok(b.build())
    }
}

//! Where the chunks of a schedule lie in a call's buffers.
//!
//! A schedule cuts every block of the data (the whole buffer, or one rank's part for
//! reduce-scatter, all-gather and all-to-all) into `k` chunks; the call's element count rarely
//! divides by `k` (Blink's chunk counts are products of odd tree counts). A [`ChunkLayout`] cuts
//! each block into `k` chunks whose sizes differ by at most one element, blocks back to back,
//! so the executor runs on the caller's memory as it is, with no padded copy of the buffers.
//!
//! Uneven chunks are only safe when every step touches slots of one size and every message is
//! received into a slot of the size it was sent from. Every generator keeps a chunk's index as
//! it moves, which guarantees both; [`ChunkLayout::fits`] checks it for the whole schedule
//! (all ranks compute the same answer from the same inputs, so they agree on the layout), and
//! a schedule that does not fit runs on a padded layout of equal chunks instead.

use rustc_hash::FxHashMap;
use topoccl_synth::schedule::{Schedule, Slot};

/// Chunk `i` of block `i / k` starts `(i % k) · ⌊block/k⌋ + min(i % k, block mod k)` elements
/// into the block: the first `block mod k` chunks of a block are one element longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ChunkLayout {
    k: usize,
    block: usize,
    esize: usize,
}

impl ChunkLayout {
    /// `k` chunks per block of `block` elements of `esize` bytes (`k` ≥ 1).
    pub(crate) fn new(k: usize, block: usize, esize: usize) -> ChunkLayout {
        ChunkLayout { k: k.max(1), block, esize }
    }

    /// Equal chunks of `chunk` elements (blocks padded to `k · chunk` elements).
    pub(crate) fn padded(k: usize, chunk: usize, esize: usize) -> ChunkLayout {
        ChunkLayout::new(k, k.max(1) * chunk, esize)
    }

    /// True when every chunk has the same size.
    pub(crate) fn even(&self) -> bool {
        self.block % self.k == 0
    }

    /// Byte offset of chunk `i`.
    pub(crate) fn offset(&self, i: usize) -> usize {
        let (b, c) = (i / self.k, i % self.k);
        (b * self.block + c * (self.block / self.k) + c.min(self.block % self.k)) * self.esize
    }

    /// Byte range `(offset, len)` of chunks `[i, i + count)`.
    pub(crate) fn range(&self, i: usize, count: usize) -> (usize, usize) {
        let start = self.offset(i);
        (start, self.offset(i + count) - start)
    }

    fn len(&self, slot: Slot, count: u32) -> usize {
        self.range(slot.index as usize, count as usize).1
    }

    /// Whether `schedule` runs correctly on this layout: each step's slots have one size, and
    /// the n-th message on each (sender, receiver, channel) has the same size at both ends.
    pub(crate) fn fits(&self, schedule: &Schedule) -> bool {
        if self.even() {
            return true;
        }
        let mut sent: FxHashMap<(u32, u32, usize), Vec<usize>> = FxHashMap::default();
        let mut received: FxHashMap<(u32, u32, usize), Vec<usize>> = FxHashMap::default();
        for (r, rank) in schedule.ranks.iter().enumerate() {
            for (c, ch) in rank.channels.iter().enumerate() {
                for st in &ch.steps {
                    let (src, dst) =
                        (st.op.src().map(|s| self.len(s, st.count)), st.op.dst().map(|s| self.len(s, st.count)));
                    if src.zip(dst).is_some_and(|(a, b)| a != b) {
                        return false;
                    }
                    let Some(len) = src.or(dst) else { continue };
                    if let Some(to) = st.op.send_to() {
                        sent.entry((r as u32, to, c)).or_default().push(len);
                    }
                    if let Some(from) = st.op.recv_from() {
                        received.entry((from, r as u32, c)).or_default().push(len);
                    }
                }
            }
        }
        sent == received
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topoccl_synth::generate::Request;
    use topoccl_synth::registry::Registry;
    use topoccl_synth::schedule::Collective;
    use topoccl_synth::topology::resolve;

    #[test]
    fn uneven_chunks_tile_each_block_exactly() {
        let l = ChunkLayout::new(4, 10, 2);
        let sizes: Vec<usize> = (0..8).map(|i| l.range(i, 1).1).collect();
        assert_eq!(sizes, [6, 6, 4, 4, 6, 6, 4, 4]);
        assert_eq!(l.offset(4), 20);
        assert_eq!(l.range(1, 6), (6, 30));
        assert!(!l.even());
        // Fewer elements than chunks: the tail chunks are empty.
        let tiny = ChunkLayout::new(5, 2, 4);
        assert_eq!((0..5).map(|i| tiny.range(i, 1).1).collect::<Vec<_>>(), [4, 4, 0, 0, 0]);
        let p = ChunkLayout::padded(3, 7, 4);
        assert!(p.even());
        assert_eq!(p.offset(5), 5 * 28);
    }

    #[test]
    fn every_builtin_generator_fits_uneven_chunks() {
        let reg = Registry::builtin();
        let topo = resolve("dgx1[0,1,2,4,5]").unwrap();
        for coll in Collective::ALL {
            for g in reg.iter().filter(|g| g.supports(coll)) {
                let s = g.generate(&Request::new(&topo, coll).pipeline(3)).unwrap();
                let k = (s.chunks / s.collective.chunk_multiple(s.nranks)) as usize;
                let l = ChunkLayout::new(k, 7 * k + 3, 4);
                assert!(l.fits(&s), "{} {coll}", g.name());
            }
        }
    }

    #[test]
    fn a_schedule_moving_a_chunk_to_another_index_does_not_fit() {
        use topoccl_synth::schedule::{Op, ScheduleBuilder};
        let mut b = ScheduleBuilder::new("shift", Collective::AllReduce, 2, 2);
        b.push(0, 0, Op::Send { to: 1, src: Slot::input(0) }, 1);
        b.push(1, 0, Op::Recv { from: 0, dst: Slot::output(1) }, 1);
        let s = b.build();
        assert!(!ChunkLayout::new(2, 5, 4).fits(&s));
        assert!(ChunkLayout::new(2, 6, 4).fits(&s));
    }
}

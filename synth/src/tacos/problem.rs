//! What the time-expanded network matcher is asked ([`TenOptions`]) and what it produces
//! ([`TenSchedule`]), shared by its two engines: the event-driven one (`super::ten`) and the
//! lock-step one (`super::lockstep`), and by what matches look at (`super::matching`).

/// Chunk `c` starts at rank `c / per_rank`.
pub type ChunkId = u32;

/// What the matcher produced.
#[derive(Debug, Clone)]
pub struct TenSchedule {
    pub nranks: usize,
    pub per_rank: u32,
    /// For every arc of the rank graph, the chunks it carries, in order.
    pub per_arc: Vec<Vec<ChunkId>>,
    /// Every transfer in start order: (arc, chunk) (only with `keep_order`).
    pub order: Vec<(u32, ChunkId)>,
    /// Where in `order` each moment's transfers begin (all of a moment start together).
    pub moments: Vec<u32>,
    /// Predicted completion, µs (links busy latency + chunk / bandwidth per chunk).
    pub time_us: f64,
    /// Distinct moments at which transfers started (the time-expanded network's steps).
    pub steps: u64,
}

/// Options for [`all_gather`](super::ten::all_gather).
#[derive(Debug, Clone, Copy)]
pub struct TenOptions {
    /// Chunks each rank starts with.
    pub per_rank: u32,
    /// Bytes per chunk, for link times.
    pub chunk_bytes: f64,
    /// Keep the transfer order (needed to emit a schedule; 8 bytes per transfer).
    pub keep_order: bool,
    /// Candidates looked at per free link and moment, as a multiple of the free links.
    pub window: usize,
    /// Breaks ties between equally good candidates: 0 takes them in chunk order, any other
    /// value in an order scrambled by it. Fixed per attempt, so every rank synthesizes the
    /// same schedule (see [`super::attempts::best_all_gather`]).
    pub seed: u64,
}

#[cfg(test)]
impl TenOptions {
    /// One 1 MB chunk per rank, order kept, the generator's window, seed 0.
    pub(crate) fn for_tests() -> TenOptions {
        TenOptions { per_rank: 1, chunk_bytes: 1e6, keep_order: true, window: 2, seed: 0 }
    }
}

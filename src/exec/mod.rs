//! The executor: one engine that runs any schedule of the IR (and grouped point-to-point
//! transfers) on real buffers over real connections. Nothing here knows which algorithm
//! produced the schedule.

pub(crate) mod engine;
pub(crate) mod layout;
pub(crate) mod memory;
pub(crate) mod program;
pub(crate) mod reduce;
pub(crate) mod wire;

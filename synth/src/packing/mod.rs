//! Packing spanning trees into link capacities: the mathematics Blink and forest packing
//! build their schedules from, and the bound certifies ceilings with. Nothing here emits a
//! schedule.
//!
//! - [`fractional`]: fractional packing by multiplicative weights (Garg–Könemann), with a
//!   certified ceiling.
//! - [`select`]: LP over the trees found, then an ILP that keeps a few (Blink's second stage).
//! - [`exact`]: where capacities are whole multiples of a unit (NVLink counts) and the trees are
//!   rooted (broadcast, reduce), Edmonds' theorem gives an exact integral packing with as many
//!   trees as the min cut.
//! - [`arborescence`]: minimum spanning trees and arborescences the packings ask for.
//! - [`multipath`], [`routed`]: trees whose edges are routed paths through switches, and their
//!   ceiling.
//! - [`lanes`]: rounding tree rates to whole lanes (channels).

pub mod arborescence;
pub mod exact;
pub mod fractional;
pub mod lanes;
pub mod multipath;
pub mod routed;
pub mod select;

//! # topoccl-synth
//!
//! The pure-computation half of topoccl: the [`topology`] model, the [`schedule`] IR every
//! algorithm emits, the classic [`algorithms`] as generators of that IR, the [`verify`]er that
//! proves a schedule computes its collective, and the [`sim`]ulator that prices a schedule on a
//! topology. Nothing here touches the network: the runtime crate executes what this crate
//! produces.
//!
//! ```
//! use topoccl_synth::{generate::Request, registry::Registry, schedule::Collective, sim, topology, verify};
//!
//! let dgx1 = topology::resolve("dgx1")?;
//! let ring = Registry::builtin().generate("ring", &Request::new(&dgx1, Collective::AllReduce))?;
//! verify::verify(&ring)?;
//! let t = sim::simulate(&dgx1, &ring, 1 << 30)?;
//! println!("1 GiB all-reduce on a DGX-1 with rings: {:.0} µs", t.time_us);
//! # Ok::<(), topoccl_synth::Error>(())
//! ```

pub mod algorithms;
pub mod blink;
pub mod bound;
pub mod error;
pub mod flow;
pub mod forest;
pub mod generate;
pub mod hash;
pub mod packing;
pub mod recent;
pub mod registry;
pub mod schedule;
pub mod sim;
pub mod tacos;
pub mod topology;
pub mod trees;
pub mod verify;

pub use error::{Error, Result};

//! Topology detection: which machine is this? Asked of NVML, the driver's management library
//! (loaded at run time, so building needs neither CUDA nor a driver): the GPUs, their NVLinks
//! and where each ends (another GPU, an NVSwitch), their generation, PCIe placement and NUMA
//! nodes. A machine wired as one of the library's (`dgx1`, `dgx-a100`, `dgx-h100`) gets the
//! library's own topology, with its measured figures; any other gets a model built from what
//! was found ([`model`]).
//!
//! `TOPOCCL_TOPOLOGY=detect` (or `detect[0-3]`, a subset of the GPUs) hands the tuner the
//! detected machine, rank i on NVML's GPU i (PCI order; NVML ignores `CUDA_VISIBLE_DEVICES`);
//! `collbench --topology detect` prints what was found. Where there is no NVML (no driver, no
//! library, `nvmlInit` fails) detection is an [`Error::NoNvml`] saying why, and callers fall
//! back to the host model.

mod model;
mod nvml;
mod probe;
mod recognise;
mod report;

use std::sync::{Once, OnceLock};

use topoccl_synth::topology::{self, Rank, Topology};

use crate::error::{Error, Result};

pub use model::{nvlink_generation, NvLinkGeneration};
pub use nvml::{PciAddress, PcieLevel};
pub use probe::{GpuFacts, NvLink, Probe, Remote};
pub use recognise::{Shape, LIBRARY};

/// The word that asks for detection, in `TOPOCCL_TOPOLOGY` and `collbench --topology`.
pub const SETTING: &str = "detect";

/// Whether the machine found is one of the library's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recognition {
    /// The library's machine of this name; its topology is the library's file.
    Library(&'static str),
    /// None of the library's: why not (the first difference from the closest one).
    Unrecognised(String),
}

/// What detection found.
#[derive(Debug, Clone)]
pub struct Detected {
    /// NVML's answers.
    pub probe: Probe,
    pub recognition: Recognition,
    /// The library's topology of a recognised machine, else the model of what was found.
    pub topology: Topology,
}

impl Detected {
    /// How the GPUs are wired by NVLink.
    pub fn shape(&self) -> Shape {
        Shape::of_probe(&self.probe)
    }
}

/// Asks NVML now (each call loads nothing new, but initialises NVML and asks again).
pub fn detect() -> Result<Detected> {
    let nvml = nvml::Nvml::open().map_err(Error::NoNvml)?;
    let probe = Probe::gather(&nvml).map_err(|e| Error::Nvml(e.message))?;
    drop(nvml);
    if probe.gpus.is_empty() {
        return Err(Error::Nvml("NVML sees no GPU".into()));
    }
    let (recognition, topology) = match recognise::recognise(&probe) {
        Ok(name) => (Recognition::Library(name), topology::resolve(name)?),
        Err(why) => (Recognition::Unrecognised(why), model::build(&probe)?),
    };
    Ok(Detected { probe, recognition, topology })
}

/// [`detect`]'s answer, asked once per process (the machine does not change under it, and
/// every communicator of the process asks).
pub fn detected() -> Result<&'static Detected> {
    static DETECTED: OnceLock<Result<Detected>> = OnceLock::new();
    DETECTED.get_or_init(detect).as_ref().map_err(Error::clone)
}

/// The rank subset a detection setting names: `None` for `detect`, the ranks for
/// `detect[0,1]`; `Err` for anything else.
fn subset(spec: &str) -> std::result::Result<Option<Vec<Rank>>, ()> {
    let spec = spec.trim();
    let Some(rest) = spec.strip_prefix(SETTING) else { return Err(()) };
    if rest.is_empty() {
        return Ok(None);
    }
    match rest.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        Some(list) => topology::parse_rank_list(list).map(Some).ok_or(()),
        None => Err(()),
    }
}

/// Whether a topology setting asks for detection (`detect`, `detect[0-3]`).
pub fn names_detection(spec: &str) -> bool {
    subset(spec).is_ok()
}

/// The detected topology a detection setting names (the subset's ranks renumbered from 0).
/// [`Error::NoNvml`] or [`Error::Nvml`] when detection cannot run here: fall back then.
pub fn resolve(spec: &str) -> Result<Topology> {
    let ranks = subset(spec)
        .map_err(|()| Error::InvalidArgument(format!("`{spec}` is not `{SETTING}` or `{SETTING}[ranks]`")))?;
    let found = detected()?;
    Ok(match ranks {
        None => found.topology.clone(),
        Some(ranks) => found.topology.select(&ranks)?,
    })
}

/// Whether an error means detection cannot run here (rather than a setting to fix).
pub fn unavailable(e: &Error) -> bool {
    matches!(e, Error::NoNvml(_) | Error::Nvml(_))
}

/// The tuner's topology for a `TOPOCCL_TOPOLOGY` setting (`None`: unset), and the spec it came
/// from: a detection setting is detected, falling back to `host_model` (with one line on
/// standard error per process) where detection cannot run; anything else is resolved by name.
pub fn resolve_setting(setting: Option<&str>, host_model: &str) -> Result<(String, Topology)> {
    let spec = setting.unwrap_or(host_model);
    if !names_detection(spec) {
        return Ok((spec.to_string(), topology::resolve(spec)?));
    }
    match resolve(spec) {
        Ok(t) => Ok((spec.to_string(), t)),
        Err(e) if unavailable(&e) => {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                eprintln!("topoccl: TOPOCCL_TOPOLOGY={spec}: {e}; the tuner uses the host model ({host_model})")
            });
            Ok((host_model.to_string(), topology::resolve(host_model)?))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_settings() {
        assert!(names_detection("detect"));
        assert!(names_detection(" detect[0-3] "));
        assert_eq!(subset("detect[0,2]"), Ok(Some(vec![0, 2])));
        for other in ["dgx1", "detector", "detect[", "detect[x]", "detect0", "full:8"] {
            assert!(!names_detection(other), "{other}");
        }
        assert!(resolve("dgx1").unwrap_err().to_string().contains("is not `detect`"));
        let (spec, t) = resolve_setting(Some("dgx1[0,1]"), "host:2").unwrap();
        assert_eq!((spec.as_str(), t.nranks()), ("dgx1[0,1]", 2));
        assert_eq!(resolve_setting(None, "host:3").unwrap().1.nranks(), 3);
    }
}

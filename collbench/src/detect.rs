//! `--topology detect`: the machine as NVML sees it (see `topoccl::detect`). Printed once per
//! job, as a table of the GPUs and a verdict (the library's machine it is, or the model built
//! for it), and used; where there is no NVML, one line saying so, and the host model.

use std::io::Write;

use topoccl::detect;
use topoccl_synth::topology::{self, Topology};

use crate::error::Result;

/// What `--topology` means for a run.
#[derive(Default)]
pub struct Choice {
    /// The machine named or detected; `None`: the host model.
    pub topology: Option<Topology>,
    /// What the ranks' tuner is told (their `TOPOCCL_TOPOLOGY`); `None`: the host model.
    pub setting: Option<String>,
    /// What to print once: the detection table, or why there is none.
    pub report: Option<String>,
}

/// Resolves `--topology` (`None`: not given).
pub fn choose(spec: Option<&str>) -> Result<Choice> {
    let Some(spec) = spec else { return Ok(Choice::default()) };
    if !detect::names_detection(spec) {
        return Ok(Choice { topology: Some(topology::resolve(spec)?), setting: Some(spec.to_string()), report: None });
    }
    match detect::resolve(spec) {
        Ok(t) => {
            let report = detect::detected()?.table();
            Ok(Choice { topology: Some(t), setting: Some(spec.to_string()), report: Some(report) })
        }
        Err(e) if detect::unavailable(&e) => Ok(Choice {
            topology: None,
            setting: None,
            report: Some(format!("# topology {spec}: {e}; using the host model\n")),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Prints `report` to `out`, or to standard error when standard output carries JSON.
pub fn print(report: &str, json_to_stdout: bool, out: &mut dyn Write) -> Result<()> {
    let written = if json_to_stdout {
        std::io::stderr().lock().write_all(report.as_bytes())
    } else {
        out.write_all(report.as_bytes())
    };
    written.map_err(|e| crate::error::Error::io("writing the detected topology", e))
}

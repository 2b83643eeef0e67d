//! The RDMA verbs transport, opened once per process for each set of settings (as NCCL opens
//! its devices once): loading libibverbs and opening a port cost milliseconds and pin memory,
//! and every communicator of the process talks through the same port.
//!
//! A rank without a usable port (no library, no device, no active port, `NCCL_IB_DISABLE=1`)
//! says so in its bootstrap record, and its pairs go over TCP; `NCCL_DEBUG=INFO` (or
//! `TOPOCCL_DEBUG=INFO`) prints one line saying which port was opened, or why none was.

use std::sync::{Arc, Mutex};

use topoccl_transports::verbs::{PortChoice, VerbsSettings, VerbsTransport};

use super::config::{Config, TransportPolicy};
use crate::env::var;
use crate::error::{Error, Result};

type Opened = (VerbsSettings, PortChoice, std::result::Result<Arc<VerbsTransport>, String>);

static OPENED: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

/// Whether `NCCL_DEBUG` (or `TOPOCCL_DEBUG`) asks for INFO lines.
fn info_wanted() -> bool {
    var("TOPOCCL_DEBUG")
        .or_else(|| var("NCCL_DEBUG"))
        .is_some_and(|v| v.eq_ignore_ascii_case("info") || v.eq_ignore_ascii_case("trace"))
}

/// The verbs transport of `settings`' port (as `choice` picks it), or why there is none;
/// opened on first use and remembered.
pub(crate) fn open(settings: &VerbsSettings, choice: PortChoice) -> std::result::Result<Arc<VerbsTransport>, String> {
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, r)) = opened.iter().find(|(s, c, _)| s == settings && *c == choice) {
        return r.clone();
    }
    let r = VerbsTransport::open(settings, choice, false).map(Arc::new);
    if info_wanted() {
        match &r {
            Ok(t) => eprintln!("topoccl INFO NET/IB : using {}", t.describe()),
            Err(why) => eprintln!("topoccl INFO NET/IB : no RDMA ({why}); pairs on different hosts use TCP"),
        }
    }
    opened.push((settings.clone(), choice, r.clone()));
    r
}

/// The verbs transport this rank uses, if the policy allows RDMA and a port opened; under
/// `TOPOCCL_TRANSPORT=ib`, an error where none did.
pub(crate) fn transport(cfg: &Config, choice: PortChoice) -> Result<Option<Arc<VerbsTransport>>> {
    let wanted = matches!(cfg.transport, TransportPolicy::Auto | TransportPolicy::Ib);
    let Some(settings) = cfg.verbs.as_ref().filter(|_| wanted) else {
        if cfg.transport == TransportPolicy::Ib {
            return Err(Error::InvalidArgument("TOPOCCL_TRANSPORT=ib, but RDMA is disabled (IB_DISABLE)".into()));
        }
        return Ok(None);
    };
    match open(settings, choice) {
        Ok(t) => Ok(Some(t)),
        Err(why) if cfg.transport == TransportPolicy::Ib => {
            Err(Error::InvalidArgument(format!("TOPOCCL_TRANSPORT=ib, but there is no RDMA port: {why}")))
        }
        Err(_) => Ok(None),
    }
}

/// The RDMA port this process would use under `cfg` (the first usable one), described, or why
/// there is none: for tools that check before they start ranks.
pub fn port(cfg: &Config) -> std::result::Result<String, String> {
    let settings = cfg.verbs.as_ref().ok_or("RDMA is disabled (IB_DISABLE)")?;
    open(settings, PortChoice::default()).map(|t| t.describe())
}

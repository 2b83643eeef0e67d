//! NVML's life cycle: `nvmlInit_v2` counts references and reads the machine (once per
//! process), `nvmlShutdown` gives one back; every other call needs a count above zero. Device
//! handles are addresses inside a static table, so a handle NVML never gave out is recognised
//! (`NVML_ERROR_INVALID_ARGUMENT`), never dereferenced.

use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use crate::machine::{Gpu, Machine, DEFAULT};
use crate::sys::{nvmlDevice_t, nvmlReturn_t, NvmlResult};

/// The environment variable naming the machine (a shipped name or a file).
pub const MACHINE_VAR: &str = "TOPOCCL_STANDIN_NVML_MACHINE";
/// The environment variable that makes `nvmlInit_v2` fail with a given code.
pub const INIT_VAR: &str = "TOPOCCL_STANDIN_NVML_INIT";

/// How many `nvmlInit_v2` are not yet matched by an `nvmlShutdown`, and whether one ever
/// succeeded.
struct Count {
    refs: u32,
    ever: bool,
}

static COUNT: Mutex<Count> = Mutex::new(Count { refs: 0, ever: false });
static MACHINE: OnceLock<Result<Machine, String>> = OnceLock::new();

/// One byte per possible device: a handle is the address of its device's byte.
static HANDLES: [u8; 64] = [0; 64];

fn count() -> std::sync::MutexGuard<'static, Count> {
    COUNT.lock().unwrap_or_else(|e| e.into_inner())
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// `TOPOCCL_STANDIN_NVML_INIT`'s code: a number, or a name (`driver_not_loaded`,
/// `no_permission`, `lib_rm_version_mismatch`, `unknown`).
pub fn parse_init_failure(v: &str) -> Option<nvmlReturn_t> {
    match v.to_ascii_lowercase().as_str() {
        "driver_not_loaded" => Some(nvmlReturn_t::DRIVER_NOT_LOADED),
        "no_permission" => Some(nvmlReturn_t::NO_PERMISSION),
        "lib_rm_version_mismatch" => Some(nvmlReturn_t(18)),
        "unknown" => Some(nvmlReturn_t::UNKNOWN),
        n => n.parse().ok().filter(|&c| c != 0).map(nvmlReturn_t),
    }
}

/// `nvmlInit_v2`.
pub fn init() -> NvmlResult<()> {
    if let Some(code) = env(INIT_VAR).as_deref().and_then(parse_init_failure) {
        return Err(code);
    }
    let machine = MACHINE.get_or_init(|| {
        let spec = env(MACHINE_VAR).unwrap_or_else(|| DEFAULT.to_string());
        let loaded = Machine::load(&spec);
        if let Err(why) = &loaded {
            // The one way to tell a person why the stand-in refuses to start.
            eprintln!("stand-in NVML: {MACHINE_VAR}: {why}");
        }
        loaded
    });
    if machine.is_err() {
        return Err(nvmlReturn_t::UNKNOWN);
    }
    let mut c = count();
    c.refs = c.refs.checked_add(1).ok_or(nvmlReturn_t::UNKNOWN)?;
    c.ever = true;
    Ok(())
}

/// `nvmlShutdown`: one reference less. More shutdowns than inits are not an error (as NVML's
/// header says), but a shutdown before any init is `NVML_ERROR_UNINITIALIZED`.
pub fn shutdown() -> NvmlResult<()> {
    let mut c = count();
    match (c.refs, c.ever) {
        (0, false) => Err(nvmlReturn_t::UNINITIALIZED),
        (0, true) => Ok(()),
        (_, _) => {
            c.refs -= 1;
            Ok(())
        }
    }
}

/// The machine, while NVML is initialised; `NVML_ERROR_UNINITIALIZED` otherwise.
pub fn machine() -> NvmlResult<&'static Machine> {
    if count().refs == 0 {
        return Err(nvmlReturn_t::UNINITIALIZED);
    }
    MACHINE.get().and_then(|m| m.as_ref().ok()).ok_or(nvmlReturn_t::UNINITIALIZED)
}

/// The handle of device `index`; `NVML_ERROR_INVALID_ARGUMENT` beyond the machine's GPUs.
pub fn handle(index: u32) -> NvmlResult<nvmlDevice_t> {
    let gpus = machine()?.gpus.len();
    let i = (index as usize).min(HANDLES.len());
    if i >= gpus || i >= HANDLES.len() {
        return Err(nvmlReturn_t::INVALID_ARGUMENT);
    }
    Ok((&HANDLES[i] as *const u8).cast_mut().cast::<c_void>())
}

/// The device a handle names, with its index: `NVML_ERROR_UNINITIALIZED` before init,
/// `NVML_ERROR_INVALID_ARGUMENT` for NULL or a handle NVML did not give out.
pub fn device(handle: nvmlDevice_t) -> NvmlResult<(usize, &'static Gpu)> {
    let m = machine()?;
    let base = HANDLES.as_ptr() as usize;
    let index = (handle as usize).wrapping_sub(base);
    m.gpus.get(index).map(|g| (index, g)).ok_or(nvmlReturn_t::INVALID_ARGUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_failures_by_name_or_number() {
        assert_eq!(parse_init_failure("driver_not_loaded"), Some(nvmlReturn_t::DRIVER_NOT_LOADED));
        assert_eq!(parse_init_failure("4"), Some(nvmlReturn_t::NO_PERMISSION));
        assert_eq!(parse_init_failure("0"), None);
        assert_eq!(parse_init_failure("x"), None);
    }
}

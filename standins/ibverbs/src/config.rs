//! The knobs: environment variables read once, at the first call that needs them.

use std::sync::OnceLock;

pub const DEVICES_VAR: &str = "TOPOCCL_STANDIN_IB_DEVICES";
pub const LINK_VAR: &str = "TOPOCCL_STANDIN_IB_LINK";
pub const SEED_VAR: &str = "TOPOCCL_STANDIN_IB_SEED";
pub const DELAY_VAR: &str = "TOPOCCL_STANDIN_IB_DELAY_US";
pub const DROP_VAR: &str = "TOPOCCL_STANDIN_IB_DROP";
pub const BAD_RKEY_VAR: &str = "TOPOCCL_STANDIN_IB_BAD_RKEY";
pub const ODP_VAR: &str = "TOPOCCL_STANDIN_IB_ODP";
pub const DMABUF_VAR: &str = "TOPOCCL_STANDIN_IB_DMABUF";

/// At most this many devices (the device index lives in two bits of the IPv4-mapped GID and
/// of the LID).
pub const MAX_DEVICES: u8 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Devices {
    /// `ibv_get_device_list` fails with `ENOSYS`, as on a kernel without RDMA.
    Enosys,
    Count(u8),
}

#[derive(Debug)]
pub struct Config {
    pub devices: Devices,
    /// InfiniBand link layer (LIDs) instead of RoCE (Ethernet, GIDs only).
    pub ib: bool,
    pub seed: u64,
    /// Each work request waits a random 0..=this many µs before the NIC reads its source.
    pub delay_us: u64,
    /// Probability that a packet (request or response) is lost.
    pub drop: f64,
    /// The N-th RDMA write this process posts (from 1) goes out with a corrupted rkey.
    pub bad_rkey: Option<u64>,
    /// Whether `IBV_ACCESS_ON_DEMAND` registrations are accepted (on-demand paging, as
    /// ConnectX-5 and later offer for RC writes).
    pub odp: bool,
    /// Whether `ibv_reg_dmabuf_mr` registers (else `EOPNOTSUPP`, as on a kernel without
    /// dma-buf support).
    pub dmabuf: bool,
}

/// The knobs of this process.
pub fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::from_env)
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

fn bad(name: &str, value: &str, default: &str) {
    eprintln!("topoccl ibverbs stand-in: ignoring {name}={value:?} (using {default})");
}

impl Config {
    fn from_env() -> Config {
        let devices = match var(DEVICES_VAR) {
            None => Devices::Count(1),
            Some(v) if v.eq_ignore_ascii_case("enosys") => Devices::Enosys,
            Some(v) => match v.parse::<u8>() {
                Ok(n) if n <= MAX_DEVICES => Devices::Count(n),
                Ok(_) => {
                    bad(DEVICES_VAR, &v, "the maximum, 4");
                    Devices::Count(MAX_DEVICES)
                }
                Err(_) => {
                    bad(DEVICES_VAR, &v, "1");
                    Devices::Count(1)
                }
            },
        };
        let ib = match var(LINK_VAR).as_deref() {
            None | Some("eth") | Some("roce") => false,
            Some("ib") => true,
            Some(v) => {
                bad(LINK_VAR, v, "eth");
                false
            }
        };
        let seed = var(SEED_VAR).and_then(|v| v.parse::<u64>().ok()).unwrap_or_else(default_seed);
        let delay_us = match var(DELAY_VAR) {
            None => 100,
            Some(v) => v.parse::<u64>().unwrap_or_else(|_| {
                bad(DELAY_VAR, &v, "100");
                100
            }),
        };
        let drop = match var(DROP_VAR) {
            None => 0.0,
            Some(v) => match v.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => p,
                _ => {
                    bad(DROP_VAR, &v, "0");
                    0.0
                }
            },
        };
        let bad_rkey = match var(BAD_RKEY_VAR) {
            None => None,
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n >= 1 => Some(n),
                _ => {
                    bad(BAD_RKEY_VAR, &v, "none");
                    None
                }
            },
        };
        let odp = match var(ODP_VAR).as_deref() {
            None | Some("1") => true,
            Some("0") => false,
            Some(v) => {
                bad(ODP_VAR, v, "1");
                true
            }
        };
        let dmabuf = match var(DMABUF_VAR).as_deref() {
            None | Some("1") => true,
            Some("0") => false,
            Some(v) => {
                bad(DMABUF_VAR, v, "1");
                true
            }
        };
        Config { devices, ib, seed, delay_us, drop, bad_rkey, odp, dmabuf }
    }
}

fn default_seed() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64);
    now.unwrap_or(0) ^ u64::from(std::process::id()).rotate_left(32)
}

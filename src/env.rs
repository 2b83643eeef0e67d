//! Reading the environment: settings (`var`), and a launcher's word on who this process is,
//! how many ranks there are and where they meet.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::error::{Error, Result};
use topoccl_synth::hash::fnv64;

/// What a launcher told this process.
#[derive(Debug, Clone)]
pub(crate) struct LaunchEnv {
    pub rank: u32,
    pub size: u32,
    pub root: SocketAddr,
    pub secret: [u8; 16],
}

/// A variable's value, trimmed; `None` when unset or blank.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn parse_u32(name: &str, v: &str) -> Result<u32> {
    v.trim().parse().map_err(|_| Error::InvalidArgument(format!("{name}={v} is not a non-negative integer")))
}

/// The launchers we recognise, as (rank variable, size variable).
const LAUNCHERS: [(&str, &str); 4] = [
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
];

/// The world size a recognised launcher announced, if any (whether or not the rest of its
/// environment is complete).
pub fn launcher_world_size() -> Option<u32> {
    LAUNCHERS.iter().find_map(|(_, s)| var(s)).and_then(|s| s.parse().ok())
}

impl LaunchEnv {
    pub(crate) fn detect() -> Result<LaunchEnv> {
        let (rank, size) =
            LAUNCHERS.iter().find_map(|(r, s)| Some(((*r, var(r)?), (*s, var(s)?)))).ok_or_else(|| {
                Error::Bootstrap(
                    "no launcher environment: set RANK and WORLD_SIZE (as torchrun does), or start under mpirun or srun"
                        .into(),
                )
            })?;
        let rank_n = parse_u32(rank.0, &rank.1)?;
        let size_n = parse_u32(size.0, &size.1)?;
        if size_n == 0 || rank_n >= size_n {
            return Err(Error::InvalidArgument(format!(
                "{}={} is out of range for {}={}",
                rank.0, rank.1, size.0, size.1
            )));
        }
        let root_text = match (var("TOPOCCL_ROOT"), var("MASTER_ADDR"), var("MASTER_PORT")) {
            (Some(r), _, _) => r,
            (None, Some(a), Some(p)) => format!("{a}:{p}"),
            (None, None, Some(p)) if size_n == 1 || single_host() => format!("127.0.0.1:{p}"),
            _ => {
                return Err(Error::Bootstrap(
                    "where should the ranks meet? set MASTER_ADDR and MASTER_PORT, or TOPOCCL_ROOT=host:port".into(),
                ))
            }
        };
        let root = root_text
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.find(|a| a.is_ipv4()).or_else(|| root_text.to_socket_addrs().ok()?.next()))
            .ok_or_else(|| Error::Bootstrap(format!("cannot resolve the meeting address {root_text}")))?;
        let secret = match var("TOPOCCL_SECRET") {
            Some(hex) => parse_secret(&hex)?,
            None => {
                // Without a shared secret, derive one from what every rank of this job shares;
                // it keeps other jobs out, not attackers (set TOPOCCL_SECRET for that).
                let job = ["SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "TORCHELASTIC_RUN_ID"]
                    .iter()
                    .find_map(|v| var(v))
                    .unwrap_or_default();
                let text = format!("{root}/{size_n}/{job}");
                let mut s = [0u8; 16];
                for (i, w) in s.chunks_exact_mut(8).enumerate() {
                    w.copy_from_slice(&fnv64(format!("{i}{text}").as_bytes()).to_le_bytes());
                }
                s
            }
        };
        Ok(LaunchEnv { rank: rank_n, size: size_n, root, secret })
    }
}

fn single_host() -> bool {
    var("OMPI_COMM_WORLD_LOCAL_SIZE") == var("OMPI_COMM_WORLD_SIZE") && var("OMPI_COMM_WORLD_SIZE").is_some()
}

fn parse_secret(hex: &str) -> Result<[u8; 16]> {
    let bad = || Error::InvalidArgument("TOPOCCL_SECRET must be 32 hexadecimal digits".into());
    if hex.len() != 32 {
        return Err(bad());
    }
    let mut s = [0u8; 16];
    for (i, b) in s.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_parse_from_hex() {
        assert_eq!(parse_secret("000102030405060708090a0b0c0d0e0f").unwrap()[15], 15);
        assert!(parse_secret("xyz").is_err());
        assert!(parse_secret("zz0102030405060708090a0b0c0d0e0f").is_err());
    }
}

//! Size strings and the size sweep, with nccl-tests' meanings: `-b` first, `-e` last, `-f`
//! multiply or `-i` add; K, M, G are powers of 1024.

use crate::error::{Error, Result};

/// Parses `8`, `1K`, `256M`, `1G`, `64KiB`, `2MB` (all powers of 1024).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let bad = || {
        Error::InvalidArgument(format!(
            "bad size `{s}`: expected a number with an optional K, M or G suffix, like 8, 64K, 1G"
        ))
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(|| Error::InvalidArgument(format!("size `{s}` is too large")))
}

/// The sizes from `min` to `max`: multiplied by `factor` each time, or increased by `step` when
/// it is non-zero (nccl-tests: `-i` wins over `-f`).
pub fn sweep(min: u64, max: u64, factor: u64, step: u64) -> Result<Vec<u64>> {
    if min > max {
        return Err(Error::InvalidArgument(format!("minimum size {min} is larger than maximum size {max}")));
    }
    if step == 0 && factor < 2 && min != max {
        return Err(Error::InvalidArgument("step factor (-f) must be at least 2, or give a step (-i)".into()));
    }
    let mut out = Vec::new();
    let mut s = min;
    loop {
        out.push(s);
        let next = if step > 0 { s.checked_add(step) } else { s.max(1).checked_mul(factor) };
        match next {
            Some(n) if n <= max && n > s => s = n,
            _ => break,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        for bad in ["", "G", "1X", "-3", "1.5M"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sweeps() {
        assert_eq!(sweep(8, 64, 2, 0).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(sweep(8, 40, 0, 16).unwrap(), vec![8, 24, 40]);
        assert_eq!(sweep(0, 4, 2, 0).unwrap(), vec![0, 2, 4]);
        assert!(sweep(64, 8, 2, 0).is_err());
        assert!(sweep(8, 64, 1, 0).is_err());
    }
}

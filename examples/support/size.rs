//! Byte sizes as the examples take them on the command line: `4096`, `512K`, `64M`, `1G`
//! (binary suffixes; a trailing `B` or `iB` is allowed). Included by `#[path]`.

pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().trim_end_matches("iB").trim_end_matches('B');
    let (num, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    num.parse::<usize>().map(|n| n << shift).map_err(|e| format!("size {s:?}: {e}"))
}

//! Resolving a topology name: a built-in machine (the files of `topologies/`, compiled in), a
//! generated family (`torus2d:8x8`), or a path to a file (topoccl's TOML, or NCCL's topology
//! XML), optionally followed by a rank subset (`dgx1[0,1,3,6]`, `dgx1[0-4]`) for fragmented
//! allocations.

use std::path::Path;

use super::{families, file, nccl_xml, Rank, Topology};
use crate::error::{Error, Result};

/// (name, file text) of every file in `topologies/`.
const BUILTIN: &[(&str, &str)] = &[
    ("dgx1", include_str!("../../../topologies/dgx1.toml")),
    ("dgx-a100", include_str!("../../../topologies/dgx-a100.toml")),
    ("dgx-h100", include_str!("../../../topologies/dgx-h100.toml")),
    ("ndv2", include_str!("../../../topologies/ndv2.toml")),
    ("ring-8", include_str!("../../../topologies/ring-8.toml")),
    ("full-8", include_str!("../../../topologies/full-8.toml")),
    ("mesh2d-4x4", include_str!("../../../topologies/mesh2d-4x4.toml")),
    ("torus2d-8x8", include_str!("../../../topologies/torus2d-8x8.toml")),
    ("torus3d-4x4x4", include_str!("../../../topologies/torus3d-4x4x4.toml")),
    ("hypercube-64", include_str!("../../../topologies/hypercube-64.toml")),
    ("cluster-64x8", include_str!("../../../topologies/cluster-64x8.toml")),
    ("cluster-2x4-slow", include_str!("../../../topologies/cluster-2x4-slow.toml")),
    ("torus2d-4x4-slowlink", include_str!("../../../topologies/torus2d-4x4-slowlink.toml")),
];

/// Names of the built-in machines.
pub fn builtin_names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(n, _)| *n).collect()
}

/// Resolves a name, family spec or path (each optionally with a `[ranks]` subset).
pub fn resolve(spec: &str) -> Result<Topology> {
    let spec = spec.trim();
    if let Some(open) = spec.rfind('[').filter(|_| spec.ends_with(']')) {
        let base = resolve(&spec[..open])?;
        let ranks = parse_rank_list(&spec[open + 1..spec.len() - 1]).ok_or_else(|| Error::InvalidTopology {
            name: spec.to_string(),
            message: "rank subset must look like [0,1,3,6] or [0-4]".into(),
        })?;
        return base.select(&ranks);
    }
    if let Some((name, text)) = BUILTIN.iter().find(|(n, _)| *n == spec) {
        return file::parse(text, Path::new(&format!("topologies/{name}.toml")), name);
    }
    if families::is_family(spec) {
        return families::generate(spec);
    }
    let path = Path::new(spec);
    if path.is_file() {
        return load(path);
    }
    Err(Error::UnknownTopology(spec.to_string(), builtin_names().join(", ")))
}

/// Reads a topology file: NCCL's XML when its name ends in `.xml` or its text starts with
/// `<system` (users have dumps from `NCCL_TOPO_DUMP_FILE`), topoccl's TOML otherwise.
fn load(path: &Path) -> Result<Topology> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.into(), source })?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    if nccl_xml::is_nccl_xml(path, &text) {
        nccl_xml::parse(&text, path, &stem)
    } else {
        file::parse(&text, path, &stem)
    }
}

/// Reads a rank subset's list (`0,1,3,6`, `0-4`, `0-1,6`), the text between a spec's brackets;
/// `None` if it is not one. Public for names resolved outside this crate (`detect[0-3]`).
pub fn parse_rank_list(list: &str) -> Option<Vec<Rank>> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim) {
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b): (Rank, Rank) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(item.parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_in_topologies_is_builtin_and_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../topologies");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let p = e.unwrap().path();
                (p.extension()? == "toml").then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
            })
            .collect();
        on_disk.sort();
        let mut builtin: Vec<String> = builtin_names().iter().map(|s| s.to_string()).collect();
        builtin.sort();
        assert_eq!(on_disk, builtin);
        for name in builtin_names() {
            let t = resolve(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(t.nranks() >= 2, "{name}");
        }
    }

    #[test]
    fn dgx1_has_six_nvlinks_per_gpu() {
        let t = resolve("dgx1").unwrap();
        assert_eq!(t.nranks(), 8);
        for r in 0..8 {
            let nvlink: f64 = (0..8).filter(|&o| o != r).map(|o| t.direct_bandwidth(r, o)).sum();
            assert_eq!(nvlink, 6.0 * 25.0, "gpu{r}");
        }
    }

    #[test]
    fn subsets_and_errors() {
        let t = resolve("dgx1[0,1,3,6]").unwrap();
        assert_eq!(t.nranks(), 4);
        assert_eq!(t.direct_bandwidth(0, 2), 50.0); // gpu0-gpu3 is a double NVLink
        assert_eq!(t.direct_bandwidth(1, 3), 0.0); // gpu1-gpu6 only through PCIe and the CPUs
        assert_eq!(resolve("dgx1[0-4]").unwrap().nranks(), 5);
        assert!(resolve("dgx1[0,9]").unwrap_err().to_string().contains("rank 9"));
        assert!(resolve("dgx1[0,0]").unwrap_err().to_string().contains("twice"));
        assert!(resolve("nonesuch").unwrap_err().to_string().contains("unknown topology"));
    }
}

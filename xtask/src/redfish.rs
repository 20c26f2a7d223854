//! The Redfish tools of the BMC tests, from PyPI (pinned in `tools/redfish/requirements.txt`)
//! in one virtual environment in the cache: `sushy-emulator` (sushy-tools, the Redfish emulator
//! OpenStack Ironic is tested against), the `sushy` client library, and the DMTF's
//! Redfish-Protocol-Validator. The tests get the environment's `bin` folder as
//! `ICHOR_REDFISH_TOOLS` (ADR 0079).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// The pinned requirements, from the workspace root.
const REQUIREMENTS: &str = "tools/redfish/requirements.txt";

/// Creates (or reuses) the virtual environment; returns its `bin` folder, which holds
/// `sushy-emulator` and a `python` that imports `sushy` and `redfish_protocol_validator`.
/// Rebuilt only when the requirements changed.
pub fn ensure(root: &Path) -> Result<PathBuf> {
    let emulator = crate::checkov::pip_tool(root, REQUIREMENTS, "sushy-tools", "sushy-emulator")?;
    let bin = emulator
        .parent()
        .with_context(|| format!("{} has no folder", emulator.display()))?
        .to_path_buf();
    check_imports(&bin)?;
    Ok(bin)
}

/// Fails unless the environment's python imports what the tests use from it.
fn check_imports(bin: &Path) -> Result<()> {
    let python = bin.join("python");
    let output = Command::new(&python)
        .args([
            "-c",
            "import bcrypt, sushy, sushy_tools.emulator.main, redfish_protocol_validator",
        ])
        .output()
        .with_context(|| format!("run {}", python.display()))?;
    if !output.status.success() {
        bail!(
            "the Redfish tools in {} do not import (delete the folder to reinstall): {}",
            bin.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

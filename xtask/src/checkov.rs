//! The shipped manifests under a real third-party linter: checkov (PyPI, pinned in
//! `tools/checkov/requirements.txt`) installed into a virtual environment in the cache, run on
//! the chart as `helm template` renders it, in a network namespace of its own so it cannot
//! reach anything. Each finding is fixed in the chart or suppressed with its reason in
//! `.checkov.yaml`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::run::run;

/// Creates (or reuses) the virtual environment holding checkov; returns the `checkov` script.
/// Rebuilt only when `tools/checkov/requirements.txt` changed.
pub fn ensure(root: &Path) -> Result<PathBuf> {
    pip_tool(root, "tools/checkov/requirements.txt", "checkov", "checkov")
}

/// A tool from PyPI in a virtual environment of the cache, `<cache>/<binary>-<version>`:
/// `requirements` (from the workspace root) pins `package==VERSION` (a `--hash=…` may follow).
/// The environment is created again only when the requirements file changed. Returns its
/// `bin/<binary>`.
pub fn pip_tool(root: &Path, requirements: &str, package: &str, binary: &str) -> Result<PathBuf> {
    let path = root.join(requirements);
    let pinned =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let pin = format!("{package}==");
    let version = pinned
        .lines()
        .find_map(|l| l.trim().strip_prefix(pin.as_str()))
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("{requirements} must pin {pin}VERSION"))?
        .to_owned();
    let venv = crate::assets::cache_root().join(format!("{binary}-{version}"));
    let tool = venv.join("bin").join(binary);
    let stamp = venv.join(".requirements.stamp");
    if tool.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == pinned) {
        eprintln!("{binary}: reusing {}", tool.display());
        return Ok(tool);
    }
    install_requirements(&venv, &path, binary)?;
    if !tool.is_file() {
        bail!(
            "{pin}{version} installed no {}: the package no longer ships it",
            tool.display()
        );
    }
    std::fs::write(&stamp, pinned).with_context(|| format!("write {binary}'s stamp"))?;
    Ok(tool)
}

/// Creates the virtual environment `venv` afresh and installs `requirements` into it with pip;
/// `what` names the tool in errors.
pub fn install_requirements(venv: &Path, requirements: &Path, what: &str) -> Result<()> {
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
        .with_context(|| format!("python3 was not found on PATH: install Python 3.9 or newer ({what} installs from PyPI)"))?;
    let _ = std::fs::remove_dir_all(venv);
    let mut cmd = Command::new(python);
    cmd.args(["-m", "venv"]).arg(venv);
    run(cmd).with_context(|| {
        format!("create {what}'s virtual environment (Debian: apt-get install python3-venv)")
    })?;
    let mut cmd = Command::new(venv.join("bin/pip"));
    cmd.args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "-r",
    ])
    .arg(requirements);
    run(cmd)
}

/// Renders the chart with `helm` and runs checkov on it, offline; fails on any finding that
/// `.checkov.yaml` does not suppress.
pub fn lint(root: &Path, helm: &Path, checkov: &Path) -> Result<()> {
    let dir = tempfile_dir()?;
    let manifests = dir.join("ichor.yaml");
    let output = Command::new(helm)
        .current_dir(root)
        .args([
            "template",
            "ichor",
            "charts/ichor",
            "--namespace",
            "ichor-system",
        ])
        .output()
        .context("run helm template")?;
    if !output.status.success() {
        bail!(
            "helm template charts/ichor failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::write(&manifests, &output.stdout).context("write the rendered chart")?;
    // `unshare --net`: a network namespace with nothing in it, so the run is offline by
    // construction (checkov otherwise looks for updates and policy metadata online).
    let mut cmd = Command::new("unshare");
    cmd.current_dir(root)
        .arg("--net")
        .arg(checkov)
        .args(["--config-file", ".checkov.yaml", "--file"])
        .arg(&manifests)
        .env("CHECKOV_RUN_SCA_PACKAGE_SCAN_V2", "false");
    let result = run(cmd);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("ichor-checkov-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

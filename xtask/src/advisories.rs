//! `cargo deny check advisories`, offline, against a snapshot of the RustSec advisory database
//! (docs/adr/0002). The build machines cannot reach the database's home; a snapshot of its
//! `crates/` and `rust/` folders is kept beside the project (`../shared/advisory-db`), and
//! `.ci/run` names it in `ICHOR_ADVISORY_DB`. cargo-deny reads a database only as a git
//! repository, in a folder named after the database's URL: the snapshot is copied into the
//! cache as such a repository with one commit, and `deny.toml`'s `db-path` is pointed there
//! through `ICHOR_ADVISORY_DBS`. A missing snapshot fails the check; it is never skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::run::run;

/// Names the advisory snapshot folder (holding `crates/`), set by `.ci/run`.
pub const SNAPSHOT_ENV: &str = "ICHOR_ADVISORY_DB";

/// Names the folder `deny.toml`'s `[advisories] db-path` reads (`${ICHOR_ADVISORY_DBS}`).
const DBS_ENV: &str = "ICHOR_ADVISORY_DBS";

/// The folder cargo-deny derives from the default database URL, github.com/RustSec/advisory-db
/// (`SNAPSHOT.md` in the snapshot).
const DB_FOLDER: &str = "advisory-db-3157b0e258782691";

/// The snapshot `ICHOR_ADVISORY_DB` names, or an error saying how to provide one.
fn snapshot() -> Result<PathBuf> {
    let Some(path) = std::env::var_os(SNAPSHOT_ENV).map(PathBuf::from) else {
        bail!(
            "{SNAPSHOT_ENV} is not set: the advisory check reads a snapshot of the RustSec advisory database offline; set {SNAPSHOT_ENV} to the snapshot folder (the one holding crates/ and SNAPSHOT.md, ../shared/advisory-db beside the project; .ci/run sets it)"
        );
    };
    if !path.join("crates").is_dir() {
        bail!(
            "{SNAPSHOT_ENV}={} holds no RustSec advisory snapshot (no crates/ folder): point it at the snapshot folder (../shared/advisory-db beside the project); the advisory check is never skipped",
            path.display()
        );
    }
    Ok(path)
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("create {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("read {}", from.display()))? {
        let entry = entry.with_context(|| format!("read {}", from.display()))?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)
                .with_context(|| format!("copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}

fn git(dir: &Path, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .args(["-c", "user.name=ichor", "-c", "user.email=ichor@localhost"])
        .args(args);
    let output = cmd.output().with_context(|| format!("run git {args:?}"))?;
    if !output.status.success() {
        bail!(
            "git {args:?} in {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Copies the snapshot into `cache` as the one-commit repository cargo-deny opens; returns the
/// folder to give as `db-path`.
fn prepare(snapshot: &Path, cache: &Path) -> Result<PathBuf> {
    let dbs = cache.join("advisory-dbs");
    let repo = dbs.join(DB_FOLDER);
    if repo.exists() {
        std::fs::remove_dir_all(&repo).with_context(|| format!("remove {}", repo.display()))?;
    }
    for part in ["crates", "rust"] {
        if snapshot.join(part).is_dir() {
            copy_tree(&snapshot.join(part), &repo.join(part))?;
        }
    }
    git(&repo, &["init", "-q"])?;
    git(&repo, &["add", "-A"])?;
    git(&repo, &["commit", "-q", "-m", "RustSec advisory snapshot"])?;
    Ok(dbs)
}

/// Runs `cargo deny --offline check advisories` against the snapshot, installing cargo-deny
/// first when needed.
pub fn check(root: &Path) -> Result<()> {
    let deny = crate::deny::ensure(root)?;
    check_with(root, &deny)
}

/// Runs `cargo deny --offline check advisories` against the snapshot with the cargo-deny
/// binary `deny`.
pub fn check_with(root: &Path, deny: &Path) -> Result<()> {
    let snapshot = snapshot()?;
    let dbs = prepare(&snapshot, &crate::assets::cache_root())?;
    let stamp = std::fs::read_to_string(snapshot.join("SNAPSHOT.md")).unwrap_or_default();
    if let Some(line) = stamp.lines().find(|l| l.contains("at commit")) {
        eprintln!("advisories: {}", line.trim());
    }
    let mut cmd = std::process::Command::new(deny);
    cmd.current_dir(root)
        .env(DBS_ENV, &dbs)
        .args(["--offline", "check", "advisories"]);
    run(cmd)
}

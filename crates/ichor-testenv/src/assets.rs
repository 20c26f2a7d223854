//! Where the envtest binaries (`kube-apiserver`, `etcd`, and for simulated workload clusters
//! `kube-controller-manager` and `kwok`) live.
//!
//! This module uses only `std`: `xtask` compiles the same file (by path) so that the folder it
//! builds into and the folder the tests look in can never disagree.

use std::env;
use std::path::{Path, PathBuf};

/// A folder holding `kube-apiserver` and `etcd`, as controller-runtime's envtest uses it.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// Overrides the cache root (default `$XDG_CACHE_HOME/ichor`, else `~/.cache/ichor`).
pub const CACHE_ENV: &str = "ICHOR_CACHE_DIR";

/// Overrides the folder holding the Talos oracle binaries (`talos-oracle-1.13`, …).
pub const ORACLES_ENV: &str = "ICHOR_ORACLES_DIR";

/// The binaries a control plane needs, by file name.
pub const BINARIES: [&str; 2] = ["kube-apiserver", "etcd"];

/// The further binaries a simulated workload cluster needs, by file name.
pub const WORKLOAD_BINARIES: [&str; 2] = ["kube-controller-manager", "kwok"];

/// The versions the tools module pins, read from its `go.mod`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolVersions {
    /// The `k8s.io/kubernetes` version, e.g. `v1.36.3`.
    pub kubernetes: String,
    /// The `go.etcd.io/etcd/server/v3` version, e.g. `v3.6.16`.
    pub etcd: String,
}

impl ToolVersions {
    /// Reads the pinned versions from the text of `tools/k8s/go.mod`.
    pub fn from_go_mod(go_mod: &str) -> Option<Self> {
        Some(Self {
            kubernetes: required_version(go_mod, "k8s.io/kubernetes")?,
            etcd: required_version(go_mod, "go.etcd.io/etcd/server/v3")?,
        })
    }

    /// The name of the cache sub-folder these versions build into.
    pub fn folder_name(&self) -> String {
        format!("k8s-{}-etcd-{}", self.kubernetes, self.etcd)
    }
}

/// The version of `module` that the text of a `go.mod` requires, written either in a
/// `require (` block or as a one-line `require module version`.
pub fn required_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let line = line.trim().trim_start_matches("require ");
        let mut words = line.split_whitespace();
        (words.next() == Some(module))
            .then(|| words.next())
            .flatten()
            .filter(|v| v.starts_with('v'))
            .map(str::to_owned)
    })
}

/// The root of Ichor's build cache, outside any source tree.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = env::var_os(CACHE_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir).join("ichor");
    }
    let home = env::var_os("HOME").map_or_else(env::temp_dir, PathBuf::from);
    home.join(".cache").join("ichor")
}

/// The folder `cargo xtask envtest-assets` builds the given versions into.
pub fn cache_dir(versions: &ToolVersions) -> PathBuf {
    cache_root().join("envtest").join(versions.folder_name())
}

/// The folder to take binaries from: `KUBEBUILDER_ASSETS` when set, else the build cache.
pub fn assets_dir(versions: &ToolVersions) -> PathBuf {
    match env::var_os(ASSETS_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => cache_dir(versions),
    }
}

/// The folder holding the Talos oracles: `ICHOR_ORACLES_DIR` when set, else the build cache.
pub fn oracles_dir() -> PathBuf {
    match env::var_os(ORACLES_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => cache_root().join("oracles"),
    }
}

/// The binaries of [`BINARIES`] that `dir` lacks.
pub fn missing_binaries(dir: &Path) -> Vec<&'static str> {
    missing(dir, &BINARIES)
}

/// The binaries of [`BINARIES`] and [`WORKLOAD_BINARIES`] that `dir` lacks.
pub fn missing_workload_binaries(dir: &Path) -> Vec<&'static str> {
    let mut all = missing(dir, &BINARIES);
    all.extend(missing(dir, &WORKLOAD_BINARIES));
    all
}

fn missing(dir: &Path, names: &[&'static str]) -> Vec<&'static str> {
    names
        .iter()
        .copied()
        .filter(|name| !dir.join(name).is_file())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_one_line_require() {
        let go_mod = "module x\n\nrequire github.com/siderolabs/talos v1.14.1\n\nrequire (\n\tgithub.com/siderolabs/talos/pkg/machinery v1.14.1 // indirect\n)\nreplace (\n\tgithub.com/cosi-project/runtime => github.com/cosi-project/runtime v1.16.2\n)\n";
        assert_eq!(
            required_version(go_mod, "github.com/siderolabs/talos").as_deref(),
            Some("v1.14.1")
        );
        assert_eq!(
            required_version(go_mod, "github.com/cosi-project/runtime"),
            None
        );
    }

    #[test]
    fn reads_pinned_versions_from_go_mod() {
        let go_mod = "module x\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 v3.6.16\n\tk8s.io/kubernetes v1.36.3\n)\nreplace (\n\tk8s.io/api => k8s.io/api v0.36.3\n)\n";
        let versions = ToolVersions::from_go_mod(go_mod).expect("versions");
        assert_eq!(versions.kubernetes, "v1.36.3");
        assert_eq!(versions.etcd, "v3.6.16");
        assert_eq!(versions.folder_name(), "k8s-v1.36.3-etcd-v3.6.16");
    }

    #[test]
    fn missing_versions_are_none() {
        assert_eq!(ToolVersions::from_go_mod("module x\n"), None);
    }
}

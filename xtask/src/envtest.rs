//! Building the envtest binaries from Go modules: kube-apiserver, etcd and
//! kube-controller-manager from `tools/k8s`, and kwok from `tools/kwok`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::assets::{self, ToolVersions};
use crate::run::run;

/// The stamp of the single-stamp layout used before each binary had its own; removed on sight.
const LEGACY_STAMP: &str = ".ichor-build-stamp";

fn tools_dir(root: &Path) -> PathBuf {
    root.join("tools").join("k8s")
}

fn kwok_dir(root: &Path) -> PathBuf {
    root.join("tools").join("kwok")
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))
}

fn versions(root: &Path) -> Result<ToolVersions> {
    let go_mod = tools_dir(root).join("go.mod");
    ToolVersions::from_go_mod(&read(&go_mod)?).with_context(|| {
        format!(
            "{} must require k8s.io/kubernetes and go.etcd.io/etcd/server/v3",
            go_mod.display()
        )
    })
}

fn require_go() -> Result<()> {
    let ok = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        bail!(
            "`go` was not found on PATH: install Go 1.26 or newer (the envtest binaries are built from Go modules), or set KUBEBUILDER_ASSETS to a folder holding kube-apiserver, etcd, kube-controller-manager and kwok"
        );
    }
    Ok(())
}

/// The Go flags of every tool build. `-gcflags=all=-dwarf=false`: the binaries are linked with
/// `-s -w`, which drops the debug information anyway, so the compiler need not make it (about
/// a fifth of a cold build's compute; stack traces read the pclntab, which stays). ADR 0058.
const GOFLAGS: &str = "-mod=readonly -buildvcs=false -gcflags=all=-dwarf=false";

/// The collector target of the Go compiler and linker: four times the default heap growth
/// between collections trades memory, which the machine has, for a fifth less compute on a cold
/// build (ADR 0058).
const GOGC: &str = "400";

fn go(dir: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(dir)
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", GOFLAGS)
        .env("GOGC", GOGC);
    cmd
}

/// One binary of the assets folder: the Go module it is built in, its package and linker flags.
struct Build {
    binary: &'static str,
    module: PathBuf,
    package: &'static str,
    ldflags: String,
}

impl Build {
    /// What the binary is a function of: its package, flags and module's go.mod and go.sum (the
    /// sources come from the module cache, pinned by go.sum).
    fn stamp(&self) -> Result<String> {
        Ok(format!(
            "{}\n{}\n{}\n{}",
            self.package,
            self.ldflags,
            read(&self.module.join("go.mod"))?,
            read(&self.module.join("go.sum"))?
        ))
    }
}

/// The binaries `envtest-assets` builds, in build order (the k8s ones share most packages).
fn builds(root: &Path, versions: &ToolVersions) -> Result<Vec<Build>> {
    let k8s = &versions.kubernetes;
    let mut parts = k8s.trim_start_matches('v').split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        bail!("k8s.io/kubernetes version {k8s} is not vMAJOR.MINOR.PATCH");
    };
    let version_flags = format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={k8s} -X k8s.io/component-base/version.gitMajor={major} -X k8s.io/component-base/version.gitMinor={minor} -X k8s.io/component-base/version.gitTreeState=clean"
    );
    let k8s_module = tools_dir(root);
    Ok(vec![
        Build {
            binary: "kube-apiserver",
            module: k8s_module.clone(),
            package: "k8s.io/kubernetes/cmd/kube-apiserver",
            ldflags: version_flags.clone(),
        },
        Build {
            binary: "etcd",
            module: k8s_module.clone(),
            package: "go.etcd.io/etcd/server/v3",
            ldflags: "-s -w".into(),
        },
        Build {
            binary: "kube-controller-manager",
            module: k8s_module.clone(),
            package: "k8s.io/kubernetes/cmd/kube-controller-manager",
            ldflags: version_flags.clone(),
        },
        // kubectl, for the specs that check published credentials with the real client: from
        // the same module, so it shares the apiserver's dependency versions and build cache.
        Build {
            binary: "kubectl",
            module: k8s_module,
            package: "k8s.io/kubernetes/cmd/kubectl",
            ldflags: version_flags,
        },
        Build {
            binary: "kwok",
            module: kwok_dir(root),
            package: "sigs.k8s.io/kwok/cmd/kwok",
            ldflags: "-s -w".into(),
        },
    ])
}

/// Builds (or reuses) kube-apiserver, etcd, kube-controller-manager and kwok and returns the
/// folder holding them. Each binary is rebuilt only when its stamp (package, flags, go.mod and
/// go.sum) changed.
///
/// `KUBEBUILDER_ASSETS`, when set, is used as it is: nothing is built.
pub fn assets(root: &Path) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(assets::ASSETS_ENV).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        let missing = assets::missing_workload_binaries(&dir);
        if !missing.is_empty() {
            bail!(
                "KUBEBUILDER_ASSETS={} lacks {}: point it at a folder holding kube-apiserver, etcd, kube-controller-manager and kwok, or unset it to build them from tools/k8s and tools/kwok",
                dir.display(),
                missing.join(", ")
            );
        }
        eprintln!("envtest-assets: using KUBEBUILDER_ASSETS");
        return Ok(dir);
    }
    let versions = versions(root)?;
    let dir = assets::cache_dir(&versions);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let _ = std::fs::remove_file(dir.join(LEGACY_STAMP));
    for build in builds(root, &versions)? {
        let binary = build.binary;
        let stamp = build.stamp()?;
        let stamp_file = dir.join(format!(".{binary}.stamp"));
        if dir.join(binary).is_file()
            && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp)
        {
            eprintln!("envtest-assets: reusing {binary}");
            continue;
        }
        require_go()?;
        let _ = std::fs::remove_file(&stamp_file);
        let started = Instant::now();
        let partial = dir.join(format!(".{binary}.partial"));
        let mut cmd = go(&build.module);
        cmd.args(["build", "-trimpath", "-ldflags", &build.ldflags, "-o"])
            .arg(&partial)
            .arg(build.package);
        run(cmd)?;
        std::fs::rename(&partial, dir.join(binary))
            .with_context(|| format!("move {binary} into {}", dir.display()))?;
        std::fs::write(&stamp_file, stamp)
            .with_context(|| format!("write the build stamp of {binary}"))?;
        eprintln!(
            "envtest-assets: built {binary} in {}s",
            started.elapsed().as_secs()
        );
    }
    Ok(dir)
}

/// The helm version `tools/helm` builds (its go.mod's `helm.sh/helm/v4` requirement).
fn helm_version(root: &Path) -> Result<String> {
    let go_mod = read(&root.join("tools").join("helm").join("go.mod"))?;
    assets::required_version(&go_mod, "helm.sh/helm/v4")
        .context("tools/helm/go.mod must require helm.sh/helm/v4")
}

/// Builds (or reuses) `helm` from `tools/helm` (Go modules, no release download) and returns its
/// path. Rebuilt only when the module's go.mod or go.sum changed.
pub fn helm(root: &Path) -> Result<PathBuf> {
    let version = helm_version(root)?;
    cached_build(
        &assets::cache_root().join(format!("helm-{version}")),
        Build {
            binary: "helm",
            module: root.join("tools").join("helm"),
            package: "helm.sh/helm/v4/cmd/helm",
            ldflags: format!("-s -w -X helm.sh/helm/v4/internal/version.version={version}"),
        },
    )
}

/// Builds (or reuses) `weed` (SeaweedFS, whose S3 gateway the backup tests write to) from
/// `tools/seaweedfs` and returns its path. Rebuilt only when the module's go.mod or go.sum
/// changed.
pub fn seaweedfs(root: &Path) -> Result<PathBuf> {
    let module = root.join("tools").join("seaweedfs");
    let go_mod = read(&module.join("go.mod"))?;
    let version = assets::required_version(&go_mod, "github.com/seaweedfs/seaweedfs")
        .context("tools/seaweedfs/go.mod must require github.com/seaweedfs/seaweedfs")?;
    // A pseudo-version ends in the commit's first 12 hex digits, which `weed version` prints.
    let commit = version.rsplit('-').next().unwrap_or(&version).to_string();
    cached_build(
        &assets::cache_root().join(format!("seaweedfs-{version}")),
        Build {
            binary: "weed",
            module,
            package: "github.com/seaweedfs/seaweedfs/weed",
            ldflags: format!(
                "-s -w -X github.com/seaweedfs/seaweedfs/weed/util/version.COMMIT={commit}"
            ),
        },
    )
}

/// Builds `build` into `dir` unless the binary there was built from the same stamp, and returns
/// its path. The build goes to a partial file first, so an interrupted build is never reused.
fn cached_build(dir: &Path, build: Build) -> Result<PathBuf> {
    let name = build.binary;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let stamp = build.stamp()?;
    let stamp_file = dir.join(format!(".{name}.stamp"));
    let binary = dir.join(name);
    if binary.is_file() && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        eprintln!("{name}: reusing {}", binary.display());
        return Ok(binary);
    }
    require_go()?;
    let _ = std::fs::remove_file(&stamp_file);
    let started = Instant::now();
    let partial = dir.join(format!(".{name}.partial"));
    let mut cmd = go(&build.module);
    cmd.args(["build", "-trimpath", "-ldflags", &build.ldflags, "-o"])
        .arg(&partial)
        .arg(build.package);
    run(cmd)?;
    std::fs::rename(&partial, &binary).with_context(|| format!("move {name} into its folder"))?;
    std::fs::write(&stamp_file, stamp)
        .with_context(|| format!("write the build stamp of {name}"))?;
    eprintln!("{name}: built in {}s", started.elapsed().as_secs());
    Ok(binary)
}

/// Builds (or reuses) every Talos oracle under `tools/talos-oracle-*`, the conformance tool
/// `tools/talos-conformance` and the real `talosctl` (`tools/talosctl`), and returns their
/// folder.
pub fn oracles(root: &Path) -> Result<PathBuf> {
    let dir = assets::oracles_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    // Each tools/talos-oracle-<minor> module with a main.go is an oracle; they share the
    // talos-oracle-core module, whose files count in every oracle's stamp.
    let tools = root.join("tools");
    let mut modules: Vec<PathBuf> = std::fs::read_dir(&tools)
        .context("read tools/")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.join("main.go").is_file()
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with("talos-oracle-") || n == "talos-conformance" || n == "talosctl"
                })
        })
        .collect();
    modules.sort();
    let mut core = String::new();
    let core_dir = tools.join("talos-oracle-core");
    for file in ["go.mod", "go.sum"] {
        core.push_str(&std::fs::read_to_string(core_dir.join(file)).unwrap_or_default());
    }
    // Every Go source of the core (oracle.go, apply.go, ...): a change to any of them rebuilds.
    for file in go_sources(&core_dir)? {
        core.push_str(&file.file_name().unwrap_or_default().to_string_lossy());
        core.push_str(&read(&file)?);
    }
    for module in modules {
        let name = module
            .file_name()
            .and_then(|n| n.to_str())
            .context("oracle module name")?
            .to_owned();
        // Only the oracles require talos-oracle-core.
        let mut stamp = if name.starts_with("talos-oracle-") {
            core.clone()
        } else {
            String::new()
        };
        for file in ["go.mod", "go.sum"] {
            stamp.push_str(&std::fs::read_to_string(module.join(file)).unwrap_or_default());
        }
        // Every Go source of the module, not only main.go: a change to any of them rebuilds.
        for file in go_sources(&module)? {
            stamp.push_str(&file.file_name().unwrap_or_default().to_string_lossy());
            stamp.push_str(&read(&file)?);
        }
        let binary = dir.join(&name);
        let stamp_file = dir.join(format!(".{name}.stamp"));
        if binary.is_file() && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
            eprintln!("oracles: reusing {name}");
            continue;
        }
        require_go()?;
        let started = Instant::now();
        let partial = dir.join(format!(".{name}.partial"));
        let mut ldflags = "-s -w".to_owned();
        if name == "talosctl" {
            ldflags.push_str(&talosctl_ldflags(&read(&module.join("go.mod"))?)?);
        }
        let mut cmd = go(&module);
        cmd.args(["build", "-trimpath", "-ldflags", &ldflags, "-o"])
            .arg(&partial)
            .arg(".");
        run(cmd)?;
        eprintln!("oracles: built {name} in {}s", started.elapsed().as_secs());
        std::fs::rename(&partial, &binary).with_context(|| format!("install {name}"))?;
        std::fs::write(&stamp_file, stamp).context("write the oracle stamp")?;
    }
    Ok(dir)
}

/// The linker flags that stamp talosctl with the Talos version its module requires, as Talos's
/// release build does (`talosctl version --client` and `gen config`'s default contract read it).
fn talosctl_ldflags(go_mod: &str) -> Result<String> {
    let version = assets::required_version(go_mod, "github.com/siderolabs/talos")
        .context("tools/talosctl/go.mod must require github.com/siderolabs/talos")?;
    Ok(format!(
        " -X github.com/siderolabs/talos/pkg/machinery/version.Tag={version}"
    ))
}

/// The `.go` files directly in `module`, sorted.
fn go_sources(module: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(module)
        .with_context(|| format!("read {}", module.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "go"))
        .collect();
    files.sort();
    Ok(files)
}

/// Regenerates (or with `--check`, verifies) the `replace` block of `tools/k8s/go.mod`: one line
/// per staging module that `k8s.io/kubernetes`'s own go.mod requires at `v0.0.0`.
pub fn k8s_replaces(root: &Path, flag: Option<&str>) -> Result<()> {
    let check = match flag {
        None => false,
        Some("--check") => true,
        Some(other) => bail!("unknown flag {other:?}: the only one is --check"),
    };
    require_go()?;
    let versions = versions(root)?;
    let staging = format!("v0.{}", versions.kubernetes.trim_start_matches("v1."));
    let tools = tools_dir(root);
    let mut cmd = go(&tools);
    cmd.args(["mod", "download", "-json"])
        .arg(format!("k8s.io/kubernetes@{}", versions.kubernetes));
    let output = cmd.output().context("run `go mod download`")?;
    if !output.status.success() {
        bail!(
            "`go mod download k8s.io/kubernetes@{}` failed: {}",
            versions.kubernetes,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let info: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("parse go mod download")?;
    let upstream_mod = info["GoMod"]
        .as_str()
        .context("go mod download gave no GoMod path")?;
    let upstream = read(Path::new(upstream_mod))?;
    let mut block = String::from("replace (\n");
    for line in upstream.lines() {
        let mut words = line.split_whitespace();
        if let (Some(module), Some("v0.0.0"), None) = (words.next(), words.next(), words.next())
            && module.starts_with("k8s.io/")
        {
            block.push_str(&format!("\t{module} => {module} {staging}\n"));
        }
    }
    block.push_str(")\n");

    let go_mod_path = tools.join("go.mod");
    let go_mod = read(&go_mod_path)?;
    let start = go_mod
        .find("replace (\n")
        .context("tools/k8s/go.mod has no `replace (` block")?;
    let end = start
        + go_mod[start..]
            .find("\n)\n")
            .context("unterminated replace block")?
        + 3;
    if go_mod[start..end] == block {
        eprintln!(
            "k8s-replaces: tools/k8s/go.mod matches k8s.io/kubernetes@{}",
            versions.kubernetes
        );
        return Ok(());
    }
    if check {
        bail!(
            "the replace block of tools/k8s/go.mod differs from what k8s.io/kubernetes@{}'s go.mod requires: run `cargo xtask k8s-replaces`, then `go mod tidy` in tools/k8s",
            versions.kubernetes
        );
    }
    let updated = format!("{}{}{}", &go_mod[..start], block, &go_mod[end..]);
    std::fs::write(&go_mod_path, updated).context("write tools/k8s/go.mod")?;
    eprintln!("k8s-replaces: rewrote the replace block; now run `go mod tidy` in tools/k8s");
    Ok(())
}

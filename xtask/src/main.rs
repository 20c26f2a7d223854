//! Project tasks, run as `cargo xtask <task>`:
//!
//! - `test`: every check and test the project has (the README's test command).
//! - `envtest-assets`: build (or reuse) kube-apiserver, etcd, kube-controller-manager and kwok;
//!   prints their folder last.
//! - `oracles`: build (or reuse) the Talos oracles from `tools/talos-oracle-*`, the conformance
//!   tool and the real talosctl (`tools/talosctl`); prints their folder last.
//! - `helm`: build (or reuse) helm from `tools/helm`; prints its path last.
//! - `seaweedfs`: build (or reuse) `weed`, the S3 server of the backup tests, from
//!   `tools/seaweedfs`; prints its path last.
//! - `k8s-replaces [--check]`: regenerate the staging-module `replace` block of
//!   `tools/k8s/go.mod` from `k8s.io/kubernetes`'s own go.mod.
//! - `crdgen`: write the CRDs and admission policies generated from `ichor-api` to `config/`.
//! - `bench [render] [backup]`: benchmarks (render beside the reference implementation's rate;
//!   backup: a snapshot of hundreds of MiB and the manager's memory); results go to
//!   `docs/benchmarks/`.
//! - `demo [--until-ready]`: the local demo (sim target: discovery to a Ready cluster).
//! - `bins`: build every workspace binary as the tests build them; prints their folder last.
//! - `readme`: run the README's commands as a new user would (`cargo xtask test` runs them).
//! - `e2e --target sim|cluster|qemu`: the end-to-end specs against a target (docs/e2e.md).
//!
//! `cargo xtask --help` (and `cargo xtask <task> --help`) says the same.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod bench;
mod envtest;
mod readme;
mod run;
mod test;

#[path = "../../crates/ichor-testenv/src/assets.rs"]
#[allow(dead_code)]
mod assets;

/// Project tasks for Ichor.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Every check and test the project has (the README's test command).
    Test,
    /// Build (or reuse) kube-apiserver, etcd, kube-controller-manager and kwok; prints their
    /// folder last.
    EnvtestAssets,
    /// Build (or reuse) the Talos oracles, the conformance tool and the real talosctl; prints
    /// their folder last.
    Oracles,
    /// Build (or reuse) helm from tools/helm; prints its path last.
    Helm,
    /// Build (or reuse) weed (SeaweedFS, the S3 server of the backup tests) from
    /// tools/seaweedfs; prints its path last.
    Seaweedfs,
    /// Regenerate the staging-module replace block of tools/k8s/go.mod.
    K8sReplaces {
        /// Only check that the block is current.
        #[arg(long)]
        check: bool,
    },
    /// Write the CRDs and admission policies generated from ichor-api to config/.
    Crdgen,
    /// Benchmarks, beside the reference implementation's rate (results in docs/benchmarks/).
    Bench {
        /// Which benchmarks (all when none is named).
        #[arg(value_enum)]
        which: Vec<Benchmark>,
    },
    /// The local demo (sim target: discovery to a Ready cluster).
    Demo {
        /// Options for ichor-demo: --until-ready (exit once the cluster is Ready), --net,
        /// --talos-version (see `ichor-demo --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        options: Vec<String>,
    },
    /// Build every workspace binary as the tests build them (nothing is compiled twice);
    /// prints their folder last.
    Bins,
    /// Run the README's commands as a new user would (`test` runs them too).
    Readme,
    /// The end-to-end specs against a target (docs/e2e.md).
    E2e {
        /// Where the specs run.
        #[arg(long, value_enum)]
        target: Target,
        /// Options for `ichor-harness run` (cluster and qemu targets).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Benchmark {
    /// Config rendering.
    Render,
    /// An etcd backup of hundreds of MiB, with the manager's memory measured.
    Backup,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Target {
    /// Simulated nodes and a local control plane.
    Sim,
    /// A real Kubernetes cluster.
    Cluster,
    /// QEMU virtual machines.
    Qemu,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Self::Sim => "sim",
            Self::Cluster => "cluster",
            Self::Qemu => "qemu",
        }
    }
}

/// The workspace root (the parent of this crate's folder).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let root = workspace_root();
    let result = match cli.task {
        Task::Test => test::run(&root),
        Task::EnvtestAssets => envtest::assets(&root).map(|dir| {
            println!("{}", dir.display());
        }),
        Task::Oracles => envtest::oracles(&root).map(|dir| {
            println!("{}", dir.display());
        }),
        Task::Helm => envtest::helm(&root).map(|path| {
            println!("{}", path.display());
        }),
        Task::Seaweedfs => envtest::seaweedfs(&root).map(|path| {
            println!("{}", path.display());
        }),
        Task::K8sReplaces { check } => envtest::k8s_replaces(&root, check.then_some("--check")),
        Task::Crdgen => test::crdgen(&root),
        Task::Bench { which } => {
            let names: Vec<String> = which
                .iter()
                .map(|b| match b {
                    Benchmark::Render => "render".to_owned(),
                    Benchmark::Backup => "backup".to_owned(),
                })
                .collect();
            bench::bench(&root, &names)
        }
        Task::Demo { options } => test::demo(&root, &options),
        Task::Bins => test::bins(&root),
        Task::Readme => readme::check(&root, &[]),
        Task::E2e { target, rest } => {
            let mut args = vec!["--target".to_owned(), target.name().to_owned()];
            args.extend(rest);
            test::e2e(&root, &args)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            if run::interrupted() {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

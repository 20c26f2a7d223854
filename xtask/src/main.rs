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
//! - `advisories`: `cargo deny --offline check advisories` against the RustSec snapshot that
//!   `ICHOR_ADVISORY_DB` names.
//! - `checkov`: the rendered chart under checkov (PyPI, in the cache), offline.
//! - `redfish-tools`: install (or reuse) the Redfish tools of the BMC tests from
//!   `tools/redfish/requirements.txt` (sushy-tools, sushy, the DMTF's protocol validator) in a
//!   virtual environment in the cache; prints its `bin` folder last (the tests'
//!   `ICHOR_REDFISH_TOOLS`).
//! - `fuzz [TARGET] [--seconds N]`: the cargo-fuzz targets of `fuzz/` (nightly toolchain), each
//!   for N seconds (default: a minute split across the targets) on a copy of its corpus.
//! - `crdgen`: write the CRDs and admission policies generated from `ichor-api` to `config/`.
//! - `bench [render] [backup] [discovery] [webhook] [fleet]`: benchmarks (render beside the
//!   reference implementation's rate; backup: a snapshot of hundreds of MiB and the manager's
//!   memory; discovery: the sweep beside a bare TCP-connect sweep; webhook: admission reviews
//!   per second beside a bare TLS server; fleet: up to a thousand simulated machines on one
//!   manager); results go to `docs/benchmarks/`.
//! - `demo [--until-ready]`: the local demo (sim target: discovery to a Ready cluster).
//! - `bins`: build every workspace binary as the tests build them; prints their folder last.
//! - `release`: build `ichor-manager` and `ichor-webhook` as the images ship them (release,
//!   statically linked), check that they need no dynamic loader, and print their folder last.
//! - `readme`: run the README's commands as a new user would (`cargo xtask test` runs them).
//! - `e2e --target sim|cluster|qemu`: the end-to-end specs against a target (docs/e2e.md);
//!   `e2e --soak N`: the seeded random sequence with N fresh seeds, each printed.
//!
//! `cargo xtask --help` (and `cargo xtask <task> --help`) says the same.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod advisories;
mod bench;
mod bench_discovery;
mod bench_fleet;
mod bench_webhook;
mod checkov;
mod deny;
mod envtest;
mod fuzz;
mod readme;
mod redfish;
mod run;
mod test;
mod testrun;

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
    /// `cargo deny --offline check advisories` against the RustSec snapshot ICHOR_ADVISORY_DB
    /// names (docs/adr/0002).
    Advisories,
    /// The rendered chart under checkov (from PyPI, in the cache), offline.
    Checkov,
    /// Install (or reuse) the Redfish tools of the BMC tests (sushy-tools, sushy, the DMTF's
    /// protocol validator) from PyPI in the cache; prints their folder last, the value of
    /// ICHOR_REDFISH_TOOLS.
    RedfishTools,
    /// The cargo-fuzz targets of fuzz/ (nightly toolchain), on a copy of their corpus.
    Fuzz {
        /// One target (all when none is named): admission_review, config_patch,
        /// secrets_bundle, talos_reply or credentials_file.
        target: Option<String>,
        /// Seconds per target (default: a minute split across the targets run).
        #[arg(long, value_name = "N")]
        seconds: Option<u64>,
    },
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
    /// Build ichor-manager and ichor-webhook as the images ship them (release, statically
    /// linked), check that they need no dynamic loader; prints their folder last.
    Release,
    /// The end-to-end specs against a target (docs/e2e.md).
    E2e {
        /// Where the specs run.
        #[arg(long, value_enum, required_unless_present = "soak")]
        target: Option<Target>,
        /// Soak: run the seeded random sequence (sim target) with N fresh seeds, printing each
        /// seed and its outcome (`ICHOR_TEST_SEED=<seed>` replays one).
        #[arg(long, value_name = "N", conflicts_with = "target")]
        soak: Option<u64>,
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
    /// The discovery sweep beside a bare TCP-connect sweep.
    Discovery,
    /// Admission reviews per second and their latency, beside a bare TLS server.
    Webhook,
    /// A fleet of simulated machines over many clusters on one manager, its cost measured.
    Fleet,
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
        Task::Advisories => advisories::check(&root),
        Task::Checkov => envtest::helm(&root).and_then(|helm| {
            let checkov = checkov::ensure(&root)?;
            checkov::lint(&root, &helm, &checkov)
        }),
        Task::RedfishTools => redfish::ensure(&root).map(|dir| {
            println!("{}", dir.display());
        }),
        Task::Fuzz { target, seconds } => {
            run::trap_signals().and_then(|()| fuzz::fuzz(&root, target.as_deref(), seconds))
        }
        Task::Bench { which } => {
            let names: Vec<String> = which
                .iter()
                .map(|b| match b {
                    Benchmark::Render => "render".to_owned(),
                    Benchmark::Backup => "backup".to_owned(),
                    Benchmark::Discovery => "discovery".to_owned(),
                    Benchmark::Webhook => "webhook".to_owned(),
                    Benchmark::Fleet => "fleet".to_owned(),
                })
                .collect();
            bench::bench(&root, &names)
        }
        Task::Demo { options } => test::demo(&root, &options),
        Task::Bins => test::bins(&root),
        Task::Readme => readme::check(&root, &[], None),
        Task::Release => test::release(&root).map(|dir| {
            println!("{}", dir.display());
        }),
        Task::E2e {
            soak: Some(count), ..
        } => test::soak(&root, count),
        Task::E2e { target, rest, .. } => {
            let target = target.unwrap_or(Target::Sim);
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

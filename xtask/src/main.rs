//! Project tasks, run as `cargo xtask <task>`:
//!
//! - `test`: every check and test the project has (the README's test command).
//! - `envtest-assets`: build (or reuse) kube-apiserver, etcd, kube-controller-manager and kwok;
//!   prints their folder last.
//! - `oracles`: build (or reuse) the Talos oracles from `tools/talos-oracle-*`, the conformance
//!   tool and the real talosctl (`tools/talosctl`); prints their folder last.
//! - `helm`: build (or reuse) helm from `tools/helm`; prints its path last.
//! - `k8s-replaces [--check]`: regenerate the staging-module `replace` block of
//!   `tools/k8s/go.mod` from `k8s.io/kubernetes`'s own go.mod.
//! - `crdgen`: write the CRDs and admission policies generated from `ichor-api` to `config/`.
//! - `bench [render]`: benchmarks, beside the reference implementation's rate; results go to
//!   `docs/benchmarks/`.
//! - `demo [--until-ready]`: the local demo (sim target: discovery to a Ready cluster).
//! - `bins`: build every workspace binary as the tests build them; prints their folder last.
//! - `readme`: run the README's commands as a new user would (`cargo xtask test` runs them).
//! - `e2e --target sim|cluster|qemu`: the end-to-end specs against a target (docs/e2e.md).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod bench;
mod envtest;
mod readme;
mod run;
mod test;

#[path = "../../crates/ichor-testenv/src/assets.rs"]
#[allow(dead_code)]
mod assets;

const USAGE: &str = "usage: cargo xtask <test | envtest-assets | oracles | helm | k8s-replaces [--check] | crdgen | bench [render] | demo [--until-ready] | bins | readme | e2e --target sim|cluster|qemu>";

/// The workspace root (the parent of this crate's folder).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    let result = match args.first().map(String::as_str) {
        Some("test") => test::run(&root),
        Some("envtest-assets") => envtest::assets(&root).map(|dir| {
            println!("{}", dir.display());
        }),
        Some("oracles") => envtest::oracles(&root).map(|dir| {
            println!("{}", dir.display());
        }),
        Some("helm") => envtest::helm(&root).map(|path| {
            println!("{}", path.display());
        }),
        Some("k8s-replaces") => envtest::k8s_replaces(&root, args.get(1).map(String::as_str)),
        Some("crdgen") => test::crdgen(&root),
        Some("bench") => bench::bench(&root, &args[1..]),
        Some("demo") => test::demo(&root, &args[1..]),
        Some("e2e") => test::e2e(&root, &args[1..]),
        Some("bins") => test::bins(&root),
        Some("readme") => readme::check(&root, &[]),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
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

//! The end-to-end harness: a target abstraction (a management cluster reached through a
//! kubeconfig and an explicit context, the maintenance-mode node endpoints, and what the target
//! can do) and one spec set that every target runs. The sim target runs a real kube-apiserver
//! and etcd, simulated Talos nodes, and the real `ichor-manager` and `ichor-webhook` binaries
//! as processes, each authenticated as its own ServiceAccount user bound to the shipped RBAC.
#![forbid(unsafe_code)]

pub mod audit;
pub mod cluster;
pub mod cluster_target;
mod front;
mod kubelets;
pub mod leaks;
pub mod qemu;
pub mod rails;
mod replica;
pub mod sim;
pub mod specs;
pub mod table;

use std::path::PathBuf;

pub use sim::{SimOptions, SimTarget};

/// What a target can do beyond the common specs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Faults can be injected into nodes (sim only).
    pub faults: bool,
    /// The manager can be killed at precise points (sim only: gates).
    pub kill_points: bool,
}

/// What went wrong bringing a target up or running a spec.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control plane failed.
    #[error("test control plane: {0}")]
    TestEnv(#[from] ichor_testenv::Error),
    /// The Kubernetes API failed.
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
    /// A simulated node failed.
    #[error("simulated node: {0}")]
    Sim(#[from] ichor_sim::SimError),
    /// A binary is missing or failed.
    #[error("{0}")]
    Binary(String),
    /// I/O failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A spec's expectation did not hold.
    #[error("{0}")]
    Spec(String),
    /// Something waited for did not happen in time.
    #[error("{0}")]
    Wait(#[from] ichor_testenv::wait::Timeout),
}

/// A place the specs run against.
pub trait Target {
    /// The management cluster's kubeconfig (YAML).
    fn kubeconfig(&self) -> &str;
    /// The kubeconfig context to use: always explicit.
    fn context(&self) -> &str;
    /// The maintenance-mode node endpoints.
    fn node_endpoints(&self) -> Vec<String>;
    /// What the target can do.
    fn capabilities(&self) -> Capabilities;
    /// The namespace the specs work in (they touch only named objects in it).
    fn namespace(&self) -> &str;
    /// A client for the management cluster (an administrator's, for the specs).
    fn client(&self) -> kube::Client;
    /// Makes sure the kubelets of `cluster`'s Ready machines have registered their Nodes with
    /// its workload control plane. Real nodes do this themselves; the sim target runs the
    /// workload control plane (with the cluster's own Kubernetes CA) and registers them; from
    /// then on each Node's `status.nodeInfo.kubeletVersion` follows its node's kubelet image, as
    /// a real kubelet restarted with a new image reports.
    fn kubelets_registered(
        &self,
        cluster: &str,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send;
    /// The installer image the specs' clusters name (the target's own build of Talos), or the
    /// official one.
    fn installer_image(&self) -> Option<String> {
        None
    }
    /// Rewrites a kubeconfig published for a cluster on this target's nodes so this process
    /// can reach it (the `cluster` target relays; the others reach nodes directly).
    fn reachable(
        &self,
        kubeconfig: &str,
    ) -> impl std::future::Future<Output = Result<String, Error>> + Send {
        let kubeconfig = kubeconfig.to_owned();
        async move { Ok(kubeconfig) }
    }
}

/// A workspace binary: `ICHOR_<NAME>_BIN`, else next to the running test's folder (where
/// `cargo` puts binaries), else an error saying how to build it.
pub fn binary(name: &str) -> Result<PathBuf, Error> {
    let env = format!(
        "ICHOR_{}_BIN",
        name.trim_start_matches("ichor-").to_uppercase()
    );
    if let Ok(path) = std::env::var(&env) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(Error::Binary(format!(
        "{name} is not built: run `cargo build -p {name}` (or `cargo xtask e2e --target sim`), or set {env}"
    )))
}

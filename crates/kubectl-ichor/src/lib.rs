//! `kubectl ichor`: a kubectl plugin for Ichor's TalosMachines and TalosClusters. It lists
//! pending machines with their hardware and pinned fingerprints, approves or rejects them,
//! describes a cluster as a tree, renders a machine's config exactly as the manager does (with
//! every secret redacted, and compared with the config last applied), writes a cluster's
//! talosconfig to a private file, and plans a changed TalosCluster manifest: what it would do
//! once applied, from the same pure rules the manager runs, with read-only permissions.
//!
//! The pure parts (argument parsing, tables, trees, redaction, the line diff) live in their own
//! modules and are unit-tested; [`run`] composes them with the Kubernetes API. Nothing here
//! writes to a Talos node: the plugin only reads and patches Kubernetes objects.
#![forbid(unsafe_code)]

pub mod cli;
pub mod connect;
pub mod describe;
pub mod diff;
pub mod machines;
pub mod plan;
pub mod redact;
pub mod render;
pub mod table;
pub mod talosconfig;
pub mod tree;

use cli::{Command, Invocation};

/// What can go wrong, each with a message that names the object and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line is wrong (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// The kubeconfig cannot be used.
    #[error("{0}")]
    Kubeconfig(String),
    /// An object is missing, or not ready for this command.
    #[error("{0}")]
    Object(String),
    /// The apiserver (its CEL rules, the admission webhook, RBAC) refused a change: its
    /// message, verbatim.
    #[error("the apiserver refused the change to {object}: {message}")]
    Refused {
        /// The object, e.g. `TalosMachine m1`.
        object: String,
        /// The apiserver's message.
        message: String,
    },
    /// A Kubernetes API call failed.
    #[error("{what}: {message}")]
    Kube {
        /// What was being done, e.g. `cannot list TalosMachines in namespace ns`.
        what: String,
        /// The apiserver's message, or the connection error.
        message: String,
    },
    /// A local file could not be written.
    #[error("{0}")]
    File(String),
    /// The manifest given to `plan` cannot be read, or declares what cannot be: the field and
    /// what is allowed.
    #[error("{0}")]
    Manifest(String),
}

impl Error {
    /// The process exit code: 2 for usage errors, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            _ => 1,
        }
    }

    /// A failed API call: the apiserver's own message when it answered, else the error.
    pub fn kube(what: impl Into<String>, error: &kube::Error) -> Self {
        Self::Kube {
            what: what.into(),
            message: api_message(error),
        }
    }
}

/// The apiserver's message of a refused request, verbatim; other errors as they print.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// Runs a parsed command line; returns what to print on stdout.
pub async fn run(invocation: Invocation) -> Result<String, Error> {
    if invocation.command == Command::Help {
        return Ok(cli::USAGE.to_owned());
    }
    let conn = connect::connect(&invocation.global).await?;
    match invocation.command {
        Command::Help => Ok(cli::USAGE.to_owned()),
        Command::Pending => machines::pending(&conn).await,
        Command::Approve { machine, role } => machines::approve(&conn, &machine, role).await,
        Command::Reject { machine } => machines::reject(&conn, &machine).await,
        Command::DescribeCluster { name } => describe::describe(&conn, &name).await,
        Command::Render {
            machine,
            diff,
            role,
        } => render::render(&conn, &machine, diff, role).await,
        Command::Talosconfig {
            cluster,
            output,
            force,
        } => talosconfig::talosconfig(&conn, &cluster, &output, force).await,
        Command::Plan { file, output, at } => {
            let namespace = invocation.global.namespace.as_deref();
            plan::plan(&conn, &file, namespace, output, at).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_exit_with_two_and_the_rest_with_one() {
        assert_eq!(Error::Usage("x".into()).exit_code(), 2);
        assert_eq!(Error::Object("x".into()).exit_code(), 1);
        let refused = Error::Refused {
            object: "TalosMachine m1".into(),
            message: "spec.approvalState and spec.role cannot change".into(),
        };
        assert_eq!(refused.exit_code(), 1);
        assert_eq!(
            refused.to_string(),
            "the apiserver refused the change to TalosMachine m1: spec.approvalState and spec.role cannot change"
        );
    }

    #[test]
    fn api_errors_carry_the_apiservers_message_verbatim() {
        let status =
            kube::core::Status::failure("denied: quorum at risk", "Forbidden").with_code(403);
        let error = kube::Error::Api(status.boxed());
        assert_eq!(api_message(&error), "denied: quorum at risk");
        assert_eq!(
            Error::kube("cannot patch TalosMachine m1", &error).to_string(),
            "cannot patch TalosMachine m1: denied: quorum at risk"
        );
    }
}

//! The command line: global flags (as kubectl reads them, anywhere on the line) and one
//! command, parsed with clap; a usage error names what is wrong and the binary exits with 2.

use std::path::PathBuf;

use ichor_api::common::Role;
use k8s_openapi::jiff::Timestamp;

use crate::Error;
use crate::plan::Output;

/// The help text.
pub const USAGE: &str = "\
kubectl ichor: Ichor's machines and clusters from kubectl

Usage:
  kubectl ichor pending                                   pending TalosMachines with hardware and fingerprints
  kubectl ichor approve MACHINE --role controlplane|worker approve a machine with a role
  kubectl ichor reject MACHINE                            reject a machine (it is never touched)
  kubectl ichor describe cluster NAME                     a TalosCluster and its machines, as a tree
  kubectl ichor render MACHINE [--diff] [--role ROLE]     the config the machine would get now, secrets redacted
                                                          (--diff: compared with the one last applied)
  kubectl ichor talosconfig CLUSTER [-o FILE] [--force]   write the cluster's talosconfig (default ./talosconfig, mode 0600)
  kubectl ichor plan -f FILE [-o table|json] [--at TIME]  what a changed TalosCluster manifest would do once applied:
                                                          each machine's change, the order and batches, what holds
                                                          or refuses it (reads only; --at judges windows at TIME)

Flags (anywhere on the line):
  --kubeconfig FILE      the kubeconfig (else KUBECONFIG, else ~/.kube/config)
  --context NAME         the kubeconfig context (else its current context)
  -n, --namespace NS     the namespace (else the context's, else default)
  -h, --help             this help
";

/// Where the Kubernetes connection comes from, as kubectl takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Global {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--context`.
    pub context: Option<String>,
    /// `-n` / `--namespace`.
    pub namespace: Option<String>,
}

/// One command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Print the help.
    Help,
    /// List pending machines.
    Pending,
    /// Approve a machine with a role.
    Approve {
        /// The TalosMachine.
        machine: String,
        /// Its role.
        role: Role,
    },
    /// Reject a machine.
    Reject {
        /// The TalosMachine.
        machine: String,
    },
    /// Describe a cluster and its machines.
    DescribeCluster {
        /// The TalosCluster.
        name: String,
    },
    /// Render a machine's config, redacted.
    Render {
        /// The TalosMachine.
        machine: String,
        /// Show the difference from the applied config instead of the config.
        diff: bool,
        /// The role to render with when the machine has none yet.
        role: Option<Role>,
    },
    /// Write the cluster's talosconfig to a file.
    Talosconfig {
        /// The TalosCluster.
        cluster: String,
        /// The file to write.
        output: PathBuf,
        /// Overwrite an existing file.
        force: bool,
    },
    /// What a changed TalosCluster manifest would do once applied.
    Plan {
        /// The manifest.
        file: PathBuf,
        /// How to print it.
        output: Output,
        /// When to judge the maintenance windows at (now when unset).
        at: Option<Timestamp>,
    },
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The connection flags.
    pub global: Global,
    /// The command.
    pub command: Command,
}

fn usage(message: impl Into<String>) -> Error {
    Error::Usage(format!(
        "{}\nRun `kubectl ichor --help` for usage.",
        message.into()
    ))
}

/// Parses a role as written in the API.
pub fn parse_role(text: &str) -> Result<Role, Error> {
    role(text).map_err(|why| usage(format!("--role: {why}")))
}

fn role(text: &str) -> Result<Role, String> {
    match text {
        "controlplane" | "control-plane" => Ok(Role::ControlPlane),
        "worker" => Ok(Role::Worker),
        other => Err(format!("expected controlplane or worker, not {other:?}")),
    }
}

/// The command line as clap reads it.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kubectl ichor",
    bin_name = "kubectl ichor",
    override_help = USAGE,
    disable_help_subcommand = true
)]
struct Cli {
    /// The kubeconfig (else KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    kubeconfig: Option<String>,
    /// The kubeconfig context (else its current context).
    #[arg(long, global = true, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    context: Option<String>,
    /// The namespace (else the context's, else default).
    #[arg(short = 'n', long, global = true, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// Pending TalosMachines with hardware and fingerprints.
    Pending,
    /// Approve a machine with a role.
    Approve {
        /// The TalosMachine.
        machine: String,
        /// controlplane or worker.
        #[arg(long, value_parser = role)]
        role: Option<Role>,
    },
    /// Reject a machine (it is never touched).
    Reject {
        /// The TalosMachine.
        machine: String,
    },
    /// A TalosCluster and its machines, as a tree.
    Describe {
        #[command(subcommand)]
        what: Describe,
    },
    /// The config the machine would get now, secrets redacted.
    Render {
        /// The TalosMachine.
        machine: String,
        /// Compare with the config last applied.
        #[arg(long)]
        diff: bool,
        /// The role to render with when the machine has none yet.
        #[arg(long, value_parser = role)]
        role: Option<Role>,
    },
    /// Write the cluster's talosconfig (mode 0600).
    Talosconfig {
        /// The TalosCluster.
        cluster: String,
        /// The file to write.
        #[arg(short = 'o', long, default_value = "talosconfig")]
        output: PathBuf,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
    /// What a changed TalosCluster manifest would do once applied.
    Plan {
        /// The changed TalosCluster manifest.
        #[arg(short = 'f', long = "filename", required = true)]
        file: PathBuf,
        /// table or json.
        #[arg(short = 'o', long, default_value = "table", value_parser = output)]
        output: Output,
        /// Judge the maintenance windows at this time (RFC 3339, e.g. 2026-12-07T22:30:00Z).
        #[arg(long, value_parser = timestamp)]
        at: Option<Timestamp>,
    },
    /// This help.
    Help,
}

fn output(text: &str) -> Result<Output, String> {
    match text {
        "table" => Ok(Output::Table),
        "json" => Ok(Output::Json),
        other => Err(format!("expected table or json, not {other:?}")),
    }
}

fn timestamp(text: &str) -> Result<Timestamp, String> {
    text.parse().map_err(|_| {
        format!(
            "expected an RFC 3339 time with its offset, e.g. 2026-12-07T22:30:00Z, not {text:?}"
        )
    })
}

#[derive(Debug, clap::Subcommand)]
enum Describe {
    /// A TalosCluster and its machines.
    #[command(visible_aliases = ["clusters", "taloscluster", "tc"])]
    Cluster {
        /// The TalosCluster.
        name: String,
    },
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Invocation, Error> {
    use clap::error::ErrorKind;
    let words = std::iter::once("kubectl-ichor".to_owned()).chain(args.iter().cloned());
    let cli = match <Cli as clap::Parser>::try_parse_from(words) {
        Ok(cli) => cli,
        Err(error)
            if matches!(
                error.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            return Ok(Invocation {
                global: Global::default(),
                command: Command::Help,
            });
        }
        Err(error) => {
            let text = error.render().to_string();
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            return Err(Error::Usage(text.trim_end().to_owned()));
        }
    };
    let global = Global {
        kubeconfig: cli.kubeconfig.map(PathBuf::from),
        context: cli.context,
        namespace: cli.namespace,
    };
    let command = command(cli.command)?;
    Ok(Invocation { global, command })
}

/// The command a parsed subcommand asks for.
fn command(sub: Option<Sub>) -> Result<Command, Error> {
    Ok(match sub {
        None | Some(Sub::Help) => Command::Help,
        Some(Sub::Pending) => Command::Pending,
        Some(Sub::Approve { machine, role }) => {
            let role = role.ok_or_else(|| {
                usage(format!(
                    "approve needs --role controlplane or --role worker: a machine is approved with the role it will have (it cannot change once its config is applied), e.g. kubectl ichor approve {machine} --role worker"
                ))
            })?;
            Command::Approve { machine, role }
        }
        Some(Sub::Reject { machine }) => Command::Reject { machine },
        Some(Sub::Describe {
            what: Describe::Cluster { name },
        }) => Command::DescribeCluster { name },
        Some(Sub::Render {
            machine,
            diff,
            role,
        }) => Command::Render {
            machine,
            diff,
            role,
        },
        Some(Sub::Talosconfig {
            cluster,
            output,
            force,
        }) => Command::Talosconfig {
            cluster,
            output,
            force,
        },
        Some(Sub::Plan { file, output, at }) => Command::Plan { file, output, at },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    fn command(line: &str) -> Command {
        parse(&args(line)).expect("parses").command
    }

    fn refused(line: &str) -> String {
        match parse(&args(line)) {
            Err(Error::Usage(message)) => message,
            other => panic!("{line:?} should be a usage error, got {other:?}"),
        }
    }

    #[test]
    fn every_command_parses() {
        assert_eq!(command("pending"), Command::Pending);
        assert_eq!(
            command("approve m1 --role controlplane"),
            Command::Approve {
                machine: "m1".into(),
                role: Role::ControlPlane
            }
        );
        assert_eq!(
            command("approve --role=worker m1"),
            Command::Approve {
                machine: "m1".into(),
                role: Role::Worker
            }
        );
        assert_eq!(
            command("reject m2"),
            Command::Reject {
                machine: "m2".into()
            }
        );
        assert_eq!(
            command("describe cluster lab"),
            Command::DescribeCluster { name: "lab".into() }
        );
        assert_eq!(
            command("render m1 --diff"),
            Command::Render {
                machine: "m1".into(),
                diff: true,
                role: None
            }
        );
        assert_eq!(
            command("talosconfig lab"),
            Command::Talosconfig {
                cluster: "lab".into(),
                output: PathBuf::from("talosconfig"),
                force: false
            }
        );
        assert_eq!(
            command("talosconfig lab -o /tmp/tc --force"),
            Command::Talosconfig {
                cluster: "lab".into(),
                output: PathBuf::from("/tmp/tc"),
                force: true
            }
        );
        assert_eq!(command(""), Command::Help);
        assert_eq!(command("approve -h"), Command::Help);
    }

    #[test]
    fn plan_takes_a_file_an_output_and_a_time() {
        assert_eq!(
            command("plan -f cluster.yaml"),
            Command::Plan {
                file: PathBuf::from("cluster.yaml"),
                output: Output::Table,
                at: None
            }
        );
        assert_eq!(
            command("plan --filename=c.yaml -o json --at 2026-12-07T22:30:00Z"),
            Command::Plan {
                file: PathBuf::from("c.yaml"),
                output: Output::Json,
                at: Some("2026-12-07T22:30:00Z".parse().expect("time"))
            }
        );
    }

    #[test]
    fn plan_needs_a_file_and_says_what_output_and_time_it_takes() {
        assert!(
            refused("plan").contains("--filename <FILE>"),
            "{}",
            refused("plan")
        );
        assert!(refused("plan -f c.yaml -o yaml").contains("expected table or json"));
        assert!(refused("plan -f c.yaml --at tomorrow").contains("RFC 3339"));
    }

    #[test]
    fn global_flags_go_anywhere_in_kubectls_spellings() {
        let parsed = parse(&args("--kubeconfig /k pending -n ns --context=ctx")).expect("parses");
        assert_eq!(
            parsed.global,
            Global {
                kubeconfig: Some(PathBuf::from("/k")),
                context: Some("ctx".into()),
                namespace: Some("ns".into())
            }
        );
        assert_eq!(
            parse(&args("pending -nns"))
                .expect("parses")
                .global
                .namespace,
            Some("ns".into())
        );
        assert_eq!(
            parse(&args("pending --namespace=ns"))
                .expect("parses")
                .global
                .namespace,
            Some("ns".into())
        );
    }

    #[test]
    fn approve_without_a_role_is_refused_naming_the_flag() {
        let message = refused("approve m1");
        assert!(message.contains("--role controlplane"), "{message}");
        assert!(
            message.contains("kubectl ichor approve m1 --role"),
            "{message}"
        );
        assert!(refused("approve m1 --role master").contains("controlplane or worker"));
    }

    #[test]
    fn mistakes_are_usage_errors_naming_what_is_wrong() {
        assert!(refused("frobnicate").contains("unrecognized subcommand 'frobnicate'"));
        assert!(refused("approve").contains("<MACHINE>"));
        assert!(refused("reject a b").contains("unexpected argument 'b'"));
        assert!(refused("describe machine m1").contains("unrecognized subcommand 'machine'"));
        assert!(refused("pending --bogus").contains("unexpected argument '--bogus'"));
        assert!(refused("pending -x").contains("unexpected argument '-x'"));
        assert!(refused("pending --context").contains("'--context <CONTEXT>'"));
        assert!(refused("pending --context=").contains("'--context <CONTEXT>'"));
        assert!(refused("reject m1 --role worker").contains("unexpected argument '--role'"));
        assert!(refused("render m1 --force").contains("unexpected argument '--force'"));
        assert!(refused("render m1 --diff=yes").contains("'--diff'"));
        assert!(refused("pending extra").contains("unexpected argument 'extra'"));
    }

    #[test]
    fn describe_takes_the_cluster_kinds_kubectl_spellings() {
        for kind in ["cluster", "clusters", "taloscluster", "tc"] {
            assert_eq!(
                command(&format!("describe {kind} lab")),
                Command::DescribeCluster { name: "lab".into() }
            );
        }
    }
}

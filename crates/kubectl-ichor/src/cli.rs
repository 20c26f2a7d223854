//! The command line: global flags (as kubectl reads them) and one command. Parsed by hand; a
//! usage error names what is wrong and the binary exits with 2.

use std::path::PathBuf;

use ichor_api::common::Role;

use crate::Error;

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
    match text {
        "controlplane" | "control-plane" => Ok(Role::ControlPlane),
        "worker" => Ok(Role::Worker),
        other => Err(usage(format!(
            "--role takes controlplane or worker, not {other:?}"
        ))),
    }
}

/// Flags split from positional words: each flag with its value (`None` for switches).
struct Split {
    flags: Vec<(String, Option<String>)>,
    words: Vec<String>,
}

/// Flags that take a value.
const VALUED: [&str; 5] = ["kubeconfig", "context", "namespace", "role", "output"];
/// Flags that take none.
const SWITCHES: [&str; 3] = ["diff", "force", "help"];

fn split(args: &[String]) -> Result<Split, Error> {
    let mut flags = Vec::new();
    let mut words = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            words.extend(rest.by_ref().cloned());
            break;
        }
        let (name, inline) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None => (long.to_owned(), None),
            }
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let (letter, tail) = short.split_at(1);
            let long = match letter {
                "n" => "namespace",
                "o" => "output",
                "h" => "help",
                _ => return Err(usage(format!("unknown flag {arg}"))),
            };
            let tail = tail.strip_prefix('=').unwrap_or(tail);
            (long.to_owned(), (!tail.is_empty()).then(|| tail.to_owned()))
        } else {
            words.push(arg.clone());
            continue;
        };
        if SWITCHES.contains(&name.as_str()) {
            if inline.is_some() {
                return Err(usage(format!("--{name} takes no value")));
            }
            flags.push((name, None));
        } else if VALUED.contains(&name.as_str()) {
            let value = match inline {
                Some(v) => v,
                None => rest
                    .next()
                    .cloned()
                    .ok_or_else(|| usage(format!("--{name} needs a value")))?,
            };
            if value.is_empty() {
                return Err(usage(format!("--{name} needs a value")));
            }
            flags.push((name, Some(value)));
        } else {
            return Err(usage(format!("unknown flag --{name}")));
        }
    }
    Ok(Split { flags, words })
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Invocation, Error> {
    let Split { flags, words } = split(args)?;
    let mut global = Global::default();
    let mut role = None;
    let mut output = None;
    let mut diff = false;
    let mut force = false;
    for (name, value) in flags {
        let value = value.unwrap_or_default();
        match name.as_str() {
            "help" => {
                return Ok(Invocation {
                    global,
                    command: Command::Help,
                });
            }
            "kubeconfig" => global.kubeconfig = Some(PathBuf::from(value)),
            "context" => global.context = Some(value),
            "namespace" => global.namespace = Some(value),
            "role" => role = Some(parse_role(&value)?),
            "output" => output = Some(PathBuf::from(value)),
            "diff" => diff = true,
            "force" => force = true,
            _ => unreachable!("split only lets known flags through"),
        }
    }
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let only = |allowed: &[&str], command: &str| -> Result<(), Error> {
        let given = [
            ("role", role.is_some()),
            ("output", output.is_some()),
            ("diff", diff),
            ("force", force),
        ];
        match given
            .iter()
            .find(|(flag, set)| *set && !allowed.contains(flag))
        {
            Some((flag, _)) => Err(usage(format!("{command} does not take --{flag}"))),
            None => Ok(()),
        }
    };
    let one = |command: &str, what: &str, rest: &[&str]| -> Result<String, Error> {
        match rest {
            [name] => Ok((*name).to_owned()),
            [] => Err(usage(format!("{command} needs {what}"))),
            [_, extra, ..] => Err(usage(format!("{command}: unexpected argument {extra}"))),
        }
    };
    let command = match words.as_slice() {
        [] | ["help"] => Command::Help,
        ["pending", rest @ ..] => {
            only(&[], "pending")?;
            if let Some(extra) = rest.first() {
                return Err(usage(format!("pending: unexpected argument {extra}")));
            }
            Command::Pending
        }
        ["approve", rest @ ..] => {
            only(&["role"], "approve")?;
            let machine = one("approve", "a TalosMachine name", rest)?;
            let role = role.ok_or_else(|| {
                usage(format!(
                    "approve needs --role controlplane or --role worker: a machine is approved with the role it will have (it cannot change once its config is applied), e.g. kubectl ichor approve {machine} --role worker"
                ))
            })?;
            Command::Approve { machine, role }
        }
        ["reject", rest @ ..] => {
            only(&[], "reject")?;
            Command::Reject {
                machine: one("reject", "a TalosMachine name", rest)?,
            }
        }
        [
            "describe",
            "cluster" | "clusters" | "taloscluster" | "tc",
            rest @ ..,
        ] => {
            only(&[], "describe cluster")?;
            Command::DescribeCluster {
                name: one("describe cluster", "a TalosCluster name", rest)?,
            }
        }
        ["describe", ..] => return Err(usage("describe takes: describe cluster NAME")),
        ["render", rest @ ..] => {
            only(&["diff", "role"], "render")?;
            Command::Render {
                machine: one("render", "a TalosMachine name", rest)?,
                diff,
                role,
            }
        }
        ["talosconfig", rest @ ..] => {
            only(&["output", "force"], "talosconfig")?;
            Command::Talosconfig {
                cluster: one("talosconfig", "a TalosCluster name", rest)?,
                output: output.unwrap_or_else(|| PathBuf::from("talosconfig")),
                force,
            }
        }
        [other, ..] => return Err(usage(format!("unknown command {other:?}"))),
    };
    Ok(Invocation { global, command })
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
    fn mistakes_are_usage_errors() {
        assert!(refused("frobnicate").contains("unknown command"));
        assert!(refused("approve").contains("needs a TalosMachine name"));
        assert!(refused("reject a b").contains("unexpected argument b"));
        assert!(refused("describe machine m1").contains("describe cluster NAME"));
        assert!(refused("pending --bogus").contains("unknown flag --bogus"));
        assert!(refused("pending -x").contains("unknown flag -x"));
        assert!(refused("pending --context").contains("--context needs a value"));
        assert!(refused("reject m1 --role worker").contains("reject does not take --role"));
        assert!(refused("render m1 --force").contains("render does not take --force"));
        assert!(refused("render m1 --diff=yes").contains("--diff takes no value"));
        assert!(refused("pending extra").contains("unexpected argument extra"));
    }
}

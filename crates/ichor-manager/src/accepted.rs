//! The versions a cluster's nodes are brought to (pure, ADR 0069). The webhook refuses a
//! version change that breaks a rule at the door; when the webhook is not registered (or a
//! change reached the store some other way), the manager holds the same rules: the cluster
//! reconcile accepts a declaration only once it passes them, and every render and upgrade reads
//! the accepted versions, never the spec's own. A refused declaration leaves the nodes where
//! they are. When both versions change, the first step is accepted first, and the second once
//! the nodes can take it.

use ichor_api::TalosClusterSpec;
use ichor_api::cluster::AcceptedVersions;
use ichor_api::names::reasons;
use ichor_api::versions::{self, Declared, First, Series, Version, VersionRefusal};

/// What the nodes run now, as far as the version rules need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Running {
    /// The oldest Talos a configured node reports.
    pub oldest_talos: Option<Version>,
    /// Whether the Kubernetes accepted last rolled out everywhere: every step taken (ADR 0070)
    /// and every machine runs the config rendered for it (`ConfigRolledOut`).
    pub kubernetes_rolled_out: bool,
}

/// Where the declaration stands against what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// What is accepted is what is declared.
    Reached,
    /// A step towards the declaration is accepted, or the next one waits: why.
    Stepping(String),
    /// The declaration breaks a version rule; what was accepted stays.
    Refused(VersionRefusal),
}

/// The versions accepted after looking at the declaration, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What the nodes are brought to now (`None`: nothing ever passed the rules).
    pub accepted: Option<AcceptedVersions>,
    /// Where the declaration stands.
    pub verdict: Verdict,
}

/// The declared versions of `spec`.
pub fn declared(spec: &TalosClusterSpec) -> Declared<'_> {
    Declared {
        talos: &spec.talos_version,
        kubernetes: &spec.kubernetes_version,
    }
}

/// Whether Talos `talos` supports Kubernetes `kubernetes` (an unreadable version or a Talos
/// without a table does not).
fn supports(talos: Series, kubernetes: &str) -> bool {
    let (Some(kubernetes), Some((oldest, newest))) = (
        Version::parse(kubernetes),
        versions::kubernetes_supported_by(talos),
    ) else {
        return false;
    };
    (oldest..=newest).contains(&kubernetes.series())
}

/// The versions to bring the nodes to, given the declaration, what was accepted before (from
/// status) and what the nodes run.
pub fn decide(
    declared: Declared<'_>,
    accepted: Option<&AcceptedVersions>,
    running: Running,
) -> Outcome {
    let oldest = running.oldest_talos;
    let Some(mut was) = accepted.cloned() else {
        return first_acceptance(declared, oldest);
    };
    // The Kubernetes accepted last rolled out: no node runs the one before any more.
    if running.kubernetes_rolled_out {
        was.kubernetes_from = None;
    }
    if was.talos_version == declared.talos && was.kubernetes_version == declared.kubernetes {
        return Outcome {
            accepted: Some(was),
            verdict: Verdict::Reached,
        };
    }
    let before = Declared {
        talos: &was.talos_version,
        kubernetes: &was.kubernetes_version,
    };
    let checked = match versions::contract_in_force(&was.talos_version, oldest) {
        Some(contract) => {
            versions::check_change(before, declared, contract, oldest.map(Version::series))
        }
        None => versions::check_declared(declared).map(|()| First::Talos),
    };
    match checked {
        Ok(first) => next_step(declared, was, first, oldest),
        Err(refusal) => Outcome {
            accepted: Some(was),
            verdict: Verdict::Refused(refusal),
        },
    }
}

/// Nothing accepted yet: the declaration must hold on its own, against the nodes.
fn first_acceptance(declared: Declared<'_>, oldest: Option<Version>) -> Outcome {
    let check = match versions::contract_in_force(declared.talos, oldest) {
        Some(contract) => {
            versions::check_change(declared, declared, contract, oldest.map(Version::series))
                .map(|_| ())
        }
        None => versions::check_declared(declared),
    };
    match check {
        Ok(()) => Outcome {
            accepted: Some(AcceptedVersions {
                talos_version: declared.talos.to_owned(),
                kubernetes_version: declared.kubernetes.to_owned(),
                kubernetes_from: None,
            }),
            verdict: Verdict::Reached,
        },
        Err(refusal) => Outcome {
            accepted: None,
            verdict: Verdict::Refused(refusal),
        },
    }
}

/// The step towards a declaration that passed the rules from `was`: all of it when one version
/// changes and the nodes can take it, the `first` version alone when both change; `was` kept
/// while the nodes cannot take the next step yet.
fn next_step(
    declared: Declared<'_>,
    was: AcceptedVersions,
    first: First,
    oldest: Option<Version>,
) -> Outcome {
    let talos_changes = was.talos_version != declared.talos;
    let kubernetes_changes = was.kubernetes_version != declared.kubernetes;
    let hold = |was: AcceptedVersions, why: String| Outcome {
        accepted: Some(was),
        verdict: Verdict::Stepping(why),
    };
    let next = match (talos_changes, kubernetes_changes, first) {
        (true, true, First::Talos) => AcceptedVersions {
            talos_version: declared.talos.to_owned(),
            ..was.clone()
        },
        (_, true, _) => {
            if let Some(oldest) = oldest
                && !supports(oldest.series(), declared.kubernetes)
            {
                return hold(
                    was,
                    format!(
                        "spec.kubernetesVersion {} waits until every node runs a Talos that supports it (the oldest runs {oldest})",
                        declared.kubernetes
                    ),
                );
            }
            let from = was
                .kubernetes_from
                .clone()
                .unwrap_or_else(|| was.kubernetes_version.clone());
            AcceptedVersions {
                kubernetes_version: declared.kubernetes.to_owned(),
                kubernetes_from: Some(from),
                ..was.clone()
            }
        }
        (_, false, _) => {
            if let Some(from) = was.kubernetes_from.as_deref()
                && Series::parse(declared.talos).is_none_or(|talos| !supports(talos, from))
            {
                let why = format!(
                    "spec.talosVersion {} waits until Kubernetes {} rolled out: Talos {} does not support Kubernetes {from}, which nodes may still run",
                    declared.talos, was.kubernetes_version, declared.talos
                );
                return hold(was.clone(), why);
            }
            AcceptedVersions {
                talos_version: declared.talos.to_owned(),
                ..was.clone()
            }
        }
    };
    Outcome {
        verdict: verdict_of(declared, &was, &next),
        accepted: Some(next),
    }
}

/// Where the declaration stands once `next` is accepted after `was`.
fn verdict_of(declared: Declared<'_>, was: &AcceptedVersions, next: &AcceptedVersions) -> Verdict {
    if next.talos_version == declared.talos && next.kubernetes_version == declared.kubernetes {
        Verdict::Reached
    } else if next.talos_version == was.talos_version {
        Verdict::Stepping(format!(
            "Kubernetes {} goes first, then Talos {}",
            declared.kubernetes, declared.talos
        ))
    } else {
        Verdict::Stepping(format!(
            "Talos {} goes first, then Kubernetes {}",
            declared.talos, declared.kubernetes
        ))
    }
}

/// `VersionRolledOut` (holds, reason, message) from what the rollout of the accepted Talos says
/// and where the declaration stands: a refusal names the rule and what the nodes stay at; a
/// step on the way is not the end.
pub fn rollout_condition(
    outcome: &Outcome,
    rollout: (bool, &'static str, String),
) -> (bool, &'static str, String) {
    let (current, reason, message) = rollout;
    match &outcome.verdict {
        Verdict::Reached => (current, reason, message),
        Verdict::Refused(refusal) => (
            false,
            reasons::VERSION_CHANGE_REFUSED,
            match &outcome.accepted {
                Some(kept) => format!(
                    "{refusal}; the nodes stay at Talos {} and Kubernetes {}",
                    kept.talos_version, kept.kubernetes_version
                ),
                None => format!("{refusal}; nothing is rendered until it is fixed"),
            },
        ),
        Verdict::Stepping(why) => (
            false,
            if current {
                reasons::VERSION_ROLLING_OUT
            } else {
                reason
            },
            format!("{message}; {why}"),
        ),
    }
}

pub use ichor_render::upgrade::effective;

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use ichor_api::TalosCluster;

    use super::*;

    fn pair<'a>(talos: &'a str, kubernetes: &'a str) -> Declared<'a> {
        Declared { talos, kubernetes }
    }

    fn accepted(talos: &str, kubernetes: &str, from: Option<&str>) -> AcceptedVersions {
        AcceptedVersions {
            talos_version: talos.into(),
            kubernetes_version: kubernetes.into(),
            kubernetes_from: from.map(Into::into),
        }
    }

    fn running(oldest: &str, kubernetes_rolled_out: bool) -> Running {
        Running {
            oldest_talos: Version::parse(oldest),
            kubernetes_rolled_out,
        }
    }

    #[test]
    fn a_first_declaration_is_accepted_when_it_holds_and_refused_when_it_does_not() {
        let fine = decide(pair("v1.14.1", "1.36.3"), None, running("v1.14.1", true));
        assert_eq!(
            fine.accepted,
            Some(accepted("v1.14.1", "1.36.3", None)),
            "{fine:?}"
        );
        assert_eq!(fine.verdict, Verdict::Reached);
        let outside = decide(pair("v1.14.1", "1.30.0"), None, running("v1.14.1", true));
        assert_eq!(outside.accepted, None);
        assert!(
            matches!(&outside.verdict, Verdict::Refused(r) if r.to_string().contains("spec.kubernetesVersion")),
            "{outside:?}"
        );
    }

    #[test]
    fn a_refused_change_keeps_what_was_accepted_and_names_the_field() {
        let was = accepted("v1.14.1", "1.36.3", None);
        let downgrade = decide(
            pair("v1.14.1", "1.35.2"),
            Some(&was),
            running("v1.14.1", true),
        );
        assert_eq!(downgrade.accepted, Some(was.clone()));
        let Verdict::Refused(refusal) = &downgrade.verdict else {
            panic!("{downgrade:?}");
        };
        assert!(
            refusal
                .to_string()
                .starts_with("spec.kubernetesVersion 1.35.2 is a minor downgrade"),
            "{refusal}"
        );
        let below = decide(
            pair("v1.13.4", "1.36.3"),
            Some(&was),
            running("v1.14.1", true),
        );
        assert_eq!(below.accepted, Some(was));
        assert!(
            matches!(&below.verdict, Verdict::Refused(r) if r.to_string().contains("spec.talosVersion")),
            "{below:?}"
        );
    }

    #[test]
    fn a_change_of_one_version_that_holds_is_accepted_at_once_and_so_is_its_revert() {
        let was = accepted("v1.14.1", "1.36.3", None);
        let bump = decide(
            pair("v1.14.2", "1.36.3"),
            Some(&was),
            running("v1.14.1", true),
        );
        assert_eq!(bump.accepted, Some(accepted("v1.14.2", "1.36.3", None)));
        assert_eq!(bump.verdict, Verdict::Reached);
        // Reverted while half the nodes run v1.14.2 and the rollout stopped: accepted at once.
        let now = accepted("v1.14.2", "1.36.3", None);
        let revert = decide(
            pair("v1.14.1", "1.36.3"),
            Some(&now),
            running("v1.14.1", false),
        );
        assert_eq!(revert.accepted, Some(was));
        let kube = decide(
            pair("v1.14.1", "1.36.4"),
            Some(&accepted("v1.14.1", "1.36.3", None)),
            running("v1.14.1", true),
        );
        assert_eq!(
            kube.accepted,
            Some(accepted("v1.14.1", "1.36.4", Some("1.36.3"))),
            "the Kubernetes before is kept until the configs rolled out"
        );
        let settled = decide(
            pair("v1.14.1", "1.36.4"),
            kube.accepted.as_ref(),
            running("v1.14.1", true),
        );
        assert_eq!(settled.accepted, Some(accepted("v1.14.1", "1.36.4", None)));
    }

    #[test]
    fn when_both_change_talos_goes_first_and_kubernetes_waits_for_every_node() {
        // Talos 1.14 supports Kubernetes up to 1.37, 1.15 from 1.33 to 1.38: 1.38 needs 1.15.
        let was = accepted("v1.14.2", "1.37.1", None);
        let declared = pair("v1.15.0", "1.38.0");
        let first = decide(declared, Some(&was), running("v1.14.2", true));
        assert_eq!(first.accepted, Some(accepted("v1.15.0", "1.37.1", None)));
        assert!(matches!(first.verdict, Verdict::Stepping(_)), "{first:?}");
        let step = first.accepted.expect("a step");
        // One node still runs 1.14: Kubernetes 1.38 waits.
        let waiting = decide(declared, Some(&step), running("v1.14.2", true));
        assert_eq!(waiting.accepted.as_ref(), Some(&step));
        assert!(
            matches!(&waiting.verdict, Verdict::Stepping(why) if why.contains("oldest runs 1.14.2")),
            "{waiting:?}"
        );
        let then = decide(declared, Some(&step), running("v1.15.0", true));
        assert_eq!(
            then.accepted,
            Some(accepted("v1.15.0", "1.38.0", Some("1.37.1")))
        );
        assert_eq!(then.verdict, Verdict::Reached);
    }

    #[test]
    fn when_the_new_talos_drops_the_old_kubernetes_kubernetes_goes_first_and_talos_waits() {
        // Talos 1.15 supports Kubernetes from 1.33: from 1.32 on 1.14, Kubernetes goes first.
        let was = accepted("v1.14.2", "1.32.4", None);
        let declared = pair("v1.15.0", "1.33.1");
        let first = decide(declared, Some(&was), running("v1.14.2", true));
        let step = first.accepted.expect("a step");
        assert_eq!(step, accepted("v1.14.2", "1.33.1", Some("1.32.4")));
        // Machines still take their new configs: Talos waits.
        let waiting = decide(declared, Some(&step), running("v1.14.2", false));
        assert_eq!(waiting.accepted.as_ref(), Some(&step));
        assert!(
            matches!(&waiting.verdict, Verdict::Stepping(why) if why.starts_with("spec.talosVersion v1.15.0 waits")),
            "{waiting:?}"
        );
        let then = decide(declared, Some(&step), running("v1.14.2", true));
        assert_eq!(then.accepted, Some(accepted("v1.15.0", "1.33.1", None)));
        assert_eq!(then.verdict, Verdict::Reached);
    }

    #[test]
    fn the_effective_cluster_carries_the_accepted_versions() {
        let mut cluster = TalosCluster::test("c")
            .talos("v1.14.2")
            .kubernetes("1.36.4")
            .build();
        assert!(matches!(effective(&cluster), Ok(Cow::Borrowed(_))));
        let mut status = ichor_api::cluster::TalosClusterStatus::default();
        status.core.accepted_versions = Some(accepted("v1.14.1", "1.36.3", None));
        cluster.status = Some(status);
        let seen = effective(&cluster).expect("accepted");
        assert_eq!(seen.spec.talos_version, "v1.14.1");
        assert_eq!(seen.spec.kubernetes_version, "1.36.3");
    }
}

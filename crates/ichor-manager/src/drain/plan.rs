//! The drain's pure decisions: which pods are evicted and which stay, which
//! PodDisruptionBudgets cover a pod, which record a drain keeps, and what the pods still on the
//! Node come to (drained, a wait, timed out, forced).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ichor_api::drain::{DrainRecord, DrainSpec, DrainTimeoutAction};
use ichor_api::names::reasons;
use ichor_api::operation::selects;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::ResourceExt as _;

use crate::Stop;

/// The annotation the kubelet sets on a mirror pod (a static pod's reflection in the API).
const MIRROR: &str = "kubernetes.io/config.mirror";

/// A pod on the Node, as the drain sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodView {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// A DaemonSet's pod or a mirror pod: it stays, as `kubectl drain` leaves it.
    pub stays: bool,
    /// Deleted already (evicted): it is leaving, and is not evicted again.
    pub leaving: bool,
}

impl PodView {
    /// What the drain sees of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let daemon = pod.owner_references().iter().any(|o| o.kind == "DaemonSet");
        Self {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            labels: pod.labels().clone(),
            stays: daemon || pod.annotations().contains_key(MIRROR),
            leaving: pod.metadata.deletion_timestamp.is_some(),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A PodDisruptionBudget, as the drain sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Budget {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its selector (`None` selects no pod, as in `policy/v1`).
    pub selector: Option<LabelSelector>,
}

impl Budget {
    /// What the drain sees of `budget`.
    pub fn of(budget: &PodDisruptionBudget) -> Self {
        Self {
            namespace: budget.namespace().unwrap_or_default(),
            name: budget.name_any(),
            selector: budget.spec.as_ref().and_then(|s| s.selector.clone()),
        }
    }
}

/// Whether the drain evicts `pod` (and waits for it to leave): not a DaemonSet's or a mirror
/// pod, not in one of `spec.skipNamespaces`, not selected by `spec.skipPods`.
pub fn evicted(spec: &DrainSpec, pod: &PodView) -> bool {
    !pod.stays
        && !spec.skip_namespaces.contains(&pod.namespace)
        && !spec
            .skip_pods
            .as_ref()
            .is_some_and(|selector| selects(selector, &pod.labels))
}

/// The PodDisruptionBudgets that cover `pod`: those of its namespace whose selector matches its
/// labels, by name.
pub fn budgets_of(pod: &PodView, budgets: &[Budget]) -> Vec<String> {
    budgets
        .iter()
        .filter(|b| b.namespace == pod.namespace)
        .filter(|b| b.selector.as_ref().is_some_and(|s| selects(s, &pod.labels)))
        .map(|b| b.name.clone())
        .collect()
}

/// A pod the drain still waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    /// `namespace/name`.
    pub pod: String,
    /// The PodDisruptionBudgets that cover it.
    pub budgets: Vec<String>,
    /// Its eviction was refused (by a budget) this time.
    pub refused: bool,
}

impl Left {
    /// The pod and what holds it, in words: `default/web-1 (PodDisruptionBudget web)`.
    fn described(&self) -> String {
        match self.budgets.as_slice() {
            [] if self.refused => format!("{} (eviction refused)", self.pod),
            [] => format!("{} (terminating)", self.pod),
            [one] => format!("{} (PodDisruptionBudget {one})", self.pod),
            many => format!("{} (PodDisruptionBudgets {})", self.pod, many.join(", ")),
        }
    }
}

/// The pods of `pods` (on the Node after an eviction pass) the drain still waits for: those it
/// evicts, with the budgets that cover them; `refused` names (`namespace/name`) the pods whose
/// eviction was refused this pass.
pub fn left(
    spec: &DrainSpec,
    pods: &[PodView],
    refused: &BTreeSet<String>,
    budgets: &[Budget],
) -> Vec<Left> {
    pods.iter()
        .filter(|p| evicted(spec, p))
        .map(|p| Left {
            pod: p.key(),
            budgets: budgets_of(p, budgets),
            refused: refused.contains(&p.key()),
        })
        .collect()
}

/// How long a drain may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    /// `spec.drain.timeout`, `elapsed` of it gone since the record's `startedAt`.
    Timeout {
        /// The timeout.
        timeout: Duration,
        /// How long the drain has run.
        elapsed: Duration,
        /// What happens once it runs out.
        on_timeout: DrainTimeoutAction,
    },
    /// No timeout (a removal): a blocked drain waits, and `hint` says how on.
    Never {
        /// What the user can do about a blocked drain.
        hint: String,
    },
}

impl Limit {
    /// The timeout of `spec`, `started_at` the drain's start and `now` the time: its
    /// `timeout` read (the default 10m if it does not read, which the apiserver's rule
    /// prevents).
    pub fn of(spec: &DrainSpec, started_at: &Time, now: k8s_openapi::jiff::Timestamp) -> Self {
        let timeout = ichor_api::time::parse_duration("spec.drain.timeout", &spec.timeout)
            .unwrap_or(Duration::from_secs(600));
        Self::Timeout {
            timeout,
            elapsed: crate::infra::clock::elapsed(started_at.0, now),
            on_timeout: spec.on_timeout,
        }
    }
}

/// What the pods still on the Node come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No pod left to wait for: the Node is drained.
    Drained,
    /// The disruption waits: pods leaving (`Draining`), evictions refused (`DrainBlocked`) or
    /// the timeout run out with `onTimeout: Wait` (`DrainTimedOut`). Evictions are retried.
    Wait(Stop),
    /// The timeout ran out with `onTimeout: Force`: `pods` (`namespace/name`) are deleted, their
    /// budgets bypassed, and the disruption goes on; `message` says so.
    Force {
        /// The pods to delete.
        pods: Vec<String>,
        /// What was forced, for the condition and the Event.
        message: String,
    },
}

/// Judges the pods `left` on Node `node` against the drain's `limit`.
pub fn judge(node: &str, left: &[Left], limit: &Limit) -> Verdict {
    if left.is_empty() {
        return Verdict::Drained;
    }
    let named = left
        .iter()
        .map(Left::described)
        .collect::<Vec<_>>()
        .join(", ");
    let hint = match limit {
        Limit::Timeout {
            timeout,
            elapsed,
            on_timeout,
        } if elapsed >= timeout => {
            let after = humantime(*timeout);
            if *on_timeout == DrainTimeoutAction::Force {
                return Verdict::Force {
                    pods: left.iter().map(|l| l.pod.clone()).collect(),
                    message: format!(
                        "the drain of Node {node} timed out after {after}; spec.drain.onTimeout Force deletes the pods left, bypassing their budgets: {named}; the disruption goes on"
                    ),
                };
            }
            return Verdict::Wait(Stop::new(
                reasons::DRAIN_TIMED_OUT,
                format!(
                    "the drain of Node {node} timed out after {after}; still there: {named}; nothing is forced and the disruption waits while the evictions are retried: let the budget allow a disruption (or remove the pod), or set spec.drain.onTimeout: Force"
                ),
            ));
        }
        Limit::Timeout { timeout, .. } => format!(
            "it is retried until the drain's timeout ({}) runs out",
            humantime(*timeout)
        ),
        Limit::Never { hint } => hint.clone(),
    };
    let blocked: Vec<&Left> = left.iter().filter(|l| l.refused).collect();
    if blocked.is_empty() {
        return Verdict::Wait(Stop::new(
            reasons::DRAINING,
            format!("waiting for pods to leave Node {node}: {named}"),
        ));
    }
    let blocked = blocked
        .iter()
        .map(|l| l.described())
        .collect::<Vec<_>>()
        .join(", ");
    Verdict::Wait(Stop::new(
        reasons::DRAIN_BLOCKED,
        format!("evicting {blocked} from Node {node} is refused by a PodDisruptionBudget; {hint}"),
    ))
}

/// `duration` in words: `10s`, `10m`, `1h30m`.
fn humantime(duration: Duration) -> String {
    let secs = duration.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if out.is_empty() { "0s".into() } else { out }
}

/// The record of a drain for `purpose`: the one recorded when it is for the same purpose (a
/// drain in flight, resumed after a restart); else a new one started `now`, whose cordon is
/// Ichor's when the Node was `schedulable` before it, or when a record left over says Ichor
/// cordoned it.
pub fn record_for(
    recorded: Option<&DrainRecord>,
    purpose: &str,
    schedulable: bool,
    now: &Time,
) -> DrainRecord {
    if let Some(same) = recorded.filter(|r| r.purpose == purpose) {
        return same.clone();
    }
    DrainRecord {
        purpose: purpose.to_owned(),
        started_at: now.clone(),
        cordoned: schedulable || recorded.is_some_and(|r| r.cordoned),
        drained_at: None,
    }
}

/// The recorded drain for `purpose`, if there is one (the Node was read and the record written
/// before its cordon).
pub fn resumes<'a>(recorded: Option<&'a DrainRecord>, purpose: &str) -> Option<&'a DrainRecord> {
    recorded.filter(|r| r.purpose == purpose)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn pod(namespace: &str, name: &str, labels: &[(&str, &str)]) -> PodView {
        PodView {
            namespace: namespace.into(),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        }
    }

    fn budget(namespace: &str, name: &str, app: &str) -> Budget {
        Budget {
            namespace: namespace.into(),
            name: name.into(),
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_owned(), app.to_owned())].into()),
                ..Default::default()
            }),
        }
    }

    fn timeout(elapsed: u64, on_timeout: DrainTimeoutAction) -> Limit {
        Limit::Timeout {
            timeout: Duration::from_secs(10),
            elapsed: Duration::from_secs(elapsed),
            on_timeout,
        }
    }

    #[test]
    fn daemonset_mirror_skipped_namespace_and_skipped_pods_stay() {
        let spec = DrainSpec {
            skip_namespaces: vec!["kube-system".into()],
            skip_pods: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "keep".into(),
                    operator: "Exists".into(),
                    values: None,
                }]),
                ..Default::default()
            }),
            ..DrainSpec::default()
        };
        let daemon = PodView {
            stays: true,
            ..pod("default", "agent", &[])
        };
        assert!(!evicted(&spec, &daemon));
        assert!(!evicted(&spec, &pod("kube-system", "dns", &[])));
        assert!(!evicted(&spec, &pod("default", "cache", &[("keep", "1")])));
        assert!(evicted(&spec, &pod("default", "web", &[("app", "web")])));
    }

    #[test]
    fn a_budget_covers_the_pods_of_its_namespace_its_selector_matches() {
        let budgets = [
            budget("default", "web", "web"),
            budget("other", "web-elsewhere", "web"),
            budget("default", "db", "db"),
            Budget {
                namespace: "default".into(),
                name: "none".into(),
                selector: None,
            },
            Budget {
                namespace: "default".into(),
                name: "all".into(),
                selector: Some(LabelSelector::default()),
            },
        ];
        let web = pod("default", "web-1", &[("app", "web")]);
        assert_eq!(budgets_of(&web, &budgets), ["web", "all"]);
    }

    #[test]
    fn nothing_left_is_drained_and_pods_leaving_wait_as_draining() {
        let limit = timeout(0, DrainTimeoutAction::Wait);
        assert_eq!(judge("w-1", &[], &limit), Verdict::Drained);
        let leaving = Left {
            pod: "default/web-1".into(),
            budgets: vec![],
            refused: false,
        };
        let Verdict::Wait(stop) = judge("w-1", &[leaving], &limit) else {
            panic!("waits");
        };
        assert_eq!(stop.reason, reasons::DRAINING);
        assert!(stop.message.contains("default/web-1"), "{}", stop.message);
    }

    #[test]
    fn a_refused_eviction_before_the_timeout_names_the_pod_and_its_budget() {
        let refused = Left {
            pod: "default/web-1".into(),
            budgets: vec!["web".into()],
            refused: true,
        };
        let Verdict::Wait(stop) = judge("w-1", &[refused], &timeout(9, DrainTimeoutAction::Wait))
        else {
            panic!("waits");
        };
        assert_eq!(stop.reason, reasons::DRAIN_BLOCKED);
        assert!(
            stop.message
                .contains("default/web-1 (PodDisruptionBudget web)")
                && stop.message.contains("timeout (10s)"),
            "{}",
            stop.message
        );
    }

    #[test]
    fn a_timed_out_drain_waits_naming_pods_and_budgets_unless_forced() {
        let left = [
            Left {
                pod: "default/web-1".into(),
                budgets: vec!["web".into()],
                refused: true,
            },
            Left {
                pod: "default/db-0".into(),
                budgets: vec!["db".into(), "all".into()],
                refused: true,
            },
        ];
        let Verdict::Wait(stop) = judge("w-1", &left, &timeout(10, DrainTimeoutAction::Wait))
        else {
            panic!("waits");
        };
        assert_eq!(stop.reason, reasons::DRAIN_TIMED_OUT);
        assert!(
            stop.message
                .contains("default/web-1 (PodDisruptionBudget web)")
                && stop
                    .message
                    .contains("default/db-0 (PodDisruptionBudgets db, all)")
                && stop.message.contains("nothing is forced"),
            "{}",
            stop.message
        );
        let Verdict::Force { pods, message } =
            judge("w-1", &left, &timeout(11, DrainTimeoutAction::Force))
        else {
            panic!("forced");
        };
        assert_eq!(pods, ["default/web-1", "default/db-0"]);
        assert!(message.contains("Force deletes"), "{message}");
    }

    #[test]
    fn without_a_timeout_a_blocked_drain_waits_with_its_hint() {
        let refused = Left {
            pod: "default/web-1".into(),
            budgets: vec![],
            refused: true,
        };
        let limit = Limit::Never {
            hint: "set skip-drain".into(),
        };
        let Verdict::Wait(stop) = judge("w-1", &[refused], &limit) else {
            panic!("waits");
        };
        assert_eq!(stop.reason, reasons::DRAIN_BLOCKED);
        assert!(stop.message.ends_with("set skip-drain"), "{}", stop.message);
    }

    #[test]
    fn the_timeout_counts_from_the_records_start() {
        let spec = DrainSpec {
            timeout: "10s".into(),
            ..DrainSpec::default()
        };
        let start: k8s_openapi::jiff::Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let limit = Limit::of(&spec, &Time(start), start + Duration::from_secs(12));
        assert_eq!(
            limit,
            Limit::Timeout {
                timeout: Duration::from_secs(10),
                elapsed: Duration::from_secs(12),
                on_timeout: DrainTimeoutAction::Wait
            }
        );
    }

    #[test]
    fn a_drain_resumes_its_record_and_a_new_purpose_keeps_an_old_cordon_ichors() {
        let t0 = Time("2026-01-01T00:00:00Z".parse().expect("time"));
        let t1 = Time("2026-01-01T01:00:00Z".parse().expect("time"));
        let first = record_for(None, "reboot (operation a)", true, &t0);
        assert!(first.cordoned);
        assert_eq!(first.started_at, t0);
        // After a restart, the same drain: its start and its cordon as recorded, even though
        // the Node reads unschedulable now (Ichor cordoned it).
        assert_eq!(
            record_for(Some(&first), "reboot (operation a)", false, &t1),
            first
        );
        assert!(resumes(Some(&first), "reboot (operation a)").is_some());
        // Another disruption finds the record left over: a new start, the cordon still Ichor's.
        let next = record_for(Some(&first), "upgrade (operation b)", false, &t1);
        assert!(next.cordoned);
        assert_eq!(next.started_at, t1);
        assert!(resumes(Some(&first), "upgrade (operation b)").is_none());
        // A Node cordoned by someone else stays theirs.
        assert!(!record_for(None, "reboot (operation a)", false, &t0).cordoned);
    }

    #[test]
    fn durations_read_short() {
        assert_eq!(humantime(Duration::from_secs(10)), "10s");
        assert_eq!(humantime(Duration::from_secs(600)), "10m");
        assert_eq!(humantime(Duration::from_secs(5400)), "1h30m");
    }
}

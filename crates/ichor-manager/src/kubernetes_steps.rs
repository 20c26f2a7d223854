//! The steps of a declared Kubernetes version's rollout (pure, ADR 0070), in the order of
//! Talos's own `talosctl upgrade-k8s` (talos-facts §9.7): kube-apiserver on each control plane
//! in turn, then kube-controller-manager, then kube-scheduler, each node's new pod seen Ready
//! before the next node takes it; then kube-proxy's image on every control plane (nothing to
//! wait for); then each kubelet in turn, control planes first, its Node seen reporting the
//! version; then the bootstrap manifests. A machine's config names each component at the
//! version its step allows: the new one once its turn came, else the one it runs.

use ichor_api::TalosMachine;
use ichor_api::common::Role;
use ichor_api::machine::{ApprovalState, KubernetesComponents};

/// A Kubernetes component a node's config names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// kube-apiserver.
    ApiServer,
    /// kube-controller-manager.
    ControllerManager,
    /// kube-scheduler.
    Scheduler,
    /// kube-proxy.
    Proxy,
    /// The kubelet.
    Kubelet,
}

impl Component {
    /// The control-plane static pods, in the order they are upgraded.
    pub const STATIC_PODS: [Self; 3] = [Self::ApiServer, Self::ControllerManager, Self::Scheduler];

    /// Its name as Kubernetes knows it.
    pub fn name(self) -> &'static str {
        match self {
            Self::ApiServer => "kube-apiserver",
            Self::ControllerManager => "kube-controller-manager",
            Self::Scheduler => "kube-scheduler",
            Self::Proxy => "kube-proxy",
            Self::Kubelet => "kubelet",
        }
    }

    /// Its version in `components`.
    pub fn of(self, components: &KubernetesComponents) -> Option<&str> {
        match self {
            Self::ApiServer => components.api_server.as_deref(),
            Self::ControllerManager => components.controller_manager.as_deref(),
            Self::Scheduler => components.scheduler.as_deref(),
            Self::Proxy => components.proxy.as_deref(),
            Self::Kubelet => components.kubelet.as_deref(),
        }
    }

    /// Sets its version in `components`.
    fn set(self, components: &mut KubernetesComponents, version: String) {
        let field = match self {
            Self::ApiServer => &mut components.api_server,
            Self::ControllerManager => &mut components.controller_manager,
            Self::Scheduler => &mut components.scheduler,
            Self::Proxy => &mut components.proxy,
            Self::Kubelet => &mut components.kubelet,
        };
        *field = Some(version);
    }
}

/// One machine of the cluster, as the rollout sees it.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    /// The machine's name.
    pub name: &'a str,
    /// Whether it is a control plane.
    pub control_plane: bool,
    /// Whether a config was ever applied to it (a new machine takes the version at once).
    pub configured: bool,
    /// The components it was last seen running.
    pub running: Option<&'a KubernetesComponents>,
}

/// Where a rollout to a version stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    /// `component` on `machine` is next (or in flight): the machines before it run it.
    Component {
        /// The component.
        component: Component,
        /// The machine.
        machine: &'a str,
    },
    /// Every node runs the version: the bootstrap manifests are synced last.
    Manifests,
}

impl std::fmt::Display for Step<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Component { component, machine } => {
                write!(f, "{} on {machine}", component.name())
            }
            Self::Manifests => f.write_str("the bootstrap manifests"),
        }
    }
}

/// The machines of cluster `cluster` in `namespace` among `machines` that take part: approved,
/// with a role, not being deleted.
pub fn members<'a>(
    machines: impl IntoIterator<Item = &'a TalosMachine>,
    namespace: &str,
    cluster: &str,
) -> Vec<Member<'a>> {
    machines
        .into_iter()
        .filter(|m| {
            m.metadata.namespace.as_deref().unwrap_or_default() == namespace
                && m.spec.cluster_ref.name == cluster
                && m.spec.approval_state == ApprovalState::Approved
                && m.spec.role.is_some()
                && m.metadata.deletion_timestamp.is_none()
        })
        .map(|m| {
            let status = m.status.as_ref();
            Member {
                name: m.metadata.name.as_deref().unwrap_or_default(),
                control_plane: m.spec.role == Some(Role::ControlPlane),
                configured: status.is_some_and(|s| s.applied.config_hash.is_some()),
                running: status.and_then(|s| s.upgrade.kubernetes.as_ref()),
            }
        })
        .collect()
}

/// Whether `a` and `b` name one version (`v1.36.4` is `1.36.4`).
pub fn same(a: &str, b: &str) -> bool {
    a.trim_start_matches('v') == b.trim_start_matches('v')
}

/// Whether `member` was seen running `component` at `version`, or its config turns the
/// component off (nothing to wait for).
fn runs(member: &Member<'_>, component: Component, version: &str) -> bool {
    member.running.is_some_and(|r| {
        r.disabled.iter().any(|d| d == component.name())
            || component.of(r).is_some_and(|v| same(v, version))
    })
}

/// The configured machines in the rollout's order: control planes, then workers, each by name.
fn ordered<'m, 'a>(members: &'m [Member<'a>]) -> Vec<&'m Member<'a>> {
    let mut ordered: Vec<&Member<'a>> = members.iter().filter(|m| m.configured).collect();
    ordered.sort_by(|a, b| {
        b.control_plane
            .cmp(&a.control_plane)
            .then_with(|| a.name.cmp(b.name))
    });
    ordered
}

/// The step the rollout to `target` is at.
pub fn step<'a>(target: &str, members: &[Member<'a>]) -> Step<'a> {
    let ordered = ordered(members);
    for component in Component::STATIC_PODS {
        if let Some(m) = ordered
            .iter()
            .filter(|m| m.control_plane)
            .find(|m| !runs(m, component, target))
        {
            return Step::Component {
                component,
                machine: m.name,
            };
        }
    }
    match ordered
        .iter()
        .find(|m| !runs(m, Component::Kubelet, target))
    {
        Some(m) => Step::Component {
            component: Component::Kubelet,
            machine: m.name,
        },
        None => Step::Manifests,
    }
}

/// The component versions machine `me`'s config names while the cluster rolls out `target`
/// from `from`: the new version for what its turn came for, else what it runs (`from` where
/// it was not seen). A machine never configured takes `target` whole.
pub fn components(
    target: &str,
    from: &str,
    members: &[Member<'_>],
    me: &str,
) -> KubernetesComponents {
    let all = |version: &str| {
        let mut all = KubernetesComponents::default();
        for c in Component::STATIC_PODS
            .into_iter()
            .chain([Component::Proxy, Component::Kubelet])
        {
            c.set(&mut all, version.to_owned());
        }
        all
    };
    let Some(mine) = members.iter().find(|m| m.name == me && m.configured) else {
        return all(target);
    };
    let keep = |c: Component| {
        mine.running
            .and_then(|r| c.of(r))
            .unwrap_or(from)
            .to_owned()
    };
    let mut out = all(target);
    let step = step(target, members);
    let (current, in_flight) = match step {
        Step::Component { component, machine } => (Some(component), machine),
        Step::Manifests => (None, ""),
    };
    let turn = |c: Component| runs(mine, c, target) || (current == Some(c) && in_flight == me);
    match current {
        Some(s) if Component::STATIC_PODS.contains(&s) => {
            let at = Component::STATIC_PODS.iter().position(|c| *c == s);
            for (i, c) in Component::STATIC_PODS.into_iter().enumerate() {
                if Some(i) > at || (Some(i) == at && !turn(c)) {
                    c.set(&mut out, keep(c));
                }
            }
            Component::Proxy.set(&mut out, keep(Component::Proxy));
            Component::Kubelet.set(&mut out, keep(Component::Kubelet));
        }
        Some(_) if !turn(Component::Kubelet) => {
            Component::Kubelet.set(&mut out, keep(Component::Kubelet));
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(api: &str, cm: &str, sched: &str, kubelet: &str) -> KubernetesComponents {
        KubernetesComponents {
            api_server: Some(api.into()),
            controller_manager: Some(cm.into()),
            scheduler: Some(sched.into()),
            proxy: None,
            kubelet: Some(kubelet.into()),
            disabled: Vec::new(),
        }
    }

    const OLD: &str = "1.36.3";
    const NEW: &str = "1.36.4";

    #[test]
    fn static_pods_go_component_by_component_node_by_node_then_kubelets_then_manifests() {
        let old = seen(OLD, OLD, OLD, OLD);
        let api_on_1 = seen(NEW, OLD, OLD, OLD);
        let statics = seen(NEW, NEW, NEW, OLD);
        let all_new = seen(NEW, NEW, NEW, NEW);
        let member = |name, control_plane, running| Member {
            name,
            control_plane,
            configured: true,
            running: Some(running),
        };
        let at = |cp1, cp2, w| {
            [
                member("cp-2", true, cp2),
                member("worker-1", false, w),
                member("cp-1", true, cp1),
            ]
        };
        let step_name = |m: &[Member<'_>]| step(NEW, m).to_string();
        assert_eq!(step_name(&at(&old, &old, &old)), "kube-apiserver on cp-1");
        assert_eq!(
            step_name(&at(&api_on_1, &old, &old)),
            "kube-apiserver on cp-2"
        );
        let both_api = seen(NEW, OLD, OLD, OLD);
        assert_eq!(
            step_name(&at(&both_api, &both_api, &old)),
            "kube-controller-manager on cp-1"
        );
        assert_eq!(
            step_name(&at(&statics, &statics, &old)),
            "kubelet on cp-1",
            "control planes' kubelets first"
        );
        assert_eq!(
            step_name(&at(&all_new, &all_new, &old)),
            "kubelet on worker-1"
        );
        assert_eq!(
            step(NEW, &at(&all_new, &all_new, &all_new)),
            Step::Manifests
        );

        // While kube-apiserver goes to cp-2, cp-2's config names the new one alone; cp-1 keeps
        // its other components; the worker keeps all.
        let members = at(&api_on_1, &old, &old);
        let cp2 = components(NEW, OLD, &members, "cp-2");
        assert_eq!(cp2, seen(NEW, OLD, OLD, OLD).with_proxy(OLD));
        let cp1 = components(NEW, OLD, &members, "cp-1");
        assert_eq!(cp1, seen(NEW, OLD, OLD, OLD).with_proxy(OLD));
        let worker = components(NEW, OLD, &members, "worker-1");
        assert_eq!(worker, old.clone().with_proxy(OLD));

        // At the kubelets: every static pod and kube-proxy is new; the kubelet only in turn.
        let members = at(&all_new, &statics, &old);
        assert_eq!(
            components(NEW, OLD, &members, "cp-2"),
            all_new.clone().with_proxy(NEW)
        );
        assert_eq!(
            components(NEW, OLD, &members, "worker-1"),
            seen(NEW, NEW, NEW, OLD).with_proxy(NEW)
        );
    }

    #[test]
    fn a_static_pod_a_node_turns_off_is_not_waited_for() {
        let mut no_scheduler = seen(NEW, NEW, OLD, OLD);
        no_scheduler.scheduler = None;
        no_scheduler.disabled = vec!["kube-scheduler".into()];
        let other = seen(NEW, NEW, OLD, OLD);
        let members = [
            Member {
                name: "cp-1",
                control_plane: true,
                configured: true,
                running: Some(&no_scheduler),
            },
            Member {
                name: "cp-2",
                control_plane: true,
                configured: true,
                running: Some(&other),
            },
        ];
        assert_eq!(step(NEW, &members).to_string(), "kube-scheduler on cp-2");
        let other = seen(NEW, NEW, NEW, OLD);
        let members = [
            members[0],
            Member {
                running: Some(&other),
                ..members[1]
            },
        ];
        assert_eq!(step(NEW, &members).to_string(), "kubelet on cp-1");
    }

    #[test]
    fn what_was_not_seen_stays_at_the_version_before_and_a_new_machine_takes_the_new_one() {
        let members = [
            Member {
                name: "cp-1",
                control_plane: true,
                configured: true,
                running: None,
            },
            Member {
                name: "cp-2",
                control_plane: true,
                configured: true,
                running: None,
            },
            Member {
                name: "cp-3",
                control_plane: true,
                configured: false,
                running: None,
            },
        ];
        assert_eq!(step(NEW, &members).to_string(), "kube-apiserver on cp-1");
        assert_eq!(
            components(NEW, OLD, &members, "cp-2"),
            seen(OLD, OLD, OLD, OLD).with_proxy(OLD)
        );
        assert_eq!(
            components(NEW, OLD, &members, "cp-1"),
            seen(NEW, OLD, OLD, OLD).with_proxy(OLD)
        );
        assert_eq!(
            components(NEW, OLD, &members, "cp-3"),
            seen(NEW, NEW, NEW, NEW).with_proxy(NEW)
        );
        assert!(same("v1.36.4", "1.36.4"));
    }

    trait WithProxy {
        fn with_proxy(self, version: &str) -> Self;
    }

    impl WithProxy for KubernetesComponents {
        fn with_proxy(mut self, version: &str) -> Self {
            self.proxy = Some(version.to_owned());
            self
        }
    }
}

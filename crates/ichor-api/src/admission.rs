//! Admission policies shipped with the CRDs: rules the apiserver enforces that a CRD schema
//! cannot express (they depend on annotations of the same request).

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::names::annotations;

/// The name of the policy (and its binding) guarding kube-proxy switches.
pub const KUBE_PROXY_SWITCH_POLICY: &str = "ichor-kube-proxy-switch";

/// Refuses changing `spec.kubeProxy` of an existing TalosCluster unless the object carries
/// `ichor.maesh.dev/confirm-kube-proxy-switch: "true"`.
pub fn kube_proxy_switch_policy() -> ValidatingAdmissionPolicy {
    let key = annotations::CONFIRM_KUBE_PROXY_SWITCH;
    let confirmed = format!(
        "has(object.metadata.annotations) && '{key}' in object.metadata.annotations && object.metadata.annotations['{key}'] == '{}'",
        annotations::TRUE
    );
    ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            name: Some(KUBE_PROXY_SWITCH_POLICY.into()),
            ..Default::default()
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![crate::GROUP.into()]),
                    api_versions: Some(vec![crate::VERSION.into()]),
                    operations: Some(vec!["UPDATE".into()]),
                    resources: Some(vec!["talosclusters".into()]),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            validations: Some(vec![Validation {
                expression: format!(
                    "!has(oldObject.spec.kubeProxy) || !has(object.spec.kubeProxy) || object.spec.kubeProxy == oldObject.spec.kubeProxy || ({confirmed})"
                ),
                message_expression: Some(format!(
                    "'switching spec.kubeProxy from ' + oldObject.spec.kubeProxy + ' to ' + object.spec.kubeProxy + ' on an existing cluster restarts networking on every node: set the annotation {key}: \"{}\" to confirm'",
                    annotations::TRUE
                )),
                reason: Some("Forbidden".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// Binds [`kube_proxy_switch_policy`] cluster-wide, denying violations.
pub fn kube_proxy_switch_binding() -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: ObjectMeta {
            name: Some(KUBE_PROXY_SWITCH_POLICY.into()),
            ..Default::default()
        },
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: KUBE_PROXY_SWITCH_POLICY.into(),
            validation_actions: vec!["Deny".into()],
            ..Default::default()
        },
    }
}

/// The validating webhook configuration the webhook injects its CA into.
pub const WEBHOOK_CONFIGURATION: &str = "ichor-validating-webhook-configuration";
/// The Secret (in the webhook's namespace) holding the webhook's CA.
pub const WEBHOOK_CERT_SECRET: &str = "ichor-webhook-server-cert";
/// The namespace the shipped manifests install into.
pub const SYSTEM_NAMESPACE: &str = "ichor-system";
/// The webhook's Service, ServiceAccount and RBAC name.
pub const WEBHOOK_NAME: &str = "ichor-webhook";
/// The path the webhook serves reviews on.
pub const WEBHOOK_PATH: &str = "/validate";

/// The webhook's rules: TalosMachine deletes and updates, TalosCluster deletes, TalosOperation
/// creates (a reset or reboot is checked at the door as the planner would run it).
pub fn webhook_rules() -> Vec<k8s_openapi::api::admissionregistration::v1::RuleWithOperations> {
    use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
    let rule = |resource: &str, operations: &[&str]| RuleWithOperations {
        api_groups: Some(vec![crate::GROUP.into()]),
        api_versions: Some(vec![crate::VERSION.into()]),
        resources: Some(vec![resource.into()]),
        operations: Some(operations.iter().map(|o| (*o).to_owned()).collect()),
        scope: Some("Namespaced".into()),
    };
    vec![
        rule("talosmachines", &["DELETE", "UPDATE"]),
        rule("talosclusters", &["DELETE", "UPDATE"]),
        rule("talosoperations", &["CREATE"]),
    ]
}

/// The validating webhook configuration: `failurePolicy: Fail`, side effects only outside dry
/// runs (the removal reservation), calling the webhook's Service. The webhook fills in
/// `caBundle` itself.
pub fn validating_webhook_configuration()
-> k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration {
    use k8s_openapi::api::admissionregistration::v1::{
        MatchCondition, ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration,
        WebhookClientConfig,
    };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(WEBHOOK_CONFIGURATION.into()),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "deletes.ichor.maesh.dev".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "NoneOnDryRun".into(),
            failure_policy: Some("Fail".into()),
            match_policy: Some("Equivalent".into()),
            timeout_seconds: Some(10),
            client_config: WebhookClientConfig {
                service: Some(ServiceReference {
                    name: WEBHOOK_NAME.into(),
                    namespace: SYSTEM_NAMESPACE.into(),
                    path: Some(WEBHOOK_PATH.into()),
                    port: Some(443),
                }),
                ..Default::default()
            },
            rules: Some(webhook_rules()),
            match_conditions: Some(vec![
                MatchCondition {
                    name: MACHINE_UPDATE_CONDITION.into(),
                    expression: MACHINE_UPDATE_EXPRESSION.into(),
                },
                MatchCondition {
                    name: CLUSTER_UPDATE_CONDITION.into(),
                    expression: CLUSTER_UPDATE_EXPRESSION.into(),
                },
            ]),
            ..Default::default()
        }]),
    }
}

/// The name of the webhook's match condition for TalosMachine updates
/// ([`MACHINE_UPDATE_EXPRESSION`]).
pub const MACHINE_UPDATE_CONDITION: &str = "machine-update-changes-approval-or-role";

/// The webhook's match condition (CEL, evaluated by the apiserver): every request of its rules
/// is sent, except a TalosMachine update that leaves `spec.approvalState` and `spec.role` as
/// they were, which the webhook always admits (ichor-deleteguard's `check_machine_update`
/// refuses only those two changes, ADR 0063). So a finalizer, label, annotation or other spec
/// patch never waits on the webhook, nor fails while it is down.
pub const MACHINE_UPDATE_EXPRESSION: &str = "request.operation != 'UPDATE' \
|| request.resource.resource != 'talosmachines' \
|| (has(object.spec.approvalState) ? object.spec.approvalState : '') \
!= (has(oldObject.spec.approvalState) ? oldObject.spec.approvalState : '') \
|| (has(object.spec.role) ? object.spec.role : '') \
!= (has(oldObject.spec.role) ? oldObject.spec.role : '')";

/// The name of the webhook's match condition for TalosCluster updates
/// ([`CLUSTER_UPDATE_EXPRESSION`]).
pub const CLUSTER_UPDATE_CONDITION: &str = "cluster-update-changes-versions";

/// The match condition for TalosCluster updates: one is sent only when it changes
/// `spec.talosVersion` or `spec.kubernetesVersion`, the changes the version rules judge
/// (`crate::versions`, ADR 0068); every other request passes it. The manager's status writes
/// and the webhook's own reservations never wait on the webhook.
pub const CLUSTER_UPDATE_EXPRESSION: &str = "request.operation != 'UPDATE' \
|| request.resource.resource != 'talosclusters' \
|| object.spec.talosVersion != oldObject.spec.talosVersion \
|| object.spec.kubernetesVersion != oldObject.spec.kubernetesVersion";

/// What the webhook may do across namespaces: list and watch TalosMachines, read, watch and
/// reserve on TalosClusters (its cache answers refusals, ADR 30), inject its CA into its own
/// webhook configuration. Exactly what the code uses:
/// the RBAC audit of every CI run fails on a grant nobody used.
pub fn webhook_cluster_role() -> k8s_openapi::api::rbac::v1::ClusterRole {
    use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
    let rule = |groups: &str, resources: &str, verbs: &[&str], names: Option<&str>| PolicyRule {
        api_groups: Some(vec![groups.into()]),
        resources: Some(vec![resources.into()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        resource_names: names.map(|n| vec![n.to_owned()]),
        ..Default::default()
    };
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(WEBHOOK_NAME.into()),
            ..Default::default()
        },
        rules: Some(vec![
            rule(crate::GROUP, "talosmachines", &["list", "watch"], None),
            rule(
                crate::GROUP,
                "talosclusters",
                &["get", "list", "watch", "update"],
                None,
            ),
            rule(
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
                &["get", "update"],
                Some(WEBHOOK_CONFIGURATION),
            ),
        ]),
        ..Default::default()
    }
}

/// What the webhook may do in its own namespace: create and read its CA Secret (and follow a
/// rotation), or fill the empty one an installer created (only that Secret).
pub fn webhook_role(namespace: &str) -> k8s_openapi::api::rbac::v1::Role {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
    Role {
        metadata: ObjectMeta {
            name: Some(WEBHOOK_NAME.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        rules: Some(vec![
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["secrets".into()]),
                verbs: vec!["get".into(), "create".into()],
                ..Default::default()
            },
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["secrets".into()]),
                resource_names: Some(vec![WEBHOOK_CERT_SECRET.into()]),
                verbs: vec!["update".into()],
                ..Default::default()
            },
        ]),
    }
}

/// The manager's name (ServiceAccount, RBAC, Lease).
pub const MANAGER_NAME: &str = "ichor-manager";

/// What the manager may do across namespaces: watch and write its own kinds and their status,
/// the bundle, talosconfig and kubeconfig Secrets, Events, and the per-cluster lock. Exactly
/// what the code uses: the RBAC audit of every CI run (`ichor-rbac-audit`) fails on a grant no
/// request used.
pub fn manager_cluster_role() -> k8s_openapi::api::rbac::v1::ClusterRole {
    use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    };
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(MANAGER_NAME.into()),
            ..Default::default()
        },
        rules: Some(vec![
            // Reconciled kinds: watched, and patched (spec.kubernetesVersion by an operation;
            // finalizers).
            rule(
                crate::GROUP,
                &["talosclusters"],
                &["get", "list", "watch", "patch"],
            ),
            rule(
                crate::GROUP,
                &["talosoperations"],
                &["get", "list", "watch"],
            ),
            // Discovery creates machines; approval pins and finalizers are patched; tearing
            // down a deleted TalosCluster deletes its machines, workers first.
            rule(
                crate::GROUP,
                &["talosmachines"],
                &["get", "list", "watch", "create", "patch", "delete"],
            ),
            // Claims on machines' UUIDs: taken by create, read when taken, released by
            // delete (found by their holder's label); address policies: read (ADR 0054) and
            // watched (ADR 0062).
            rule(
                crate::GROUP,
                &["talosmachineclaims"],
                &["get", "list", "create", "delete"],
            ),
            rule(
                crate::GROUP,
                &["talosnamespacepolicies"],
                &["get", "list", "watch"],
            ),
            // Classes and storages: watched (caches and controllers), never written but for
            // their status.
            rule(
                crate::GROUP,
                &["talosmachineclasses", "talosstorages"],
                &["list", "watch"],
            ),
            // Status: server-side apply, one field manager per group of fields (ADR 0020).
            rule(
                crate::GROUP,
                &[
                    "talosclusters/status",
                    "talosmachines/status",
                    "talosoperations/status",
                    "talosmachineclasses/status",
                    "talosstorages/status",
                ],
                &["patch"],
            ),
            // The bundle, talosconfig, kubeconfig and snapshot Secrets: created once, replaced;
            // the metadata of Ichor's cluster Secrets watched (by their labels) so that one is
            // read again only when it changed.
            rule(
                "",
                &["secrets"],
                &["get", "list", "watch", "create", "update"],
            ),
            rule("events.k8s.io", &["events"], &["create", "patch"]),
            // The per-cluster lock, held by the action (removal/<uid>, ...), in the cluster's
            // namespace.
            rule(
                "coordination.k8s.io",
                &["leases"],
                &["get", "create", "update", "delete"],
            ),
        ]),
        ..Default::default()
    }
}

/// What the manager may do in its own namespace: hold its leader-election Lease.
pub fn manager_role(namespace: &str) -> k8s_openapi::api::rbac::v1::Role {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
    Role {
        metadata: ObjectMeta {
            name: Some(MANAGER_NAME.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".into()]),
            resources: Some(vec!["leases".into()]),
            verbs: vec!["get".into(), "create".into(), "update".into()],
            ..Default::default()
        }]),
    }
}

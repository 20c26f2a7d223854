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

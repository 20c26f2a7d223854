//! The RBAC audit: every permission the shipped roles grant must be used, measured from the
//! apiserver's audit log over a whole sim e2e run (`ichor_testenv::AUDIT_DIR_ENV`), and no
//! request of Ichor's may be refused. The e2e already fails when a permission is missing; this
//! fails when one is granted but never needed.

use std::collections::BTreeSet;

use ichor_api::admission;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde_json::Value;

/// One permission: a verb on a resource (with its subresource, `talosclusters/status`) of an API
/// group, cluster-wide or in one namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource, `resource/subresource` for a subresource.
    pub resource: String,
    /// The verb.
    pub verb: String,
    /// The namespace of a Role's grant; `None` for a ClusterRole's.
    pub namespace: Option<String>,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {} ({group})", self.verb, self.resource)?;
        if let Some(namespace) = &self.namespace {
            write!(f, " in {namespace}")?;
        }
        Ok(())
    }
}

fn expand(rules: &[PolicyRule], namespace: Option<&str>) -> Vec<Permission> {
    let mut out = Vec::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.push(Permission {
                        group: group.clone(),
                        resource: resource.clone(),
                        verb: verb.clone(),
                        namespace: namespace.map(str::to_owned),
                    });
                }
            }
        }
    }
    out
}

/// Everything a ClusterRole and a Role grant.
pub fn granted(cluster_role: &ClusterRole, role: &Role) -> Vec<Permission> {
    let mut all = expand(cluster_role.rules.as_deref().unwrap_or_default(), None);
    all.extend(expand(
        role.rules.as_deref().unwrap_or_default(),
        role.metadata.namespace.as_deref(),
    ));
    all
}

/// One request in an audit log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    /// Who sent it.
    pub user: String,
    /// What it asked for (its namespace in `namespace`).
    pub permission: Permission,
    /// The response code.
    pub code: u16,
    /// The field manager a write named (`?fieldManager=` of its URI), if any.
    pub field_manager: Option<String>,
}

/// The resource requests in an audit log (JSON lines; non-resource requests are skipped).
pub fn requests(log: &str) -> Vec<Request> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|event| {
            let object = event.get("objectRef")?;
            let mut resource = object.get("resource")?.as_str()?.to_owned();
            if let Some(sub) = object.get("subresource").and_then(Value::as_str) {
                resource = format!("{resource}/{sub}");
            }
            Some(Request {
                user: event["user"]["username"].as_str()?.to_owned(),
                permission: Permission {
                    group: object
                        .get("apiGroup")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    resource,
                    verb: event.get("verb")?.as_str()?.to_owned(),
                    namespace: object
                        .get("namespace")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                },
                code: event["responseStatus"]["code"]
                    .as_u64()
                    .and_then(|c| u16::try_from(c).ok())
                    .unwrap_or(0),
                field_manager: event
                    .get("requestURI")
                    .and_then(Value::as_str)
                    .and_then(field_manager),
            })
        })
        .collect()
}

/// The `fieldManager` query parameter of a request URI.
fn field_manager(uri: &str) -> Option<String> {
    let (_, query) = uri.split_once('?')?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("fieldManager="))
        .map(str::to_owned)
}

/// What the audit found for one identity.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Granted, never used.
    pub unused: Vec<Permission>,
    /// Asked for and refused (403).
    pub refused: Vec<Permission>,
    /// How many of its requests the logs hold.
    pub requests: usize,
}

/// Compares `user`'s requests with its grants.
pub fn audit(user: &str, grants: &[Permission], requests: &[Request]) -> Findings {
    let mine: Vec<&Request> = requests.iter().filter(|r| r.user == user).collect();
    let used = |grant: &Permission| {
        mine.iter().any(|r| {
            r.code != 403
                && r.permission.group == grant.group
                && r.permission.resource == grant.resource
                && r.permission.verb == grant.verb
                && (grant.namespace.is_none() || r.permission.namespace == grant.namespace)
        })
    };
    let unused: BTreeSet<Permission> = grants.iter().filter(|g| !used(g)).cloned().collect();
    let refused: BTreeSet<Permission> = mine
        .iter()
        .filter(|r| r.code == 403)
        .map(|r| r.permission.clone())
        .collect();
    Findings {
        unused: unused.into_iter().collect(),
        refused: refused.into_iter().collect(),
        requests: mine.len(),
    }
}

/// The shipped identities: their user name in the sim target and their grants.
pub fn shipped() -> Vec<(String, Vec<Permission>)> {
    let user = |name: &str| {
        format!(
            "system:serviceaccount:{}:{name}",
            admission::SYSTEM_NAMESPACE
        )
    };
    vec![
        (
            user(admission::MANAGER_NAME),
            granted(
                &admission::manager_cluster_role(),
                &admission::manager_role(admission::SYSTEM_NAMESPACE),
            ),
        ),
        (
            user(admission::WEBHOOK_NAME),
            granted(
                &admission::webhook_cluster_role(),
                &admission::webhook_role(admission::SYSTEM_NAMESPACE),
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permission(group: &str, resource: &str, verb: &str, namespace: Option<&str>) -> Permission {
        Permission {
            group: group.into(),
            resource: resource.into(),
            verb: verb.into(),
            namespace: namespace.map(str::to_owned),
        }
    }

    #[test]
    fn audit_events_are_read_with_their_subresource_and_code() {
        let log = r#"{"kind":"Event","verb":"patch","user":{"username":"sa:m"},"requestURI":"/apis/ichor.maesh.dev/v1alpha1/namespaces/e2e/talosclusters/lab/status?fieldManager=ichor-core&force=true","objectRef":{"resource":"talosclusters","namespace":"e2e","name":"lab","apiGroup":"ichor.maesh.dev","subresource":"status"},"responseStatus":{"code":200}}
{"kind":"Event","verb":"get","user":{"username":"sa:m"},"objectRef":{"resource":"secrets","namespace":"ichor-system","apiVersion":"v1"},"responseStatus":{"code":403}}
{"kind":"Event","verb":"get","user":{"username":"sa:m"},"requestURI":"/healthz","responseStatus":{"code":200}}
not json"#;
        let found = requests(log);
        assert_eq!(found.len(), 2);
        assert_eq!(
            found[0].permission,
            permission(
                "ichor.maesh.dev",
                "talosclusters/status",
                "patch",
                Some("e2e")
            )
        );
        assert_eq!(found[1].permission.group, "");
        assert_eq!(found[1].code, 403);
        assert_eq!(found[0].field_manager.as_deref(), Some("ichor-core"));
        assert_eq!(found[1].field_manager, None);
    }

    #[test]
    fn a_grant_nobody_uses_and_a_refused_request_are_findings() {
        let grants = vec![
            permission("", "secrets", "get", None),
            permission("", "secrets", "delete", None),
            permission(
                "coordination.k8s.io",
                "leases",
                "update",
                Some("ichor-system"),
            ),
        ];
        let request =
            |verb: &str, resource: &str, group: &str, namespace: &str, code: u16| Request {
                user: "sa:m".into(),
                permission: permission(group, resource, verb, Some(namespace)),
                code,
                field_manager: None,
            };
        let requests = vec![
            request("get", "secrets", "", "e2e", 200),
            // A Role's grant is used only in its namespace.
            request("update", "leases", "coordination.k8s.io", "elsewhere", 200),
            request("list", "nodes", "", "", 403),
            Request {
                user: "someone-else".into(),
                ..request("delete", "secrets", "", "e2e", 200)
            },
        ];
        let findings = audit("sa:m", &grants, &requests);
        assert_eq!(
            findings.unused,
            vec![
                permission("", "secrets", "delete", None),
                permission(
                    "coordination.k8s.io",
                    "leases",
                    "update",
                    Some("ichor-system")
                ),
            ]
        );
        assert_eq!(
            findings.refused,
            vec![permission("", "nodes", "list", Some(""))]
        );
        assert_eq!(findings.requests, 3);
        assert_eq!(findings.unused[0].to_string(), "delete secrets (core)");
    }

    #[test]
    fn the_shipped_roles_are_expanded_per_verb() {
        let shipped = shipped();
        assert_eq!(shipped.len(), 2);
        assert!(shipped[0].0.ends_with(":ichor-manager"));
        assert!(
            shipped[0]
                .1
                .iter()
                .any(|p| p.resource == "talosmachines" && p.verb == "delete")
        );
    }
}

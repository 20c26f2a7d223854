//! `render MACHINE [--diff]`: the exact config the machine would get now, rendered by the same
//! pure function the manager applies ([`ichor_render::render_machine`]) from the TalosCluster,
//! the TalosMachine, its role and the cluster's secrets bundle, and printed with every secret
//! redacted. `--diff` compares it instead with the config last applied, which the manager keeps
//! in the Secret `<machine>-applied-config`; both sides are redacted before they are compared.

use ichor_api::common::Role;
use ichor_api::machine::ApprovalState;
use ichor_api::names::secrets as secret_names;
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass, TalosStorage};
use ichor_render::{MachineLayers, Rendered, SecretsBundle, config_hash, render::to_yaml};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::Api;
use serde_json::Value;

use crate::Error;
use crate::connect::Connection;
use crate::diff::unified;
use crate::machines::get_machine;
use crate::redact::{bundle_secrets, leaked, redact};

/// The role to render with: the machine's, else `--role` (a preview for a machine not approved
/// yet).
pub fn choose_role(machine: &TalosMachine, flag: Option<Role>) -> Result<Role, Error> {
    let name = machine.name_any();
    match (machine.spec.role, flag) {
        (Some(role), None) => Ok(role),
        (Some(role), Some(asked)) if role == asked => Ok(role),
        (Some(role), Some(asked)) => Err(Error::Usage(format!(
            "TalosMachine {name} has spec.role {}: --role {} would render a config it never gets (leave --role out)",
            role.as_str(),
            asked.as_str()
        ))),
        (None, Some(asked)) => Ok(asked),
        (None, None) => Err(Error::Usage(format!(
            "TalosMachine {name} has no spec.role yet, and its config depends on it: pass --role controlplane or --role worker to preview it"
        ))),
    }
}

/// The name of the Secret in which the manager keeps the config last applied to `machine`.
pub fn applied_config_secret(machine: &str) -> String {
    format!("{machine}{}", secret_names::APPLIED_CONFIG_SUFFIX)
}

/// Documents as YAML with every secret redacted.
pub fn redacted_yaml(documents: &[Value]) -> Result<String, Error> {
    let mut documents = documents.to_vec();
    redact(&mut documents);
    to_yaml(&documents).map_err(|e| Error::Object(format!("cannot print the config: {e}")))
}

/// What `render` prints: a comment naming what was rendered, then the redacted config.
pub fn config_text(
    machine: &TalosMachine,
    cluster: &str,
    role: Role,
    rendered: &Rendered,
) -> Result<String, Error> {
    Ok(format!(
        "# TalosMachine {} ({}) of TalosCluster {cluster}: config {}, secrets redacted\n{}",
        machine.name_any(),
        role.as_str(),
        rendered.hash,
        redacted_yaml(&rendered.documents)?
    ))
}

/// What `render --diff` prints, from the machine's recorded hash (`status.appliedConfigHash`),
/// the stored applied config (when its Secret exists) and the config rendered now.
pub fn diff_report(
    machine: &TalosMachine,
    stored: Option<&str>,
    rendered: &Rendered,
) -> Result<String, Error> {
    let name = machine.name_any();
    let secret = applied_config_secret(&name);
    let now = &rendered.hash;
    let recorded = machine
        .status
        .as_ref()
        .and_then(|s| s.applied.config_hash.clone());
    let Some(applied) = recorded else {
        let next = match machine.spec.approval_state {
            ApprovalState::Pending => {
                format!("the config rendered now ({now}) is applied once the machine is approved")
            }
            ApprovalState::Rejected => format!(
                "the machine is rejected, so the config rendered now ({now}) is never applied"
            ),
            ApprovalState::Approved => {
                format!("the manager applies the config rendered now ({now}) next")
            }
        };
        return Ok(format!(
            "nothing applied yet to TalosMachine {name} (status.appliedConfigHash is empty): {next}\n"
        ));
    };
    let compared = if &applied == now {
        "the same: no difference"
    } else {
        "a different one; the manager applies it (live, or with a reboot under the cluster lock)"
    };
    let Some(stored) = stored else {
        return Ok(format!(
            "applied config not recorded: TalosMachine {name} has config {applied} applied, but no Secret {secret} holds it (it was applied before the manager kept applied configs); the config rendered now is {compared} ({now})\n"
        ));
    };
    let stored_hash = config_hash(stored);
    if stored_hash != applied {
        return Ok(format!(
            "applied config not recorded: Secret {secret} holds config {stored_hash}, but status.appliedConfigHash is {applied} (a config was staged and its reboot did not happen, or the record is behind); the config rendered now is {compared} ({now})\n"
        ));
    }
    if stored == rendered.yaml {
        return Ok(format!(
            "no difference: the config rendered now is the one applied to TalosMachine {name} ({applied})\n"
        ));
    }
    let documents: Vec<Value> = serde_saphyr::from_multiple(stored).map_err(|_| {
        Error::Object(format!(
            "the applied config in Secret {secret} (key {}) does not parse as YAML documents",
            secret_names::APPLIED_CONFIG_KEY
        ))
    })?;
    let old = redacted_yaml(&documents)?;
    let new = redacted_yaml(&rendered.documents)?;
    Ok(
        match unified(
            &old,
            &new,
            &format!("applied {applied}"),
            &format!("rendered now {now}"),
        ) {
            Some(diff) => format!(
                "{diff}\nthe config rendered now differs from the one applied to TalosMachine {name}: the manager applies it (live, or with a reboot under the cluster lock)\n"
            ),
            None => format!(
                "the config rendered now ({now}) differs from the one applied ({applied}) only in redacted (secret) values: the manager applies it\n"
            ),
        },
    )
}

fn secrets(conn: &Connection) -> Api<Secret> {
    Api::namespaced(conn.client.clone(), &conn.namespace)
}

/// One key of a Secret as text; `None` when the Secret does not exist.
async fn secret_key(conn: &Connection, name: &str, key: &str) -> Result<Option<String>, Error> {
    let Some(secret) = secrets(conn)
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("cannot read Secret {name}"), &e))?
    else {
        return Ok(None);
    };
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| Error::Object(format!("Secret {name} has no key {key}")))?;
    String::from_utf8(value.0.clone())
        .map(Some)
        .map_err(|_| Error::Object(format!("Secret {name} key {key} is not UTF-8 text")))
}

/// The TalosCluster `name`, or an error naming who referenced it.
pub async fn get_cluster(conn: &Connection, name: &str, via: &str) -> Result<TalosCluster, Error> {
    Api::<TalosCluster>::namespaced(conn.client.clone(), &conn.namespace)
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("cannot read TalosCluster {name}"), &e))?
        .ok_or_else(|| {
            Error::Object(format!(
                "TalosCluster {name}{via} not found in namespace {ns}: list them with `kubectl get talosclusters -n {ns}`",
                ns = conn.namespace
            ))
        })
}

/// The cluster's secrets bundle, from the Secret named in `status.secretsSecret`.
async fn bundle(conn: &Connection, cluster: &TalosCluster) -> Result<SecretsBundle, Error> {
    let cluster_name = cluster.name_any();
    let name = cluster
        .status
        .as_ref()
        .and_then(|s| s.core.secrets_secret.clone())
        .or_else(|| cluster.spec.secrets_ref.as_ref().map(|r| r.name.clone()))
        .ok_or_else(|| {
            Error::Object(format!(
                "TalosCluster {cluster_name} has no secrets bundle yet (status.secretsSecret is empty): the manager generates it; wait for the SecretsReady condition (kubectl ichor describe cluster {cluster_name})"
            ))
        })?;
    let text = secret_key(conn, &name, secret_names::BUNDLE_KEY)
        .await?
        .ok_or_else(|| {
            Error::Object(format!(
                "Secret {name} (the secrets bundle of TalosCluster {cluster_name}) not found in namespace {}",
                conn.namespace
            ))
        })?;
    SecretsBundle::from_yaml(&text).map_err(|e| {
        Error::Object(format!(
            "Secret {name} does not hold a valid secrets bundle under {}: {e}",
            secret_names::BUNDLE_KEY
        ))
    })
}

/// The machine classes and storages of the namespace: what a machine's class patches and
/// volumes come from (a list call for each, per 500 objects).
async fn layer_sources(
    conn: &Connection,
) -> Result<(Vec<TalosMachineClass>, Vec<TalosStorage>), Error> {
    let classes = crate::connect::list_all(
        &Api::<TalosMachineClass>::namespaced(conn.client.clone(), &conn.namespace),
        "TalosMachineClasses",
    )
    .await?;
    let storages = crate::connect::list_all(
        &Api::<TalosStorage>::namespaced(conn.client.clone(), &conn.namespace),
        "TalosStorages",
    )
    .await?;
    Ok((classes, storages))
}

/// Renders `name`'s config as the manager would now; prints it redacted, or its diff.
pub async fn render(
    conn: &Connection,
    name: &str,
    diff: bool,
    role: Option<Role>,
) -> Result<String, Error> {
    let machine = get_machine(conn, name).await?;
    let role = choose_role(&machine, role)?;
    let cluster_name = machine.spec.cluster_ref.name.clone();
    let cluster = get_cluster(
        conn,
        &cluster_name,
        &format!(" (spec.clusterRef of TalosMachine {name})"),
    )
    .await?;
    let bundle = bundle(conn, &cluster).await?;
    let (classes, storages) = layer_sources(conn).await?;
    let rendered = MachineLayers::of(&machine, &classes, &storages)
        .and_then(|layers| ichor_render::render_machine(&cluster, &machine, role, &layers, &bundle))
        .map_err(|e| {
            Error::Object(format!(
                "the config of TalosMachine {name} cannot be rendered: {e}"
            ))
        })?;
    let text = if diff {
        let stored = match secret_key(
            conn,
            &applied_config_secret(name),
            secret_names::APPLIED_CONFIG_KEY,
        )
        .await
        {
            Ok(stored) => stored,
            // A Secret without the key holds no record.
            Err(Error::Object(_)) => None,
            Err(error) => return Err(error),
        };
        diff_report(&machine, stored.as_deref(), &rendered)?
    } else {
        config_text(&machine, &cluster_name, role, &rendered)?
    };
    // Fail closed: a value of the bundle that survived redaction is never printed.
    if leaked(&text, &bundle_secrets(&bundle)) {
        return Err(Error::Object(format!(
            "refusing to print the config of TalosMachine {name}: a value of the secrets bundle survived redaction (a bug in kubectl-ichor: please report it)"
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use ichor_render::Contract;
    use serde_json::json;

    use super::*;

    fn bundle() -> SecretsBundle {
        SecretsBundle::from_yaml(include_str!(
            "../../ichor-render/tests/golden/bundle-1.14.yaml"
        ))
        .expect("the test bundle")
    }

    fn cluster(kubernetes: &str) -> TalosCluster {
        serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosCluster",
            "metadata": {"name": "lab", "namespace": "ns"},
            "spec": {
                "talosVersion": "v1.14.1",
                "kubernetesVersion": kubernetes,
                "endpoint": "https://10.0.0.10:6443",
                "controlPlane": {"count": 1}
            }
        }))
        .expect("cluster")
    }

    fn machine(role: Option<&str>, applied: Option<&str>) -> TalosMachine {
        let mut value = json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosMachine",
            "metadata": {"name": "m1", "namespace": "ns"},
            "spec": {"clusterRef": {"name": "lab"}, "approvalState": "approved"},
            "status": {}
        });
        if let Some(role) = role {
            value["spec"]["role"] = json!(role);
        }
        if let Some(hash) = applied {
            value["status"]["appliedConfigHash"] = json!(hash);
        }
        serde_json::from_value(value).expect("machine")
    }

    fn rendered(kubernetes: &str) -> Rendered {
        ichor_render::render_machine(
            &cluster(kubernetes),
            &machine(Some("controlplane"), None),
            Role::ControlPlane,
            &MachineLayers::default(),
            &bundle(),
        )
        .expect("render")
    }

    #[test]
    fn the_machines_role_wins_and_a_preview_needs_one() {
        assert_eq!(
            choose_role(&machine(Some("worker"), None), None).expect("role"),
            Role::Worker
        );
        assert_eq!(
            choose_role(&machine(None, None), Some(Role::ControlPlane)).expect("role"),
            Role::ControlPlane
        );
        let err = choose_role(&machine(None, None), None).expect_err("no role");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--role controlplane"), "{err}");
        let err = choose_role(&machine(Some("worker"), None), Some(Role::ControlPlane))
            .expect_err("another role");
        assert!(err.to_string().contains("has spec.role worker"), "{err}");
    }

    #[test]
    fn the_printed_config_names_what_was_rendered_and_holds_no_secret() {
        let b = bundle();
        let out = rendered("1.36.3");
        let text = config_text(
            &machine(Some("controlplane"), None),
            "lab",
            Role::ControlPlane,
            &out,
        )
        .expect("text");
        assert!(text.starts_with(&format!(
            "# TalosMachine m1 (controlplane) of TalosCluster lab: config {}, secrets redacted\n",
            out.hash
        )));
        assert!(!text.contains(&b.secrets.bootstrap_token.0));
        assert!(!text.contains(&b.cluster.secret.0));
        // Still one YAML stream: the comment and the documents parse.
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text).expect("yaml");
        assert_eq!(documents.len(), out.documents.len());
        assert_eq!(Contract::from_version("v1.14.1"), Ok(out.contract));
    }

    #[test]
    fn nothing_applied_yet_says_so() {
        let out = rendered("1.36.3");
        let report = diff_report(&machine(Some("controlplane"), None), None, &out).expect("report");
        assert!(
            report.starts_with("nothing applied yet to TalosMachine m1"),
            "{report}"
        );
        assert!(
            report.contains(&format!(
                "the manager applies the config rendered now ({}) next",
                out.hash
            )),
            "{report}"
        );
        let mut pending = machine(None, None);
        pending.spec.approval_state = ApprovalState::Pending;
        let report = diff_report(&pending, None, &out).expect("report");
        assert!(
            report.contains("is applied once the machine is approved"),
            "{report}"
        );
    }

    #[test]
    fn the_applied_config_itself_has_no_difference() {
        let out = rendered("1.36.3");
        let m = machine(Some("controlplane"), Some(&out.hash));
        let report = diff_report(&m, Some(&out.yaml), &out).expect("report");
        assert_eq!(
            report,
            format!(
                "no difference: the config rendered now is the one applied to TalosMachine m1 ({})\n",
                out.hash
            )
        );
    }

    #[test]
    fn a_newer_kubernetes_shows_as_a_redacted_diff() {
        let b = bundle();
        let before = rendered("1.36.3");
        let after = rendered("1.36.4");
        let m = machine(Some("controlplane"), Some(&before.hash));
        let report = diff_report(&m, Some(&before.yaml), &after).expect("report");
        assert!(
            report.starts_with(&format!(
                "--- applied {}\n+++ rendered now {}\n@@ ",
                before.hash, after.hash
            )),
            "{report}"
        );
        assert!(
            report.contains("-  image: registry.k8s.io/kube-apiserver:v1.36.3\n")
                || report.contains("-image: registry.k8s.io/kube-apiserver:v1.36.3\n"),
            "{report}"
        );
        assert!(
            report.contains("+image: registry.k8s.io/kube-apiserver:v1.36.4\n"),
            "{report}"
        );
        assert!(!report.contains(&b.secrets.bootstrap_token.0));
        assert!(!report.contains(&b.trustd_info.token.0));
        assert!(report.contains("the manager applies it"), "{report}");
    }

    #[test]
    fn a_missing_or_stale_record_says_the_applied_config_is_not_recorded() {
        let out = rendered("1.36.3");
        let m = machine(Some("controlplane"), Some(&out.hash));
        let report = diff_report(&m, None, &out).expect("report");
        assert!(
            report.starts_with("applied config not recorded"),
            "{report}"
        );
        assert!(report.contains("Secret m1-applied-config"), "{report}");
        assert!(report.contains("the same: no difference"), "{report}");
        let older = rendered("1.36.2");
        let report = diff_report(&m, Some(&older.yaml), &out).expect("report");
        assert!(
            report.starts_with("applied config not recorded"),
            "{report}"
        );
        assert!(report.contains(&older.hash), "{report}");
    }
}

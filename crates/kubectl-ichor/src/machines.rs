//! `pending`, `approve` and `reject`: the machines waiting for a person, and that person's
//! decision, written as a merge patch of `spec.approvalState` (and `spec.role`). What the
//! apiserver refuses (the lock once a config is applied, a missing pin) is shown verbatim.

use ichor_api::TalosMachine;
use ichor_api::common::{ConditionStatus, Role};
use ichor_api::machine::ApprovalState;
use ichor_api::names::conditions;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::Error;
use crate::connect::Connection;
use crate::table::{bytes, table};

/// The columns of `pending`.
pub const PENDING_COLUMNS: [&str; 9] = [
    "NAME",
    "CLUSTER",
    "ADDRESS",
    "TALOS",
    "UUID",
    "SYSTEM",
    "DISKS",
    "LINKS",
    "FINGERPRINT",
];

fn or_dash(value: Option<String>) -> String {
    value
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "-".into())
}

/// One `pending` row: what a person checks before approving.
pub fn pending_row(machine: &TalosMachine) -> Vec<String> {
    let status = machine.status.clone().unwrap_or_default();
    let hardware = status.inventory.hardware.clone().unwrap_or_default();
    let system = [&hardware.manufacturer, &hardware.product_name]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    let disks = hardware
        .disks
        .iter()
        .filter(|d| !d.cdrom)
        .map(|d| format!("{}:{}", d.name, bytes(d.size)))
        .collect::<Vec<_>>()
        .join(",");
    let links = hardware
        .links
        .iter()
        .filter(|l| l.kind.as_deref().unwrap_or_default().is_empty())
        .map(|l| match &l.hardware_addr {
            Some(mac) => format!("{}:{mac}", l.name),
            None => l.name.clone(),
        })
        .collect::<Vec<_>>()
        .join(",");
    vec![
        machine.name_any(),
        machine.spec.cluster_ref.name.clone(),
        or_dash(if machine.spec.endpoints.is_empty() {
            status.inventory.address.clone()
        } else {
            Some(machine.spec.endpoints.join(","))
        }),
        or_dash(status.inventory.talos_version.clone()),
        or_dash(Some(hardware.uuid.clone())),
        or_dash(Some(system)),
        or_dash(Some(disks)),
        or_dash(Some(links)),
        or_dash(machine.spec.fingerprint.clone()),
    ]
}

/// A warning for a pending machine whose certificate no longer matches its pin.
pub fn fingerprint_warning(machine: &TalosMachine) -> Option<String> {
    let status = machine.status.as_ref()?;
    let flagged = status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::FINGERPRINT_CHANGED && c.status == ConditionStatus::True);
    let observed = status.inventory.observed_fingerprint.as_deref();
    let pinned = machine.spec.fingerprint.as_deref();
    let differs = matches!((observed, pinned), (Some(o), Some(p)) if o != p);
    (flagged || differs).then(|| {
        format!(
            "warning: {} now presents fingerprint {}, not the pinned {}: it rebooted (a new maintenance certificate) or it is another machine. Nothing is applied to it until you check it and set spec.fingerprint to the new value.",
            machine.name_any(),
            observed.unwrap_or("(unknown)"),
            pinned.unwrap_or("(none)")
        )
    })
}

/// The `pending` output for `machines` (all of a namespace's; only pending ones are shown).
pub fn pending_table(machines: &[TalosMachine], namespace: &str) -> String {
    let mut pending: Vec<&TalosMachine> = machines
        .iter()
        .filter(|m| m.spec.approval_state == ApprovalState::Pending)
        .collect();
    if pending.is_empty() {
        return format!("No pending TalosMachines in namespace {namespace}.\n");
    }
    pending.sort_by_key(|m| (m.spec.cluster_ref.name.clone(), m.name_any()));
    let rows: Vec<Vec<String>> = pending.iter().map(|m| pending_row(m)).collect();
    let mut out = table(&PENDING_COLUMNS, &rows);
    for warning in pending.iter().filter_map(|m| fingerprint_warning(m)) {
        out.push('\n');
        out.push_str(&warning);
        out.push('\n');
    }
    out
}

fn api(conn: &Connection) -> Api<TalosMachine> {
    Api::namespaced(conn.client.clone(), &conn.namespace)
}

/// Lists the namespace's pending machines as a table.
pub async fn pending(conn: &Connection) -> Result<String, Error> {
    let machines = crate::connect::list_all(
        &api(conn),
        &format!("TalosMachines in namespace {}", conn.namespace),
    )
    .await?;
    Ok(pending_table(&machines, &conn.namespace))
}

/// The machine `name`, or an error saying where it was looked for.
pub async fn get_machine(conn: &Connection, name: &str) -> Result<TalosMachine, Error> {
    api(conn)
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("cannot read TalosMachine {name}"), &e))?
        .ok_or_else(|| {
            Error::Object(format!(
                "TalosMachine {name} not found in namespace {ns}: list them with `kubectl get talosmachines -n {ns}` (or `kubectl ichor pending -n {ns}`)",
                ns = conn.namespace
            ))
        })
}

/// The API spelling of an approval state.
pub fn state_name(state: ApprovalState) -> &'static str {
    match state {
        ApprovalState::Pending => "pending",
        ApprovalState::Approved => "approved",
        ApprovalState::Rejected => "rejected",
    }
}

fn role_name(role: Option<Role>) -> String {
    role.map_or_else(|| "(unset)".into(), |r| r.as_str().into())
}

/// The merge patch setting `state` (and `role`, when given).
pub fn approval_patch(state: ApprovalState, role: Option<Role>) -> serde_json::Value {
    let mut spec = json!({"approvalState": state_name(state)});
    if let Some(role) = role {
        spec["role"] = json!(role.as_str());
    }
    json!({ "spec": spec })
}

/// What changed between `before` and `after`, one `field: old -> new` line each.
pub fn changes(before: &TalosMachine, after: &TalosMachine) -> Vec<String> {
    let mut out = Vec::new();
    if before.spec.approval_state != after.spec.approval_state {
        out.push(format!(
            "spec.approvalState: {} -> {}",
            state_name(before.spec.approval_state),
            state_name(after.spec.approval_state)
        ));
    }
    if before.spec.role != after.spec.role {
        out.push(format!(
            "spec.role: {} -> {}",
            role_name(before.spec.role),
            role_name(after.spec.role)
        ));
    }
    out
}

/// What `approve`/`reject` prints once the apiserver accepted the patch.
pub fn report(before: &TalosMachine, after: &TalosMachine) -> String {
    let name = after.name_any();
    let changed = changes(before, after);
    let state = state_name(after.spec.approval_state);
    let mut out = if changed.is_empty() {
        format!(
            "talosmachine/{name} unchanged: already {state}{}\n",
            after
                .spec
                .role
                .map(|r| format!(" as {}", r.as_str()))
                .unwrap_or_default()
        )
    } else {
        let mut text = format!("talosmachine/{name} {state}\n");
        for line in changed {
            text.push_str(&format!("  {line}\n"));
        }
        text
    };
    if after.spec.approval_state == ApprovalState::Approved
        && let Some(warning) = fingerprint_warning(after)
    {
        out.push_str(&warning);
        out.push('\n');
    }
    out
}

async fn decide(
    conn: &Connection,
    name: &str,
    state: ApprovalState,
    role: Option<Role>,
) -> Result<String, Error> {
    let before = get_machine(conn, name).await?;
    let after = api(conn)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(approval_patch(state, role)),
        )
        .await
        .map_err(|e| match &e {
            kube::Error::Api(status) if status.code != 404 && !status.message.is_empty() => {
                Error::Refused {
                    object: format!("TalosMachine {name}"),
                    message: status.message.clone(),
                }
            }
            _ => Error::kube(format!("cannot patch TalosMachine {name}"), &e),
        })?;
    Ok(report(&before, &after))
}

/// Approves `name` with `role`.
pub async fn approve(conn: &Connection, name: &str, role: Role) -> Result<String, Error> {
    decide(conn, name, ApprovalState::Approved, Some(role)).await
}

/// Rejects `name`: it is never touched.
pub async fn reject(conn: &Connection, name: &str) -> Result<String, Error> {
    decide(conn, name, ApprovalState::Rejected, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(value: serde_json::Value) -> TalosMachine {
        let mut base = json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosMachine",
            "metadata": {"name": "lab-5a1a", "namespace": "ns"},
            "spec": {
                "clusterRef": {"name": "lab"},
                "approvalState": "pending",
                "endpoints": ["127.0.85.1"],
                "fingerprint": "q1bvP9DqJk0y4k1aVh2l0wqXw0j3bQ5dJ6XJ0v8o3nA="
            },
            "status": {
                "phase": "Pending",
                "talosVersion": "v1.14.1",
                "hardware": {
                    "uuid": "5a1a0000-0000-4000-8000-000000005501",
                    "manufacturer": "QEMU",
                    "productName": "Standard PC",
                    "disks": [
                        {"name": "sr0", "devPath": "/dev/sr0", "size": 104857600, "cdrom": true},
                        {"name": "vda", "devPath": "/dev/vda", "size": 100000000000u64}
                    ],
                    "links": [
                        {"name": "eth0", "hardwareAddr": "52:54:00:00:55:01"},
                        {"name": "lo", "kind": "loopback"}
                    ]
                }
            }
        });
        merge(&mut base, value);
        serde_json::from_value(base).expect("a TalosMachine")
    }

    fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
        match (base, patch) {
            (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, p) => *b = p,
        }
    }

    #[test]
    fn pending_shows_hardware_and_the_pinned_fingerprint() {
        let m = machine(json!({}));
        let other = machine(json!({
            "metadata": {"name": "lab-0002"},
            "spec": {"approvalState": "approved", "role": "worker"}
        }));
        let out = pending_table(&[m, other], "ns");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].starts_with("NAME "), "{out}");
        assert!(lines[0].ends_with("FINGERPRINT"), "{out}");
        for cell in [
            "lab-5a1a",
            "lab",
            "127.0.85.1",
            "v1.14.1",
            "5a1a0000-0000-4000-8000-000000005501",
            "QEMU Standard PC",
            "vda:100GB",
            "eth0:52:54:00:00:55:01",
            "q1bvP9DqJk0y4k1aVh2l0wqXw0j3bQ5dJ6XJ0v8o3nA=",
        ] {
            assert!(lines[1].contains(cell), "{cell} missing from {out}");
        }
        assert!(
            !out.contains("sr0"),
            "the boot CD is not a disk to install to"
        );
        assert!(
            !out.contains("lab-0002"),
            "approved machines are not pending"
        );
    }

    #[test]
    fn nothing_pending_says_so_naming_the_namespace() {
        assert_eq!(
            pending_table(&[], "prod"),
            "No pending TalosMachines in namespace prod.\n"
        );
    }

    #[test]
    fn a_changed_fingerprint_is_warned_about() {
        let m = machine(json!({"status": {
            "observedFingerprint": "AAAAP9DqJk0y4k1aVh2l0wqXw0j3bQ5dJ6XJ0v8o3nA=",
            "conditions": [{"type": "FingerprintChanged", "status": "True", "reason": "FingerprintMismatch", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }}));
        let out = pending_table(&[m], "ns");
        assert!(
            out.contains("warning: lab-5a1a now presents fingerprint AAAAP9Dq"),
            "{out}"
        );
        assert!(out.contains("set spec.fingerprint"), "{out}");
        assert_eq!(fingerprint_warning(&machine(json!({}))), None);
    }

    #[test]
    fn missing_hardware_shows_dashes() {
        let mut m = machine(json!({}));
        m.status = None;
        m.spec.fingerprint = None;
        let row = pending_row(&m);
        assert_eq!(row[3..], ["-", "-", "-", "-", "-", "-"]);
    }

    #[test]
    fn patches_set_the_state_and_the_role_only_when_given() {
        assert_eq!(
            approval_patch(ApprovalState::Approved, Some(Role::ControlPlane)),
            json!({"spec": {"approvalState": "approved", "role": "controlplane"}})
        );
        assert_eq!(
            approval_patch(ApprovalState::Rejected, None),
            json!({"spec": {"approvalState": "rejected"}})
        );
    }

    #[test]
    fn reports_say_what_changed() {
        let before = machine(json!({}));
        let after = machine(json!({"spec": {"approvalState": "approved", "role": "controlplane"}}));
        assert_eq!(
            report(&before, &after),
            "talosmachine/lab-5a1a approved\n  spec.approvalState: pending -> approved\n  spec.role: (unset) -> controlplane\n"
        );
        assert_eq!(
            report(&after, &after),
            "talosmachine/lab-5a1a unchanged: already approved as controlplane\n"
        );
        let rejected = machine(json!({"spec": {"approvalState": "rejected"}}));
        assert_eq!(
            report(&before, &rejected),
            "talosmachine/lab-5a1a rejected\n  spec.approvalState: pending -> rejected\n"
        );
    }
}

//! The demo's table of machines (`ichor-demo` prints it while the cluster comes up).

use ichor_api::TalosMachine;
use ichor_api::names::conditions;
use kube::ResourceExt as _;
use kube::api::Api;

/// One line per machine of `namespace`: name, address, role, approval, phase, and what it
/// waits for; and how many are Ready. Listed in pages of 500 by `kubectl-ichor`'s `list_all`,
/// as kubectl lists: a call per 500 machines, never one per machine (the fleet benchmark counts
/// them in the audit log).
pub async fn machines(client: &kube::Client, namespace: &str) -> (String, usize) {
    let machines: Api<TalosMachine> = Api::namespaced(client.clone(), namespace);
    // A table to look at, not a verdict: a failed list shows no machines.
    let mut list = kubectl_ichor::connect::list_all(&machines, "TalosMachines")
        .await
        .unwrap_or_default();
    list.sort_by_key(|m| m.spec.endpoints.first().cloned().unwrap_or_default());
    let mut out = format!(
        "  {:<46} {:<12} {:<13} {:<9} {:<10} {}\n",
        "MACHINE", "ADDRESS", "ROLE", "APPROVAL", "PHASE", "STATUS"
    );
    let mut ready = 0;
    for m in &list {
        let status = m.status.clone().unwrap_or_default();
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::READY)
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        if condition == "EtcdVoter" || condition == "Running" {
            ready += 1;
        }
        out.push_str(&format!(
            "  {:<46} {:<12} {:<13} {:<9} {:<10} {}\n",
            m.name_any(),
            m.spec.endpoints.first().cloned().unwrap_or_default(),
            m.spec
                .role
                .map(|r| format!("{r:?}"))
                .unwrap_or_else(|| "-".into()),
            format!("{:?}", m.spec.approval_state),
            format!("{:?}", status.lifecycle.phase),
            condition
        ));
    }
    (out, ready)
}

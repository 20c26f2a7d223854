//! The kube-proxy-switch ValidatingAdmissionPolicy, applied verbatim from its file.

use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::support::{api, cluster, create_ok, merge, repo_root, setup_private};

/// Applies every document of `config/admission/kube-proxy-switch.yaml` as it is.
async fn apply_policy_file(client: kube::Client) {
    let text = std::fs::read_to_string(repo_root().join("config/admission/kube-proxy-switch.yaml"))
        .expect("read the policy file");
    let docs: Vec<DynamicObject> = serde_saphyr::from_multiple(&text).expect("policy YAML parses");
    assert_eq!(docs.len(), 2, "a policy and its binding");
    for doc in docs {
        let types = doc.types.clone().expect("apiVersion and kind");
        let (group, version) = types.api_version.split_once('/').expect("group/version");
        let gvk = GroupVersionKind::gvk(group, version, &types.kind);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
        let name = doc.metadata.name.clone().expect("name");
        api.patch(
            &name,
            &PatchParams::apply("ichor-test"),
            &Patch::Apply(&doc),
        )
        .await
        .expect("apply the policy document");
    }
}

#[tokio::test]
async fn switching_kube_proxy_needs_the_confirmation_annotation() {
    let (env, ns) = setup_private("vap").await;
    apply_policy_file(env.client()).await;
    let clusters = api(&env, &ns, "TalosCluster");
    create_ok(
        &clusters,
        cluster("c", json!({"cni": {"preset": "cilium"}})),
    )
    .await;

    // The apiserver compiles and loads a new policy asynchronously: wait until it refuses.
    let deadline = Instant::now() + Duration::from_secs(30);
    let message = loop {
        match merge(&clusters, "c", json!({"spec": {"kubeProxy": "disabled"}})).await {
            Err(message) => break message,
            Ok(_) => {
                assert!(Instant::now() < deadline, "the policy never took effect");
                if merge(&clusters, "c", json!({"spec": {"kubeProxy": "enabled"}}))
                    .await
                    .is_err()
                {
                    // The policy loaded between the two writes: switch back with the
                    // confirmation, then drop it, and try again.
                    let key = "ichor.maesh.dev/confirm-kube-proxy-switch";
                    merge(
                        &clusters,
                        "c",
                        json!({"metadata": {"annotations": {key: "true"}}, "spec": {"kubeProxy": "enabled"}}),
                    )
                    .await
                    .expect("switch back with the confirmation");
                    merge(
                        &clusters,
                        "c",
                        json!({"metadata": {"annotations": {key: null}}}),
                    )
                    .await
                    .expect("drop the confirmation");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(message.contains("ichor-kube-proxy-switch"), "{message}");
    assert!(
        message.contains("switching spec.kubeProxy from enabled to disabled"),
        "{message}"
    );
    assert!(
        message.contains("ichor.maesh.dev/confirm-kube-proxy-switch"),
        "{message}"
    );

    merge(
        &clusters,
        "c",
        json!({"spec": {"controlPlane": {"count": 5}}}),
    )
    .await
    .expect("other updates need no annotation");
    merge(
        &clusters,
        "c",
        json!({
            "metadata": {"annotations": {"ichor.maesh.dev/confirm-kube-proxy-switch": "true"}},
            "spec": {"kubeProxy": "disabled"}
        }),
    )
    .await
    .expect("the annotated switch is allowed");
    let created = create_ok(
        &clusters,
        cluster(
            "born-without",
            json!({"cni": {"preset": "none"}, "kubeProxy": "disabled"}),
        ),
    )
    .await;
    assert_eq!(
        created["spec"]["kubeProxy"], "disabled",
        "creating without kube-proxy is not a switch"
    );
}

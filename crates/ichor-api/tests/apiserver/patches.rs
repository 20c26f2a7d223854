//! Config patches: secret fields are pruned however they arrive; RFC 6902 operations reaching a
//! secret are refused.

use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support::{api, cluster, create_ok, merge, refused, setup};

/// A strategic patch carrying secrets beside legitimate neighbours, in both document styles.
fn patches_with_secrets() -> Value {
    json!([
        {
            "name": "legacy",
            "machine": {
                "token": "abcdef.0123456789abcdef",
                "ca": {"crt": "Y3J0", "key": "a2V5"},
                "certSANs": ["lab.example.internal"],
                "network": {"interfaces": [{"interface": "eth0", "mtu": 9000,
                    "wireguard": {"privateKey": "d2c="},
                    "vip": {"ip": "10.0.0.5", "hcloud": {"apiToken": "tok"}}}]},
                "registries": {"config": {"r.example": {"auth": {"username": "u", "password": "p", "auth": "a", "identityToken": "i"}}}}
            },
            "cluster": {
                "secret": "c2VjcmV0",
                "token": "abcdef.0123456789abcdef",
                "secretboxEncryptionSecret": "c2I=",
                "aescbcEncryptionSecret": "YWVz",
                "ca": {"crt": "Y3J0", "key": "a2V5"},
                "aggregatorCA": {"crt": "Y3J0", "key": "a2V5"},
                "serviceAccount": {"key": "a2V5"},
                "etcd": {"ca": {"crt": "Y3J0", "key": "a2V5"}, "image": "registry.k8s.io/etcd:v3.6.5"},
                "apiServer": {"certSANs": ["api.lab.internal"]}
            }
        },
        {
            "name": "typed",
            "documents": {
                "DiscoveryIdentityConfig": {"clusterID": "aWQ=", "clusterSecret": "c2VjcmV0"},
                "KubeAPIServerCAConfig": {"issuingCA": {"cert": "crt", "key": "key"}, "acceptedCAs": ["-----BEGIN CERTIFICATE-----"]},
                "KubeAggregatorCAConfig": {"issuingCA": {"cert": "crt", "key": "key"}},
                "KubeServiceAccountConfig": {"issuer": {"privateKey": "key", "issuerURL": "https://issuer.lab.internal"}},
                "KubeEtcdEncryptionConfig": {"config": {"secretbox": {"keys": [{"secret": "s"}]}}},
                "KubeProxyConfig": {"enabled": true, "mode": "nftables"},
                "LinkConfig": [{"name": "eth0", "mtu": 9000}]
            }
        }
    ])
}

/// Asserts no secret survived in `patches` and every legitimate neighbour did.
fn assert_pruned(patches: &Value) {
    let legacy = &patches[0];
    let machine = &legacy["machine"];
    assert!(
        machine.get("token").is_none(),
        "machine.token pruned: {machine}"
    );
    assert!(machine.get("ca").is_none(), "machine.ca pruned: {machine}");
    assert_eq!(machine["certSANs"], json!(["lab.example.internal"]));
    let iface = &machine["network"]["interfaces"][0];
    assert_eq!(iface["mtu"], 9000);
    assert!(
        iface.get("wireguard").is_none(),
        "wireguard key pruned: {iface}"
    );
    assert_eq!(iface["vip"], json!({"ip": "10.0.0.5"}));
    assert_eq!(
        machine["registries"]["config"]["r.example"]["auth"],
        json!({"username": "u"})
    );

    let cluster = &legacy["cluster"];
    for secret in [
        "secret",
        "token",
        "secretboxEncryptionSecret",
        "aescbcEncryptionSecret",
        "ca",
        "aggregatorCA",
        "serviceAccount",
    ] {
        assert!(
            cluster.get(secret).is_none(),
            "cluster.{secret} pruned: {cluster}"
        );
    }
    assert_eq!(
        cluster["etcd"],
        json!({"image": "registry.k8s.io/etcd:v3.6.5"})
    );
    assert_eq!(
        cluster["apiServer"]["certSANs"],
        json!(["api.lab.internal"])
    );

    let docs = &patches[1]["documents"];
    assert!(docs.get("DiscoveryIdentityConfig").is_none(), "{docs}");
    assert!(docs.get("KubeEtcdEncryptionConfig").is_none(), "{docs}");
    assert_eq!(
        docs["KubeAPIServerCAConfig"],
        json!({"acceptedCAs": ["-----BEGIN CERTIFICATE-----"]})
    );
    assert_eq!(docs["KubeAggregatorCAConfig"], json!({}));
    assert_eq!(
        docs["KubeServiceAccountConfig"],
        json!({"issuer": {"issuerURL": "https://issuer.lab.internal"}})
    );
    assert_eq!(
        docs["KubeProxyConfig"],
        json!({"enabled": true, "mode": "nftables"})
    );
    assert_eq!(docs["LinkConfig"], json!([{"name": "eth0", "mtu": 9000}]));
}

fn to_value(object: DynamicObject) -> Value {
    serde_json::to_value(object).expect("serialize")
}

#[tokio::test]
async fn secret_fields_are_pruned_on_create() {
    let (env, ns) = setup("patch-create").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let created = create_ok(
        &clusters,
        cluster("c", json!({"configPatches": patches_with_secrets()})),
    )
    .await;
    assert_pruned(&created["spec"]["configPatches"]);
    let read = to_value(clusters.get("c").await.expect("read"));
    assert_pruned(&read["spec"]["configPatches"]);
}

#[tokio::test]
async fn secret_fields_are_pruned_on_update() {
    let (env, ns) = setup("patch-update").await;
    let clusters = api(&env, &ns, "TalosCluster");
    create_ok(&clusters, cluster("c", json!({}))).await;
    let mut current = clusters.get("c").await.expect("read");
    current.data["spec"]["configPatches"] = patches_with_secrets();
    let replaced = clusters
        .replace("c", &PostParams::default(), &current)
        .await
        .expect("update");
    assert_pruned(&to_value(replaced)["spec"]["configPatches"]);
    merge(
        &clusters,
        "c",
        json!({"spec": {"configPatches": patches_with_secrets()}}),
    )
    .await
    .expect("merge patch");
    assert_pruned(&to_value(clusters.get("c").await.expect("read"))["spec"]["configPatches"]);
}

/// Server-side apply cannot prune: structured merge refuses any field the schema does not
/// declare, whatever `fieldValidation` says. So a secret sent by apply is refused, never stored.
#[tokio::test]
async fn secret_fields_sent_by_server_side_apply_are_refused_and_never_stored() {
    let (env, ns) = setup("patch-ssa").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let apply = |object: &Value| {
        let clusters = clusters.clone();
        let object = object.clone();
        async move {
            clusters
                .patch(
                    "c",
                    &PatchParams::apply("ichor-test"),
                    &Patch::Apply(&object),
                )
                .await
        }
    };
    let with_secrets = cluster("c", json!({"configPatches": patches_with_secrets()}));
    match apply(&with_secrets).await {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains("field not declared in schema"),
                "{}",
                status.message
            );
        }
        other => panic!("an apply carrying secrets must be refused, got {other:?}"),
    }
    assert!(
        clusters.get_opt("c").await.expect("read").is_none(),
        "nothing was stored"
    );

    // Created without secrets, then applied again with them: refused, the stored object unchanged.
    let created = create_ok(
        &clusters,
        cluster("c", json!({"configPatches": patches_with_secrets()})),
    )
    .await;
    assert!(
        apply(&with_secrets).await.is_err(),
        "an apply carrying secrets is refused on update too"
    );
    let stored = to_value(clusters.get("c").await.expect("read"));
    assert_eq!(stored["spec"], created["spec"]);
    assert_pruned(&stored["spec"]["configPatches"]);

    // The same patches with only legitimate fields apply, neighbours intact.
    let applied = apply(&cluster(
        "c",
        json!({"configPatches": stored["spec"]["configPatches"].clone()}),
    ))
    .await
    .expect("an apply without secrets is accepted");
    assert_pruned(&to_value(applied)["spec"]["configPatches"]);
}

#[tokio::test]
async fn secret_fields_are_pruned_from_machine_and_class_patches_too() {
    let (env, ns) = setup("patch-kinds").await;
    let machines = api(&env, &ns, "TalosMachine");
    let created = create_ok(
        &machines,
        crate::support::machine("m", json!({"configPatches": patches_with_secrets()})),
    )
    .await;
    assert_pruned(&created["spec"]["configPatches"]);
    let classes = api(&env, &ns, "TalosMachineClass");
    let created = create_ok(
        &classes,
        json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachineClass",
            "metadata": {"name": "k"},
            "spec": {"clusterRef": {"name": "lab"}, "role": "worker",
                     "qualifiers": {"uuids": ["4c4c4544-0042-3510-8050-b4c04f4e4d32"]},
                     "configPatches": patches_with_secrets()}
        }),
    )
    .await;
    assert_pruned(&created["spec"]["configPatches"]);
}

fn json_patch(ops: Value) -> Value {
    cluster(
        "c",
        json!({"configPatches": [{"name": "ops", "jsonPatch": ops}]}),
    )
}

#[tokio::test]
async fn json_patch_operations_reaching_a_secret_are_refused() {
    let (env, ns) = setup("patch-6902").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let needle = "jsonPatch path reaches a secret field";
    for path in [
        "/machine/token",
        "/machine/ca/key",
        "/machine/ca",
        "/machine",
        "/cluster",
        "/cluster/secret",
        "/cluster/token",
        "/cluster/etcd/ca/key",
        "/cluster/etcd",
        "/cluster/serviceAccount/key",
        "/cluster/aggregatorCA",
        "/cluster/secretboxEncryptionSecret",
        "/machine/network/interfaces/0/wireguard/privateKey",
        "/machine/registries/config/r.example/auth/password",
    ] {
        refused(
            &clusters,
            json_patch(json!([{"op": "replace", "path": path, "value": "x"}])),
            needle,
        )
        .await;
    }
    refused(
        &clusters,
        json_patch(json!([{"op": "remove", "path": "/cluster/token"}])),
        needle,
    )
    .await;
    refused(
        &clusters,
        json_patch(json!([{"op": "copy", "from": "/cluster/token", "path": "/machine/env/LEAK"}])),
        "jsonPatch from reaches a secret field",
    )
    .await;
    create_ok(
        &clusters,
        json_patch(json!([
            {"op": "add", "path": "/machine/certSANs/-", "value": "lab.example.internal"},
            {"op": "replace", "path": "/cluster/etcd/image", "value": "registry.k8s.io/etcd:v3.6.5"},
            {"op": "add", "path": "/machine/tokens", "value": "not a secret field"}
        ])),
    )
    .await;
}

#[tokio::test]
async fn patch_shapes_and_owned_fields_are_checked() {
    let (env, ns) = setup("patch-shape").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |patch: Value| cluster("c", json!({"configPatches": [patch]}));
    refused(
        &clusters,
        with(json!({"name": "empty"})),
        "a config patch needs machine, cluster, documents or jsonPatch",
    )
    .await;
    refused(
        &clusters,
        with(json!({"machine": {"certSANs": ["a"]}, "jsonPatch": [{"op": "remove", "path": "/machine/certSANs"}]})),
        "either a strategic merge (machine, cluster, documents) or a jsonPatch",
    )
    .await;
    refused(
        &clusters,
        with(json!({"machine": {"type": "controlplane"}})),
        "machine.type comes from the TalosMachine's spec.role",
    )
    .await;
    refused(
        &clusters,
        with(json!({"cluster": {"clusterName": "x"}})),
        "cluster.clusterName is the TalosCluster's name",
    )
    .await;
    refused(
        &clusters,
        with(json!({"cluster": {"controlPlane": {"endpoint": "https://x:6443"}}})),
        "comes from the TalosCluster's spec.endpoint",
    )
    .await;
    refused(
        &clusters,
        with(json!({"cluster": {"network": {"podSubnets": ["10.0.0.0/8"]}}})),
        "come from the TalosCluster's spec.network",
    )
    .await;
    refused(
        &clusters,
        with(json!({"jsonPatch": [{"op": "copy", "path": "/machine/env"}]})),
        "jsonPatch move and copy need from",
    )
    .await;
    refused(
        &clusters,
        with(json!({"jsonPatch": [{"op": "add", "path": "machine", "value": 1}]})),
        "spec.configPatches[0].jsonPatch[0].path",
    )
    .await;
    create_ok(
        &clusters,
        with(json!({"cluster": {"controlPlane": {"localAPIServerPort": 7443}}})),
    )
    .await;
}

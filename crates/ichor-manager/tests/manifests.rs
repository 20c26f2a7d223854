//! The bootstrap manifests' sync (`workload::manifests`, talos-facts §9.7) against a real
//! apiserver: the manifests a simulated control plane renders are created, then updated when
//! the config changes the kube-proxy image, a field a person changed is taken back, and an
//! object the manifests dropped is pruned; a CRD and its custom resource go in one sync; an
//! object the apiserver refuses, or of a kind it does not serve, is named in the error.

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_manager::workload::manifests::{
    self, Change, FIELD_MANAGER, INVENTORY_NAME, INVENTORY_NAMESPACE, OWNING_INVENTORY, ObjectId,
    Stage, SyncError, Synced,
};
use ichor_render::SecretsBundle;
use ichor_render::pki::{self, Role};
use ichor_sim::{Hardware, SimNode};
use ichor_talos::{ApplyMode, Credentials, Manifest, TalosClient};
use ichor_testenv::{ControlPlane, TestEnv};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use serde_json::json;

const PROXY_1_36: &str = "registry.k8s.io/kube-proxy:v1.36.3";
const PROXY_1_37: &str = "registry.k8s.io/kube-proxy:v1.37.0";

/// A renderer's golden file.
fn golden(name: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ichor-render/tests/golden");
    std::fs::read_to_string(dir.join(name)).expect("a golden file")
}

/// A private apiserver serving Talos's default service subnet, so the CoreDNS Service's
/// `clusterIP` (10.96.0.10) is valid there.
async fn apiserver() -> TestEnv {
    let plane = ControlPlane::builder()
        .apiserver_arg("--service-cluster-ip-range=10.96.0.0/12")
        .start()
        .await
        .expect("a control plane");
    TestEnv::from_control_plane(plane)
        .await
        .expect("a test env")
}

/// A simulated 1.14 control plane configured with `config`, and an `os:admin` client of it.
async fn control_plane(config: &str, seed: u32) -> (SimNode, TalosClient) {
    let node = SimNode::start_configured(
        "127.0.0.1:0".parse().expect("address"),
        "v1.14.1",
        Hardware::vm(seed),
        config,
    )
    .await
    .expect("a simulated node");
    let bundle = SecretsBundle::from_yaml(&golden("bundle-1.14.yaml")).expect("the bundle");
    let issued = pki::client_certificate(&bundle, "test", Role::Admin, Duration::from_secs(600))
        .expect("a client certificate");
    let credentials = Credentials {
        ca_pem: bundle.certs.os.crt.0.clone(),
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(client) = TalosClient::connect(&node.addr().to_string(), &credentials).await
            && client.version().await.is_ok()
        {
            return (node, client);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node never answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The objects `synced` applied, as `<change> <kind>/<namespace>/<name>`, stage by stage.
fn applied(synced: &Synced) -> Vec<String> {
    synced
        .applied
        .iter()
        .map(|a| format!("{:?} {}", a.change, a.object))
        .collect()
}

/// The inventory ConfigMap's keys.
async fn inventory(client: &kube::Client) -> Vec<String> {
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), INVENTORY_NAMESPACE)
        .get(INVENTORY_NAME)
        .await
        .expect("the inventory");
    config_map.data.unwrap_or_default().into_keys().collect()
}

/// The kube-proxy DaemonSet's image.
fn image(daemon_set: &DaemonSet) -> &str {
    daemon_set
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod spec")
        .containers[0]
        .image
        .as_deref()
        .expect("an image")
}

/// The managers owning the kube-proxy container's `image` field.
fn image_owners(daemon_set: &DaemonSet) -> Vec<(String, String)> {
    daemon_set
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| {
            entry.fields_v1.as_ref().is_some_and(|fields| {
                fields.0["f:spec"]["f:template"]["f:spec"]["f:containers"]
                    ["k:{\"name\":\"kube-proxy\"}"]
                    .get("f:image")
                    .is_some()
            })
        })
        .map(|entry| {
            (
                entry.manager.clone().unwrap_or_default(),
                entry.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_manifests_are_created_then_updated_taken_back_and_pruned() {
    let env = apiserver().await;
    let kube = env.client();
    let config = golden("1.14-controlplane-flannel-plain.yaml").replace("/dev/sda", "/dev/vda");
    assert!(config.contains(PROXY_1_36));
    let (node, talos) = control_plane(&config, 9701).await;
    let rendered = talos.manifests().await.expect("manifests");

    // Into an empty apiserver: everything is created, ConfigMaps before the rest.
    let synced = manifests::sync(&kube, &rendered)
        .await
        .expect("the first sync");
    let first = applied(&synced);
    assert!(
        first.iter().all(|a| a.starts_with("Created ")),
        "{first:#?}"
    );
    assert_eq!(
        synced.count(Stage::Definitions),
        1,
        "ClusterRole system:coredns"
    );
    assert_eq!(
        synced.count(Stage::Data),
        2,
        "kube-proxy's and CoreDNS's ConfigMaps"
    );
    assert!(synced.pruned.is_empty());
    for expected in [
        "Created ClusterRole/system:coredns",
        "Created ClusterRoleBinding/kube-proxy",
        "Created ClusterRoleBinding/system:coredns",
        "Created ServiceAccount/kube-system/kube-proxy",
        "Created ServiceAccount/kube-system/coredns",
        "Created ConfigMap/kube-system/coredns",
        "Created Service/kube-system/kube-dns",
        "Created Deployment/kube-system/coredns",
        "Created DaemonSet/kube-system/kube-proxy",
    ] {
        assert!(
            first.contains(&expected.to_owned()),
            "{expected} in {first:#?}"
        );
    }
    let keys = inventory(&kube).await;
    assert_eq!(keys.len(), first.len(), "{keys:#?}");
    assert!(keys.contains(&"_system__coredns_rbac.authorization.k8s.io_ClusterRole".into()));
    assert!(keys.contains(&"kube-system_kube-proxy_apps_DaemonSet".into()));
    let daemon_sets: Api<DaemonSet> = Api::namespaced(kube.clone(), "kube-system");
    let daemon_set = daemon_sets.get("kube-proxy").await.expect("kube-proxy");
    assert_eq!(image(&daemon_set), PROXY_1_36);
    assert_eq!(
        daemon_set.metadata.annotations.expect("annotations")[OWNING_INVENTORY],
        INVENTORY_NAME
    );

    // Again, nothing changed: nothing is written.
    let again = manifests::sync(&kube, &rendered)
        .await
        .expect("the same sync");
    assert!(
        again.applied.iter().all(|a| a.change == Change::Unchanged),
        "{:#?}",
        applied(&again)
    );

    // The config's new kube-proxy image rolls out by the sync.
    talos
        .apply_configuration(
            config.replace(PROXY_1_36, PROXY_1_37).as_bytes(),
            ApplyMode::Auto,
        )
        .await
        .expect("apply the new image");
    let rendered = talos.manifests().await.expect("manifests");
    let updated = manifests::sync(&kube, &rendered).await.expect("the update");
    let configured: Vec<&ObjectId> = updated
        .applied
        .iter()
        .filter(|a| a.change == Change::Configured)
        .map(|a| &a.object)
        .collect();
    assert_eq!(
        configured
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["DaemonSet/kube-system/kube-proxy"]
    );
    let daemon_set = daemon_sets.get("kube-proxy").await.expect("kube-proxy");
    assert_eq!(image(&daemon_set), PROXY_1_37);
    assert_eq!(
        image_owners(&daemon_set),
        [(FIELD_MANAGER.to_owned(), "Apply".to_owned())]
    );

    // A person's change of a field the manifest sets is taken back.
    daemon_sets
        .patch(
            "kube-proxy",
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..PatchParams::default()
            },
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.35.0"}
            ]}}}})),
        )
        .await
        .expect("a person's edit");
    let edited = daemon_sets.get("kube-proxy").await.expect("kube-proxy");
    assert_eq!(image(&edited), "registry.k8s.io/kube-proxy:v1.35.0");
    let taken_back = manifests::sync(&kube, &rendered)
        .await
        .expect("the take-back");
    assert!(
        applied(&taken_back).contains(&"Configured DaemonSet/kube-system/kube-proxy".into()),
        "{:#?}",
        applied(&taken_back)
    );
    let daemon_set = daemon_sets.get("kube-proxy").await.expect("kube-proxy");
    assert_eq!(image(&daemon_set), PROXY_1_37);
    assert_eq!(
        image_owners(&daemon_set),
        [(FIELD_MANAGER.to_owned(), "Apply".to_owned())]
    );

    // A manifest dropped: its object is pruned and leaves the inventory.
    let without_dns_service: Vec<Manifest> = rendered
        .iter()
        .filter(|m| m.id != "11-core-dns-svc")
        .cloned()
        .collect();
    assert_eq!(without_dns_service.len(), rendered.len() - 1);
    let pruned = manifests::sync(&kube, &without_dns_service)
        .await
        .expect("the sync that prunes");
    assert_eq!(
        pruned
            .pruned
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["Service/kube-system/kube-dns"]
    );
    let services: Api<Service> = Api::namespaced(kube.clone(), "kube-system");
    assert!(services.get_opt("kube-dns").await.expect("read").is_none());
    let keys = inventory(&kube).await;
    assert!(
        !keys.contains(&"kube-system_kube-dns__Service".into()),
        "{keys:#?}"
    );
    assert_eq!(keys.len(), first.len() - 1);
    node.stop().await;
}

/// A CRD `widgets.example.com` and one `Widget`.
fn widget_manifest() -> Manifest {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}
                }}}
            }]
        }
    });
    let widget = json!({
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "first"},
        "spec": {"size": 3}
    });
    Manifest {
        id: "13-widgets".into(),
        objects: vec![widget, crd],
    }
}

#[tokio::test]
async fn a_crd_and_its_resource_go_in_one_sync_and_refusals_name_the_object() {
    let env = apiserver().await;
    let kube = env.client();

    // The Widget comes first in its manifest; its kind is served once the CRD stage is done.
    let synced = manifests::sync(&kube, &[widget_manifest()])
        .await
        .expect("the CRD and its resource");
    assert_eq!(
        applied(&synced),
        [
            "Created CustomResourceDefinition/widgets.example.com",
            "Created Widget/default/first",
        ]
    );
    assert_eq!(synced.in_stage(Stage::Definitions).count(), 1);
    let widgets = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    let widget = Api::<DynamicObject>::namespaced_with(kube.clone(), "default", &widgets)
        .get("first")
        .await
        .expect("the widget, in namespace default");
    assert_eq!(widget.data["spec"]["size"], 3);

    // A kind nobody serves: named, with its manifest's object.
    let unknown = Manifest {
        id: "99-gadgets".into(),
        objects: vec![json!({
            "apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}
        })],
    };
    let error = manifests::sync(&kube, &[widget_manifest(), unknown])
        .await
        .expect_err("an unknown kind");
    assert!(
        matches!(&error, SyncError::UnknownKind { object, .. } if object.to_string() == "Gadget/g"),
        "{error}"
    );

    // An object the apiserver refuses: named, with the apiserver's answer.
    let invalid = Manifest {
        id: "99-bad".into(),
        objects: vec![json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "bad", "namespace": "kube-system"},
            "spec": {"ports": [{"port": 70000}]}
        })],
    };
    let error = manifests::sync(&kube, &[widget_manifest(), invalid])
        .await
        .expect_err("an invalid Service");
    let message = error.to_string();
    assert!(
        matches!(error, SyncError::Apply { .. })
            && message
                .starts_with("Service/kube-system/bad: server-side apply refused: 422 Invalid:")
            && message.contains("spec.ports[0].port"),
        "{message}"
    );

    // An object a person made, annotated for another inventory, is not taken.
    let foreign = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "theirs", "namespace": "default",
                     "annotations": {OWNING_INVENTORY: "someone-else"}},
        "data": {"a": "b"}
    });
    Api::<ConfigMap>::namespaced(kube.clone(), "default")
        .patch(
            "theirs",
            &PatchParams::apply("someone"),
            &Patch::Apply(&foreign),
        )
        .await
        .expect("their ConfigMap");
    let ours = Manifest {
        id: "99-theirs".into(),
        objects: vec![json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "theirs", "namespace": "default"},
            "data": {"a": "c"}
        })],
    };
    let error = manifests::sync(&kube, &[widget_manifest(), ours])
        .await
        .expect_err("another inventory's object");
    assert_eq!(
        error.to_string(),
        "ConfigMap/default/theirs belongs to inventory \"someone-else\", not talos-bootstrap-manifests-inventory"
    );
    let theirs = Api::<ConfigMap>::namespaced(kube.clone(), "default")
        .get("theirs")
        .await
        .expect("their ConfigMap");
    assert_eq!(
        theirs.data.expect("data"),
        BTreeMap::from([("a".to_owned(), "b".to_owned())])
    );
}

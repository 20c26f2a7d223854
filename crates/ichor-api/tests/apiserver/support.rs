//! Shared helpers for the apiserver tests: install the checked-in CRDs, and create or update
//! objects as JSON so tests can send fields the Rust types do not have.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ichor_testenv::TestEnv;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The CRDs as checked in under `config/crd/`.
pub fn checked_in_crds() -> Vec<CustomResourceDefinition> {
    let dir = repo_root().join("config/crd");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("config/crd exists")
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).expect("read CRD");
            serde_saphyr::from_str(&text).expect("CRD YAML parses")
        })
        .collect()
}

/// The run's control plane with Ichor's CRDs installed, and a fresh namespace.
pub async fn setup(prefix: &str) -> (TestEnv, String) {
    let env = TestEnv::shared().await.expect("control plane");
    env.install_crds(checked_in_crds())
        .await
        .expect("install CRDs");
    let ns = env.namespace(prefix).await.expect("namespace");
    (env, ns)
}

/// A private control plane with Ichor's CRDs installed, and a namespace.
pub async fn setup_private(prefix: &str) -> (TestEnv, String) {
    let env = TestEnv::private().await.expect("private control plane");
    env.install_crds(checked_in_crds())
        .await
        .expect("install CRDs");
    let ns = env.namespace(prefix).await.expect("namespace");
    (env, ns)
}

/// A dynamic API for one of Ichor's kinds in `ns`.
pub fn api(env: &TestEnv, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(ichor_api::GROUP, ichor_api::VERSION, kind);
    Api::namespaced_with(env.client(), ns, &ApiResource::from_gvk(&gvk))
}

/// Creates `object` (JSON), returning the stored object or the apiserver's refusal message.
pub async fn create(api: &Api<DynamicObject>, object: Value) -> Result<Value, String> {
    let object: DynamicObject = serde_json::from_value(object).expect("a valid object");
    match api.create(&PostParams::default(), &object).await {
        Ok(created) => Ok(serde_json::to_value(created).expect("serialize")),
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(other) => panic!("unexpected error: {other}"),
    }
}

/// Creates `object`, panicking with the refusal if the apiserver refuses it.
pub async fn create_ok(api: &Api<DynamicObject>, object: Value) -> Value {
    match create(api, object).await {
        Ok(v) => v,
        Err(message) => panic!("expected the object to be accepted, got: {message}"),
    }
}

/// Asserts the apiserver refuses `object` with a message containing `needle`.
pub async fn refused(api: &Api<DynamicObject>, object: Value, needle: &str) {
    match create(api, object).await {
        Ok(v) => panic!("expected a refusal containing {needle:?}, but it was accepted: {v}"),
        Err(message) => assert!(
            message.contains(needle),
            "expected a refusal containing {needle:?}, got: {message}"
        ),
    }
}

/// Merge-patches `name` with `patch`, returning the result or the refusal message.
pub async fn merge(api: &Api<DynamicObject>, name: &str, patch: Value) -> Result<Value, String> {
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(o) => Ok(serde_json::to_value(o).expect("serialize")),
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(other) => panic!("unexpected error: {other}"),
    }
}

/// Merge-patches the status subresource of `name`.
pub async fn merge_status(api: &Api<DynamicObject>, name: &str, patch: Value) -> Value {
    let patched = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("status patch");
    serde_json::to_value(patched).expect("serialize")
}

/// A valid TalosCluster named `name`, with `spec` fields overridden by `overrides`.
///
/// Minimal JSON on purpose, not `ichor_api::testing`'s builders: these tests check what the
/// apiserver fills in (defaults) and refuses (CEL, schema), so they send only what a person
/// would write, and overrides are often what the typed API cannot express.
pub fn cluster(name: &str, overrides: Value) -> Value {
    let mut spec = serde_json::json!({
        "talosVersion": "v1.14.0",
        "kubernetesVersion": "1.36.3",
        "endpoint": "https://192.168.10.5:6443",
        "controlPlane": {"count": 3},
        "discovery": {"cidrs": ["192.168.10.0/24"]}
    });
    merge_json(&mut spec, overrides);
    serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosCluster",
        "metadata": {"name": name},
        "spec": spec
    })
}

/// A valid pending TalosMachine named `name` in cluster `lab`, with `spec` overrides (minimal
/// JSON, as for [`cluster`]).
pub fn machine(name: &str, overrides: Value) -> Value {
    let mut spec = serde_json::json!({
        "clusterRef": {"name": "lab"},
        "endpoints": ["192.168.10.21"],
        "fingerprint": "n7cGkBrmW4Sdq4aR8RCH7TL+5L3N8CuTDxQYX0ngk4U="
    });
    merge_json(&mut spec, overrides);
    serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosMachine",
        "metadata": {"name": name},
        "spec": spec
    })
}

/// JSON merge patch semantics: objects merge, `null` deletes, anything else replaces.
pub fn merge_json(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    merge_json(t.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p,
    }
}

/// The table `kubectl get` prints for `path` (an API path), as the apiserver renders it from
/// the kind's printer columns: the columns' names, and the table.
pub async fn table(env: &TestEnv, path: &str) -> (Vec<String>, Value) {
    let request = http::Request::get(path)
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .expect("request");
    let table: Value = env.client().request(request).await.expect("table");
    let columns = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect();
    (columns, table)
}

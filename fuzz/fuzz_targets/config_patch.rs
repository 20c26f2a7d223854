//! Config patches as a TalosCluster, TalosMachineClass or TalosMachine carries them (a JSON
//! list of `ConfigPatch`: strategic merges of the `machine` and `cluster` sections and of typed
//! documents, or RFC 6902 operations), decoded and rendered into a control plane's config on
//! both contracts with `ichor_render::render`.
//!
//! Invariants: nothing panics; rendering is deterministic; a rendered config keeps every
//! secret of the bundle exactly as rendering without patches put it (no patch sets, changes
//! or removes a secret field), and carries no user-supplied secret field (wireguard keys,
//! registry passwords, ...); a refused patch names itself and says why.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use ichor_api::cluster::TalosClusterSpec;
use ichor_api::common::Role;
use ichor_api::config::{ConfigPatch, SECRET_PATH_PATTERNS, SECRET_PATHS};
use ichor_render::{RenderError, RenderInput, Rendered, SecretsBundle, render};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// A bundle from the secrets-bundle corpus (generating one takes an RSA-4096 key).
fn bundle() -> &'static SecretsBundle {
    static BUNDLE: OnceLock<SecretsBundle> = OnceLock::new();
    BUNDLE.get_or_init(|| {
        SecretsBundle::from_yaml(include_str!("../corpus/secrets_bundle/v1_14.yaml"))
            .expect("the corpus bundle is valid")
    })
}

fn spec(version: &str) -> TalosClusterSpec {
    serde_json::from_value(serde_json::json!({
        "talosVersion": version,
        "kubernetesVersion": "1.36.3",
        "endpoint": "https://10.5.0.2:6443",
        "controlPlane": {"count": 3},
    }))
    .expect("a cluster spec")
}

/// The kinds of typed documents that hold only secrets (rendered from the bundle).
const SECRET_KINDS: &[&str] = &[
    "DiscoveryIdentityConfig",
    "KubeEtcdEncryptionConfig",
    "SideroLinkConfig",
];

fn run(version: &str, patches: &[ConfigPatch]) -> Result<Rendered, RenderError> {
    let cluster = spec(version);
    let none = BTreeMap::new();
    let layers: [&[ConfigPatch]; 1] = [patches];
    render(&RenderInput {
        cluster_name: "lab",
        cluster: &cluster,
        role: Role::ControlPlane,
        hostname: Some("cp-1"),
        install: None,
        schematic: None,
        oldest_running: None,
        cert_sans: &[],
        node_labels: &none,
        node_taints: &none,
        patches: &layers,
        bundle: bundle(),
    })
}

/// Every JSON pointer to a leaf (or an empty container) of `value`.
fn leaves(value: &Value, pointer: &mut String, out: &mut Vec<String>) {
    let mut descend = |key: &str, child: &Value, pointer: &mut String| {
        let len = pointer.len();
        pointer.push('/');
        pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
        leaves(child, pointer, out);
        pointer.truncate(len);
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, child) in map {
                descend(key, child, pointer);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, child) in items.iter().enumerate() {
                descend(&i.to_string(), child, pointer);
            }
        }
        _ => out.push(pointer.clone()),
    }
}

fn patterns() -> &'static [regex::Regex] {
    static PATTERNS: OnceLock<Vec<regex::Regex>> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        SECRET_PATH_PATTERNS
            .iter()
            .map(|p| regex::Regex::new(p).expect("the secret patterns are valid"))
            .collect()
    })
}

fn secret_documents(rendered: &Rendered) -> Vec<&Value> {
    rendered
        .documents
        .iter()
        .filter(|d| SECRET_KINDS.iter().any(|k| d["kind"] == *k))
        .collect()
}

fn check(version: &str, patches: &[ConfigPatch]) {
    let base = run(version, &[]).expect("the unpatched config renders");
    let result = run(version, patches);
    let again = run(version, patches);
    match (&result, &again) {
        (Ok(a), Ok(b)) => assert_eq!(a.hash, b.hash, "two renderings differ"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("the same input rendered once and failed once"),
    }
    let rendered = match result {
        Ok(rendered) => rendered,
        Err(RenderError::Patch(error)) => {
            assert!(!error.patch.is_empty() && !error.reason.is_empty());
            return;
        }
        Err(_) => return,
    };
    let (doc, base_doc) = (&rendered.documents[0], &base.documents[0]);
    for path in SECRET_PATHS {
        assert_eq!(
            doc.pointer(path),
            base_doc.pointer(path),
            "a patch changed the secret {path}"
        );
    }
    assert_eq!(
        secret_documents(&rendered),
        secret_documents(&base),
        "a patch changed a secret document"
    );
    let mut found = Vec::new();
    leaves(doc, &mut String::new(), &mut found);
    for pointer in found {
        assert!(
            !patterns().iter().any(|p| p.is_match(&pointer)),
            "a patch set the user secret {pointer}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(patches) = serde_json::from_slice::<Vec<ConfigPatch>>(data) else {
        return;
    };
    for version in ["v1.13.2", "v1.14.1"] {
        check(version, &patches);
    }
});

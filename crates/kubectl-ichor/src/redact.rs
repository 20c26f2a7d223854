//! Redaction of machine-config documents before they are printed: every secret-bearing field
//! Talos defines (talos-facts §4.3), of the v1alpha1 document and of the typed documents, has
//! its value replaced with `<redacted>`. The free-form fields that commonly carry credentials
//! (inline manifests, file contents, environment values) are redacted too; `extraArgs` are
//! shown. Empty values stay empty (a worker's `machine.ca.key: ""` says it has no key).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ichor_render::SecretsBundle;
use serde_json::Value;

/// What a redacted value is replaced with.
pub const REDACTED: &str = "<redacted>";

/// Secret paths of the v1alpha1 document. `[]` walks every element of a list, `*` every value
/// of a map, `**` any depth.
pub const V1ALPHA1_PATHS: &[&str] = &[
    // Generated from the secrets bundle.
    "machine.token",
    "machine.ca.key",
    "cluster.secret",
    "cluster.token",
    "cluster.secretboxEncryptionSecret",
    "cluster.aescbcEncryptionSecret",
    "cluster.ca.key",
    "cluster.aggregatorCA.key",
    "cluster.serviceAccount.key",
    "cluster.etcd.ca.key",
    // Supplied by the user.
    "machine.network.interfaces[].wireguard.privateKey",
    "machine.network.interfaces[].wireguard.peers[].presharedKey",
    "machine.network.interfaces[].vip.hcloud.apiToken",
    "machine.network.interfaces[].vip.equinixMetal.apiToken",
    "machine.network.interfaces[].vlans[].vip.hcloud.apiToken",
    "machine.network.interfaces[].vlans[].vip.equinixMetal.apiToken",
    "machine.registries.config.*.auth.password",
    "machine.registries.config.*.auth.auth",
    "machine.registries.config.*.auth.identityToken",
    "machine.registries.config.*.tls.clientIdentity.key",
    "machine.systemDiskEncryption.state.keys[].static.passphrase",
    "machine.systemDiskEncryption.ephemeral.keys[].static.passphrase",
    // Free-form fields that commonly hold credentials.
    "cluster.inlineManifests[].contents",
    "machine.files[].content",
    "machine.env.*",
];

/// Secret paths of the typed documents, by kind.
pub const TYPED_PATHS: &[(&str, &[&str])] = &[
    ("DiscoveryIdentityConfig", &["clusterSecret"]),
    ("KubeAPIServerCAConfig", &["issuingCA.key"]),
    ("KubeAggregatorCAConfig", &["issuingCA.key"]),
    ("KubeServiceAccountConfig", &["issuer.privateKey"]),
    ("KubeEtcdEncryptionConfig", &["config.**.secret"]),
    ("WireguardConfig", &["privateKey", "peers[].presharedKey"]),
    ("HCloudVIPConfig", &["apiToken"]),
    ("RegistryAuthConfig", &["password", "auth", "identityToken"]),
    ("RegistryTLSConfig", &["clientIdentity.key"]),
    ("VolumeConfig", &["encryption.keys[].static.passphrase"]),
    ("UserVolumeConfig", &["encryption.keys[].static.passphrase"]),
    ("RawVolumeConfig", &["encryption.keys[].static.passphrase"]),
    ("SwapVolumeConfig", &["encryption.keys[].static.passphrase"]),
    ("SideroLinkConfig", &["uniqueToken"]),
    ("KubeInlineManifestConfig", &["manifest"]),
    ("EnvironmentConfig", &["variables.*"]),
];

/// Redacts every document of a config in place.
pub fn redact(documents: &mut [Value]) {
    for document in documents {
        redact_document(document);
    }
}

/// Redacts one document in place, by its kind (no `kind`: the v1alpha1 document).
pub fn redact_document(document: &mut Value) {
    let kind = document
        .get("kind")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let paths: &[&str] = match kind.as_deref() {
        None => V1ALPHA1_PATHS,
        Some(kind) => TYPED_PATHS
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(&[], |(_, p)| p),
    };
    for path in paths {
        let segments = segments(path);
        redact_at(document, &segments);
    }
    if kind.as_deref() == Some("SideroLinkConfig")
        && let Some(Value::String(url)) = document.get_mut("apiUrl")
    {
        *url = redact_join_token(url);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Each,
    AnyValue,
    AnyDepth,
}

fn segments(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in path.split('.') {
        match part {
            "*" => out.push(Segment::AnyValue),
            "**" => out.push(Segment::AnyDepth),
            _ => match part.strip_suffix("[]") {
                Some(key) => {
                    out.push(Segment::Key(key.to_owned()));
                    out.push(Segment::Each);
                }
                None => out.push(Segment::Key(part.to_owned())),
            },
        }
    }
    out
}

fn replace(value: &mut Value) {
    let empty = match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        _ => false,
    };
    if !empty {
        *value = Value::String(REDACTED.to_owned());
    }
}

fn redact_at(value: &mut Value, path: &[Segment]) {
    let Some((first, rest)) = path.split_first() else {
        replace(value);
        return;
    };
    match first {
        Segment::Key(key) => {
            if let Some(child) = value.get_mut(key.as_str()) {
                redact_at(child, rest);
            }
        }
        Segment::Each => {
            if let Value::Array(items) = value {
                for item in items {
                    redact_at(item, rest);
                }
            }
        }
        Segment::AnyValue => match value {
            Value::Object(map) => {
                for child in map.values_mut() {
                    redact_at(child, rest);
                }
            }
            Value::Array(items) => {
                for item in items {
                    redact_at(item, rest);
                }
            }
            _ => {}
        },
        Segment::AnyDepth => {
            redact_at(value, rest);
            match value {
                Value::Object(map) => {
                    for child in map.values_mut() {
                        redact_at(child, path);
                    }
                }
                Value::Array(items) => {
                    for item in items {
                        redact_at(item, path);
                    }
                }
                _ => {}
            }
        }
    }
}

/// `jointoken=<value>` in a SideroLink URL's query, redacted.
fn redact_join_token(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if k.eq_ignore_ascii_case("jointoken") && !v.is_empty() => {
                format!("{k}={REDACTED}")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", query.join("&"))
}

/// Every secret value of `bundle` as a config may carry it: plain, base64 of a PEM key, and
/// each PEM key's body lines alone. What [`leaked`] looks for.
pub fn bundle_secrets(bundle: &SecretsBundle) -> Vec<String> {
    let mut out = vec![
        bundle.cluster.secret.0.clone(),
        bundle.secrets.bootstrap_token.0.clone(),
        bundle.secrets.secretbox_encryption_secret.0.clone(),
        bundle.trustd_info.token.0.clone(),
    ];
    for key in [
        &bundle.certs.etcd.key.0,
        &bundle.certs.k8s.key.0,
        &bundle.certs.k8s_aggregator.key.0,
        &bundle.certs.k8s_service_account.key.0,
        &bundle.certs.os.key.0,
    ] {
        out.push(key.clone());
        out.push(STANDARD.encode(key));
        out.extend(
            key.lines()
                .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                .map(str::to_owned),
        );
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Whether `text` still holds one of `secrets` (a redaction gap: never print it).
pub fn leaked(text: &str, secrets: &[String]) -> bool {
    secrets.iter().any(|secret| text.contains(secret.as_str()))
}

#[cfg(test)]
mod tests {
    use ichor_api::common::Role;
    use ichor_render::{Contract, render::to_yaml};
    use serde_json::json;

    use super::*;

    /// The fixed test bundles of the renderer's golden files.
    fn bundle(contract: Contract) -> SecretsBundle {
        let text = match contract {
            Contract::V1_13 => include_str!("../../ichor-render/tests/golden/bundle-1.13.yaml"),
            Contract::V1_14 => include_str!("../../ichor-render/tests/golden/bundle-1.14.yaml"),
        };
        SecretsBundle::from_yaml(text).expect("the test bundle")
    }

    fn rendered(contract: Contract, role: Role, b: &SecretsBundle) -> ichor_render::Rendered {
        let cluster: ichor_api::TalosCluster = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosCluster",
            "metadata": {"name": "lab", "namespace": "ns"},
            "spec": {
                "talosVersion": match contract { Contract::V1_13 => "v1.13.9", Contract::V1_14 => "v1.14.1" },
                "kubernetesVersion": "1.36.3",
                "endpoint": "https://10.0.0.10:6443",
                "controlPlane": {"count": 3}
            }
        }))
        .expect("cluster");
        let machine: ichor_api::TalosMachine = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosMachine",
            "metadata": {"name": "m1", "namespace": "ns"},
            "spec": {"clusterRef": {"name": "lab"}, "hostname": "cp-1"}
        }))
        .expect("machine");
        ichor_render::render_machine(
            &cluster,
            &machine,
            role,
            &ichor_render::MachineLayers::default(),
            b,
        )
        .expect("render")
    }

    #[test]
    fn a_rendered_config_keeps_none_of_the_bundles_secrets() {
        for contract in [Contract::V1_13, Contract::V1_14] {
            let b = bundle(contract);
            let secrets = bundle_secrets(&b);
            for role in [Role::ControlPlane, Role::Worker] {
                let out = rendered(contract, role, &b);
                // The test means something: the raw config carries the secrets.
                assert!(
                    out.yaml.contains(&b.trustd_info.token.0),
                    "{contract:?} {role:?}"
                );
                let mut documents = out.documents.clone();
                redact(&mut documents);
                let text = to_yaml(&documents).expect("yaml");
                for secret in &secrets {
                    assert!(
                        !text.contains(secret.as_str()),
                        "{contract:?} {role:?}: a secret survived redaction"
                    );
                }
                assert!(text.contains(REDACTED));
                // Only secrets go: the public CA certificate and the cluster name stay.
                let crt = match contract {
                    Contract::V1_13 => STANDARD.encode(&b.certs.k8s.crt.0),
                    Contract::V1_14 => b.certs.k8s.crt.0.lines().nth(1).unwrap_or("").to_owned(),
                };
                assert!(
                    text.contains(&crt),
                    "{contract:?} {role:?}: the CA cert went"
                );
                assert!(text.contains("lab"));
            }
        }
    }

    #[test]
    fn a_worker_keeps_its_empty_keys_empty() {
        let b = bundle(Contract::V1_14);
        let mut documents = rendered(Contract::V1_14, Role::Worker, &b).documents;
        redact(&mut documents);
        assert_eq!(documents[0]["machine"]["ca"]["key"], "");
        assert_eq!(documents[0]["machine"]["token"], REDACTED);
    }

    #[test]
    fn user_supplied_secrets_are_redacted_too() {
        let mut documents = vec![
            json!({
                "version": "v1alpha1",
                "machine": {
                    "network": {"interfaces": [
                        {"interface": "wg0", "wireguard": {"privateKey": "wgkey", "peers": [{"publicKey": "pub", "presharedKey": "psk"}]}},
                        {"interface": "eth0", "vip": {"ip": "10.0.0.10", "hcloud": {"apiToken": "hctoken"}}}
                    ]},
                    "registries": {"config": {"r.example": {"auth": {"username": "me", "password": "pw", "auth": "basic", "identityToken": "idt"}, "tls": {"clientIdentity": {"crt": "CRT", "key": "tlskey"}}}}},
                    "systemDiskEncryption": {"state": {"keys": [{"static": {"passphrase": "diskpw"}}]}},
                    "files": [{"path": "/var/x", "content": "filesecret"}],
                    "env": {"HTTP_PROXY": "http://u:proxypw@p"}
                },
                "cluster": {"inlineManifests": [{"name": "m", "contents": "kind: Secret"}]}
            }),
            json!({"apiVersion": "v1alpha1", "kind": "WireguardConfig", "name": "wg1", "privateKey": "wgkey2", "peers": [{"presharedKey": "psk2"}]}),
            json!({"apiVersion": "v1alpha1", "kind": "RegistryAuthConfig", "name": "r", "username": "me", "password": "pw2"}),
            json!({"apiVersion": "v1alpha1", "kind": "UserVolumeConfig", "name": "data", "encryption": {"keys": [{"static": {"passphrase": "volpw"}}]}}),
            json!({"apiVersion": "v1alpha1", "kind": "SideroLinkConfig", "apiUrl": "https://omni.example:8090?jointoken=jt&grpc_tunnel=true", "uniqueToken": "ut"}),
            json!({"apiVersion": "v1alpha1", "kind": "KubeEtcdEncryptionConfig", "config": {"resources": [{"providers": [{"aescbc": {"keys": [{"name": "k", "secret": "etcdsecret"}]}}]}]}}),
        ];
        redact(&mut documents);
        let text = to_yaml(&documents).expect("yaml");
        for secret in [
            "wgkey",
            "psk",
            "hctoken",
            "pw",
            "basic",
            "idt",
            "tlskey",
            "diskpw",
            "filesecret",
            "proxypw",
            "kind: Secret",
            "psk2",
            "pw2",
            "volpw",
            "jt&",
            "ut\n",
            "etcdsecret",
        ] {
            assert!(!text.contains(secret), "{secret} survived:\n{text}");
        }
        for kept in [
            "username: me",
            "publicKey: pub",
            "crt: CRT",
            "grpc_tunnel=true",
            "jointoken=<redacted>",
            "path: /var/x",
        ] {
            assert!(text.contains(kept), "{kept} went:\n{text}");
        }
    }
}

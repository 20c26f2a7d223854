//! The secret scan: no secret value involved in a run may show up where people and tools read.
//!
//! The values are read from every Secret of the management cluster: the secrets bundles'
//! secret fields (keys, tokens, encryption secrets), the client keys of the kubeconfigs and
//! talosconfigs Ichor mints, the webhook's serving key, object-store credentials and
//! encryption identities where backups are configured, and BMC passwords (`spec.bmc`'s
//! credentials Secrets). Certificates are public and are not values, nor is a user name
//! (a BMC's is named in its `BmcUnauthorized` message). The places are the manager's and the webhook's whole logs, every Event, the status
//! of every Ichor object, and (through [`check_text`]) the plugin's output. A match is an
//! error naming the place and the Secret the value came from, never the value itself.

use std::collections::BTreeSet;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams};
use serde_json::Value;

use crate::Error;

/// Values shorter than this are not scanned for (they would match by chance).
const MIN_LEN: usize = 12;

/// One secret value and where it came from (`namespace/name[key]`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretValue {
    /// The Secret and data key it came from.
    pub origin: String,
    /// The text to look for.
    pub text: String,
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value: a failing scan must not leak it into the test output.
        f.debug_struct("SecretValue")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// A secret value found in a place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leak {
    /// Where it was found, e.g. `manager log line 12` or `Event ns/name`.
    pub place: String,
    /// The Secret and key it came from.
    pub origin: String,
}

/// Whether a data key or a YAML key names public material (a certificate) rather than a secret.
fn is_public(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.ends_with("crt") || key.contains("certificate") || key == "id" || key == "ca"
}

/// Whether a YAML key in a bundle, kubeconfig or talosconfig holds a secret.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    !is_public(&key)
        && ["key", "secret", "token", "password"]
            .iter()
            .any(|w| key.contains(w))
}

/// The forms a value may leak in: itself, and for a PEM block (plain or base64-encoded) its
/// first body line, which is found whether the block is printed raw or with escaped newlines.
fn forms(text: &str) -> Vec<String> {
    let text = text.trim();
    let mut out = Vec::new();
    if text.len() >= MIN_LEN {
        out.push(text.to_owned());
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    for pem in [Some(text.to_owned()), decoded].into_iter().flatten() {
        if pem.starts_with("-----BEGIN")
            && let Some(line) = pem
                .lines()
                .map(str::trim)
                .find(|l| !l.starts_with("-----") && l.len() >= MIN_LEN)
        {
            out.push(line.to_owned());
        }
    }
    out
}

fn walk(value: &Value, origin: &str, secret_branch: bool, out: &mut Vec<SecretValue>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                if is_public(key) {
                    continue;
                }
                walk(
                    child,
                    &format!("{origin}.{key}"),
                    secret_branch || is_secret_key(key),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for item in items {
                walk(item, origin, secret_branch, out);
            }
        }
        Value::String(text) if secret_branch => {
            out.extend(forms(text).into_iter().map(|text| SecretValue {
                origin: origin.to_owned(),
                text,
            }));
        }
        _ => {}
    }
}

/// The secret values of `secrets`: YAML documents (bundles, kubeconfigs, talosconfigs) give
/// their secret fields; any other value is a secret whole, unless its key names a certificate.
pub fn secret_values(secrets: &[Secret]) -> Vec<SecretValue> {
    let mut out = Vec::new();
    for secret in secrets {
        if secret.type_.as_deref() == Some("kubernetes.io/service-account-token") {
            continue;
        }
        let name = format!(
            "Secret {}/{}",
            secret.metadata.namespace.as_deref().unwrap_or_default(),
            secret.metadata.name.as_deref().unwrap_or_default()
        );
        for (key, bytes) in secret.data.iter().flatten() {
            if is_public(key) || key == ichor_api::bmc::keys::USERNAME {
                continue;
            }
            let origin = format!("{name}[{key}]");
            let Ok(text) = String::from_utf8(bytes.0.clone()) else {
                continue;
            };
            match serde_saphyr::from_str::<Value>(&text) {
                Ok(document @ Value::Object(_)) => walk(&document, &origin, false, &mut out),
                _ => out.extend(forms(&text).into_iter().map(|text| SecretValue {
                    origin: origin.clone(),
                    text,
                })),
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Every secret value found in `text`, read at `place`.
pub fn scan(values: &[SecretValue], place: &str, text: &str) -> Vec<Leak> {
    let mut found = BTreeSet::new();
    for value in values {
        if text.contains(&value.text) {
            found.insert(value.origin.clone());
        }
    }
    found
        .into_iter()
        .map(|origin| Leak {
            place: place.to_owned(),
            origin,
        })
        .collect()
}

/// The places of the management cluster: every Event, and the status of every Ichor object.
async fn places(client: &kube::Client) -> Result<Vec<(String, String)>, Error> {
    let all = ListParams::default();
    let mut out = Vec::new();
    for event in Api::<Event>::all(client.clone()).list(&all).await?.items {
        let place = format!(
            "Event {}/{}",
            event.metadata.namespace.as_deref().unwrap_or_default(),
            event.metadata.name.as_deref().unwrap_or_default()
        );
        out.push((place, serde_json::to_string(&event).unwrap_or_default()));
    }
    macro_rules! statuses {
        ($($kind:ty),*) => {$(
            for object in Api::<$kind>::all(client.clone()).list(&all).await?.items {
                let place = format!(
                    "{} {}/{} status",
                    stringify!($kind),
                    object.metadata.namespace.as_deref().unwrap_or_default(),
                    object.metadata.name.as_deref().unwrap_or_default()
                );
                out.push((place, serde_json::to_string(&object.status).unwrap_or_default()));
            }
        )*};
    }
    statuses!(
        ichor_api::TalosCluster,
        ichor_api::TalosMachine,
        ichor_api::TalosOperation,
        ichor_api::TalosMachineClass,
        ichor_api::TalosStorage
    );
    Ok(out)
}

/// Every Secret of the management cluster's secret values.
pub async fn cluster_secret_values(client: &kube::Client) -> Result<Vec<SecretValue>, Error> {
    let secrets = Api::<Secret>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    Ok(secret_values(&secrets))
}

fn fail(leaks: &[Leak]) -> Result<(), Error> {
    if leaks.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = leaks
        .iter()
        .map(|l| format!("  {} holds the value of {}", l.place, l.origin))
        .collect();
    Err(Error::Spec(format!(
        "secret values leaked ({}):\n{}",
        leaks.len(),
        lines.join("\n")
    )))
}

/// Scans the management cluster's Events and Ichor objects' status, and each `(name, path)`
/// log file, for the values of its Secrets; fails naming each place and Secret.
pub async fn check_cluster(
    client: &kube::Client,
    logs: &[(&str, &std::path::Path)],
) -> Result<(), Error> {
    let values = cluster_secret_values(client).await?;
    let mut leaks = Vec::new();
    let places = places(client).await?;
    for (place, text) in &places {
        leaks.extend(scan(&values, place, text));
    }
    let mut lines = 0;
    for (name, path) in logs {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            lines += 1;
            leaks.extend(scan(&values, &format!("{name} log line {}", n + 1), line));
        }
    }
    eprintln!(
        "secret scan: {} values, {} Events and statuses, {lines} log lines, {} leaks",
        values.len(),
        places.len(),
        leaks.len()
    );
    fail(&leaks)
}

/// Scans `text` (a command's output, say) for the values of the management cluster's Secrets.
pub async fn check_text(client: &kube::Client, place: &str, text: &str) -> Result<(), Error> {
    let values = cluster_secret_values(client).await?;
    fail(&scan(&values, place, text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    const PEM: &str = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkzQ2x5c2VjcmV0a2V5Ym9keWxpbmVvbmU=\n-----END EC PRIVATE KEY-----\n";

    #[test]
    fn yaml_documents_give_their_secret_fields_and_not_their_certificates() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(PEM);
        let kubeconfig = format!(
            "users:\n- name: admin\n  user:\n    client-certificate-data: Q0VSVElGSUNBVEVEQVRB\n    client-key-data: {b64}\n"
        );
        let bundle = "cluster:\n  id: clusteridvalue123\n  secret: clustersecretvalue123\ncerts:\n  os:\n    crt: cHVibGljY2VydGlmaWNhdGU=\n    key: b3NrZXlzZWNyZXR2YWx1ZQ==\n";
        let values = secret_values(&[
            secret("kc", &[("value", &kubeconfig)]),
            secret("bundle", &[("secrets.yaml", bundle)]),
            secret(
                "store",
                &[
                    ("secretAccessKey", "s3cr3t-access-key-xyz"),
                    ("ca.crt", PEM),
                ],
            ),
            secret(
                "node-1-bmc",
                &[
                    ("username", "ichor-bmc-reader"),
                    ("password", "bmc-password-value-123"),
                ],
            ),
        ]);
        let texts: Vec<&str> = values.iter().map(|v| v.text.as_str()).collect();
        assert!(texts.contains(&b64.as_str()), "the client key, encoded");
        assert!(
            texts.contains(&"MHcCAQEEIBkzQ2x5c2VjcmV0a2V5Ym9keWxpbmVvbmU="),
            "its PEM body"
        );
        assert!(texts.contains(&"clustersecretvalue123"));
        assert!(texts.contains(&"b3NrZXlzZWNyZXR2YWx1ZQ=="));
        assert!(texts.contains(&"s3cr3t-access-key-xyz"));
        assert!(
            texts.contains(&"bmc-password-value-123"),
            "a BMC's password"
        );
        assert!(
            !texts.contains(&"ichor-bmc-reader"),
            "a user name is not a secret"
        );
        assert!(
            !texts.contains(&"clusteridvalue123"),
            "an id is not a secret"
        );
        assert!(
            !texts.contains(&"cHVibGljY2VydGlmaWNhdGU="),
            "a certificate is public"
        );
        assert!(
            !texts.contains(&"Q0VSVElGSUNBVEVEQVRB"),
            "a client certificate is public"
        );
        assert_eq!(
            values
                .iter()
                .filter(|v| v.origin.contains("ca.crt"))
                .count(),
            0
        );
    }

    #[test]
    fn a_planted_value_is_found_and_named_without_printing_it() {
        let values = secret_values(&[secret(
            "store",
            &[("age.key", "AGE-SECRET-KEY-1PLANTEDVALUE")],
        )]);
        let leaks = scan(
            &values,
            "manager log line 3",
            "INFO backup: sealing with AGE-SECRET-KEY-1PLANTEDVALUE now",
        );
        assert_eq!(
            leaks,
            vec![Leak {
                place: "manager log line 3".into(),
                origin: "Secret ns/store[age.key]".into(),
            }]
        );
        let message = fail(&leaks).expect_err("a leak fails").to_string();
        assert!(message.contains("Secret ns/store[age.key]"));
        assert!(
            !message.contains("PLANTEDVALUE"),
            "the report never repeats the value"
        );
        assert!(format!("{values:?}").find("PLANTEDVALUE").is_none());
        assert!(scan(&values, "Event", "nothing here").is_empty());
    }

    #[test]
    fn an_escaped_pem_in_a_json_log_line_is_found() {
        let values = secret_values(&[secret("tls", &[("tls.key", PEM)])]);
        let line = format!("{{\"msg\":\"key {}\"}}", PEM.replace('\n', "\\n"));
        assert_eq!(scan(&values, "webhook log line 1", &line).len(), 1);
    }
}

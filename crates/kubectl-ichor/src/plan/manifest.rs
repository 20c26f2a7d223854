//! The changed TalosCluster, read from the file given with `-f`: one YAML stream holding exactly
//! one TalosCluster (other kinds beside it, as a GitOps folder's file may hold, are skipped).

use ichor_api::TalosCluster;
use serde_json::Value;

use crate::Error;

/// The API version of a TalosCluster.
const API_VERSION: &str = "ichor.maesh.dev/v1alpha1";

/// What a TalosCluster manifest starts with, for messages.
const EXPECTED: &str = "apiVersion: ichor.maesh.dev/v1alpha1, kind: TalosCluster";

/// Reads the one TalosCluster of `text`, the contents of the file `source`.
pub fn read_manifest(text: &str, source: &str) -> Result<TalosCluster, Error> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| {
        let first = e.to_string().lines().next().unwrap_or_default().to_owned();
        Error::Manifest(format!("{source} is not YAML: {first}"))
    })?;
    let documents: Vec<&Value> = documents.iter().filter(|d| !d.is_null()).collect();
    let mut clusters = documents
        .iter()
        .filter(|d| d["kind"] == "TalosCluster" && d["apiVersion"] == API_VERSION);
    let (Some(found), None) = (clusters.next(), clusters.next()) else {
        return Err(not_one_cluster(&documents, source));
    };
    let name = found["metadata"]["name"].as_str().unwrap_or_default();
    if name.is_empty() {
        return Err(Error::Manifest(format!(
            "{source}: the TalosCluster has no metadata.name: plan finds the live cluster by its name"
        )));
    }
    serde_json::from_value((*found).clone()).map_err(|e| {
        Error::Manifest(format!(
            "{source}: TalosCluster {name} does not read as one ({e}): check it with `kubectl apply --dry-run=server -f {source}`"
        ))
    })
}

/// Why `documents` hold no single TalosCluster: what they hold instead.
fn not_one_cluster(documents: &[&Value], source: &str) -> Error {
    let count = documents
        .iter()
        .filter(|d| d["kind"] == "TalosCluster" && d["apiVersion"] == API_VERSION)
        .count();
    if count > 1 {
        return Error::Manifest(format!(
            "{source} holds {count} TalosClusters: plan takes one at a time (a file with one TalosCluster)"
        ));
    }
    let seen: Vec<String> = documents
        .iter()
        .map(|d| match (d["kind"].as_str(), d["apiVersion"].as_str()) {
            (Some(kind), Some(version)) => format!("kind {kind} (apiVersion {version})"),
            (Some(kind), None) => format!("kind {kind} without an apiVersion"),
            _ => "a document without a kind".to_owned(),
        })
        .collect();
    let held = if seen.is_empty() {
        "no document".to_owned()
    } else {
        seen.join(", ")
    };
    Error::Manifest(format!(
        "{source} holds no TalosCluster ({held}): plan reads a TalosCluster manifest ({EXPECTED})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "apiVersion: ichor.maesh.dev/v1alpha1
kind: TalosCluster
metadata:
  name: lab
spec:
  talosVersion: v1.14.2
  kubernetesVersion: 1.36.3
  endpoint: https://10.0.0.10:6443
  controlPlane:
    count: 1
";

    fn refused(text: &str) -> String {
        read_manifest(text, "cluster.yaml")
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn a_cluster_reads_alone_or_beside_other_kinds() {
        let cluster = read_manifest(CLUSTER, "cluster.yaml").expect("reads");
        assert_eq!(cluster.metadata.name.as_deref(), Some("lab"));
        assert_eq!(cluster.spec.talos_version, "v1.14.2");
        let beside =
            format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n---\n{CLUSTER}---\n");
        assert!(read_manifest(&beside, "cluster.yaml").is_ok());
    }

    #[test]
    fn a_file_that_is_no_taloscluster_says_what_it_holds_and_what_is_read() {
        let message = refused("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n");
        assert_eq!(
            message,
            "cluster.yaml holds no TalosCluster (kind Deployment (apiVersion apps/v1)): plan reads a TalosCluster manifest (apiVersion: ichor.maesh.dev/v1alpha1, kind: TalosCluster)"
        );
        let message = refused("kind: TalosCluster\nmetadata:\n  name: lab\n");
        assert!(
            message.contains("kind TalosCluster without an apiVersion"),
            "{message}"
        );
        assert!(refused("").contains("(no document)"));
        assert!(refused("a: [").starts_with("cluster.yaml is not YAML: "));
        assert!(refused(&format!("{CLUSTER}---\n{CLUSTER}")).contains("holds 2 TalosClusters"));
    }

    #[test]
    fn a_cluster_without_a_name_or_a_field_is_refused_naming_it() {
        let nameless = CLUSTER.replace("  name: lab\n", "  labels: {}\n");
        assert!(refused(&nameless).contains("no metadata.name"));
        let missing = CLUSTER.replace("  endpoint: https://10.0.0.10:6443\n", "");
        let message = refused(&missing);
        assert!(
            message.starts_with("cluster.yaml: TalosCluster lab does not read as one (")
                && message.contains("endpoint"),
            "{message}"
        );
    }
}

//! The operation's pure decisions: what was observed (the operation, its nodes' steps, the
//! nodes' answers) in, what to do next out. No I/O here; the reconcile and `Node` act on them.

use std::collections::BTreeMap;

use ichor_api::TalosCluster;
use ichor_api::operation::TalosOperation;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use kube::{Resource as _, ResourceExt as _};

/// The lowercase hex SHA-256 of `bytes`, as a snapshot's message gives it.
pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The Secret `name` holding an etcd snapshot (key `snapshot.db`), owned by the operation and
/// labelled with its cluster.
pub(super) fn snapshot_secret(
    operation: &TalosOperation,
    cluster: &TalosCluster,
    name: &str,
    bytes: &[u8],
) -> Secret {
    let owner = OwnerReference {
        api_version: TalosOperation::api_version(&()).into_owned(),
        kind: TalosOperation::kind(&()).into_owned(),
        name: operation.name_any(),
        uid: operation.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(operation.namespace().unwrap_or_default()),
            owner_references: Some(vec![owner]),
            labels: Some(BTreeMap::from([(
                ichor_api::names::labels::CLUSTER.to_owned(),
                cluster.name_any(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "snapshot.db".to_owned(),
            ByteString(bytes.to_vec()),
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use ichor_api::operation::OperationAction;

    use super::*;

    #[test]
    fn a_snapshot_digest_is_lowercase_sha256_hex() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_snapshot_secret_is_owned_by_the_operation_and_labelled_with_its_cluster() {
        let mut operation = TalosOperation::test("snap", OperationAction::EtcdSnapshot)
            .namespace("lab-ns")
            .build();
        operation.metadata.uid = Some("uid-1".into());
        let cluster = TalosCluster::test("lab").build();
        let secret = snapshot_secret(&operation, &cluster, "snap-etcd-snapshot", b"db");
        assert_eq!(secret.metadata.name.as_deref(), Some("snap-etcd-snapshot"));
        assert_eq!(secret.metadata.namespace.as_deref(), Some("lab-ns"));
        let owners = secret.metadata.owner_references.expect("an owner");
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "TalosOperation");
        assert_eq!(owners[0].name, "snap");
        assert_eq!(owners[0].uid, "uid-1");
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(owners[0].block_owner_deletion, None);
        assert_eq!(
            secret.metadata.labels.expect("labels")[ichor_api::names::labels::CLUSTER],
            "lab"
        );
        let data = secret.data.expect("data");
        assert_eq!(data.len(), 1);
        assert_eq!(data["snapshot.db"].0, b"db");
    }
}

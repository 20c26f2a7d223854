//! Replies turned into domain types, without a connection: the per-node envelope of wrapped
//! replies, the version, the etcd member list, and COSI resource specs (machine status, disks,
//! links). The typed operations of [`TalosClient`](crate::TalosClient) call these on what the
//! node sent; they are public so that what arrives from the network can be checked (and fuzzed)
//! on bytes alone. Errors are the message a [`TalosError::Node`](crate::TalosError::Node)
//! carries.

use serde_json::Value;

use crate::api::common::Metadata;
use crate::api::cosi::resource::Resource;
use crate::api::machine::{EtcdMemberListResponse, VersionResponse};
use crate::ops::EtcdMember;
use crate::resources::{Disk, Link, MachineStatus, Stage};

/// The one reply of a call to one node: wrapped responses carry a list of per-node messages
/// whose metadata may hold the node's error instead of a result (talos-facts §1.1), which is
/// an error, never taken for success.
pub fn single<T>(
    messages: Vec<T>,
    metadata: impl Fn(&T) -> Option<&Metadata>,
) -> Result<T, String> {
    let first = messages
        .into_iter()
        .next()
        .ok_or_else(|| "empty reply".to_owned())?;
    match metadata(&first)
        .map(|m| m.error.as_str())
        .filter(|e| !e.is_empty())
    {
        Some(error) => Err(error.to_owned()),
        None => Ok(first),
    }
}

/// The Talos version a `Version` reply names (`VersionInfo.tag`, e.g. `v1.14.1`; empty when
/// the reply has none).
pub fn version(reply: VersionResponse) -> Result<String, String> {
    let first = single(reply.messages, |m| m.metadata.as_ref())?;
    Ok(first.version.map(|v| v.tag).unwrap_or_default())
}

/// The members an `EtcdMemberList` reply names.
pub fn etcd_members(reply: EtcdMemberListResponse) -> Result<Vec<EtcdMember>, String> {
    let first = single(reply.messages, |m| m.metadata.as_ref())?;
    Ok(first
        .members
        .into_iter()
        .map(|m| EtcdMember {
            id: m.id,
            hostname: m.hostname,
            peer_urls: m.peer_urls,
            client_urls: m.client_urls,
            learner: m.is_learner,
        })
        .collect())
}

/// A COSI resource's spec, from its YAML form (an empty spec is YAML `null`).
pub fn resource_spec(resource: &Resource) -> Result<Value, String> {
    let yaml = resource
        .spec
        .as_ref()
        .map(|s| s.yaml_spec.as_str())
        .unwrap_or_default();
    serde_saphyr::from_str(yaml).map_err(|e| format!("cannot decode a resource spec: {e}"))
}

/// A COSI resource's id (empty without metadata).
pub fn resource_id(resource: &Resource) -> String {
    resource
        .metadata
        .as_ref()
        .map(|m| m.id.clone())
        .unwrap_or_default()
}

/// The stage and readiness a `MachineStatuses.runtime.talos.dev/machine` spec says.
pub fn machine_status(spec: &Value) -> MachineStatus {
    let unmet = spec["status"]["unmetConditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    MachineStatus {
        stage: Stage::parse(spec["stage"].as_str().unwrap_or_default()),
        ready: spec["status"]["ready"].as_bool().unwrap_or(false),
        unmet,
    }
}

/// One disk from its `Disks.block.talos.dev` resource id and spec.
pub fn disk(id: String, spec: Value) -> Result<Disk, String> {
    let mut disk: Disk = serde_json::from_value(spec).map_err(|e| format!("disk {id}: {e}"))?;
    disk.name = id;
    Ok(disk)
}

/// One link from its `LinkStatuses.net.talos.dev` resource id and spec.
pub fn link(id: String, spec: Value) -> Result<Link, String> {
    let mut link: Link = serde_json::from_value(spec).map_err(|e| format!("link {id}: {e}"))?;
    link.name = id;
    Ok(link)
}

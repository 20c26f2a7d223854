//! Replies from a Talos node, as protobuf bytes off the wire, through `prost` and
//! `ichor_talos::decode` into the domain types the typed operations return. The first byte
//! picks the reply: 0 `Version`, 1 `EtcdMemberList`, 2 a COSI `Get` of the machine status,
//! 3 a COSI `List` item of a disk or a link (the rest is the message).
//!
//! Invariants: nothing panics; a decoded message encodes to bytes that decode to the same
//! message; a per-node error is an error, never a result; the conversion keeps every member and
//! its id; a spec that reads as a disk or link keeps its resource id as its name.
#![no_main]

use ichor_talos::api::cosi::resource::{GetResponse, ListResponse};
use ichor_talos::api::machine::{EtcdMemberListResponse, VersionResponse};
use ichor_talos::decode;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// Decodes `bytes` as `M`, checking that it round-trips through its encoding.
fn message<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> Option<M> {
    let decoded = M::decode(bytes).ok()?;
    let again = M::decode(decoded.encode_to_vec().as_slice()).expect("our encoding decodes");
    assert_eq!(again, decoded, "a message changed through its encoding");
    Some(decoded)
}

fn node_failed(metadata: Option<&ichor_talos::api::common::Metadata>) -> bool {
    metadata.is_some_and(|m| !m.error.is_empty())
}

fn version(bytes: &[u8]) {
    let Some(reply) = message::<VersionResponse>(bytes) else {
        return;
    };
    let first = reply.messages.first().cloned();
    match (decode::version(reply), first) {
        (Ok(tag), Some(first)) => {
            assert!(
                !node_failed(first.metadata.as_ref()),
                "a node error read as a version"
            );
            assert_eq!(tag, first.version.map(|v| v.tag).unwrap_or_default());
        }
        (Ok(_), None) => panic!("an empty reply read as a version"),
        (Err(error), _) => assert!(!error.is_empty()),
    }
}

fn etcd_members(bytes: &[u8]) {
    let Some(reply) = message::<EtcdMemberListResponse>(bytes) else {
        return;
    };
    let first = reply.messages.first().cloned();
    match (decode::etcd_members(reply), first) {
        (Ok(members), Some(first)) => {
            assert!(
                !node_failed(first.metadata.as_ref()),
                "a node error read as members"
            );
            let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
            let sent: Vec<u64> = first.members.iter().map(|m| m.id).collect();
            assert_eq!(ids, sent, "members were lost or reordered");
        }
        (Ok(_), None) => panic!("an empty reply read as members"),
        (Err(error), _) => assert!(!error.is_empty()),
    }
}

fn machine_status(bytes: &[u8]) {
    let Some(reply) = message::<GetResponse>(bytes) else {
        return;
    };
    let resource = reply.resource.unwrap_or_default();
    if let Ok(spec) = decode::resource_spec(&resource) {
        let status = decode::machine_status(&spec);
        assert_eq!(status, decode::machine_status(&spec));
    }
}

fn list_item(bytes: &[u8]) {
    let Some(reply) = message::<ListResponse>(bytes) else {
        return;
    };
    let resource = reply.resource.unwrap_or_default();
    let id = decode::resource_id(&resource);
    let Ok(spec) = decode::resource_spec(&resource) else {
        return;
    };
    if let Ok(disk) = decode::disk(id.clone(), spec.clone()) {
        assert_eq!(disk.name, id);
    }
    if let Ok(link) = decode::link(id.clone(), spec) {
        assert_eq!(link.name, id);
        if link.is_physical() {
            assert!(link.kind.is_empty() && link.link_type == "ether");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => version(bytes),
        1 => etcd_members(bytes),
        2 => machine_status(bytes),
        _ => list_item(bytes),
    }
});

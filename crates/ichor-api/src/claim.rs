//! `TalosMachineClaim`: which one TalosMachine of the whole management cluster may act on a
//! machine, and `TalosNamespacePolicy`: the address ranges an administrator confines a
//! namespace to (ADR 0054).
//!
//! A claim is cluster-scoped and named by the SMBIOS UUID the node itself reports over the
//! pinned connection ([`claim_name`]); it is taken by *create*, so the apiserver lets exactly
//! one TalosMachine hold it. Its spec never changes: a claim is released by deleting it.

use std::net::IpAddr;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A machine's identity held by one TalosMachine: nothing is applied to, rebooted, reset or
/// upgraded on the node with this SMBIOS UUID on behalf of any other TalosMachine.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosMachineClaim",
    plural = "talosmachineclaims",
    shortname = "tmcl",
    category = "ichor",
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.machine.namespace"}"#,
    printcolumn = r#"{"name":"Machine","type":"string","jsonPath":".spec.machine.name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("a claim never changes hands: it is released by deleting it"))]
pub struct TalosMachineClaimSpec {
    /// The TalosMachine holding the claim.
    pub machine: ClaimHolder,
    /// The fingerprint of the maintenance-mode certificate the node presented when it was
    /// claimed (pinned in the holder's `spec.fingerprint`).
    #[schemars(length(max = 64))]
    pub fingerprint: String,
    /// The address the node answered at when it was claimed.
    #[schemars(length(max = 45))]
    pub address: String,
}

/// The TalosMachine a claim belongs to: a recreated machine of the same name is another one.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimHolder {
    /// Its namespace.
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// Its name.
    #[schemars(length(max = 253))]
    pub name: String,
    /// Its uid.
    #[schemars(length(max = 64))]
    pub uid: String,
}

/// The claim name for an SMBIOS UUID as a node reported it: the UUID lowercased, when that is
/// a valid object name (a DNS subdomain, as every SMBIOS UUID is); `None` for anything else a
/// node may send (the value is untrusted), which can never be claimed.
pub fn claim_name(uuid: &str) -> Option<String> {
    let name = uuid.trim().to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    valid.then_some(name)
}

/// An administrator's confinement of one namespace (the object's name) to address ranges:
/// its clusters discover only inside them, and its machines are configured only at addresses
/// inside them. Without a policy a namespace may use any address (opt-in).
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosNamespacePolicy",
    plural = "talosnamespacepolicies",
    shortname = "tnp",
    category = "ichor",
    printcolumn = r#"{"name":"Ranges","type":"string","jsonPath":".spec.addressRanges"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TalosNamespacePolicySpec {
    /// The ranges (CIDRs, e.g. `192.168.10.0/24`) the namespace named like this object may
    /// use: discovery CIDRs must lie inside one, and machine addresses must be in one. An
    /// empty list allows no address at all.
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(max = 43)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("each address range must be in CIDR notation, e.g. 192.168.10.0/24"))]
    pub address_ranges: Vec<String>,
}

impl TalosNamespacePolicySpec {
    /// Whether `address` (an IP) lies inside one of the ranges; anything that does not read
    /// as an IP lies in none.
    pub fn allows_address(&self, address: &str) -> bool {
        let Ok(ip) = address.parse::<IpAddr>() else {
            return false;
        };
        self.address_ranges
            .iter()
            .any(|range| crate::class::cidr_contains(range, ip))
    }

    /// Whether every address of `cidr` lies inside one range (a discovery CIDR only partly
    /// inside is not allowed); an invalid CIDR is not.
    pub fn allows_cidr(&self, cidr: &str) -> bool {
        let Some((net, bits)) = cidr.split_once('/') else {
            return false;
        };
        let (Ok(net), Ok(bits)) = (net.parse::<IpAddr>(), bits.parse::<u32>()) else {
            return false;
        };
        self.address_ranges.iter().any(|range| {
            let Some((_, range_bits)) = range.split_once('/') else {
                return false;
            };
            // Inside when the range is no narrower and holds the CIDR's network address.
            range_bits
                .parse::<u32>()
                .is_ok_and(|range_bits| range_bits <= bits)
                && crate::class::cidr_contains(range, net)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(ranges: &[&str]) -> TalosNamespacePolicySpec {
        TalosNamespacePolicySpec {
            address_ranges: ranges.iter().map(|r| (*r).to_owned()).collect(),
        }
    }

    #[test]
    fn a_claim_is_named_by_the_uuid_lowercased() {
        assert_eq!(
            claim_name("4C4C4544-0042-3610-8052-B4C04F4B4E32").as_deref(),
            Some("4c4c4544-0042-3610-8052-b4c04f4b4e32")
        );
    }

    #[test]
    fn a_uuid_that_cannot_name_an_object_is_never_claimed() {
        for uuid in [
            "",
            " ",
            "a/b",
            "../x",
            "-abc",
            "abc-",
            "a..b",
            "ä-1",
            &"a".repeat(254),
        ] {
            assert_eq!(claim_name(uuid), None, "{uuid:?}");
        }
    }

    #[test]
    fn an_address_is_allowed_inside_a_range_only() {
        let p = policy(&["10.0.1.0/24", "192.168.0.8/29"]);
        assert!(p.allows_address("10.0.1.7"));
        assert!(p.allows_address("192.168.0.15"));
        assert!(!p.allows_address("192.168.0.16"));
        assert!(!p.allows_address("10.0.2.7"));
        assert!(!p.allows_address("node.example"));
        assert!(!p.allows_address("::1"));
        assert!(
            !policy(&[]).allows_address("10.0.1.7"),
            "no range: no address"
        );
    }

    #[test]
    fn a_discovery_cidr_is_allowed_only_wholly_inside_a_range() {
        let p = policy(&["10.0.0.0/23"]);
        assert!(p.allows_cidr("10.0.1.0/24"));
        assert!(p.allows_cidr("10.0.0.0/23"));
        assert!(p.allows_cidr("10.0.1.128/25"));
        assert!(!p.allows_cidr("10.0.0.0/22"), "wider than the range");
        assert!(!p.allows_cidr("10.0.2.0/24"));
        assert!(!p.allows_cidr("10.0.1.0"), "not a CIDR");
    }
}

//! The network resources of a node (talos-facts §13.5): its links (`lo` and the hardware's),
//! their addresses, the node addresses Talos picks from them, and the hostname.
//!
//! The node's address on the simulated network is its first link's address, with a /24 (IPv4)
//! or /64 (IPv6) prefix; it is not filtered out as a loopback address would be on a real
//! node, because on the simulated network it is the node's routable address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ichor_talos::api::common::{NetIp, NetIpPrefix};
use ichor_talos::api::resource::definitions::enums::{
    NethelpersAddressSortAlgorithm, NethelpersDuplex, NethelpersFamily, NethelpersLinkType,
    NethelpersOperationalState, NethelpersPort, NethelpersScope,
};
use ichor_talos::api::resource::definitions::network::{
    AddressStatusSpec, HostnameStatusSpec, LinkStatusSpec, NodeAddressSpec,
};
use prost::Message as _;

use super::Wanted;
use super::store::Res;
use super::yaml::{Fields, Yaml, marshal};
use crate::Node;

const NAMESPACE: &str = "network";
const LINK_STATUS: &str = "LinkStatuses.net.talos.dev";
const ADDRESS_STATUS: &str = "AddressStatuses.net.talos.dev";
const NODE_ADDRESS: &str = "NodeAddresses.net.talos.dev";
/// The type of the hostname status.
pub(crate) const HOSTNAME_STATUS: &str = "HostnameStatuses.net.talos.dev";

/// `IFF_UP|IFF_BROADCAST|IFF_RUNNING|IFF_MULTICAST|IFF_LOWER_UP`.
const ETHER_FLAGS: u32 = 0x1 | 0x2 | 0x40 | 0x1000 | 0x1_0000;
/// `IFF_UP|IFF_LOOPBACK|IFF_RUNNING|IFF_LOWER_UP`.
const LOOPBACK_FLAGS: u32 = 0x1 | 0x8 | 0x40 | 0x1_0000;
/// `IFA_F_PERMANENT`.
const PERMANENT: u32 = 0x80;
/// The route metric Talos gives DHCP addresses (`DefaultRouteMetric`).
const DHCP_PRIORITY: u32 = 1024;

/// A link as `LinkStatusController` reports it.
struct Link<'a> {
    name: &'a str,
    index: u32,
    loopback: bool,
    mac: Vec<u8>,
}

fn parse_mac(text: &str) -> Vec<u8> {
    text.split(':')
        .filter_map(|b| u8::from_str_radix(b, 16).ok())
        .collect()
}

fn mac_text(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `nethelpers.LinkFlags` as text.
fn link_flags(flags: u32) -> String {
    const NAMES: [(u32, &str); 7] = [
        (0x1, "UP"),
        (0x2, "BROADCAST"),
        (0x8, "LOOPBACK"),
        (0x40, "RUNNING"),
        (0x1000, "MULTICAST"),
        (0x1_0000, "LOWER_UP"),
        (0x2_0000, "DORMANT"),
    ];
    NAMES
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, name)| *name)
        .collect::<Vec<_>>()
        .join(",")
}

fn link_status(link: &Link<'_>) -> Res {
    let (kind, flags, mtu, qdisc, state, up) = if link.loopback {
        (
            NethelpersLinkType::LinkLoopbck,
            LOOPBACK_FLAGS,
            65536,
            "noqueue",
            NethelpersOperationalState::OperStateUnknown,
            false,
        )
    } else {
        (
            NethelpersLinkType::LinkEther,
            ETHER_FLAGS,
            1500,
            "pfifo_fast",
            NethelpersOperationalState::OperStateUp,
            true,
        )
    };
    let broadcast = if link.loopback {
        vec![0; 6]
    } else {
        vec![0xff; 6]
    };
    let permanent = if link.loopback {
        Vec::new()
    } else {
        link.mac.clone()
    };
    let driver = if link.loopback { "" } else { "virtio_net" };
    let spec = LinkStatusSpec {
        index: link.index,
        r#type: kind as i32,
        flags,
        hardware_addr: link.mac.clone(),
        broadcast_addr: broadcast.clone(),
        mtu,
        queue_disc: qdisc.into(),
        operational_state: state as i32,
        driver: driver.into(),
        link_state: up,
        port: NethelpersPort::Other as i32,
        duplex: NethelpersDuplex::Unknown as i32,
        permanent_addr: permanent.clone(),
        ..Default::default()
    };
    let yaml = Fields::new()
        .field("index", Yaml::int(link.index))
        .field(
            "type",
            Yaml::str(if link.loopback { "loopback" } else { "ether" }),
        )
        .field("linkIndex", Yaml::int(0))
        .field("flags", Yaml::str(link_flags(flags)))
        .field("hardwareAddr", Yaml::str(mac_text(&link.mac)))
        .field("permanentAddr", Yaml::str(mac_text(&permanent)))
        .field("broadcastAddr", Yaml::str(mac_text(&broadcast)))
        .field("mtu", Yaml::int(mtu))
        .field("queueDisc", Yaml::str(qdisc))
        .field(
            "operationalState",
            Yaml::str(if link.loopback { "unknown" } else { "up" }),
        )
        .field("kind", Yaml::str(""))
        .field("slaveKind", Yaml::str(""))
        .omitempty("driver", Yaml::str(driver))
        .field("linkState", Yaml::Bool(up))
        .field("port", Yaml::str("Other"))
        .field("duplex", Yaml::str("Unknown"))
        .done();
    Res::new(
        NAMESPACE,
        LINK_STATUS,
        link.name,
        "network.LinkStatusController",
        marshal(&yaml),
        spec.encode_to_vec(),
    )
}

/// An address as `AddressStatusController` reports it.
struct Address<'a> {
    link: &'a Link<'a>,
    ip: IpAddr,
    prefix: u8,
    scope: NethelpersScope,
    flags: u32,
    priority: u32,
}

fn net_ip(ip: IpAddr) -> NetIp {
    NetIp {
        ip: match ip {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => v6.octets().to_vec(),
        },
    }
}

fn prefix_text(ip: IpAddr, prefix: u8) -> String {
    format!("{ip}/{prefix}")
}

fn address_status(a: &Address<'_>) -> Res {
    let v4 = a.ip.is_ipv4();
    let family = if v4 {
        NethelpersFamily::FamilyInet4
    } else {
        NethelpersFamily::FamilyInet6
    };
    // IPv4 addresses carry IFA_LOCAL (and a broadcast address on a broadcast link).
    let (local, broadcast) = match a.ip {
        IpAddr::V4(v4) => {
            let broadcast = (a.prefix < 31 && !a.link.loopback).then(|| {
                let host_bits = 32 - u32::from(a.prefix);
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) | ((1u32 << host_bits) - 1)))
            });
            (Some(a.ip), broadcast)
        }
        IpAddr::V6(_) => (None, None),
    };
    let spec = AddressStatusSpec {
        address: Some(NetIpPrefix {
            ip: net_ip(a.ip).ip,
            prefix_length: i32::from(a.prefix),
        }),
        local: local.map(net_ip),
        broadcast: broadcast.map(net_ip),
        anycast: None,
        multicast: None,
        link_index: a.link.index,
        link_name: a.link.name.into(),
        family: family as i32,
        scope: a.scope as i32,
        flags: a.flags,
        priority: a.priority,
    };
    let scope = match a.scope {
        NethelpersScope::ScopeHost => "host",
        NethelpersScope::ScopeLink => "link",
        _ => "global",
    };
    // go-yaml leaves out every netip.Addr field tagged omitempty (local, broadcast, ...):
    // their fields are unexported, so it sees them as zero.
    let yaml = Fields::new()
        .field("address", Yaml::str(prefix_text(a.ip, a.prefix)))
        .field("linkIndex", Yaml::int(a.link.index))
        .field("linkName", Yaml::str(a.link.name))
        .field("family", Yaml::str(if v4 { "inet4" } else { "inet6" }))
        .field("scope", Yaml::str(scope))
        .field(
            "flags",
            Yaml::str(if a.flags & PERMANENT != 0 {
                "permanent"
            } else {
                ""
            }),
        )
        .field("priority", Yaml::int(a.priority))
        .done();
    Res::new(
        NAMESPACE,
        ADDRESS_STATUS,
        format!("{}/{}", a.link.name, prefix_text(a.ip, a.prefix)),
        "network.AddressStatusController",
        marshal(&yaml),
        spec.encode_to_vec(),
    )
}

/// The link-local address the kernel derives from a MAC (EUI-64).
fn link_local(mac: &[u8]) -> Option<Ipv6Addr> {
    let [a, b, c, d, e, f] = <[u8; 6]>::try_from(mac).ok()?;
    Some(Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        a ^ 0x02,
        b,
        c,
        0xff,
        0xfe,
        d,
        e,
        f,
    ]))
}

/// The sort algorithm of node addresses: `machine.features.nodeAddressSortAlgorithm`, `v1`
/// by default.
fn sort_algorithm(node: &Node) -> bool {
    node.running
        .as_ref()
        .or(node.persisted.as_ref())
        .is_some_and(|c| c.yaml.contains("nodeAddressSortAlgorithm: v2"))
}

/// The node's network resources.
pub(crate) fn resources(node: &Node, want: &Wanted) -> Vec<Res> {
    let mut out = Vec::new();
    let lo = Link {
        name: "lo",
        index: 1,
        loopback: true,
        mac: vec![0; 6],
    };
    let links: Vec<Link<'_>> = node
        .hardware
        .links
        .iter()
        .enumerate()
        .map(|(i, l)| Link {
            name: &l.name,
            index: u32::try_from(i).unwrap_or(0) + 2,
            loopback: false,
            mac: parse_mac(&l.hardware_addr),
        })
        .collect();
    if want.has(LINK_STATUS) {
        out.push(link_status(&lo));
        out.extend(links.iter().map(link_status));
    }
    let mut addresses = vec![
        Address {
            link: &lo,
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            prefix: 8,
            scope: NethelpersScope::ScopeHost,
            flags: PERMANENT,
            priority: 0,
        },
        Address {
            link: &lo,
            ip: IpAddr::V6(Ipv6Addr::LOCALHOST),
            prefix: 128,
            scope: NethelpersScope::ScopeHost,
            flags: PERMANENT,
            priority: 0,
        },
    ];
    let ip = node.shared.addr.ip();
    let prefix = if ip.is_ipv4() { 24 } else { 64 };
    if let Some(first) = links.first() {
        addresses.push(Address {
            link: first,
            ip,
            prefix,
            scope: NethelpersScope::ScopeGlobal,
            // Talos's DHCP operator adds the lease's address as permanent, with the route
            // metric as its priority.
            flags: PERMANENT,
            priority: DHCP_PRIORITY,
        });
    }
    for link in &links {
        if let Some(fe80) = link_local(&link.mac) {
            addresses.push(Address {
                link,
                ip: IpAddr::V6(fe80),
                prefix: 64,
                scope: NethelpersScope::ScopeLink,
                flags: PERMANENT,
                priority: 0,
            });
        }
    }
    if want.has(ADDRESS_STATUS) {
        out.extend(addresses.iter().map(address_status));
    }
    // NodeAddressController: the global-scope addresses of links that are up.
    let v2 = sort_algorithm(node);
    let node_addresses: Vec<(IpAddr, u8)> = if links.is_empty() {
        Vec::new()
    } else {
        vec![(ip, prefix)]
    };
    let mut ids = vec!["current", "routed", "accumulative"];
    if !node_addresses.is_empty() {
        ids.insert(0, "default");
    }
    for id in ids.into_iter().filter(|_| want.has(NODE_ADDRESS)) {
        let spec = NodeAddressSpec {
            addresses: node_addresses
                .iter()
                .map(|(ip, prefix)| NetIpPrefix {
                    ip: net_ip(*ip).ip,
                    prefix_length: i32::from(*prefix),
                })
                .collect(),
            sort_algorithm: if v2 {
                NethelpersAddressSortAlgorithm::AddressSortAlgorithmV2
            } else {
                NethelpersAddressSortAlgorithm::AddressSortAlgorithmV1
            } as i32,
        };
        let yaml = Fields::new()
            .field(
                "addresses",
                Yaml::Seq(
                    node_addresses
                        .iter()
                        .map(|(ip, prefix)| Yaml::str(prefix_text(*ip, *prefix)))
                        .collect(),
                ),
            )
            .field("sortAlgorithm", Yaml::str(if v2 { "v2" } else { "v1" }))
            .done();
        out.push(Res::new(
            NAMESPACE,
            NODE_ADDRESS,
            id,
            "network.NodeAddressController",
            marshal(&yaml),
            spec.encode_to_vec(),
        ));
    }
    if !want.has(HOSTNAME_STATUS) {
        return out;
    }
    let hostname = node.hostname();
    let spec = HostnameStatusSpec {
        hostname: hostname.clone(),
        domainname: String::new(),
    };
    let yaml = Fields::new()
        .field("hostname", Yaml::str(&hostname))
        .field("domainname", Yaml::str(""))
        .done();
    out.push(Res::new(
        NAMESPACE,
        HOSTNAME_STATUS,
        "hostname",
        "network.HostnameSpecController",
        marshal(&yaml),
        spec.encode_to_vec(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_addresses_come_from_the_mac() {
        assert_eq!(
            link_local(&parse_mac("52:54:00:00:00:01")).map(|a| a.to_string()),
            Some("fe80::5054:ff:fe00:1".to_owned())
        );
        assert_eq!(
            link_flags(ETHER_FLAGS),
            "UP,BROADCAST,RUNNING,MULTICAST,LOWER_UP"
        );
        assert_eq!(link_flags(LOOPBACK_FLAGS), "UP,LOOPBACK,RUNNING,LOWER_UP");
    }
}

//! The checks of the typed documents (each kind's `Validate`), their conflicts with the
//! legacy v1alpha1 document (`V1Alpha1ConflictValidate`) and the checks of the whole
//! container (1.14's `validateContainer`), talos-facts §11.4. Kinds without a model here
//! are accepted as Talos would accept a valid document of that kind.

use super::cel;
use super::decode::{Container, Document};
use super::gofmt::{self, quote};
use super::v1alpha1::{self, LabelKind, Outcome};
use super::yaml::Node;
use super::{Minor, Runtime};

fn push_join(out: &mut Vec<String>, errors: Vec<String>) {
    if !errors.is_empty() {
        out.push(gofmt::join(&errors));
    }
}

/// The image checks shared by the Kubernetes component documents.
fn image_errors(rt: &Runtime, image: &str, what: &str, empty: &str, errors: &mut Vec<String>) {
    if image.is_empty() {
        errors.push(empty.to_owned());
    } else if let Err(e) = v1alpha1::validate_image_tag(rt, image) {
        errors.push(format!("{what} image is not valid: {e}"));
    }
}

/// Go's `time.ParseDuration` sign: whether the duration is negative.
fn negative_duration(text: &str) -> bool {
    text.trim().starts_with('-') && text.trim() != "-0" && text.trim() != "-0s"
}

fn subnet_errors(subnets: &[String], pod: bool, node: &Node) -> Option<String> {
    if subnets.is_empty() {
        return Some("at least one subnet must be specified".into());
    }
    if subnets.len() > 2 {
        return Some("at most two subnets can be specified for dual-stack clusters".into());
    }
    let mask4 = node
        .int_at(&["nodeCIDRMaskSizeIPv4"])
        .filter(|m| *m != 0)
        .unwrap_or(24);
    let mask6 = node
        .int_at(&["nodeCIDRMaskSizeIPv6"])
        .filter(|m| *m != 0)
        .unwrap_or(64);
    let mask4_valid = (1..=32).contains(&mask4);
    let mask6_valid = (1..=128).contains(&mask6);
    let (mut v4, mut v6) = (0, 0);
    for subnet in subnets {
        let Ok((addr, bits)) = gofmt::parse_prefix(subnet) else {
            return Some(format!("invalid subnet: {subnet}"));
        };
        let bit_len: i128 = if addr.is_ipv4() { 32 } else { 128 };
        let bits = i128::from(bits);
        if !prefix_is_masked(addr, bits) {
            return Some(format!("invalid subnet: {subnet} is not a valid CIDR"));
        }
        if bit_len - bits < 4 {
            return Some(format!(
                "invalid subnet: /{bits} is too small, it must be larger than /{}",
                bits - 4
            ));
        }
        if pod {
            let (mask, valid) = if addr.is_ipv6() {
                (mask6, mask6_valid)
            } else {
                (mask4, mask4_valid)
            };
            if valid {
                if bits > mask {
                    return Some(format!(
                        "invalid subnet: {subnet} is smaller than the per-node pod CIDR mask size /{mask}"
                    ));
                }
                if mask - bits > 16 {
                    return Some(format!(
                        "invalid subnet: {subnet} is too large for the per-node pod CIDR mask size /{mask}, the difference must be at most 16 bits"
                    ));
                }
            }
        } else if bit_len - bits > 20 {
            return Some(format!(
                "invalid subnet: {subnet} is too large, it must be at least /{} (at most 20 host identifier bits)",
                bit_len - 20
            ));
        }
        if addr.is_ipv4() {
            v4 += 1;
        } else {
            v6 += 1;
        }
    }
    (v4 > 1 || v6 > 1).then(|| {
        "at most one IPv4 and one IPv6 subnet can be specified for dual-stack clusters".into()
    })
}

fn prefix_is_masked(addr: std::net::IpAddr, bits: i128) -> bool {
    let (value, len): (u128, i128) = match addr {
        std::net::IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        std::net::IpAddr::V6(a) => (u128::from(a), 128),
    };
    let host = len - bits;
    host <= 0 || value & ((1u128 << host) - 1) == 0
}

/// One document's `Validate`: warnings and its errors (errors.Join'ed into one entry).
fn validate_document(rt: &Runtime, doc: &Document) -> Outcome {
    let n = &doc.node;
    let mut out = Outcome::default();
    let mut errors: Vec<String> = Vec::new();
    match doc.kind.as_str() {
        "HostnameConfig" => {
            let auto = n.get("auto").map(Node::text);
            let hostname = n.str_at(&["hostname"]);
            if auto.is_none() && hostname.is_empty() {
                errors.push("either 'auto' or 'hostname' must be set".into());
            }
            let auto_value = auto.clone().unwrap_or_else(|| "off".into());
            if auto_value != "off" && !hostname.is_empty() {
                errors.push("'auto' and 'hostname' cannot be set at the same time".into());
            }
            if auto_value != "off" && auto_value != "stable" {
                errors.push(format!("invalid value for 'auto': {auto_value}"));
            }
            if !hostname.is_empty() {
                if hostname.len() > 253 {
                    errors.push(format!("fqdn is too long: {}", hostname.len()));
                }
                let host = hostname.split('.').next().unwrap_or_default();
                if host.is_empty() || host.len() > 63 {
                    errors.push(format!("invalid hostname {}", quote(host)));
                }
            }
        }
        "ResolverConfig" if rt.talos.minor == Minor::V14 => {
            if let Some(host_dns) = n.get("hostDNS").filter(|h| !h.is_empty())
                && host_dns.bool_at(&["enabled"]) != Some(true)
            {
                if host_dns.bool_at(&["forwardKubeDNSToHost"]) == Some(true) {
                    errors.push("hostDNS.forwardKubeDNSToHost cannot be enabled when hostDNS.enabled is false".into());
                }
                if host_dns.bool_at(&["resolveMemberNames"]) == Some(true) {
                    errors.push("hostDNS.resolveMemberNames cannot be enabled when hostDNS.enabled is false".into());
                }
            }
        }
        "TimeSyncConfig" => {
            if negative_duration(&n.str_at(&["bootTimeout"])) {
                errors.push("bootTimeout cannot be negative".into());
            }
            if n.get("ntp").is_some() && n.get("ptp").is_some() {
                errors.push("only one of ntp or ptp configuration can be specified".into());
            }
            if rt.talos.minor == Minor::V14 && n.bool_at(&["ntp", "useNTS"]) == Some(true) {
                for server in n.strings_at(&["ntp", "servers"]) {
                    if server.parse::<std::net::IpAddr>().is_ok() {
                        errors.push(format!(
                            "NTS requires hostnames, not IP addresses: {}",
                            quote(&server)
                        ));
                    }
                }
            }
        }
        "VolumeConfig" => {
            let allowed: &[&str] = match rt.talos.minor {
                Minor::V13 => &["STATE", "EPHEMERAL", "IMAGECACHE"],
                Minor::V14 => &[
                    "STATE",
                    "EPHEMERAL",
                    "IMAGECACHE",
                    "ETCD",
                    "CRI",
                    "KUBELET",
                    "LOG",
                ],
            };
            if !allowed.contains(&doc.name.as_str()) {
                let list: Vec<String> = allowed.iter().map(|a| quote(a)).collect();
                errors.push(format!("only [{}] volumes are supported", list.join(" ")));
            } else {
                let matcher = n.str_at(&["provisioning", "diskSelector", "match"]);
                if !matcher.is_empty()
                    && let Err(e) = cel::parse_bool(&matcher)
                {
                    errors.push(format!("disk selector is invalid: {e}"));
                }
            }
        }
        "DiscoveryIdentityConfig" => {
            let id = n.str_at(&["clusterID"]);
            let secret = n.str_at(&["clusterSecret"]);
            if id.is_empty() {
                errors.push("clusterID is required".into());
            } else if secret.is_empty() {
                errors.push("clusterSecret is required".into());
            } else if let Some(e) = gofmt::base64_error(&secret) {
                errors.push(format!(
                    "invalid clusterSecret: failed to decode from base64: {secret}; {e}"
                ));
            } else {
                use base64::Engine as _;
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(&secret)
                    .map(|d| d.len())
                    .unwrap_or_default();
                if decoded != 32 {
                    errors.push(format!(
                        "invalid clusterSecret: expected 32 bytes, got {decoded}: {secret}"
                    ));
                }
            }
        }
        "DiscoveryServiceConfig" => {
            let endpoint = n.str_at(&["endpoint"]);
            if doc.name.is_empty() {
                errors.push("name is required".into());
            } else if endpoint.is_empty() {
                errors.push("endpoint is required".into());
            } else if let Ok(url) = gofmt::parse_url(&endpoint) {
                if url.scheme.is_empty() {
                    errors.push("endpoint scheme is required".into());
                } else if !["http", "https", "grpc"].contains(&url.scheme.as_str()) {
                    errors.push("endpoint scheme must be http://, https:// or grpc://".into());
                } else if url.hostname().is_empty() {
                    errors.push("endpoint host is required".into());
                }
            }
        }
        "KubeClusterConfig" => {
            if n.str_at(&["clusterName"]).is_empty() {
                errors.push("clusterName must be specified".into());
            }
            let endpoint = n.str_at(&["endpoint"]);
            if endpoint.is_empty() {
                errors.push("endpoint must be specified".into());
            } else if let Err(e) = gofmt::validate_endpoint_uri(&endpoint) {
                errors.push(format!("cluster endpoint is invalid: {e}"));
            }
        }
        "KubeNetworkConfig" => {
            let mask4 = n.int_at(&["nodeCIDRMaskSizeIPv4"]).unwrap_or(0);
            let mask6 = n.int_at(&["nodeCIDRMaskSizeIPv6"]).unwrap_or(0);
            if !(mask4 == 0 || (1..=32).contains(&mask4)) {
                errors.push("nodeCIDRMaskSizeIPv4 must be between 1 and 32".into());
            }
            if !(mask6 == 0 || (1..=128).contains(&mask6)) {
                errors.push("nodeCIDRMaskSizeIPv6 must be between 1 and 128".into());
            }
            let pods = n.strings_at(&["podSubnets"]);
            let services = n.strings_at(&["serviceSubnets"]);
            if let Some(e) = subnet_errors(&pods, true, n) {
                errors.push(format!("pod subnets: {e}"));
            }
            if let Some(e) = subnet_errors(&services, false, n) {
                errors.push(format!("service subnets: {e}"));
            }
            if pods.len() != services.len() {
                errors.push(
                    "the number of pod subnets must match the number of service subnets".into(),
                );
            }
        }
        "KubeletConfig" => {
            image_errors(
                rt,
                &n.str_at(&["image"]),
                "kubelet",
                "kubelet image cannot be empty",
                &mut errors,
            );
            protected_kubelet_fields(n, &mut errors);
        }
        "KubeNodeConfig" => {
            for cidr in n.strings_at(&["nodeIP", "validSubnets"]) {
                let cidr = cidr.trim_start_matches('!');
                if gofmt::parse_subnet_or_address(cidr).is_err() {
                    errors.push(format!("nodeIP subnet is not valid: {}", quote(cidr)));
                }
            }
            for (key, kind, what) in [
                ("labels", LabelKind::Labels, "labels"),
                ("annotations", LabelKind::Annotations, "annotations"),
                ("taints", LabelKind::Taints, "taints"),
            ] {
                if let Some(e) = v1alpha1::labels_error(kind, &n.string_map_at(&[key])) {
                    errors.push(format!("invalid node {what}: {e}"));
                }
            }
        }
        "KubeAPIServerConfig" => image_errors(
            rt,
            &n.str_at(&["image"]),
            "kube-apiserver",
            "kube-apiserver image cannot be empty",
            &mut errors,
        ),
        "KubeControllerManagerConfig" if n.bool_at(&["enabled"]) != Some(false) => image_errors(
            rt,
            &n.str_at(&["image"]),
            "kube-controller-manager",
            "kube-controller-manager image cannot be empty",
            &mut errors,
        ),
        "KubeSchedulerConfig" if n.bool_at(&["enabled"]) != Some(false) => image_errors(
            rt,
            &n.str_at(&["image"]),
            "scheduler",
            "scheduler image cannot be empty",
            &mut errors,
        ),
        "KubeProxyConfig" if n.bool_at(&["enabled"]) != Some(false) => {
            image_errors(
                rt,
                &n.str_at(&["image"]),
                "proxy",
                "proxy image cannot be empty",
                &mut errors,
            );
            match n.str_at(&["mode"]).as_str() {
                "" | "nftables" => {}
                mode @ ("iptables" | "ipvs") => out.warnings.push(format!(
                    "proxy mode {} is not recommended, please switch to nftables if possible",
                    quote(mode)
                )),
                mode => errors.push(format!(
                    "invalid proxy mode {}: supported modes are iptables, ipvs and nftables",
                    quote(mode)
                )),
            }
            if n.get("extraArgs").is_some_and(|a| !a.is_empty()) {
                out.warnings.push("extra arguments for kube-proxy may not work as expected, please use configuration instead".into());
            }
        }
        "KubeFlannelCNIConfig" if n.str_at(&["backendType"]).is_empty() => {
            errors.push("flannel backend type must be specified".into());
        }
        "KubePrismConfig" => {
            let port = n.int_at(&["port"]).unwrap_or(0);
            if !(1..=65535).contains(&port) {
                errors.push(format!("invalid port {port}: must be in range 1-65535"));
            }
        }
        "KubeAdmissionControlConfig" if doc.name.is_empty() => {
            errors.push("admission control plugin name is required".into());
        }
        "KubeAuthorizerConfig" => {
            let kind = n.str_at(&["type"]);
            if doc.name.is_empty() {
                errors.push("authorizer name is required".into());
            }
            if kind.is_empty() {
                errors.push("authorizer type is required".into());
            }
            if !["Node", "RBAC", "Webhook"].contains(&kind.as_str()) {
                errors.push(format!(
                    "authorizer type {kind} is not allowed, allowed types are [Node RBAC Webhook]"
                ));
            }
            let webhook = n.get("webhook").is_some_and(|w| !w.is_empty());
            if kind == "Webhook" && !webhook {
                errors.push(
                    "authorizer webhook configuration is required for Webhook authorizer type"
                        .into(),
                );
            }
            if kind != "Webhook" && webhook {
                out.warnings.push(
                    "authorizer webhook configuration is not allowed non-Webhook authorizer types"
                        .into(),
                );
            }
        }
        "KubeEtcdEncryptionConfig" if n.get("config").is_none_or(Node::is_empty) => {
            errors.push("etcd encryption config is required".into());
        }
        "KubeAggregatorCAConfig" if n.get("issuingCA").is_none() => {
            errors.push("issuing CA is not set".into());
        }
        "KubeServiceAccountConfig" if n.str_at(&["issuer", "privateKey"]).is_empty() => {
            errors.push("service issuer private key is required".into());
        }
        "UnattendedInstallConfig" => {
            if n.str_at(&["installer", "image"]).is_empty() {
                out.warnings.push("installer.image is not set, if Talos is not booted from asset built by Image Factory, installation will fail".into());
            }
            let matcher = n.str_at(&["provisioning", "diskSelector", "match"]);
            if matcher.is_empty() {
                errors.push("provisioning.diskSelector.match is required".into());
            } else if let Err(e) = cel::parse_bool(&matcher) {
                errors.push(format!("provisioning.diskSelector.match: {e}"));
            }
        }
        "LinkConfig" if doc.name.is_empty() => {
            errors.push("name must be specified".into());
        }
        "UserVolumeConfig" => user_volume_errors(rt, n, &doc.name, &mut errors),
        _ => {}
    }
    push_join(&mut out.errors, errors);
    out
}

/// A size field's value when set (not absent, null or empty): bytes or percent, whether it is
/// a percentage, whether it is negative (`ByteSize`, `Size`, `PercentageSize`).
fn size_field(node: Option<&Node>) -> Option<(u64, bool, bool)> {
    let text = node.filter(|n| !n.is_null())?.text();
    if text.is_empty() {
        return None;
    }
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest.to_owned()),
        None => (false, text.clone()),
    };
    if let Some(percent) = rest.strip_suffix('%') {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let value = percent.parse::<f64>().unwrap_or(0.0) as u64;
        return Some((value, true, negative));
    }
    Some((
        super::disks::parse_bytes(&rest).unwrap_or(0),
        false,
        negative,
    ))
}

/// Whether a pointer field is set (present and not null).
fn set(n: &Node, path: &[&str]) -> bool {
    n.at(path).is_some_and(|v| !v.is_null())
}

/// `UserVolumeConfigV1Alpha1.Validate` (`pkg/machinery/config/types/block/user_volume_config.go`
/// and `volume_config.go`, `encryption.go`, `trim.go`, `scrub.go`; 1.14 as pkg/machinery
/// v1.14.1, which lets a directory volume set `mount.secure`).
fn user_volume_errors(rt: &Runtime, n: &Node, name: &str, errors: &mut Vec<String>) {
    let v14 = rt.talos.minor == Minor::V14;
    if name.is_empty() {
        errors.push("name is required".into());
    }
    if name.is_empty() || name.len() > 34 {
        errors.push("name must be between 1 and 34 characters long".into());
    }
    if name
        .chars()
        .any(|c| !(c.is_ascii_alphanumeric() || c == '-'))
    {
        errors.push(
            "name can only contain lowercase and uppercase ASCII letters, digits, and hyphens"
                .into(),
        );
    }
    let kind = n
        .get("volumeType")
        .filter(|v| !v.is_null())
        .map_or_else(|| "partition".to_owned(), |v| v.text().to_lowercase());
    let matcher = n.str_at(&["provisioning", "diskSelector", "match"]);
    let min = size_field(n.at(&["provisioning", "minSize"]));
    let max = size_field(n.at(&["provisioning", "maxSize"]));
    let grow = set(n, &["provisioning", "grow"]);
    let mut filesystem = n.str_at(&["filesystem", "type"]).to_lowercase();
    if filesystem == "none" {
        filesystem.clear();
    }
    let quota = set(n, &["filesystem", "projectQuotaSupport"]);
    let xfs = v14 && set(n, &["filesystem", "xfs"]);
    let provider = n.str_at(&["encryption", "provider"]).to_lowercase();
    let keys: Vec<Node> = n
        .at(&["encryption", "keys"])
        .map(|k| k.items().to_vec())
        .unwrap_or_default();
    let encryption_zero = (provider.is_empty() || provider == "none") && keys.is_empty();
    match kind.as_str() {
        "directory" => {
            if !matcher.is_empty() || min.is_some() || max.is_some() || grow {
                errors.push("provisioning spec is invalid for volumeType directory".into());
            }
            if !encryption_zero {
                errors.push("encryption spec is invalid for volumeType directory".into());
            }
            if !filesystem.is_empty() || quota || xfs {
                errors.push("filesystem spec is invalid for volumeType directory".into());
            }
            if v14 {
                if set(n, &["mount", "disableAccessTime"]) {
                    errors
                        .push("mount.disableAccessTime is invalid for volumeType directory".into());
                }
            } else if set(n, &["mount", "disableAccessTime"]) || set(n, &["mount", "secure"]) {
                errors.push("mount spec is invalid for volumeType directory".into());
            }
        }
        "disk" | "partition" => {
            // ProvisioningSpec.Validate(required: true, sizeSupported: partition).
            if !matcher.is_empty() {
                if let Err(e) = cel::parse_bool(&matcher) {
                    errors.push(format!("disk selector is invalid: {e}"));
                }
            } else {
                errors.push("disk selector is required".into());
            }
            if kind == "partition" {
                match (min, max) {
                    // An absolute, non-negative max size is compared; a relative or a
                    // negative one is not.
                    (Some((min, _, _)), Some((max, false, false))) if min > max => {
                        errors.push("min size is greater than max size".into());
                    }
                    (None, None) => errors.push("min size or max size is required".into()),
                    _ => {}
                }
                if min.is_some_and(|(_, _, negative)| negative) {
                    errors.push("min size cannot be negative".into());
                }
            } else if min.is_some() || max.is_some() || grow {
                errors.push("min size, max size and grow are not supported".into());
            }
            // FilesystemSpec.Validate: its first error only.
            let effective = if filesystem.is_empty() {
                "xfs"
            } else {
                filesystem.as_str()
            };
            if !["xfs", "ext4", "btrfs"].contains(&effective) {
                errors.push(format!("unsupported filesystem type: {effective}"));
            } else if quota
                && n.bool_at(&["filesystem", "projectQuotaSupport"]) == Some(true)
                && effective != "xfs"
            {
                errors.push("project quota support is only available for xfs filesystem".into());
            } else if xfs && effective != "xfs" {
                errors.push("xfs options are only available for xfs filesystem".into());
            }
            if !encryption_zero {
                encryption_errors(&provider, &keys, errors);
            }
        }
        other => errors.push(format!("unsupported volume type {}", quote(other))),
    }
    if v14 {
        let interval = |section: &str| {
            n.at(&[section, "interval"])
                .filter(|v| !v.is_null())
                .and_then(|v| crate::volumes::parse_go_duration(&v.text()))
                .unwrap_or(0)
        };
        if set(n, &["trim"]) && interval("trim") < 0 {
            errors.push("trim interval cannot be negative".into());
        }
        let scrub = interval("scrub");
        if set(n, &["scrub"]) && scrub != 0 && scrub < 10_000_000_000 {
            errors.push("scrub interval: minimum value is 10s".into());
        }
    }
}

/// `EncryptionSpec.Validate` of a set encryption section (`encryption.go`).
fn encryption_errors(provider: &str, keys: &[Node], errors: &mut Vec<String>) {
    if provider != "luks2" {
        let shown = if provider.is_empty() {
            "none"
        } else {
            provider
        };
        errors.push(format!("unsupported encryption provider: {shown}"));
    }
    if keys.is_empty() {
        errors.push("encryption keys are required".into());
    }
    let mut slots = Vec::new();
    for key in keys {
        let slot = key.int_at(&["slot"]).unwrap_or(0);
        if slots.contains(&slot) {
            errors.push(format!("duplicate key slot {slot}"));
        }
        slots.push(slot);
        if !["static", "nodeID", "kms", "tpm"]
            .iter()
            .any(|k| set(key, &[k]))
        {
            errors.push(format!(
                "at least one encryption key type must be specified for slot {slot}"
            ));
        }
        if let Some(pcrs) = key.at(&["tpm", "options", "pcrs"]) {
            for pcr in pcrs.items() {
                let value = pcr.text().parse::<i128>().unwrap_or(0);
                if !(0..=23).contains(&value) {
                    errors.push(format!("TPM PCR {value} is out of range (0-23)"));
                }
            }
        }
    }
}

fn protected_kubelet_fields(n: &Node, errors: &mut Vec<String>) {
    const PROTECTED: &[&str] = &[
        "apiVersion",
        "authentication",
        "authorization",
        "cgroupRoot",
        "kind",
        "kubeletCgroups",
        "port",
        "protectKernelDefaults",
        "resolvConf",
        "rotateCertificates",
        "systemCgroups",
        "staticPodPath",
    ];
    if let Some(config) = n.get("config") {
        for field in PROTECTED {
            if config.entry(field).is_some() {
                errors.push(format!(
                    "kubelet configuration field {} can't be overridden",
                    quote(field)
                ));
            }
        }
    }
}

/// One document's conflict with the v1alpha1 document.
fn conflict(rt: &Runtime, doc: &Document, v1: &Node) -> Option<String> {
    let machine = v1.get("machine");
    let cluster = v1.get("cluster");
    let m = |path: &[&str]| machine.and_then(|n| n.at(path));
    let c = |path: &[&str]| cluster.and_then(|n| n.at(path));
    let text = |s: &str| Some(s.to_owned());
    let v14 = rt.talos.minor == Minor::V14;
    match doc.kind.as_str() {
        "HostnameConfig" => {
            if !v1.str_at(&["machine", "network", "hostname"]).is_empty() {
                return text("static hostname is already set in v1alpha1 config");
            }
            if v1.bool_at(&["machine", "features", "stableHostname"]) == Some(true) {
                return text("stable hostname is already set in v1alpha1 config");
            }
            None
        }
        "ResolverConfig" => {
            if m(&["network", "searchDomains"]).is_some() {
                return text(".machine.network.searchDomains is already set in v1alpha1 config");
            }
            let valid_nameservers = machine
                .map(|n| n.strings_at(&["network", "nameservers"]))
                .unwrap_or_default()
                .iter()
                .any(|ns| gofmt::parse_addr(ns).is_ok());
            if valid_nameservers {
                return text(".machine.network.nameservers is already set in v1alpha1 config");
            }
            if v1.bool_at(&["machine", "network", "disableSearchDomain"]) == Some(true) {
                return text(".machine.network.disableSearchDomain is already set in v1alpha1 config");
            }
            if v14
                && doc.node.get("hostDNS").is_some_and(|h| !h.is_empty())
                && m(&["features", "hostDNS"]).is_some()
            {
                return text(".machine.features.hostDNS is already set in v1alpha1 config");
            }
            None
        }
        "TimeSyncConfig" => {
            let time = m(&["time"])?;
            if time.bool_at(&["disabled"]) == Some(true) {
                return text("time sync cannot be disabled in both v1alpha1 and new-style configuration");
            }
            if !time.strings_at(&["servers"]).is_empty() {
                return text("time servers cannot be specified in both v1alpha1 and new-style configuration");
            }
            let timeout = time.str_at(&["bootTimeout"]);
            if !timeout.is_empty() && !["0", "0s"].contains(&timeout.as_str()) {
                return text("boot timeout cannot be specified in both v1alpha1 and new-style configuration");
            }
            None
        }
        "VolumeConfig" => {
            if ["STATE", "EPHEMERAL"].contains(&doc.name.as_str())
                && doc.node.get("encryption").is_some()
                && m(&["systemDiskEncryption", &doc.name.to_lowercase()]).is_some()
            {
                return Some(format!(
                    "system disk encryption for {} is configured in both v1alpha1.Config and VolumeConfig",
                    quote(&doc.name)
                ));
            }
            None
        }
        _ if !v14 => None,
        "UnattendedInstallConfig" => m(&["install"])
            .map(|_| "UnattendedInstallConfig config is incompatible with v1alpha1 config (.machine.install)".into()),
        "KubeClusterConfig" => {
            if !v1.str_at(&["cluster", "clusterName"]).is_empty() {
                return text("cluster name is already set in the v1alpha1 config (.cluster.clusterName). Please remove it and use only the new KubeClusterConfig document to avoid conflicts");
            }
            c(&["controlPlane", "endpoint"]).map(|_| "cluster endpoint is already set in the v1alpha1 config (.cluster.controlPlane.endpoint). Please remove it and use only the new KubeClusterConfig document to avoid conflicts".into())
        }
        "KubeNetworkConfig" => c(&["network"]).map(|_| "cluster network config is already set in the v1alpha1 config (.machine.cluster.network). Please remove it and use only the new KubeNetworkConfig document to avoid conflicts".into()),
        "KubeFlannelCNIConfig" => c(&["network"]).map(|_| "cluster network config in v1alpha1 config (.machine.cluster.network) can't be used with KubeFlannelCNIConfig document, please remove it to avoid conflicts".into()),
        "KubeletConfig" => m(&["kubelet"]).map(|_| "kubelet config is already set in v1alpha1 config (.machine.kubelet)".into()),
        "KubeNodeConfig" => {
            if c(&["allowSchedulingOnControlPlanes"]).is_some() {
                return text(".cluster.allowSchedulingOnControlPlanes is already set in v1alpha1 config");
            }
            if c(&["allowSchedulingOnMasters"]).is_some() {
                return text(".cluster.allowSchedulingOnMasters is already set in v1alpha1 config");
            }
            for (key, name) in [
                ("skipNodeRegistration", ".machine.kubelet.skipNodeRegistration"),
                ("registerWithFQDN", ".machine.kubelet.registerWithFQDN"),
                ("nodeIP", ".machine.kubelet.nodeIP"),
            ] {
                if m(&["kubelet", key]).is_some() {
                    return Some(format!("{name} is already set in v1alpha1 config"));
                }
            }
            for key in ["nodeLabels", "nodeAnnotations", "nodeTaints"] {
                if m(&[key]).is_some() {
                    return Some(format!(".machine.{key} is already set in v1alpha1 config"));
                }
            }
            None
        }
        "DiscoveryIdentityConfig" => (!v1.str_at(&["cluster", "id"]).is_empty()
            || !v1.str_at(&["cluster", "secret"]).is_empty())
        .then(|| "cluster identity is already configured in .cluster.id/.cluster.secret of the v1alpha1 config".into()),
        "DiscoveryServiceConfig" => c(&["discovery"]).map(|_| "discovery service is already configured in .cluster.discovery of the v1alpha1 config".into()),
        "KubeAPIServerConfig" => {
            if c(&["apiServer"]).is_some() {
                return text("kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)");
            }
            c(&["controlPlane", "localAPIServerPort"])
                .filter(|p| p.text() != "0")
                .map(|_| "kube-apiserver API port is already set in v1alpha1 config (.cluster.controlPlane.localAPIServerPort)".into())
        }
        "KubeAPIServerCAConfig" => c(&["ca"]).map(|_| "kube-apiserver CA is already set in v1alpha1 config (.cluster.ca)".into()),
        "KubeAggregatorCAConfig" => c(&["aggregatorCA"]).map(|_| "kube-apiserver aggregator CA is already set in v1alpha1 config (.cluster.aggregatorCA), please remove it and use the new KubeAggregatorCAConfig document instead".into()),
        "KubeAuditPolicyConfig" => c(&["apiServer", "auditPolicy"])
            .filter(|p| !p.is_empty())
            .map(|_| "audit policy config is already set in v1alpha1 config".into()),
        "KubeAdmissionControlConfig" | "KubeAuthorizerConfig" => c(&["apiServer", "admissionControl"])
            .filter(|p| !p.is_empty())
            .map(|_| "admission control plugin config is already set in v1alpha1 config".into()),
        "KubeControllerManagerConfig" => {
            if c(&["controllerManager"]).is_some() {
                return text("kube-controller-manager config is already set in v1alpha1 config (.cluster.controllerManager)");
            }
            m(&["controlPlane", "controllerManager"]).map(|_| "kube-controller-manager config is already set in v1alpha1 config (.machine.controlplane.controllerManager)".into())
        }
        "KubeSchedulerConfig" => {
            if c(&["scheduler"]).is_some() {
                return text("kube-scheduler config is already set in v1alpha1 config (.cluster.scheduler)");
            }
            m(&["controlPlane", "scheduler"]).map(|_| "kube-scheduler config is already set in v1alpha1 config (.machine.controlplane.scheduler)".into())
        }
        "KubeProxyConfig" => c(&["proxy"]).map(|_| "cluster proxy config in v1alpha1 config (.machine.cluster.proxy) can't be used with KubeProxyConfig document, please remove it to avoid conflicts".into()),
        "KubeCoreDNSConfig" => c(&["coreDNS"]).map(|_| "CoreDNS config is already set in v1alpha1 config (.cluster.coreDNS)".into()),
        "KubeEtcdEncryptionConfig" => (!v1.str_at(&["cluster", "secretboxEncryptionSecret"]).is_empty()
            || !v1.str_at(&["cluster", "aescbcEncryptionSecret"]).is_empty())
        .then(|| "etcd encryption config is already set in v1alpha1 config".into()),
        "KubePrismConfig" => m(&["features", "kubePrism"]).map(|_| "KubePrism config in v1alpha1 config (.machine.features.kubePrism) can't be used with KubePrismConfig document, please remove it to avoid conflicts".into()),
        "KubeServiceAccountConfig" => c(&["serviceAccount"]).map(|_| "service account is already set in v1alpha1 config (.cluster.serviceAccount)".into()),
        _ => None,
    }
}

/// The kinds only allowed on control planes (1.14, `ControlplaneOnlyDocument`).
const CONTROL_PLANE_ONLY: &[&str] = &[
    "KubeAPIServerConfig",
    "KubeAdmissionControlConfig",
    "KubeAggregatorCAConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeControllerManagerConfig",
    "KubeCoreDNSConfig",
    "KubeEtcdEncryptionConfig",
    "KubeFlannelCNIConfig",
    "KubeProxyConfig",
    "KubeSchedulerConfig",
    "KubeServiceAccountConfig",
    "KubeTalosAPIAccessConfig",
];

/// 1.14's `validateContainer` (metal mode: the container-mode checks do not apply).
fn validate_container(container: &Container, out: &mut Outcome) {
    let v1 = container.v1alpha1.as_ref();
    let cluster = v1.and_then(|d| d.get("cluster"));
    let legacy_discovery = cluster.and_then(|c| c.get("discovery")).is_some_and(|d| {
        d.bool_at(&["enabled"]) == Some(true)
            && d.bool_at(&["registries", "service", "disabled"]) != Some(true)
            && gofmt::parse_url(&d.str_at(&["registries", "service", "endpoint"])).is_ok()
    });
    if legacy_discovery || container.has("DiscoveryServiceConfig") {
        let legacy_id = cluster.map(|c| c.str_at(&["id"])).unwrap_or_default();
        let legacy_secret = cluster.map(|c| c.str_at(&["secret"])).unwrap_or_default();
        let (id, secret) = if !legacy_id.is_empty() || !legacy_secret.is_empty() {
            (legacy_id, legacy_secret)
        } else if let Some(d) = container.doc("DiscoveryIdentityConfig") {
            (
                d.node.str_at(&["clusterID"]),
                d.node.str_at(&["clusterSecret"]),
            )
        } else {
            (String::new(), String::new())
        };
        if id.is_empty() {
            out.errors.push("cluster ID (.cluster.id or DiscoveryIdentityConfig) should be set when cluster discovery (DiscoveryServiceConfig) is enabled".into());
        }
        if secret.is_empty() {
            out.errors.push("cluster secret (.cluster.secret or DiscoveryIdentityConfig) should be set when cluster discovery (DiscoveryServiceConfig) is enabled".into());
        }
    }
    let machine_type = v1alpha1::machine_type(v1);
    let kubernetes_ca = container.has("KubeAPIServerCAConfig")
        || cluster.is_some_and(|c| c.get("ca").is_some() || c.get("acceptedCAs").is_some());
    if machine_type.is_control_plane() {
        if kubernetes_ca {
            let legacy = cluster.is_some_and(|c| {
                !c.str_at(&["secretboxEncryptionSecret"]).is_empty()
                    || !c.str_at(&["aescbcEncryptionSecret"]).is_empty()
            });
            if !legacy && !container.has("KubeEtcdEncryptionConfig") {
                out.errors.push("etcd encryption config is required for control plane machines running kube-apiserver".into());
            }
        }
        if let Some(node) = container.doc("KubeNodeConfig")
            && node
                .node
                .get("labels")
                .and_then(|l| l.entry("node-role.kubernetes.io/control-plane"))
                .is_none()
            && node.node.bool_at(&["skipNodeRegistration"]) != Some(true)
        {
            out.warnings.push("KubeNodeConfig document should set the \"node-role.kubernetes.io/control-plane\" node label on control plane machines (and, unless scheduling on control planes is allowed, the \"node-role.kubernetes.io/control-plane: NoSchedule\" taint): unlike .machine.nodeLabels/.machine.nodeTaints, the document contents are used as-is".into());
        }
    }
    let cluster_config = container.has("KubeClusterConfig")
        || cluster.is_some_and(|c| c.at(&["controlPlane", "endpoint"]).is_some());
    if kubernetes_ca && !cluster_config {
        out.errors.push("cluster name and endpoint are required when Kubernetes is configured: either .cluster.clusterName/.cluster.controlPlane.endpoint or the KubeClusterConfig document".into());
    }
    let mut only: Vec<&str> = container
        .documents
        .iter()
        .map(|d| d.kind.as_str())
        .filter(|k| CONTROL_PLANE_ONLY.contains(k))
        .collect();
    if !only.is_empty() && !machine_type.is_control_plane() {
        only.sort_unstable();
        only.dedup();
        out.errors.push(format!(
            "the following document kinds are only allowed on control plane machines: [{}]",
            only.join(" ")
        ));
    }
}

/// The container's `Validate` (1.13) / `validate` (1.14): the v1alpha1 document, each
/// document, the conflicts, and (1.14) the container.
pub(crate) fn validate(rt: &Runtime, container: &Container) -> Outcome {
    let mut out = Outcome::default();
    if let Some(v1) = &container.v1alpha1 {
        let v = v1alpha1::validate(rt, v1);
        out.warnings.extend(v.warnings);
        if !v.errors.is_empty() {
            out.errors
                .push(format!("v1alpha1.Config: {}", gofmt::multierror(&v.errors)));
        }
    }
    for doc in &container.documents {
        let d = validate_document(rt, doc);
        out.warnings.extend(d.warnings);
        if let Some(e) = d.errors.first() {
            out.errors.push(format!("{}: {e}", doc.id()));
        }
    }
    if let Some(v1) = &container.v1alpha1 {
        for doc in &container.documents {
            if let Some(e) = conflict(rt, doc, v1) {
                out.errors.push(e);
            }
        }
    }
    if rt.talos.minor == Minor::V14 {
        validate_container(container, &mut out);
    }
    out
}

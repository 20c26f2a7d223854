//! Talos's config loader (`configloader.NewFromBytes`, talos-facts §11.3): the document
//! stream, each document's kind by the keys it holds, the registry of kinds per release,
//! duplicates, values that cannot be decoded into their Go types, unknown keys.

use serde_json::{Map, Value as Json};

use super::gofmt::{self, quote};
use super::yaml::{self, Node, Value};
use super::{Minor, Talos};

/// One typed document (`apiVersion` + `kind`).
#[derive(Debug, Clone)]
pub(crate) struct Document {
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) node: Node,
}

impl Document {
    /// How Talos names the document in messages: the kind, and `/name` for named kinds.
    pub(crate) fn id(&self) -> String {
        if NAMED.contains(&self.kind.as_str()) {
            format!("{}/{}", self.kind, self.name)
        } else {
            self.kind.clone()
        }
    }
}

/// A loaded config: the legacy v1alpha1 document and the typed ones, in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Container {
    pub(crate) v1alpha1: Option<Node>,
    pub(crate) documents: Vec<Document>,
}

impl Container {
    /// The first document of `kind`.
    pub(crate) fn doc(&self, kind: &str) -> Option<&Document> {
        self.documents.iter().find(|d| d.kind == kind)
    }

    /// Whether a document of `kind` is present.
    pub(crate) fn has(&self, kind: &str) -> bool {
        self.doc(kind).is_some()
    }
}

/// Kinds registered in pkg/machinery v1.13.9 (besides the legacy `v1alpha1`).
const KINDS_1_13: &[&str] = &[
    "BlackholeRouteConfig",
    "BondConfig",
    "BridgeConfig",
    "DHCPv4Config",
    "DHCPv6Config",
    "DummyLinkConfig",
    "EnvironmentConfig",
    "EthernetConfig",
    "EventSinkConfig",
    "ExistingVolumeConfig",
    "ExtensionServiceConfig",
    "ExternalVolumeConfig",
    "HCloudVIPConfig",
    "HostnameConfig",
    "ImageVerificationConfig",
    "KmsgLogConfig",
    "KubeSpanConfig",
    "KubeSpanEndpointsConfig",
    "Layer2VIPConfig",
    "LinkAliasConfig",
    "LinkConfig",
    "NetworkDefaultActionConfig",
    "NetworkRuleConfig",
    "OOMConfig",
    "PCIDriverRebindConfig",
    "RawVolumeConfig",
    "RegistryAuthConfig",
    "RegistryMirrorConfig",
    "RegistryTLSConfig",
    "ResolverConfig",
    "RoutingRuleConfig",
    "SideroLinkConfig",
    "StaticHostConfig",
    "SwapVolumeConfig",
    "TCPProbeConfig",
    "TimeSyncConfig",
    "TrustedRootsConfig",
    "UserVolumeConfig",
    "VLANConfig",
    "VRFConfig",
    "VolumeConfig",
    "WatchdogTimerConfig",
    "WireguardConfig",
    "ZswapConfig",
];

/// Kinds pkg/machinery v1.14.1 adds to the 1.13 ones.
const KINDS_1_14_ADDED: &[&str] = &[
    "BGPInstanceConfig",
    "CRIBaseRuntimeSpecConfig",
    "CRICustomizationConfig",
    "ContainerConfig",
    "DiscoveryIdentityConfig",
    "DiscoveryServiceConfig",
    "EtcFileConfig",
    "FilesystemScrubConfig",
    "FilesystemTrimConfig",
    "HTTPProbeConfig",
    "ImageCacheConfig",
    "KernelModuleConfig",
    "KubeAPIServerCAConfig",
    "KubeAPIServerConfig",
    "KubeAdmissionControlConfig",
    "KubeAggregatorCAConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeClusterConfig",
    "KubeControllerManagerConfig",
    "KubeCoreDNSConfig",
    "KubeCredentialProviderConfig",
    "KubeEtcdEncryptionConfig",
    "KubeExternalManifestConfig",
    "KubeFlannelCNIConfig",
    "KubeInlineManifestConfig",
    "KubeNetworkConfig",
    "KubeNodeConfig",
    "KubePrismConfig",
    "KubeProxyConfig",
    "KubeSchedulerConfig",
    "KubeServiceAccountConfig",
    "KubeStaticPodConfig",
    "KubeTalosAPIAccessConfig",
    "KubeletConfig",
    "LVMLogicalVolumeConfig",
    "LVMVolumeGroupConfig",
    "RAIDArrayConfig",
    "SecurityProfileConfig",
    "SysctlConfig",
    "SysfsConfig",
    "UdevRulesConfig",
    "UnattendedInstallConfig",
    "VethConfig",
];

/// Kinds whose documents are named (`config.NamedDocument`): messages say `Kind/name`.
const NAMED: &[&str] = &[
    "BGPInstanceConfig",
    "BlackholeRouteConfig",
    "BondConfig",
    "BridgeConfig",
    "DHCPv4Config",
    "DHCPv6Config",
    "DiscoveryServiceConfig",
    "DummyLinkConfig",
    "EthernetConfig",
    "ExistingVolumeConfig",
    "ExternalVolumeConfig",
    "HCloudVIPConfig",
    "KernelModuleConfig",
    "KmsgLogConfig",
    "KubeAdmissionControlConfig",
    "KubeAuthorizerConfig",
    "KubeExternalManifestConfig",
    "KubeInlineManifestConfig",
    "KubeStaticPodConfig",
    "LVMLogicalVolumeConfig",
    "LVMVolumeGroupConfig",
    "Layer2VIPConfig",
    "LinkAliasConfig",
    "LinkConfig",
    "PCIDriverRebindConfig",
    "RAIDArrayConfig",
    "RawVolumeConfig",
    "RegistryAuthConfig",
    "RegistryMirrorConfig",
    "RegistryTLSConfig",
    "RoutingRuleConfig",
    "NetworkRuleConfig",
    "StaticHostConfig",
    "SwapVolumeConfig",
    "TrustedRootsConfig",
    "UserVolumeConfig",
    "VLANConfig",
    "VRFConfig",
    "VethConfig",
    "VolumeConfig",
    "WireguardConfig",
];

fn registered(talos: &Talos, kind: &str) -> bool {
    KINDS_1_13.contains(&kind) || (talos.minor == Minor::V14 && KINDS_1_14_ADDED.contains(&kind))
}

/// Loads a config as `configloader.NewFromBytes` does; the error is Talos's message.
pub(crate) fn load(talos: &Talos, source: &str) -> Result<Container, String> {
    let nodes = yaml::parse_stream(source).map_err(|e| format!("decode error: {e}"))?;
    let mut container = Container::default();
    let mut seen: Vec<(String, String, String)> = Vec::new();
    let mut any = false;
    for node in nodes {
        match &node.value {
            Value::Map(_) => {}
            Value::Null => continue,
            _ => return Err(format!("expected a YAML document at line {}", node.line)),
        }
        any = true;
        let find = |key: &str| {
            node.entry(key)
                .map(|(_, v)| match &v.value {
                    Value::Str(_) | Value::Bool(_) | Value::Int(_) | Value::Float(_) => v.text(),
                    _ => String::new(),
                })
                .unwrap_or_default()
        };
        let api_version = find("apiVersion");
        let kind = find("kind");
        let name = find("name");
        let id_kind = if kind.is_empty() {
            "v1alpha1".to_owned()
        } else {
            kind.clone()
        };
        let id = (api_version.clone(), id_kind.clone(), name.clone());
        if seen.contains(&id) {
            return Err(format!(
                "duplicate document {api_version}/{id_kind}/{name} is not allowed (line {})",
                node.line
            ));
        }
        seen.push(id);
        let wrap = |err: String| {
            format!(
                "error decoding document {api_version}/{id_kind}/{name} (line {}): {err}",
                node.line
            )
        };
        // The version: apiVersion, or v1alpha1 as soon as a legacy top-level key is seen.
        let mut version = String::new();
        for (key, value) in node.entries() {
            match key.name.as_str() {
                "apiVersion" => version = value.text(),
                "machine" | "cluster" | "debug" | "persist" => version = "v1alpha1".into(),
                _ => {}
            }
        }
        let legacy = version == "v1alpha1" && kind.is_empty();
        if !legacy {
            if kind.is_empty() {
                return Err(wrap("missing kind".into()));
            }
            if version.is_empty() {
                return Err(wrap("missing apiVersion".into()));
            }
            if version != "v1alpha1" || !registered(talos, &kind) {
                return Err(wrap(format!(
                    "{} {}: not registered",
                    quote(&kind),
                    quote(&version)
                )));
            }
        }
        let schema_kind = if legacy { "v1alpha1" } else { kind.as_str() };
        if let Some(error) = construct_errors(talos, source, schema_kind, &node) {
            return Err(wrap(format!(
                "error decoding {kind} to {}: {error}",
                go_type(schema_kind)
            )));
        }
        if let Some(unknown) = unknown_keys(talos, schema_kind, &node) {
            return Err(wrap(format!(
                "unknown keys found during decoding:\n{}",
                yaml::encode_go(&unknown)
            )));
        }
        if legacy {
            container.v1alpha1 = Some(node);
        } else {
            container.documents.push(Document { kind, name, node });
        }
    }
    if !any {
        return Err("config not found".into());
    }
    conflicts(&container)?;
    Ok(container)
}

/// Kinds whose documents may not share a name (`ConflictsWithKinds`: a user volume and an
/// existing volume of one name, `pkg/machinery/config/types/block/user_volume_config.go`).
const CONFLICTING: &[(&str, &str)] = &[("UserVolumeConfig", "ExistingVolumeConfig")];

/// `container.New`'s conflict check: the first of two conflicting documents is named first.
fn conflicts(container: &Container) -> Result<(), String> {
    for (i, doc) in container.documents.iter().enumerate() {
        for (a, b) in CONFLICTING {
            let other = match doc.kind.as_str() {
                k if k == *a => *b,
                k if k == *b => *a,
                _ => continue,
            };
            if let Some(first) = container.documents[..i]
                .iter()
                .find(|d| d.kind == other && d.name == doc.name)
            {
                return Err(format!(
                    "conflicting documents: {} and {}",
                    first.id(),
                    doc.id()
                ));
            }
        }
    }
    Ok(())
}

/// The Go type a kind decodes into, as `%T` prints it.
fn go_type(kind: &str) -> String {
    let package = match kind {
        "v1alpha1" => return "*v1alpha1.Config".into(),
        "DiscoveryIdentityConfig" | "DiscoveryServiceConfig" => "cluster",
        "VolumeConfig"
        | "FilesystemTrimConfig"
        | "UserVolumeConfig"
        | "RawVolumeConfig"
        | "ExistingVolumeConfig"
        | "ExternalVolumeConfig"
        | "SwapVolumeConfig"
        | "ZswapConfig" => "block",
        "SecurityProfileConfig"
        | "UnattendedInstallConfig"
        | "EnvironmentConfig"
        | "EventSinkConfig"
        | "KmsgLogConfig"
        | "WatchdogTimerConfig"
        | "OOMConfig" => "runtime",
        k if k.starts_with("Kube") && k != "KubeSpanConfig" && k != "KubeSpanEndpointsConfig" => {
            "k8s"
        }
        _ => "network",
    };
    format!("*{package}.{kind}V1Alpha1")
}

/// A value Go's decoder cannot construct: what the Go type's unmarshaler answers.
type ConstructCheck = fn(&str) -> Option<String>;

/// A decode-time check of the value at a path (`*` is any list item); `pair` when the Go
/// type unmarshals the enclosing mapping (a certificate-and-key pair decodes as one value, so
/// Go reports the pair's line, not the field's).
struct Rule {
    path: &'static [&'static str],
    check: ConstructCheck,
    pair: bool,
}

const fn rule(path: &'static [&'static str], check: ConstructCheck) -> Rule {
    Rule {
        path,
        check,
        pair: false,
    }
}

const fn pair(path: &'static [&'static str]) -> Rule {
    Rule {
        path,
        check: base64_check,
        pair: true,
    }
}

fn base64_check(text: &str) -> Option<String> {
    gofmt::base64_error(text)
}

fn url_check(text: &str) -> Option<String> {
    if text.is_empty() {
        return None;
    }
    gofmt::parse_url(text).err()
}

fn prefix_check(text: &str) -> Option<String> {
    gofmt::parse_prefix(text).err()
}

fn addr_check(text: &str) -> Option<String> {
    gofmt::parse_addr(text).err()
}

fn disk_size_check(text: &str) -> Option<String> {
    super::disks::parse_size_condition(text).err()
}

fn auto_hostname_check(text: &str) -> Option<String> {
    match text {
        "off" | "talos-addr" | "stable" => None,
        other => Some(format!(
            "{other} does not belong to AutoHostnameKind values"
        )),
    }
}

const V1ALPHA1_RULES: &[Rule] = &[
    pair(&["machine", "ca", "crt"]),
    pair(&["machine", "ca", "key"]),
    pair(&["machine", "acceptedCAs", "*", "crt"]),
    pair(&["cluster", "ca", "crt"]),
    pair(&["cluster", "ca", "key"]),
    pair(&["cluster", "acceptedCAs", "*", "crt"]),
    pair(&["cluster", "aggregatorCA", "crt"]),
    pair(&["cluster", "aggregatorCA", "key"]),
    pair(&["cluster", "serviceAccount", "key"]),
    pair(&["cluster", "etcd", "ca", "crt"]),
    pair(&["cluster", "etcd", "ca", "key"]),
    rule(&["cluster", "controlPlane", "endpoint"], url_check),
    rule(
        &["machine", "install", "diskSelector", "size"],
        disk_size_check,
    ),
];
const HOSTNAME_CONFIG_RULES: &[Rule] = &[rule(&["auto"], auto_hostname_check)];
const KUBE_NETWORK_CONFIG_RULES: &[Rule] = &[
    rule(&["podSubnets", "*"], prefix_check),
    rule(&["serviceSubnets", "*"], prefix_check),
];
const KUBE_CLUSTER_CONFIG_RULES: &[Rule] = &[rule(&["endpoint"], url_check)];
const DISCOVERY_SERVICE_CONFIG_RULES: &[Rule] = &[rule(&["endpoint"], url_check)];
const RESOLVER_CONFIG_RULES: &[Rule] = &[rule(&["nameservers", "*", "address"], addr_check)];
const LINK_CONFIG_RULES: &[Rule] = &[rule(&["addresses", "*", "address"], prefix_check)];

/// An enumer `UnmarshalText` (case-insensitive): the error names the Go type.
fn enum_check(text: &str, values: &[&str], type_name: &str) -> Option<String> {
    (!values.contains(&text.to_lowercase().as_str()))
        .then(|| format!("{text} does not belong to {type_name} values"))
}

/// `block.VolumeType` (`pkg/machinery/resources/block/volumetype_enumer.go`).
fn volume_type_check(text: &str) -> Option<String> {
    enum_check(
        text,
        &[
            "partition",
            "disk",
            "tmpfs",
            "directory",
            "symlink",
            "overlay",
            "external",
        ],
        "VolumeType",
    )
}

/// `block.FilesystemType` of 1.13 (its `swap` is spelt `swapi`).
fn filesystem_type_check_1_13(text: &str) -> Option<String> {
    enum_check(
        text,
        &[
            "none", "xfs", "vfat", "ext4", "iso9660", "swapi", "virtiofs",
        ],
        "FilesystemType",
    )
}

/// `block.FilesystemType` of 1.14, which adds `btrfs`.
fn filesystem_type_check_1_14(text: &str) -> Option<String> {
    enum_check(
        text,
        &[
            "none", "xfs", "vfat", "ext4", "iso9660", "swapi", "virtiofs", "btrfs",
        ],
        "FilesystemType",
    )
}

/// `block.EncryptionProviderType`.
fn encryption_provider_check(text: &str) -> Option<String> {
    enum_check(text, &["none", "luks2"], "EncryptionProviderType")
}

/// `block.ByteSize.UnmarshalText`: an optional `-`, then `humanize.ParseBytes`.
fn byte_size_check(text: &str) -> Option<String> {
    if text.is_empty() {
        return None;
    }
    super::disks::parse_bytes(text.strip_prefix('-').unwrap_or(text)).err()
}

/// `block.Size.UnmarshalText`: a `PercentageSize` when there is a `%`, else a `ByteSize`.
fn size_check(text: &str) -> Option<String> {
    if !text.contains('%') {
        return byte_size_check(text);
    }
    let Some(number) = text.strip_suffix('%') else {
        return Some("percentage must end with '%'".into());
    };
    let number = number.strip_prefix('-').unwrap_or(number);
    match number.parse::<f64>() {
        Err(_) => Some(format!(
            "invalid percentage value: strconv.ParseFloat: parsing {}: invalid syntax",
            quote(number)
        )),
        Ok(v) if !(0.0..=100.0).contains(&v) => {
            Some(format!("percentage must be between 0 and 100, got {v}"))
        }
        Ok(_) => None,
    }
}

/// A `time.Duration` field: go-yaml parses a string with `time.ParseDuration` and refuses
/// integers.
fn duration_check(text: &str) -> Option<String> {
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit()) {
        return Some(format!(
            "cannot construct !!int `{text}` into time.Duration"
        ));
    }
    crate::volumes::parse_go_duration(text)
        .is_none()
        .then(|| format!("cannot construct !!str `{text}` into time.Duration"))
}

/// `UserVolumeConfigV1Alpha1` of 1.13.
const USER_VOLUME_CONFIG_RULES_1_13: &[Rule] = &[
    rule(&["volumeType"], volume_type_check),
    rule(&["provisioning", "minSize"], byte_size_check),
    rule(&["provisioning", "maxSize"], size_check),
    rule(&["filesystem", "type"], filesystem_type_check_1_13),
    rule(&["encryption", "provider"], encryption_provider_check),
];
/// `UserVolumeConfigV1Alpha1` of 1.14: btrfs, the xfs options, trim and scrub.
const USER_VOLUME_CONFIG_RULES_1_14: &[Rule] = &[
    rule(&["volumeType"], volume_type_check),
    rule(&["provisioning", "minSize"], byte_size_check),
    rule(&["provisioning", "maxSize"], size_check),
    rule(&["filesystem", "type"], filesystem_type_check_1_14),
    rule(
        &["filesystem", "xfs", "minAllocationGroupSize"],
        byte_size_check,
    ),
    rule(&["encryption", "provider"], encryption_provider_check),
    rule(&["trim", "interval"], duration_check),
    rule(&["scrub", "interval"], duration_check),
];

/// The decode-time checks of the fields the simulator models, by path (`*` is any list
/// item) within a document of `kind`.
fn construct_rules(talos: &Talos, kind: &str) -> &'static [Rule] {
    match kind {
        "UserVolumeConfig" if talos.minor == Minor::V13 => USER_VOLUME_CONFIG_RULES_1_13,
        "UserVolumeConfig" => USER_VOLUME_CONFIG_RULES_1_14,
        "v1alpha1" => V1ALPHA1_RULES,
        "HostnameConfig" => HOSTNAME_CONFIG_RULES,
        "KubeNetworkConfig" => KUBE_NETWORK_CONFIG_RULES,
        "KubeClusterConfig" => KUBE_CLUSTER_CONFIG_RULES,
        "DiscoveryServiceConfig" => DISCOVERY_SERVICE_CONFIG_RULES,
        "ResolverConfig" => RESOLVER_CONFIG_RULES,
        "LinkConfig" => LINK_CONFIG_RULES,
        _ => &[],
    }
}

fn construct_errors(talos: &Talos, source: &str, kind: &str, node: &Node) -> Option<String> {
    let rules = construct_rules(talos, kind);
    if rules.is_empty() {
        return None;
    }
    let mut found: Vec<(u64, String)> = Vec::new();
    walk(
        source,
        node,
        &mut Vec::new(),
        None,
        node.line,
        rules,
        &mut found,
    );
    if found.is_empty() {
        return None;
    }
    let lines: Vec<String> = found
        .iter()
        .map(|(line, message)| format!("line {line}: {message}"))
        .collect();
    // go.yaml.in/yaml v4 rc.4 (machinery 1.13) puts each on its own line; the version
    // machinery 1.14 uses writes them on one.
    Some(match talos.minor {
        Minor::V13 => format!("yaml: construct errors:\n  {}", lines.join("\n  ")),
        Minor::V14 => format!("yaml: construct errors: {}", lines.join("; ")),
    })
}

fn walk<'a>(
    source: &str,
    node: &'a Node,
    path: &mut Vec<&'a str>,
    key: Option<&yaml::Key>,
    parent_line: u64,
    rules: &[Rule],
    found: &mut Vec<(u64, String)>,
) {
    match &node.value {
        Value::Map(entries) => {
            for (k, v) in entries {
                path.push(k.name.as_str());
                walk(source, v, path, Some(k), node.line, rules, found);
                path.pop();
            }
        }
        Value::Seq(items) => {
            for item in items {
                path.push("*");
                walk(source, item, path, None, node.line, rules, found);
                path.pop();
            }
        }
        Value::Null => {}
        _ => {
            for rule in rules {
                if rule.path.len() == path.len()
                    && rule.path.iter().zip(path.iter()).all(|(p, k)| p == k)
                    && let Some(message) = (rule.check)(&node.text())
                {
                    let line = if rule.pair {
                        parent_line
                    } else {
                        key.map_or(node.line, |k| yaml::value_line(source, k, node))
                    };
                    found.push((line, message));
                }
            }
        }
    }
}

/// The keys each modelled kind knows at its top level (and, for the v1alpha1 document, in
/// `machine` and `cluster`). Kinds not listed are not checked.
fn known_keys(kind: &str) -> Option<&'static [&'static str]> {
    const META: [&str; 2] = ["apiVersion", "kind"];
    let _ = META;
    Some(match kind {
        "v1alpha1" => &["version", "debug", "persist", "machine", "cluster"],
        "DiscoveryIdentityConfig" => &["apiVersion", "kind", "clusterID", "clusterSecret"],
        "DiscoveryServiceConfig" => &["apiVersion", "kind", "name", "endpoint"],
        "FilesystemTrimConfig" => &["apiVersion", "kind", "interval"],
        "HostnameConfig" => &["apiVersion", "kind", "auto", "hostname"],
        "KubeAPIServerCAConfig" | "KubeAggregatorCAConfig" => {
            &["apiVersion", "kind", "issuingCA", "acceptedCAs"]
        }
        "KubeAPIServerConfig" => &[
            "apiVersion",
            "kind",
            "image",
            "extraArgs",
            "env",
            "resources",
            "apiPort",
            "certExtraSANs",
            "startupProbes",
        ],
        "KubeAdmissionControlConfig" => &["apiVersion", "kind", "name", "configuration"],
        "KubeAuditPolicyConfig" | "KubeAuthenticationConfig" => {
            &["apiVersion", "kind", "configuration"]
        }
        "KubeAuthorizerConfig" => &["apiVersion", "kind", "name", "type", "webhook"],
        "KubeClusterConfig" => &["apiVersion", "kind", "clusterName", "endpoint"],
        "KubeControllerManagerConfig" => &[
            "apiVersion",
            "kind",
            "enabled",
            "image",
            "extraArgs",
            "env",
            "resources",
        ],
        "KubeCoreDNSConfig" => &["apiVersion", "kind", "enabled", "image"],
        "KubeEtcdEncryptionConfig" => &["apiVersion", "kind", "config"],
        "KubeFlannelCNIConfig" => &[
            "apiVersion",
            "kind",
            "backendType",
            "backendPort",
            "backendMTU",
            "backendExtraConfig",
            "resources",
            "extraArgs",
            "kubeNetworkPoliciesEnabled",
        ],
        "KubeNetworkConfig" => &[
            "apiVersion",
            "kind",
            "dnsDomain",
            "podSubnets",
            "serviceSubnets",
            "nodeCIDRMaskSizeIPv4",
            "nodeCIDRMaskSizeIPv6",
        ],
        "KubeNodeConfig" => &[
            "apiVersion",
            "kind",
            "skipNodeRegistration",
            "registerWithFQDN",
            "nodeIP",
            "labels",
            "annotations",
            "taints",
        ],
        "KubePrismConfig" => &["apiVersion", "kind", "port", "tlsServerName"],
        "KubeProxyConfig" => &[
            "apiVersion",
            "kind",
            "enabled",
            "image",
            "mode",
            "config",
            "extraArgs",
            "resources",
        ],
        "KubeSchedulerConfig" => &[
            "apiVersion",
            "kind",
            "enabled",
            "image",
            "config",
            "extraArgs",
            "env",
            "resources",
        ],
        "KubeServiceAccountConfig" => &["apiVersion", "kind", "issuer", "accepted"],
        "KubeletConfig" => &[
            "apiVersion",
            "kind",
            "image",
            "config",
            "extraArgs",
            "clusterDNS",
            "defaultRuntimeSeccompProfileEnabled",
        ],
        "ResolverConfig" => &[
            "apiVersion",
            "kind",
            "nameservers",
            "searchDomains",
            "hostDNS",
        ],
        "SecurityProfileConfig" => &["apiVersion", "kind", "workloadIsolation"],
        "TimeSyncConfig" => &["apiVersion", "kind", "enabled", "bootTimeout", "ntp", "ptp"],
        "UnattendedInstallConfig" => &["apiVersion", "kind", "reboot", "installer", "provisioning"],
        "VolumeConfig" => &[
            "apiVersion",
            "kind",
            "name",
            "provisioning",
            "filesystem",
            "encryption",
            "mount",
            "trim",
            "scrub",
        ],
        _ => return None,
    })
}

const MACHINE_KEYS: &[&str] = &[
    "type",
    "token",
    "ca",
    "acceptedCAs",
    "certSANs",
    "controlPlane",
    "kubelet",
    "pods",
    "network",
    "disks",
    "install",
    "files",
    "env",
    "time",
    "sysctls",
    "sysfs",
    "registries",
    "systemDiskEncryption",
    "features",
    "udev",
    "logging",
    "kernel",
    "seccompProfiles",
    "baseRuntimeSpecOverrides",
    "nodeLabels",
    "nodeAnnotations",
    "nodeTaints",
];

const CLUSTER_KEYS: &[&str] = &[
    "id",
    "secret",
    "controlPlane",
    "clusterName",
    "network",
    "token",
    "aescbcEncryptionSecret",
    "secretboxEncryptionSecret",
    "ca",
    "acceptedCAs",
    "aggregatorCA",
    "serviceAccount",
    "apiServer",
    "controllerManager",
    "proxy",
    "scheduler",
    "discovery",
    "etcd",
    "coreDNS",
    "externalCloudProvider",
    "extraManifests",
    "extraManifestHeaders",
    "inlineManifests",
    "adminKubeconfig",
    "allowSchedulingOnMasters",
    "allowSchedulingOnControlPlanes",
];

/// The shape of a Go struct, for the unknown keys below its top level: each known key, and
/// what its value decodes into.
enum Shape {
    /// A scalar, or anything not checked further.
    Leaf,
    /// A struct with these keys.
    Struct(&'static [(&'static str, Shape)]),
    /// A list of structs of this shape.
    List(&'static [(&'static str, Shape)]),
}

/// `block.ProvisioningSpec`.
const PROVISIONING: Shape = Shape::Struct(&[
    ("diskSelector", Shape::Struct(&[("match", Shape::Leaf)])),
    ("grow", Shape::Leaf),
    ("minSize", Shape::Leaf),
    ("maxSize", Shape::Leaf),
]);

/// `block.EncryptionKey`.
const ENCRYPTION_KEY: &[(&str, Shape)] = &[
    ("slot", Shape::Leaf),
    ("static", Shape::Struct(&[("passphrase", Shape::Leaf)])),
    ("nodeID", Shape::Struct(&[])),
    ("kms", Shape::Struct(&[("endpoint", Shape::Leaf)])),
    (
        "tpm",
        Shape::Struct(&[
            ("options", Shape::Struct(&[("pcrs", Shape::Leaf)])),
            ("checkSecurebootStatusOnEnroll", Shape::Leaf),
        ]),
    ),
    ("lockToState", Shape::Leaf),
];

/// `block.UserMountSpec`.
const USER_MOUNT: Shape =
    Shape::Struct(&[("disableAccessTime", Shape::Leaf), ("secure", Shape::Leaf)]);

/// `UserVolumeConfigV1Alpha1` of 1.13 (`pkg/machinery/config/types/block`).
const USER_VOLUME_CONFIG_1_13: &[(&str, Shape)] = &[
    ("apiVersion", Shape::Leaf),
    ("kind", Shape::Leaf),
    ("name", Shape::Leaf),
    ("volumeType", Shape::Leaf),
    ("provisioning", PROVISIONING),
    (
        "filesystem",
        Shape::Struct(&[("type", Shape::Leaf), ("projectQuotaSupport", Shape::Leaf)]),
    ),
    (
        "encryption",
        Shape::Struct(&[
            ("provider", Shape::Leaf),
            ("keys", Shape::List(ENCRYPTION_KEY)),
            ("cipher", Shape::Leaf),
            ("keySize", Shape::Leaf),
            ("blockSize", Shape::Leaf),
            ("options", Shape::Leaf),
        ]),
    ),
    ("mount", USER_MOUNT),
];

/// `UserVolumeConfigV1Alpha1` of 1.14: the xfs options, `allowDiscards`, trim and scrub.
const USER_VOLUME_CONFIG_1_14: &[(&str, Shape)] = &[
    ("apiVersion", Shape::Leaf),
    ("kind", Shape::Leaf),
    ("name", Shape::Leaf),
    ("volumeType", Shape::Leaf),
    ("provisioning", PROVISIONING),
    (
        "filesystem",
        Shape::Struct(&[
            ("type", Shape::Leaf),
            ("projectQuotaSupport", Shape::Leaf),
            (
                "xfs",
                Shape::Struct(&[("minAllocationGroupSize", Shape::Leaf)]),
            ),
        ]),
    ),
    (
        "encryption",
        Shape::Struct(&[
            ("provider", Shape::Leaf),
            ("keys", Shape::List(ENCRYPTION_KEY)),
            ("cipher", Shape::Leaf),
            ("keySize", Shape::Leaf),
            ("blockSize", Shape::Leaf),
            ("options", Shape::Leaf),
            ("allowDiscards", Shape::Leaf),
        ]),
    ),
    ("mount", USER_MOUNT),
    (
        "trim",
        Shape::Struct(&[("enabled", Shape::Leaf), ("interval", Shape::Leaf)]),
    ),
    (
        "scrub",
        Shape::Struct(&[("enabled", Shape::Leaf), ("interval", Shape::Leaf)]),
    ),
];

/// The kinds checked below their top level, by release.
fn shape_of(talos: &Talos, kind: &str) -> Option<&'static [(&'static str, Shape)]> {
    match kind {
        "UserVolumeConfig" if talos.minor == Minor::V13 => Some(USER_VOLUME_CONFIG_1_13),
        "UserVolumeConfig" => Some(USER_VOLUME_CONFIG_1_14),
        _ => None,
    }
}

/// The keys of `node` a struct of `fields` does not know, recursively (a list reports only
/// its items with unknown keys).
fn unknown_in(fields: &[(&str, Shape)], node: &Node) -> Option<Json> {
    let mut unknown = Map::new();
    for (key, value) in node.entries() {
        let Some((_, shape)) = fields.iter().find(|(name, _)| *name == key.name) else {
            unknown.insert(key.name.clone(), value.to_json());
            continue;
        };
        let inner = match (shape, &value.value) {
            (Shape::Struct(inner), Value::Map(_)) => unknown_in(inner, value),
            (Shape::List(inner), Value::Seq(items)) => {
                let found: Vec<Json> = items
                    .iter()
                    .filter(|i| matches!(i.value, Value::Map(_)))
                    .filter_map(|i| unknown_in(inner, i))
                    .collect();
                (!found.is_empty()).then_some(Json::Array(found))
            }
            _ => None,
        };
        if let Some(inner) = inner {
            unknown.insert(key.name.clone(), inner);
        }
    }
    (!unknown.is_empty()).then_some(Json::Object(unknown))
}

/// The unknown part of a document, as xyaml.CheckUnknownKeys reports it.
fn unknown_keys(talos: &Talos, kind: &str, node: &Node) -> Option<Json> {
    if let Some(fields) = shape_of(talos, kind) {
        return unknown_in(fields, node);
    }
    let known = known_keys(kind)?;
    let mut unknown = Map::new();
    for (key, value) in node.entries() {
        if !known.contains(&key.name.as_str()) {
            unknown.insert(key.name.clone(), value.to_json());
            continue;
        }
        let section = match (kind, key.name.as_str()) {
            ("v1alpha1", "machine") => MACHINE_KEYS,
            ("v1alpha1", "cluster") => CLUSTER_KEYS,
            _ => continue,
        };
        let inner: Map<String, Json> = value
            .entries()
            .iter()
            .filter(|(k, _)| !section.contains(&k.name.as_str()))
            .map(|(k, v)| (k.name.clone(), v.to_json()))
            .collect();
        if !inner.is_empty() {
            unknown.insert(key.name.clone(), Json::Object(inner));
        }
    }
    (!unknown.is_empty()).then_some(Json::Object(unknown))
}

//! The checks of the legacy v1alpha1 document (`v1alpha1.Config.Validate` and
//! `RuntimeValidate`, talos-facts §11.4), per release, in Talos's order. Each returns the
//! warnings and the errors as go-multierror flattens them.

use super::cel::DiskFields;
use super::disks;
use super::gofmt::{self, quote};
use super::yaml::Node;
use super::{Minor, Runtime};

/// Warnings and errors of one check.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) warnings: Vec<String>,
    pub(crate) errors: Vec<String>,
}

/// The machine type as `machine.ParseType` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Type {
    Init,
    ControlPlane,
    Worker,
    Unknown,
}

impl Type {
    /// Parses `machine.type`.
    pub(crate) fn parse(raw: &str) -> Self {
        match raw {
            "init" => Self::Init,
            "controlplane" => Self::ControlPlane,
            "worker" | "join" | "" => Self::Worker,
            _ => Self::Unknown,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::ControlPlane => "controlplane",
            Self::Worker => "worker",
            Self::Unknown => "unknown",
        }
    }

    /// Init and controlplane.
    pub(crate) fn is_control_plane(self) -> bool {
        matches!(self, Self::Init | Self::ControlPlane)
    }
}

/// The machine type of a v1alpha1 document (`TypeUnknown` without a machine section).
pub(crate) fn machine_type(doc: Option<&Node>) -> Type {
    match doc.and_then(|d| d.get("machine")) {
        Some(machine) => Type::parse(&machine.str_at(&["type"])),
        None => Type::Unknown,
    }
}

/// `constants.DefaultKubernetesVersion` of the running release.
pub(crate) fn default_k8s(minor: Minor) -> &'static str {
    match minor {
        Minor::V13 => "1.36.3",
        Minor::V14 => "1.37.0",
    }
}

/// `compatibility.ValidateKubernetesImageTag` against the running Talos release.
pub(crate) fn validate_image_tag(rt: &Runtime, image: &str) -> Result<(), String> {
    let Some(index) = image.rfind(":v") else {
        return Err(format!(
            "failed to parse Kubernetes version from image reference {}: invalid image reference: {}",
            quote(image),
            quote(image)
        ));
    };
    let mut version = &image[index + 2..];
    if let Some(at) = version.find('@') {
        version = &version[..at];
    }
    let Some(parsed) = semver_tolerant(version) else {
        return Err(format!(
            "failed to parse Kubernetes version from image reference {}: {}",
            quote(image),
            semver_error(version)
        ));
    };
    let (min, max) = match rt.talos.minor {
        Minor::V13 => ((1, 31, 0), (1, 36, 99)),
        Minor::V14 => ((1, 32, 0), (1, 37, 99)),
    };
    let shown = format!("{}.{}.{}", parsed.0, parsed.1, parsed.2);
    if parsed < min {
        return Err(format!(
            "version of Kubernetes {shown} is too old to be used with Talos {}",
            rt.talos.version
        ));
    }
    if parsed >= max {
        return Err(format!(
            "version of Kubernetes {shown} is too new to be used with Talos {}",
            rt.talos.version
        ));
    }
    Ok(())
}

fn semver_tolerant(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

fn semver_error(v: &str) -> String {
    if v.is_empty() {
        "Version string empty".into()
    } else {
        format!("Invalid character(s) found in major number {}", quote(v))
    }
}

/// go-multierror's Append of a nested multierror: its errors, flattened.
fn append(out: &mut Vec<String>, errors: Vec<String>) {
    out.extend(errors);
}

fn valid_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() - name.matches('.').count() > 255 {
        return false;
    }
    let labels_ok = |candidate: &str| {
        !candidate.is_empty()
            && candidate.split('.').all(|label| {
                let mut chars = label.chars();
                match chars.next() {
                    Some(first) if first.is_ascii_alphanumeric() || first == '_' => {}
                    _ => return false,
                }
                label.len() <= 63
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            })
    };
    labels_ok(name)
        || ((name.ends_with('.') || name.ends_with('_')) && labels_ok(&name[..name.len() - 1]))
}

fn cluster_validate(rt: &Runtime, cluster: Option<&Node>, is_cp: bool) -> Vec<String> {
    let Some(c) = cluster else {
        return vec!["cluster instructions are required".into()];
    };
    let mut result = Vec::new();
    let control_plane = c.get("controlPlane");
    let endpoint = control_plane.and_then(|cp| cp.get("endpoint"));
    match rt.talos.minor {
        Minor::V13 => {
            let Some(endpoint) = endpoint else {
                return vec!["cluster controlplane endpoint is required".into()];
            };
            if let Err(e) = gofmt::validate_endpoint_uri(&endpoint.text()) {
                result.push(format!("invalid controlplane endpoint: {e}"));
            }
        }
        Minor::V14 => {
            if control_plane.is_some() {
                let Some(endpoint) = endpoint else {
                    return vec!["cluster controlplane endpoint is required (.cluster.controlPlane.endpoint); when the endpoint is migrated to the KubeClusterConfig document, the whole .cluster.controlPlane section should be removed (.cluster.controlPlane.localAPIServerPort is migrated to the KubeAPIServerConfig document)".into()];
                };
                if let Err(e) = gofmt::validate_endpoint_uri(&endpoint.text()) {
                    result.push(format!("invalid controlplane endpoint: {e}"));
                }
            }
            if c.get("serviceAccount").is_some() && endpoint.is_none() {
                result.push(".cluster.serviceAccount requires the cluster endpoint to be set in the same document (.cluster.controlPlane.endpoint); when the cluster endpoint is migrated to the KubeClusterConfig document, .cluster.serviceAccount should be migrated to the KubeServiceAccountConfig document as well".into());
            }
        }
    }
    let dns_domain = c.str_at(&["network", "dnsDomain"]);
    if c.get("network").is_some() && !dns_domain.is_empty() && !valid_dns_name(&dns_domain) {
        result.push(format!("{} is not a valid DNS name", quote(&dns_domain)));
    }
    if let Some(etcd) = c.get("etcd") {
        if is_cp {
            append(&mut result, etcd_validate(etcd));
        } else {
            result.push("etcd config is only allowed on control plane machines".into());
        }
    }
    if let Some(ca) = c.get("ca")
        && !is_cp
        && !ca.str_at(&["key"]).is_empty()
    {
        result.push("cluster CA key is not allowed on non-controlplane nodes (.cluster.ca)".into());
    }
    // Inline manifests.
    let mut names: Vec<String> = Vec::new();
    for manifest in c
        .get("inlineManifests")
        .map(Node::items)
        .unwrap_or_default()
    {
        let name = manifest.str_at(&["name"]);
        if name.trim().is_empty() {
            result.push("inline manifest name can't be empty".into());
        }
        if names.contains(&name) {
            result.push(format!(
                "inline manifest name {} is duplicate",
                quote(&name)
            ));
        }
        names.push(name);
    }
    // Discovery.
    if let Some(discovery) = c.get("discovery")
        && discovery.bool_at(&["enabled"]) == Some(true)
        && discovery.bool_at(&["registries", "service", "disabled"]) != Some(true)
    {
        let mut endpoint = discovery.str_at(&["registries", "service", "endpoint"]);
        if endpoint.is_empty() {
            endpoint = "https://discovery.talos.dev/".into();
        }
        match gofmt::parse_request_uri(&endpoint) {
            Err(e) => {
                result.push(format!(
                    "cluster discovery service registry endpoint is invalid: {e}"
                ));
            }
            Ok(url) if !url.path.is_empty() && url.path != "/" => {
                result.push("cluster discovery service path should be empty".into());
            }
            Ok(_) => {}
        }
        if c.str_at(&["id"]).is_empty() {
            result.push("cluster discovery service requires .cluster.id".into());
        }
        if c.str_at(&["secret"]).is_empty() {
            result.push("cluster discovery service requires .cluster.secret".into());
        }
    }
    result
}

fn etcd_validate(etcd: &Node) -> Vec<String> {
    let mut result = Vec::new();
    if etcd.get("ca").is_none() {
        result.push("key/cert combination should not be empty".into());
    }
    let subnet = etcd.str_at(&["subnet"]);
    let advertised = etcd.strings_at(&["advertisedSubnets"]);
    if !subnet.is_empty() && !advertised.is_empty() {
        result.push("etcd subnet can't be set when advertised subnets are set".into());
    }
    let advertised = if subnet.is_empty() {
        advertised
    } else {
        vec![subnet]
    };
    for cidr in &advertised {
        if gofmt::parse_subnet_or_address(cidr.trim_start_matches('!')).is_err() {
            result.push(format!(
                "etcd advertised subnet is not valid: {}",
                quote(cidr.trim_start_matches('!'))
            ));
        }
    }
    let mut listen = etcd.strings_at(&["listenSubnets"]);
    if listen.is_empty() {
        listen = advertised;
    }
    for cidr in &listen {
        if gofmt::parse_subnet_or_address(cidr.trim_start_matches('!')).is_err() {
            result.push(format!(
                "etcd listen subnet is not valid: {}",
                quote(cidr.trim_start_matches('!'))
            ));
        }
    }
    result
}

fn validate_cni(cluster: Option<&Node>) -> Outcome {
    let mut out = Outcome::default();
    let cni = cluster.and_then(|c| c.at(&["network", "cni"]));
    let name = cni.map_or_else(|| "flannel".to_owned(), |c| c.str_at(&["name"]));
    let urls = cni.map(|c| c.strings_at(&["urls"])).unwrap_or_default();
    let flannel_args = cni
        .and_then(|c| c.at(&["flannel", "extraArgs"]))
        .is_some_and(|a| !a.is_empty());
    let policies =
        cni.and_then(|c| c.bool_at(&["flannel", "kubeNetworkPoliciesEnabled"])) == Some(true);
    match name.as_str() {
        "flannel" => {
            if !urls.is_empty() {
                out.errors.push(format!(
                    "\"urls\" field should be empty for {} CNI",
                    quote(&name)
                ));
            }
        }
        "none" | "custom" => {
            if name == "none" && !urls.is_empty() {
                out.errors.push(format!(
                    "\"urls\" field should be empty for {} CNI",
                    quote(&name)
                ));
            }
            if name == "custom" && urls.is_empty() {
                out.warnings.push(format!(
                    "\"urls\" field should not be empty for {} CNI",
                    quote(&name)
                ));
            }
            if flannel_args {
                out.errors.push(format!(
                    "\"flanneldExtraArgs\" field should be empty for {} CNI",
                    quote(&name)
                ));
            }
            if policies {
                out.errors.push(format!(
                    "\"flannelKubeNetworkPoliciesEnabled\" should not be enabled for {} CNI",
                    quote(&name)
                ));
            }
            if name == "custom" {
                for url in &urls {
                    if let Err(e) = gofmt::validate_endpoint_uri(url) {
                        out.errors.push(e);
                    }
                }
            }
        }
        _ => out
            .errors
            .push("cni name should be one of [\"flannel\", \"custom\", \"none\"]".into()),
    }
    out
}

fn validate_ip_or_cidr(address: &str) -> Result<(), String> {
    if address.contains('/') {
        return gofmt::parse_prefix(address)
            .map(|_| ())
            .map_err(|_| format!("invalid CIDR address: {address}"));
    }
    gofmt::parse_addr(address)
        .map(|_| ())
        .map_err(|_| format!("failed to parse IP address {}", quote(address)))
}

fn network_validate(machine: &Node, out: &mut Outcome) {
    let Some(network) = machine.get("network") else {
        return;
    };
    for device in network
        .get("interfaces")
        .map(Node::items)
        .unwrap_or_default()
    {
        let interface = device.str_at(&["interface"]);
        if device.bool_at(&["ignore"]) == Some(true) {
            continue;
        }
        let selector = device.get("deviceSelector");
        if interface.is_empty() && selector.is_none() {
            out.errors.push("[networking.os.device.interface], [networking.os.device.deviceSelector]: required either config section to be set".into());
        } else if !interface.is_empty() && selector.is_some() {
            out.errors.push("[networking.os.device.interface], [networking.os.device.deviceSelector]: config sections are mutually exclusive".into());
        }
        if selector.is_some_and(Node::is_empty) {
            out.errors.push("[networking.os.device.deviceSelector]: config section should contain at least one field".into());
        }
        let cidr = device.str_at(&["cidr"]);
        let addresses = device.strings_at(&["addresses"]);
        if !addresses.is_empty() && !cidr.is_empty() {
            out.errors.push(format!(
                "[networking.os.device] {}: interface can't have both .cidr and .addresses set",
                quote(&interface)
            ));
        }
        if !cidr.is_empty() {
            if let Err(e) = validate_ip_or_cidr(&cidr) {
                out.errors.push(format!(
                    "[networking.os.device.CIDR] {}: {e}",
                    quote(&interface)
                ));
            }
            out.warnings.push(format!(
                "{}: machine.network.interface.cidr is deprecated, please use machine.network.interface.addresses",
                quote(&interface)
            ));
        }
        for address in &addresses {
            if let Err(e) = validate_ip_or_cidr(address) {
                out.errors.push(format!(
                    "[networking.os.device.addresses] {}: {e}",
                    quote(&interface)
                ));
            }
        }
    }
}

/// `labels.Validate` / `ValidateAnnotations` / `ValidateTaints`, as one multierror text.
pub(crate) fn labels_error(kind: LabelKind, entries: &[(String, String)]) -> Option<String> {
    let mut sorted: Vec<&(String, String)> = entries.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut errors = Vec::new();
    for (key, value) in sorted {
        if let Err(e) = qualified_name(key) {
            errors.push(e);
            if kind == LabelKind::Taints {
                continue;
            }
        }
        match kind {
            LabelKind::Labels => {
                if let Err(e) = label_value(value) {
                    errors.push(e);
                }
            }
            LabelKind::Annotations => {}
            LabelKind::Taints => {
                let (val, effect, found) = match value.split_once(':') {
                    Some((v, e)) => (v, e, true),
                    None => (value.as_str(), value.as_str(), false),
                };
                if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
                    errors.push(format!("invalid taint effect: {}", quote(effect)));
                    continue;
                }
                if found && let Err(e) = label_value(val) {
                    errors.push(e);
                }
            }
        }
    }
    (!errors.is_empty()).then(|| gofmt::multierror(&errors))
}

/// Which of the label validators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LabelKind {
    Labels,
    Annotations,
    Taints,
}

fn qname_ok(name: &str) -> bool {
    let bytes = name.as_bytes();
    match bytes {
        [] => false,
        [one] => one.is_ascii_alphanumeric(),
        [first, middle @ .., last] => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && middle
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        }
    }
}

fn dns1123_subdomain_ok(value: &str) -> bool {
    value.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
            && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    })
}

fn qualified_name(value: &str) -> Result<(), String> {
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err(format!("prefix cannot be empty: {}", quote(value)));
            }
            if prefix.len() > 253 {
                return Err(format!(
                    "prefix {} is invalid: domain name length exceeds limit of 253: {}",
                    quote(prefix),
                    quote(prefix)
                ));
            }
            if !dns1123_subdomain_ok(prefix) {
                return Err(format!(
                    "prefix {} is invalid: domain doesn't match required format: {}",
                    quote(prefix),
                    quote(prefix)
                ));
            }
            *name
        }
        _ => {
            return Err(format!(
                "invalid format: too many slashes: {}",
                quote(value)
            ));
        }
    };
    if name.is_empty() {
        return Err(format!("name cannot be empty: {}", quote(value)));
    }
    if name.len() > 63 {
        return Err(format!("name is too long: {} (limit is 63)", quote(value)));
    }
    if !qname_ok(name) {
        return Err(format!("name {} is invalid", quote(name)));
    }
    Ok(())
}

fn label_value(value: &str) -> Result<(), String> {
    if value.len() > 63 {
        return Err(format!(
            "label value length exceeds limit of 63: {}",
            quote(value)
        ));
    }
    if !value.is_empty() && !qname_ok(value) {
        return Err(format!("label value {} is invalid", quote(value)));
    }
    Ok(())
}

/// `Config.Validate(mode)` with no options (not strict, not local), as machined calls it.
pub(crate) fn validate(rt: &Runtime, doc: &Node) -> Outcome {
    let mut out = Outcome::default();
    let Some(machine) = doc.get("machine") else {
        out.errors.push("machine instructions are required".into());
        return out;
    };
    let cluster = doc.get("cluster");
    let raw_type = machine.str_at(&["type"]);
    let machine_type = Type::parse(&raw_type);
    if rt.talos.minor == Minor::V14 {
        if machine.get("files").is_some_and(|f| !f.is_empty()) {
            out.warnings.push(
                ".machine.files is deprecated; use dedicated configuration documents instead"
                    .into(),
            );
        }
        if machine
            .get("baseRuntimeSpecOverrides")
            .is_some_and(|f| !f.is_empty())
        {
            out.warnings.push(".machine.baseRuntimeSpecOverrides is deprecated; use a CRIBaseRuntimeSpecConfig document instead".into());
        }
    }
    append(
        &mut out.errors,
        cluster_validate(rt, cluster, machine_type.is_control_plane()),
    );
    let install = machine.get("install");
    if rt.requires_install() {
        match install {
            None if rt.talos.minor == Minor::V13 => out
                .errors
                .push("install instructions are required in \"metal\" mode".into()),
            None => {}
            Some(install) => {
                let matcher = match disks::legacy_selector(install) {
                    Ok(m) => m,
                    Err(e) => {
                        out.errors
                            .push(format!("install disk selector is invalid: {e}"));
                        None
                    }
                };
                if install.str_at(&["disk"]).is_empty() && matcher.is_none() {
                    out.errors
                        .push("either install disk or diskSelector should be defined".into());
                }
                if install
                    .get("extraKernelArgs")
                    .is_some_and(|a| !a.is_empty())
                    && install.bool_at(&["grubUseUKICmdline"]) == Some(true)
                {
                    out.errors.push(
                        "install.extraKernelArgs and install.grubUseUKICmdline can't be used together".into(),
                    );
                }
            }
        }
    }
    if let Some(host_dns) = machine.at(&["features", "hostDNS"])
        && host_dns.bool_at(&["forwardKubeDNSToHost"]) == Some(true)
        && host_dns.bool_at(&["enabled"]) != Some(true)
    {
        out.errors.push("feature hostDNS.forwardKubeDNSToHost requires hostDNS.enabled to be true (.machine.features.hostDNS)".into());
    }
    if machine_type != Type::Unknown && machine_type.name() != raw_type {
        out.warnings.push(format!(
            "use {} instead of {} for machine type",
            quote(machine_type.name()),
            quote(&raw_type)
        ));
    }
    let issuing_ca = machine.get("ca");
    let accepted_cas = machine.get("acceptedCAs").is_some_and(|a| !a.is_empty());
    if issuing_ca.is_none() && !accepted_cas {
        out.errors.push(
            "issuing CA or some accepted CAs are required (.machine.ca, machine.acceptedCAs)"
                .into(),
        );
    }
    match machine_type {
        Type::Init | Type::ControlPlane => {
            if rt.talos.minor == Minor::V13 || cluster.is_some_and(|c| c.get("network").is_some()) {
                let cni = validate_cni(cluster);
                out.warnings.extend(cni.warnings);
                append(&mut out.errors, cni.errors);
            }
            match issuing_ca {
                None => out
                    .errors
                    .push("issuing CA is required (.machine.ca)".into()),
                Some(ca) if ca.str_at(&["key"]).is_empty() => out.errors.push(
                    "issuing CA key is required for controlplane nodes (.machine.ca.key)".into(),
                ),
                Some(_) => {}
            }
        }
        Type::Worker => {
            for device in machine
                .at(&["network", "interfaces"])
                .map(Node::items)
                .unwrap_or_default()
            {
                if device.get("vip").is_some() {
                    out.errors.push(
                        "virtual (shared) IP is not allowed on non-controlplane nodes".into(),
                    );
                }
                for vlan in device.get("vlans").map(Node::items).unwrap_or_default() {
                    if vlan.get("vip").is_some() {
                        out.errors.push(
                            "virtual (shared) IP is not allowed on non-controlplane nodes".into(),
                        );
                    }
                }
            }
            if let Some(ca) = issuing_ca {
                if !ca.str_at(&["key"]).is_empty() {
                    out.errors.push("issuing Talos API CA key is not allowed on non-controlplane nodes (.machine.ca)".into());
                }
                if ca.str_at(&["crt"]).is_empty() && !accepted_cas {
                    out.errors.push("trusted CA certificates are required on non-controlplane nodes (.machine.ca.crt, .machine.acceptedCAs)".into());
                }
            }
            if cluster
                .and_then(|c| c.get("ca"))
                .is_some_and(|ca| !ca.str_at(&["key"]).is_empty())
            {
                out.errors.push("issuing Kubernetes API CA key is not allowed on non-controlplane nodes (.cluster.ca)".into());
            }
        }
        Type::Unknown => out
            .errors
            .push(format!("unknown machine type {}", quote(&raw_type))),
    }
    network_validate(machine, &mut out);
    if let Some(kubelet) = machine.get("kubelet") {
        for cidr in kubelet.strings_at(&["nodeIP", "validSubnets"]) {
            let cidr = cidr.trim_start_matches('!');
            if gofmt::parse_subnet_or_address(cidr).is_err() {
                out.errors.push(format!(
                    "kubelet nodeIP subnet is not valid: {}",
                    quote(cidr)
                ));
            }
        }
    }
    for (key, kind, what) in [
        ("nodeLabels", LabelKind::Labels, "labels"),
        ("nodeAnnotations", LabelKind::Annotations, "annotations"),
        ("nodeTaints", LabelKind::Taints, "taints"),
    ] {
        if let Some(error) = labels_error(kind, &machine.string_map_at(&[key])) {
            out.errors
                .push(format!("invalid machine node {what}: {error}"));
        }
    }
    if doc.bool_at(&["persist"]) == Some(false) {
        out.errors.push(".persist should be enabled".into());
    }
    if rt.talos.minor == Minor::V14 {
        append(
            &mut out.errors,
            kubernetes_versions(rt, machine, cluster, machine_type, true),
        );
    }
    out
}

/// `ValidateKubernetesVersions` (1.14, in Validate) and the image checks of 1.13's
/// RuntimeValidate: the kubelet image and, on control planes, the control-plane images, each
/// with Talos's default when unset.
fn kubernetes_versions(
    rt: &Runtime,
    machine: &Node,
    cluster: Option<&Node>,
    machine_type: Type,
    only_explicit_kubelet: bool,
) -> Vec<String> {
    let mut result = Vec::new();
    let default = default_k8s(rt.talos.minor);
    let kubelet = machine.get("kubelet");
    if kubelet.is_some() || !only_explicit_kubelet {
        let mut image = kubelet.map(|k| k.str_at(&["image"])).unwrap_or_default();
        if image.is_empty() {
            image = format!("ghcr.io/siderolabs/kubelet:v{default}");
        }
        if let Err(e) = validate_image_tag(rt, &image) {
            result.push(format!("kubelet image is not valid: {e}"));
        }
    }
    if let Some(cluster) = cluster
        && machine_type.is_control_plane()
    {
        for (name, key) in [
            ("kube-apiserver", "apiServer"),
            ("kube-controller-manager", "controllerManager"),
            ("kube-scheduler", "scheduler"),
        ] {
            let mut image = cluster.str_at(&[key, "image"]);
            if image.is_empty() {
                image = format!("registry.k8s.io/{name}:v{default}");
            }
            if let Err(e) = validate_image_tag(rt, &image) {
                result.push(format!("{name} image is not valid: {e}"));
            }
        }
    }
    result
}

/// `Config.RuntimeValidate`: the install selector against the machine's disks (and, on 1.13,
/// the Kubernetes image versions against the running release).
pub(crate) fn runtime_validate(rt: &Runtime, doc: &Node, disks: &[DiskFields]) -> Outcome {
    let mut out = Outcome::default();
    let Some(machine) = doc.get("machine") else {
        return out;
    };
    if rt.requires_install()
        && let Some(install) = machine.get("install")
    {
        match disks::legacy_selector(install) {
            Err(e) => out
                .errors
                .push(format!("install disk selector is invalid: {e}")),
            Ok(Some(selector)) => {
                if !disks.iter().any(|d| selector.matches(d)) {
                    out.errors.push(format!(
                        "no disks matched the expression: {}",
                        selector.expression
                    ));
                }
            }
            Ok(None) => {}
        }
    }
    if machine
        .at(&["install", "extensions"])
        .is_some_and(|e| !e.is_empty())
    {
        out.warnings.push(".machine.install.extensions is deprecated, please see https://docs.siderolabs.com/talos/latest/platform-specific-installations/boot-assets".into());
    }
    if rt.talos.minor == Minor::V13 {
        let machine_type = Type::parse(&machine.str_at(&["type"]));
        append(
            &mut out.errors,
            kubernetes_versions(rt, machine, doc.get("cluster"), machine_type, false),
        );
    }
    out
}

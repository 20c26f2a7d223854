//! Applying config patches to rendered documents, in a defined order (cluster → class →
//! machine), with errors that name the patch and the path.
//!
//! Strategic merge: objects merge key by key, lists append the items they lack, `null` removes
//! a key; typed documents merge into the document of the same kind (and `name`) or are added.
//! RFC 6902 operations apply to the v1alpha1 document. No patch may set a secret field (the
//! bundle owns them), and on contract 1.14 a patch may not set a legacy v1alpha1 field whose
//! typed document replaces it.

use ichor_api::config::{ConfigPatch, SECRET_PATH_PATTERNS, SECRET_PATHS};
use regex::Regex;
use serde_json::{Map, Value};

use crate::Contract;

/// A patch that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{patch}: {path}: {reason}")]
pub struct PatchError {
    /// Which patch: layer, position and name, e.g. `machine patch 2 ("mtu")`.
    pub patch: String,
    /// The path inside the patch, e.g. `machine.install.disk`.
    pub path: String,
    /// Why it was refused.
    pub reason: String,
}

/// Typed documents that carry only secrets: the bundle renders them.
const SECRET_KINDS: &[&str] = &[
    "DiscoveryIdentityConfig",
    "KubeEtcdEncryptionConfig",
    "SideroLinkConfig",
];

/// Secret fields of typed documents, as `Kind.path` (talos-facts §4.3).
const SECRET_DOCUMENT_FIELDS: &[(&str, &str)] = &[
    ("KubeAPIServerCAConfig", "issuingCA"),
    ("KubeAggregatorCAConfig", "issuingCA"),
    ("KubeServiceAccountConfig", "issuer.privateKey"),
    ("WireguardConfig", "privateKey"),
    ("WireguardConfig", "peers.presharedKey"),
    ("HCloudVIPConfig", "apiToken"),
    ("RegistryAuthConfig", "password"),
    ("RegistryAuthConfig", "auth"),
    ("RegistryAuthConfig", "identityToken"),
    ("RegistryTLSConfig", "clientIdentity.key"),
];

/// Legacy v1alpha1 fields that contract 1.14 replaces with a typed document.
const LEGACY_ON_1_14: &[(&str, &str)] = &[
    ("machine.install", "UnattendedInstallConfig"),
    (
        "machine.kubelet",
        "KubeletConfig (and KubeNodeConfig for nodeIP)",
    ),
    (
        "machine.network",
        "LinkConfig, ResolverConfig, HostnameConfig and the other network documents",
    ),
    ("machine.time", "TimeSyncConfig"),
    ("machine.sysctls", "SysctlConfig"),
    ("machine.sysfs", "SysfsConfig"),
    ("machine.udev", "UdevRulesConfig"),
    ("machine.kernel", "KernelModuleConfig"),
    (
        "machine.registries",
        "RegistryMirrorConfig and RegistryTLSConfig",
    ),
    ("machine.env", "EnvironmentConfig"),
    ("machine.nodeLabels", "KubeNodeConfig"),
    ("machine.nodeAnnotations", "KubeNodeConfig"),
    ("machine.nodeTaints", "KubeNodeConfig"),
    ("cluster.network", "KubeNetworkConfig"),
    ("cluster.apiServer", "KubeAPIServerConfig"),
    ("cluster.controllerManager", "KubeControllerManagerConfig"),
    ("cluster.scheduler", "KubeSchedulerConfig"),
    ("cluster.proxy", "KubeProxyConfig"),
    ("cluster.discovery", "DiscoveryServiceConfig"),
    ("cluster.coreDNS", "KubeCoreDNSConfig"),
    ("cluster.inlineManifests", "KubeInlineManifestConfig"),
    ("cluster.extraManifests", "KubeExternalManifestConfig"),
];

/// Whether a typed document kind was introduced with contract 1.14 (talos-facts §4.4), so a
/// 1.13 node does not know it.
pub fn needs_1_14(kind: &str) -> bool {
    kind.starts_with("Kube")
        || kind.starts_with("LVM")
        || kind.starts_with("CRI")
        || matches!(
            kind,
            "DiscoveryServiceConfig"
                | "UnattendedInstallConfig"
                | "SysctlConfig"
                | "SysfsConfig"
                | "UdevRulesConfig"
                | "KernelModuleConfig"
                | "EtcFileConfig"
                | "SecurityProfileConfig"
                | "FilesystemTrimConfig"
                | "FilesystemScrubConfig"
                | "ImageCacheConfig"
                | "ContainerConfig"
                | "RAIDArrayConfig"
                | "VethConfig"
                | "HTTPProbeConfig"
                | "BGPInstanceConfig"
        )
}

struct Context {
    patch: String,
}

impl Context {
    fn error(&self, path: impl Into<String>, reason: impl Into<String>) -> PatchError {
        PatchError {
            patch: self.patch.clone(),
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// Applies one patch to `documents` (the v1alpha1 document first).
pub fn apply(
    documents: &mut Vec<Value>,
    contract: Contract,
    layer: &str,
    index: usize,
    patch: &ConfigPatch,
) -> Result<(), PatchError> {
    let ctx = Context {
        patch: match &patch.name {
            Some(name) => format!("{layer} patch {index} ({name:?})"),
            None => format!("{layer} patch {index}"),
        },
    };
    if !patch.json_patch.is_empty() {
        return apply_json(documents, contract, &ctx, patch);
    }
    for (section, value) in [("machine", &patch.machine), ("cluster", &patch.cluster)] {
        let Some(value) = value else { continue };
        let mut path = format!("/{section}");
        check_legacy_value(&ctx, contract, &mut path, value)?;
        let target = documents[0]
            .as_object_mut()
            .expect("the v1alpha1 document is an object")
            .entry(section)
            .or_insert_with(|| Value::Object(Map::new()));
        merge(target, value.clone());
    }
    for (kind, value) in patch.documents.iter().flatten() {
        apply_document(documents, contract, &ctx, kind, value)?;
    }
    Ok(())
}

fn pointer_to_dotted(pointer: &str) -> String {
    pointer.trim_start_matches('/').replace('/', ".")
}

fn secret_patterns() -> &'static [Regex] {
    static PATTERNS: std::sync::OnceLock<Vec<Regex>> = std::sync::OnceLock::new();
    PATTERNS.get_or_init(|| {
        SECRET_PATH_PATTERNS
            .iter()
            .map(|p| Regex::new(p).expect("the secret patterns are valid RE2"))
            .collect()
    })
}

/// Refuses a JSON pointer that is or lies inside a secret or (on 1.14) a legacy field. With
/// `whole_subtree` (RFC 6902, whose value replaces everything below the pointer) a pointer that
/// merely contains a secret is refused too.
fn check_pointer(
    ctx: &Context,
    contract: Contract,
    pointer: &str,
    whole_subtree: bool,
) -> Result<(), PatchError> {
    let reaches = |secret: &str| {
        secret == pointer
            || pointer.starts_with(&format!("{secret}/"))
            || (whole_subtree && secret.starts_with(&format!("{pointer}/")))
    };
    let pattern_hit = secret_patterns().iter().any(|p| p.is_match(pointer));
    if pointer == "/" || SECRET_PATHS.iter().any(|s| reaches(s)) || pattern_hit {
        return Err(ctx.error(
            pointer_to_dotted(pointer),
            "reaches a secret field: tokens, CA keys and encryption secrets come only from the secrets bundle",
        ));
    }
    if contract == Contract::V1_14 {
        let dotted = pointer_to_dotted(pointer);
        if let Some((legacy, replacement)) = LEGACY_ON_1_14
            .iter()
            .find(|(legacy, _)| dotted == *legacy || dotted.starts_with(&format!("{legacy}.")))
        {
            return Err(ctx.error(
                dotted.clone(),
                format!("{legacy} is a legacy field on contract v1.14: use the {replacement} document instead"),
            ));
        }
    }
    Ok(())
}

/// Walks a patch value, checking every path in it with [`check_pointer`] (a path whose value is
/// not an object as a whole subtree).
fn check_legacy_value(
    ctx: &Context,
    contract: Contract,
    path: &mut String,
    value: &Value,
) -> Result<(), PatchError> {
    // A value that is not an object (a scalar, a list, `null`) replaces or removes everything
    // below its path, secrets included.
    check_pointer(ctx, contract, path, !value.is_object())?;
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let len = path.len();
                path.push('/');
                path.push_str(key);
                check_legacy_value(ctx, contract, path, child)?;
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("/{i}"));
                check_legacy_value(ctx, contract, path, child)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

fn apply_json(
    documents: &mut [Value],
    contract: Contract,
    ctx: &Context,
    patch: &ConfigPatch,
) -> Result<(), PatchError> {
    for (i, op) in patch.json_patch.iter().enumerate() {
        check_pointer(ctx, contract, &op.path, true)?;
        if let Some(from) = &op.from {
            check_pointer(ctx, contract, from, true)?;
        }
        let needs_value = matches!(
            op.op,
            ichor_api::config::JsonPatchOp::Add
                | ichor_api::config::JsonPatchOp::Replace
                | ichor_api::config::JsonPatchOp::Test
        );
        if needs_value && op.value.is_none() {
            return Err(ctx.error(
                format!("jsonPatch[{i}]"),
                "add, replace and test need a value",
            ));
        }
        // The value lands below the path: a user-supplied secret field inside it is refused
        // as if the path named it.
        if let Some(value) = &op.value {
            check_legacy_value(ctx, contract, &mut op.path.clone(), value)?;
        }
    }
    let ops = serde_json::to_value(&patch.json_patch).expect("operations serialize");
    let ops: json_patch::Patch = serde_json::from_value(ops)
        .map_err(|e| ctx.error("jsonPatch", format!("not an RFC 6902 patch: {e}")))?;
    json_patch::patch(&mut documents[0], &ops)
        .map_err(|e| ctx.error(format!("jsonPatch[{}]", e.operation), e.kind.to_string()))
}

fn apply_document(
    documents: &mut Vec<Value>,
    contract: Contract,
    ctx: &Context,
    kind: &str,
    value: &Value,
) -> Result<(), PatchError> {
    if SECRET_KINDS.contains(&kind) {
        return Err(ctx.error(
            format!("documents.{kind}"),
            "this document holds only secrets: the secrets bundle renders it",
        ));
    }
    if contract == Contract::V1_13 && needs_1_14(kind) {
        return Err(ctx.error(
            format!("documents.{kind}"),
            "this document needs contract v1.14 or later; on v1.13 patch the v1alpha1 machine and cluster sections",
        ));
    }
    let items: Vec<&Value> = match value {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    for item in items {
        let Value::Object(fields) = item else {
            return Err(ctx.error(format!("documents.{kind}"), "a document must be an object"));
        };
        for (secret_kind, field) in SECRET_DOCUMENT_FIELDS {
            if *secret_kind == kind && reaches_dotted(item, field) {
                return Err(ctx.error(
                    format!("documents.{kind}.{field}"),
                    "a secret field: it comes only from the secrets bundle",
                ));
            }
        }
        let name = fields.get("name").and_then(Value::as_str);
        let existing = documents
            .iter_mut()
            .skip(1)
            .find(|d| d["kind"] == kind && d.get("name").and_then(Value::as_str) == name);
        match existing {
            Some(target) => merge(target, item.clone()),
            None => {
                let mut new = Map::new();
                new.insert("apiVersion".into(), Value::String("v1alpha1".into()));
                new.insert("kind".into(), Value::String(kind.into()));
                new.extend(fields.clone());
                documents.push(Value::Object(new));
            }
        }
    }
    Ok(())
}

/// Whether `value` has the dotted path (descending into list items).
fn reaches_dotted(value: &Value, path: &str) -> bool {
    let Some((head, rest)) = path.split_once('.').map_or(Some((path, "")), Some) else {
        return false;
    };
    match value {
        Value::Array(items) => items.iter().any(|i| reaches_dotted(i, path)),
        Value::Object(map) => match map.get(head) {
            Some(child) if rest.is_empty() => !child.is_null(),
            Some(child) => reaches_dotted(child, rest),
            None => false,
        },
        _ => false,
    }
}

/// Strategic merge: objects key by key, lists append what they lack, `null` removes.
pub fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (key, value) in p {
                if value.is_null() {
                    t.remove(&key);
                } else {
                    merge(t.entry(key).or_insert(Value::Null), value);
                }
            }
        }
        (Value::Array(t), Value::Array(p)) => {
            for item in p {
                if !t.contains(&item) {
                    t.push(item);
                }
            }
        }
        (t, p) => *t = p,
    }
}

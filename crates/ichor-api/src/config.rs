//! Config patches: how a TalosCluster, TalosMachineClass or TalosMachine changes the rendered
//! Talos configuration.
//!
//! A patch is either a strategic merge — `machine` and `cluster` sections of the legacy v1alpha1
//! document, and typed documents under `documents` keyed by kind — or an RFC 6902 `jsonPatch`
//! against the v1alpha1 document. The schema of the strategic parts lists every field a user
//! may set and **no secret-bearing field** (they belong to the secrets bundle), so the apiserver
//! prunes a secret from any patch, however it arrives. RFC 6902 values cannot be pruned, so an
//! operation whose `path` or `from` reaches a secret field is refused. See
//! `docs/adr/0003-config-patch-schema.md`.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::Schema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The field-by-field description of what patches may set (see the file for its syntax).
const TALOS_SCHEMA: &str = include_str!("talos_schema.txt");

/// JSON pointers (into the v1alpha1 document) of the fields the secrets bundle owns.
pub const SECRET_PATHS: &[&str] = &[
    "/machine/token",
    "/machine/ca/key",
    "/cluster/secret",
    "/cluster/token",
    "/cluster/secretboxEncryptionSecret",
    "/cluster/aescbcEncryptionSecret",
    "/cluster/ca/key",
    "/cluster/aggregatorCA/key",
    "/cluster/serviceAccount/key",
    "/cluster/etcd/ca/key",
];

/// Regular expressions (RE2) over JSON pointers of user-supplied secret fields, which patches may
/// not carry either: they would sit unencrypted in a custom resource.
pub const SECRET_PATH_PATTERNS: &[&str] = &[
    "^/machine/network/interfaces/[^/]+/wireguard/(privateKey|peers/[^/]+/presharedKey)(/|$)",
    "^/machine/network/interfaces/[^/]+/(vlans/[^/]+/)?vip/(hcloud|equinixMetal)/apiToken(/|$)",
    "^/machine/registries/config/[^/]+/auth/(password|auth|identityToken)(/|$)",
    "^/machine/registries/config/[^/]+/tls/clientIdentity/key(/|$)",
    "^/machine/systemDiskEncryption/(state|ephemeral)/keys/[^/]+/static(/|$)",
];

/// A change to the rendered Talos configuration.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("has(self.machine) || has(self.cluster) || has(self.documents) || (has(self.jsonPatch) && size(self.jsonPatch) > 0)").message("a config patch needs machine, cluster, documents or jsonPatch"),
    validation = kube::core::Rule::new("!has(self.jsonPatch) || size(self.jsonPatch) == 0 || !(has(self.machine) || has(self.cluster) || has(self.documents))").message("a config patch is either a strategic merge (machine, cluster, documents) or a jsonPatch, not both: split it in two"),
    validation = kube::core::Rule::new("!has(self.machine) || !has(self.machine.type)").message("machine.type comes from the TalosMachine's spec.role: remove it from the patch"),
    validation = kube::core::Rule::new("!has(self.cluster) || !has(self.cluster.clusterName)").message("cluster.clusterName is the TalosCluster's name: remove it from the patch"),
    validation = kube::core::Rule::new("!has(self.cluster) || !has(self.cluster.controlPlane) || !has(self.cluster.controlPlane.endpoint)").message("cluster.controlPlane.endpoint comes from the TalosCluster's spec.endpoint: remove it from the patch"),
    validation = kube::core::Rule::new("!has(self.cluster) || !has(self.cluster.network) || !(has(self.cluster.network.podSubnets) || has(self.cluster.network.serviceSubnets) || has(self.cluster.network.dnsDomain))").message("pod subnets, service subnets and the DNS domain come from the TalosCluster's spec.network: remove them from the patch")
)]
pub struct ConfigPatch {
    /// A name for the patch, used in error messages and events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub name: Option<String>,
    /// Strategic merge into the `machine` section of the v1alpha1 document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "machine_schema")]
    pub machine: Option<Value>,
    /// Strategic merge into the `cluster` section of the v1alpha1 document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "cluster_schema")]
    pub cluster: Option<Value>,
    /// Typed documents by kind, merged into (or added to) the rendered documents of that kind.
    /// Named kinds (e.g. `LinkConfig`) take a list of documents, each with its `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "documents_schema")]
    pub documents: Option<BTreeMap<String, Value>>,
    /// RFC 6902 operations on the v1alpha1 document, applied in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub json_patch: Vec<JsonPatchOperation>,
}

/// One RFC 6902 operation.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new(secret_path_rule("self.path")).message("jsonPatch path reaches a secret field (tokens, CA keys, encryption secrets live only in the secrets bundle)"),
    validation = kube::core::Rule::new(format!("!has(self.from) || ({})", secret_path_rule("self.from"))).message("jsonPatch from reaches a secret field (tokens, CA keys, encryption secrets live only in the secrets bundle)"),
    validation = kube::core::Rule::new("(self.op != 'move' && self.op != 'copy') || has(self.from)").message("jsonPatch move and copy need from")
)]
pub struct JsonPatchOperation {
    /// `add`, `remove`, `replace`, `move`, `copy` or `test`.
    pub op: JsonPatchOp,
    /// A JSON pointer into the v1alpha1 document, e.g. `/machine/certSANs/-`.
    #[schemars(length(min = 1, max = 512), regex(pattern = r"^/"))]
    pub path: String,
    /// The source pointer of `move` and `copy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), regex(pattern = r"^/"))]
    pub from: Option<String>,
    /// The value of `add`, `replace` and `test` (any JSON; CEL cannot see an untyped field, so
    /// its presence is checked when the patch is rendered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value_schema")]
    pub value: Option<Value>,
}

/// The RFC 6902 operations.
#[derive(schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JsonPatchOp {
    /// Add a value.
    Add,
    /// Remove a value.
    Remove,
    /// Replace a value.
    Replace,
    /// Move a value.
    Move,
    /// Copy a value.
    Copy,
    /// Test a value.
    Test,
}

/// CEL, true when the JSON pointer `expr` neither is, contains nor lies inside a secret field.
fn secret_path_rule(expr: &str) -> String {
    let exact = SECRET_PATHS
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let patterns = SECRET_PATH_PATTERNS
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(", ");
    // An ancestor of a secret (`/machine`, `/cluster/ca`) reaches it too: its value replaces the
    // secret's subtree. Patterns are checked against the path and its would-be descendants.
    format!(
        "[{exact}].all(s, !(s == {expr} || s.startsWith({expr} + '/') || {expr}.startsWith(s + '/'))) && [{patterns}].all(p, !{expr}.matches(p)) && !({expr} in ['/', '/machine/network', '/machine/network/interfaces', '/machine/registries', '/machine/registries/config', '/machine/systemDiskEncryption'])"
    )
}

fn any_value_schema(_: &mut schemars::SchemaGenerator) -> Schema {
    to_schema(json!({
        "description": "Any JSON value.",
        "x-kubernetes-preserve-unknown-fields": true
    }))
}

fn machine_schema(_: &mut schemars::SchemaGenerator) -> Schema {
    to_schema(section_schema("machine"))
}

fn cluster_schema(_: &mut schemars::SchemaGenerator) -> Schema {
    to_schema(section_schema("cluster"))
}

fn documents_schema(_: &mut schemars::SchemaGenerator) -> Schema {
    to_schema(documents_json_schema())
}

fn to_schema(value: Value) -> Schema {
    Schema::try_from(value).expect("a JSON object is a schema")
}

/// The structural schema of one legacy section (`machine` or `cluster`).
pub fn section_schema(section: &str) -> Value {
    let tree = parse_tree();
    let section = tree
        .sections
        .iter()
        .find(|s| s.kind == SectionKind::Legacy && s.name == section)
        .expect("talos_schema.txt has the section");
    let mut schema = object_schema(&section.fields, section.name.as_str());
    schema["description"] = Value::String(format!(
        "Strategic merge into the `{}` section of the Talos v1alpha1 document.",
        section.name
    ));
    schema
}

/// The structural schema of `documents`: one property per supported kind.
pub fn documents_json_schema() -> Value {
    let tree = parse_tree();
    let mut properties = Map::new();
    for section in tree
        .sections
        .iter()
        .filter(|s| s.kind != SectionKind::Legacy)
    {
        let mut doc = object_schema(&section.fields, &section.name);
        let schema = if section.kind == SectionKind::Named {
            doc["properties"]["name"] = json!({
                "type": "string",
                "maxLength": 253,
                "description": format!("The {} document's name.", section.name)
            });
            doc["required"] = json!(["name"]);
            json!({
                "type": "array",
                "maxItems": 32,
                "description": format!("{} documents, each identified by its name.", section.name),
                "items": doc
            })
        } else {
            doc["description"] = Value::String(format!("The {} document.", section.name));
            doc
        };
        properties.insert(section.name.clone(), schema);
    }
    json!({
        "type": "object",
        "description": "Typed Talos config documents by kind.",
        "properties": properties
    })
}

/// All supported typed-document kinds, and whether each is named (a list).
pub fn document_kinds() -> Vec<(String, bool)> {
    parse_tree()
        .sections
        .iter()
        .filter(|s| s.kind != SectionKind::Legacy)
        .map(|s| (s.name.clone(), s.kind == SectionKind::Named))
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SectionKind {
    Legacy,
    Singleton,
    Named,
}

#[derive(Debug)]
struct Section {
    kind: SectionKind,
    name: String,
    fields: Vec<Field>,
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    ty: String,
    children: Vec<Field>,
}

#[derive(Debug)]
struct Tree {
    sections: Vec<Section>,
}

/// Indented lines of one section: (indentation, text).
type Lines = Vec<(usize, String)>;

/// A section as read, before fragments are expanded; `kind` is `None` for a `@define`.
struct RawSection {
    kind: Option<SectionKind>,
    name: String,
    lines: Lines,
}

/// The parsed `talos_schema.txt`, parsed once.
fn parse_tree() -> &'static Tree {
    static TREE: std::sync::OnceLock<Tree> = std::sync::OnceLock::new();
    TREE.get_or_init(|| parse_text(TALOS_SCHEMA))
}

/// Parses the schema text, expanding `%FRAGMENT` lines. Panics on a malformed file: it is
/// compiled in, and the unit tests parse it.
fn parse_text(text: &str) -> Tree {
    let mut raw: Vec<RawSection> = Vec::new();
    for line in text.lines().map(str::trim_end) {
        let content = line.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        if let Some(header) = line.strip_prefix('@') {
            let (word, name) = header.split_once(' ').unwrap_or((header, ""));
            let (kind, name) = match word {
                "machine" | "cluster" => (Some(SectionKind::Legacy), word),
                "doc" => (Some(SectionKind::Singleton), name),
                "docs" => (Some(SectionKind::Named), name),
                "define" => (None, name),
                other => panic!("talos_schema.txt: unknown section @{other}"),
            };
            raw.push(RawSection {
                kind,
                name: name.trim().to_owned(),
                lines: Vec::new(),
            });
            continue;
        }
        let section = raw
            .last_mut()
            .expect("talos_schema.txt: a field before any section");
        section
            .lines
            .push((line.len() - content.len(), content.to_owned()));
    }

    let fragments: BTreeMap<&str, &Lines> = raw
        .iter()
        .filter(|s| s.kind.is_none())
        .map(|s| (s.name.as_str(), &s.lines))
        .collect();
    let expand = |lines: &Lines| -> Lines {
        let mut out = Vec::new();
        for (indent, text) in lines {
            match text.strip_prefix('%') {
                Some(name) => {
                    let fragment = fragments
                        .get(name)
                        .unwrap_or_else(|| panic!("talos_schema.txt: no fragment {name}"));
                    out.extend(fragment.iter().map(|(i, t)| (i + indent, t.clone())));
                }
                None => out.push((*indent, text.clone())),
            }
        }
        out
    };
    let sections = raw
        .iter()
        .filter_map(|s| s.kind.map(|kind| (kind, s)))
        .map(|(kind, s)| {
            let lines = expand(&s.lines);
            let mut pos = 0;
            let fields = parse_fields(&lines, &mut pos, 0);
            assert_eq!(
                pos,
                lines.len(),
                "talos_schema.txt: bad indentation in {}",
                s.name
            );
            Section {
                kind,
                name: s.name.clone(),
                fields,
            }
        })
        .collect();
    Tree { sections }
}

fn parse_fields(lines: &Lines, pos: &mut usize, indent: usize) -> Vec<Field> {
    let mut fields = Vec::new();
    while let Some((line_indent, text)) = lines.get(*pos) {
        if *line_indent < indent {
            break;
        }
        assert_eq!(
            *line_indent, indent,
            "talos_schema.txt: bad indentation at `{text}`"
        );
        let (name, ty) = text
            .split_once(": ")
            .unwrap_or_else(|| panic!("talos_schema.txt: expected `name: TYPE`, got `{text}`"));
        *pos += 1;
        let children = parse_fields(lines, pos, indent + 2);
        fields.push(Field {
            name: name.to_owned(),
            ty: ty.to_owned(),
            children,
        });
    }
    fields
}

fn object_schema(fields: &[Field], path: &str) -> Value {
    let mut properties = Map::new();
    for field in fields {
        let field_path = format!("{path}.{}", field.name);
        properties.insert(field.name.clone(), field_schema(field, &field_path));
    }
    json!({"type": "object", "properties": properties})
}

fn scalar_schema(ty: &str) -> Value {
    if let Some(len) = ty.strip_prefix("str(").and_then(|r| r.strip_suffix(')')) {
        let max: u64 = len
            .parse()
            .expect("talos_schema.txt: str(N) takes a number");
        return json!({"type": "string", "maxLength": max});
    }
    if let Some(values) = ty.strip_prefix("enum(").and_then(|r| r.strip_suffix(')')) {
        let values: Vec<&str> = values.split('|').collect();
        return json!({"type": "string", "enum": values});
    }
    match ty {
        "str" => json!({"type": "string", "maxLength": 1024}),
        "int" => json!({"type": "integer"}),
        "bool" => json!({"type": "boolean"}),
        "dur" => {
            json!({"type": "string", "maxLength": 64, "pattern": r"^[-+]?(((\d+(\.\d*)?|\d*(\.\d+)+)([nuµm]?s|m|h))|0)+$"})
        }
        "intstr" => json!({"x-kubernetes-int-or-string": true}),
        "any" => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        "args" => json!({
            "type": "object",
            "maxProperties": 128,
            "additionalProperties": {"x-kubernetes-preserve-unknown-fields": true}
        }),
        other => panic!("talos_schema.txt: unknown type {other}"),
    }
}

fn field_schema(field: &Field, path: &str) -> Value {
    let ty = field.ty.as_str();
    let mut schema = if let Some(inner) = ty.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        let items = if inner == "obj" {
            object_schema(&field.children, &format!("{path}[]"))
        } else {
            scalar_schema(inner)
        };
        json!({"type": "array", "maxItems": 256, "items": items})
    } else if let Some(inner) = ty.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        let values = if inner == "obj" {
            object_schema(&field.children, &format!("{path}.*"))
        } else {
            scalar_schema(inner)
        };
        json!({"type": "object", "maxProperties": 256, "additionalProperties": values})
    } else if ty == "obj" {
        object_schema(&field.children, path)
    } else {
        assert!(
            field.children.is_empty(),
            "talos_schema.txt: {path} has children but type {ty}"
        );
        scalar_schema(ty)
    };
    schema["description"] = Value::String(format!("Talos `{path}`."));
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks `schema` along a dotted path of property names (`[]` steps into list items).
    fn reaches(schema: &Value, path: &[&str]) -> bool {
        let Some((first, rest)) = path.split_first() else {
            return true;
        };
        let node = if *first == "[]" {
            &schema["items"]
        } else if *first == "*" {
            &schema["additionalProperties"]
        } else {
            &schema["properties"][*first]
        };
        !node.is_null() && reaches(node, rest)
    }

    #[test]
    fn the_schema_file_parses_into_every_section() {
        let tree = parse_tree();
        assert!(tree.sections.iter().any(|s| s.name == "machine"));
        assert!(tree.sections.iter().any(|s| s.name == "cluster"));
        assert!(document_kinds().len() > 40);
    }

    #[test]
    fn no_generated_secret_is_in_the_legacy_schema() {
        for path in SECRET_PATHS {
            let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let section = section_schema(parts[0]);
            assert!(!reaches(&section, &parts[1..]), "{path} must be pruned");
        }
    }

    #[test]
    fn no_user_secret_is_in_the_legacy_schema() {
        let machine = section_schema("machine");
        for path in [
            &["network", "interfaces", "[]", "wireguard"][..],
            &["network", "interfaces", "[]", "vip", "hcloud"],
            &["network", "interfaces", "[]", "vip", "equinixMetal"],
            &["registries", "config", "*", "auth", "password"],
            &["registries", "config", "*", "tls", "clientIdentity"],
            &["systemDiskEncryption", "state", "keys", "[]", "static"],
        ] {
            assert!(!reaches(&machine, path), "{path:?} must be pruned");
        }
        assert!(reaches(&machine, &["certSANs"]));
        assert!(reaches(
            &machine,
            &["registries", "config", "*", "auth", "username"]
        ));
        assert!(reaches(&section_schema("cluster"), &["etcd", "image"]));
    }

    #[test]
    fn no_typed_document_secret_is_in_the_schema() {
        let docs = documents_json_schema();
        for kind in [
            "DiscoveryIdentityConfig",
            "KubeEtcdEncryptionConfig",
            "SideroLinkConfig",
            "WireguardConfig",
            "HCloudVIPConfig",
            "RegistryAuthConfig",
        ] {
            assert!(docs["properties"][kind].is_null(), "{kind} carries secrets");
        }
        assert!(!reaches(&docs, &["KubeAPIServerCAConfig", "issuingCA"]));
        assert!(!reaches(&docs, &["KubeAggregatorCAConfig", "issuingCA"]));
        assert!(!reaches(
            &docs,
            &["KubeServiceAccountConfig", "issuer", "privateKey"]
        ));
        assert!(reaches(
            &docs,
            &["KubeServiceAccountConfig", "issuer", "issuerURL"]
        ));
        assert!(!reaches(
            &docs,
            &["RegistryTLSConfig", "[]", "clientIdentity"]
        ));
    }
}

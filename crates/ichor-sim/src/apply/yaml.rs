//! A YAML document tree that keeps the line each node starts on, as Go's `yaml.Node` does:
//! Talos's messages name lines (talos-facts §11.3), so the simulator must know them too.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// A node and the line (1-based) it starts on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) line: u64,
    pub(crate) value: Value,
}

/// What a node holds. Mapping keys keep their order and their own line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

/// A mapping key and its line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Key {
    pub(crate) name: String,
    pub(crate) line: u64,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<Value>::deserialize(d)?;
        Ok(Self {
            line: spanned.referenced.line(),
            value: spanned.value,
        })
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<Value>::deserialize(d)?;
        let name = match spanned.value {
            Value::Str(s) => s,
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Null => String::new(),
            Value::Seq(_) | Value::Map(_) => {
                return Err(de::Error::custom("unexpected mapping key type"));
            }
        };
        Ok(Self {
            name,
            line: spanned.referenced.line(),
        })
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a YAML node")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        i128::try_from(v)
            .map(Value::Int)
            .map_err(|_| E::custom("integer out of range"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Str(String::from_utf8_lossy(v).into_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(node) = seq.next_element::<Node>()? {
            items.push(node);
        }
        Ok(Value::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Key>()? {
            let node = map.next_value::<Node>()?;
            entries.push((key, node));
        }
        Ok(Value::Map(entries))
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

/// Parses a YAML stream into its documents (empty documents are skipped, as Talos skips them).
pub(crate) fn parse_stream(text: &str) -> Result<Vec<Node>, String> {
    serde_saphyr::from_multiple::<Node>(text).map_err(|e| e.to_string())
}

impl Node {
    /// The entries of a mapping (none for anything else).
    pub(crate) fn entries(&self) -> &[(Key, Node)] {
        match &self.value {
            Value::Map(entries) => entries,
            _ => &[],
        }
    }

    /// The items of a sequence (none for anything else).
    pub(crate) fn items(&self) -> &[Node] {
        match &self.value {
            Value::Seq(items) => items,
            _ => &[],
        }
    }

    /// The entry under `key`, with its key, null or not.
    pub(crate) fn entry(&self, key: &str) -> Option<(&Key, &Node)> {
        self.entries()
            .iter()
            .find(|(k, _)| k.name == key)
            .map(|(k, v)| (k, v))
    }

    /// The value under `key` unless absent or null: what a Go pointer, map or slice field
    /// decodes to non-nil.
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        self.entry(key).map(|(_, v)| v).filter(|v| !v.is_null())
    }

    /// The value at a path of keys, if every step is present.
    pub(crate) fn at(&self, path: &[&str]) -> Option<&Node> {
        path.iter().try_fold(self, |node, key| node.get(key))
    }

    /// Whether this is YAML null.
    pub(crate) fn is_null(&self) -> bool {
        self.value == Value::Null
    }

    /// The scalar as Go would decode it into a string field ("" for null or non-scalars).
    pub(crate) fn text(&self) -> String {
        match &self.value {
            Value::Str(s) => s.clone(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            _ => String::new(),
        }
    }

    /// The string at `path`, "" when absent.
    pub(crate) fn str_at(&self, path: &[&str]) -> String {
        self.at(path).map(Node::text).unwrap_or_default()
    }

    /// The boolean at `path`, if set.
    pub(crate) fn bool_at(&self, path: &[&str]) -> Option<bool> {
        match self.at(path).map(|n| &n.value) {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// The integer at `path`, if set.
    pub(crate) fn int_at(&self, path: &[&str]) -> Option<i128> {
        match self.at(path).map(|n| &n.value) {
            Some(Value::Int(i)) => Some(*i),
            _ => None,
        }
    }

    /// The strings of the sequence at `path`.
    pub(crate) fn strings_at(&self, path: &[&str]) -> Vec<String> {
        self.at(path)
            .map(|n| n.items().iter().map(Node::text).collect())
            .unwrap_or_default()
    }

    /// The string entries of the mapping at `path`.
    pub(crate) fn string_map_at(&self, path: &[&str]) -> Vec<(String, String)> {
        self.at(path)
            .map(|n| {
                n.entries()
                    .iter()
                    .map(|(k, v)| (k.name.clone(), v.text()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the node is an empty mapping, sequence or string (what Go's `len(x) == 0` sees).
    pub(crate) fn is_empty(&self) -> bool {
        match &self.value {
            Value::Null => true,
            Value::Map(m) => m.is_empty(),
            Value::Seq(s) => s.is_empty(),
            Value::Str(s) => s.is_empty(),
            _ => false,
        }
    }

    /// The node as JSON (for the parts of the simulator that read configs as JSON).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => i64::try_from(*i)
                .map(J::from)
                .or_else(|_| u64::try_from(*i).map(J::from))
                .unwrap_or_else(|_| J::String(i.to_string())),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.name.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

/// The line Go's decoder reports for the value under `key`: the key's own line for a block
/// scalar (`key: >-` then the text), whose node starts at its indicator on the key's line.
pub(crate) fn value_line(source: &str, key: &Key, value: &Node) -> u64 {
    if value.line != key.line
        && matches!(value.value, Value::Str(_))
        && source
            .lines()
            .nth(usize::try_from(key.line.saturating_sub(1)).unwrap_or(usize::MAX))
            .and_then(|l| l.split_once(':'))
            .is_some_and(|(_, rest)| {
                let rest = rest.trim();
                rest.starts_with('|') || rest.starts_with('>')
            })
    {
        return key.line;
    }
    value.line
}

/// Encodes a JSON-like tree as Go's yaml encoder does for Talos's "unknown keys" report: keys
/// sorted, four-space indentation.
pub(crate) fn encode_go(value: &serde_json::Value) -> String {
    let mut out = String::new();
    encode_into(&mut out, value, 0);
    out
}

fn encode_into(out: &mut String, value: &serde_json::Value, indent: usize) {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            for (key, v) in entries {
                encode_entry(out, &" ".repeat(indent), key, v, indent, indent + 4);
            }
        }
        other => out.push_str(&format!("{}{}\n", " ".repeat(indent), scalar(other))),
    }
}

/// One `key: value` whose key starts at `key_col` after `lead` (the indentation, or a list
/// item's dash); a nested mapping's keys go to `child_col`, a list's dashes four past the key.
/// Inside a list item go's encoder indents the item's keys two past the dash and what they
/// hold four past it.
fn encode_entry(
    out: &mut String,
    lead: &str,
    key: &str,
    value: &serde_json::Value,
    key_col: usize,
    child_col: usize,
) {
    use serde_json::Value as J;
    let name = scalar(&J::String(key.to_owned()));
    match value {
        J::Object(inner) if !inner.is_empty() => {
            out.push_str(&format!("{lead}{name}:\n"));
            encode_into(out, value, child_col);
        }
        J::Array(items) if !items.is_empty() => {
            out.push_str(&format!("{lead}{name}:\n"));
            let dash = key_col + 4;
            for item in items {
                match item {
                    J::Object(map) if !map.is_empty() => {
                        let mut entries: Vec<_> = map.iter().collect();
                        entries.sort_by(|a, b| a.0.cmp(b.0));
                        for (i, (k, v)) in entries.into_iter().enumerate() {
                            let lead = if i == 0 {
                                format!("{}- ", " ".repeat(dash))
                            } else {
                                " ".repeat(dash + 2)
                            };
                            encode_entry(out, &lead, k, v, dash + 2, dash + 4);
                        }
                    }
                    other => out.push_str(&format!("{}- {}\n", " ".repeat(dash), scalar(other))),
                }
            }
        }
        _ => out.push_str(&format!("{lead}{name}: {}\n", scalar(value))),
    }
}

fn scalar(value: &serde_json::Value) -> String {
    use serde_json::Value as J;
    match value {
        J::Null => "null".into(),
        J::Bool(b) => b.to_string(),
        J::Number(n) => n.to_string(),
        J::String(s) => {
            let plain = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./ ".contains(c))
                && !s.starts_with(' ')
                && !s.ends_with(' ')
                && !matches!(
                    s.as_str(),
                    "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "~"
                )
                && s.parse::<f64>().is_err();
            if plain {
                s.clone()
            } else {
                format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
            }
        }
        J::Object(_) => "{}".into(),
        J::Array(_) => "[]".into(),
    }
}

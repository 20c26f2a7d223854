//! The YAML a Talos node puts in a resource's `yaml_spec`: its spec marshalled by go-yaml v4's
//! `yaml.Marshal` (v3 defaults: 4-space indent, sequences indented under their key, legacy
//! quoting), byte for byte (talos-facts §13.4). Specs are built as [`Yaml`] values in the Go
//! struct's field order, leaving out what an `omitempty` tag leaves out; this module only
//! writes them.

use std::fmt::Write as _;
use std::sync::LazyLock;

use regex::Regex;

/// A value as go-yaml represents it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Yaml {
    /// A nil interface or pointer (`null`).
    Null,
    /// A bool.
    Bool(bool),
    /// An integer, already formatted in decimal.
    Int(String),
    /// A string (also what a Go `TextMarshaler` yields).
    Str(String),
    /// A list.
    Seq(Vec<Yaml>),
    /// A struct or map, in field order.
    Map(Vec<(String, Yaml)>),
}

impl Yaml {
    /// A string value.
    pub(crate) fn str(s: impl Into<String>) -> Self {
        Self::Str(s.into())
    }

    /// An integer value.
    pub(crate) fn int(n: impl std::fmt::Display) -> Self {
        Self::Int(n.to_string())
    }

    /// A list of strings.
    pub(crate) fn strs<S: AsRef<str>>(items: &[S]) -> Self {
        Self::Seq(items.iter().map(|s| Self::str(s.as_ref())).collect())
    }

    /// Whether Go's `omitempty` leaves this value out: the zero value of its kind.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Self::Null => true,
            Self::Bool(b) => !b,
            Self::Int(n) => n == "0",
            Self::Str(s) => s.is_empty(),
            Self::Seq(items) => items.is_empty(),
            Self::Map(entries) => entries.is_empty(),
        }
    }
}

/// A struct's fields, in order.
#[derive(Debug, Default)]
pub(crate) struct Fields(Vec<(String, Yaml)>);

impl Fields {
    /// No fields yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A field always written.
    pub(crate) fn field(mut self, key: &str, value: Yaml) -> Self {
        self.0.push((key.to_owned(), value));
        self
    }

    /// A field tagged `omitempty`: left out when empty.
    pub(crate) fn omitempty(self, key: &str, value: Yaml) -> Self {
        if value.is_empty() {
            self
        } else {
            self.field(key, value)
        }
    }

    /// The struct.
    pub(crate) fn done(self) -> Yaml {
        Yaml::Map(self.0)
    }
}

/// A value decoded from JSON into Go's `any` (`map[string]any`, `[]any`, string, bool,
/// number, nil), as go-yaml marshals it: a map's keys in go-yaml's order ([`go_key_less`]).
pub(crate) fn from_json(value: &serde_json::Value) -> Yaml {
    match value {
        serde_json::Value::Null => Yaml::Null,
        serde_json::Value::Bool(b) => Yaml::Bool(*b),
        // Only whole numbers are written: go-yaml formats an int64, and a float64 with no
        // fraction below 1e21, as plain decimal digits.
        serde_json::Value::Number(n) => Yaml::Int(n.to_string()),
        serde_json::Value::String(s) => Yaml::str(s),
        serde_json::Value::Array(items) => Yaml::Seq(items.iter().map(from_json).collect()),
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| {
                if go_key_less(a, b) {
                    std::cmp::Ordering::Less
                } else if go_key_less(b, a) {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            });
            Yaml::Map(
                keys.into_iter()
                    .map(|k| (k.clone(), from_json(&map[k])))
                    .collect(),
            )
        }
    }
}

/// go-yaml's order of string map keys (`keyList.Less`, `sorter.go`): letters compare as
/// characters, a letter sorts after a non-letter (before it after a run of digits), and runs
/// of digits compare as numbers.
pub(crate) fn go_key_less(a: &str, b: &str) -> bool {
    let (ar, br): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut digits = false;
    let mut i = 0;
    while i < ar.len() && i < br.len() {
        if ar[i] == br[i] {
            digits = ar[i].is_numeric();
            i += 1;
            continue;
        }
        let (al, bl) = (ar[i].is_alphabetic(), br[i].is_alphabetic());
        if al && bl {
            return ar[i] < br[i];
        }
        if al || bl {
            return if digits { al } else { bl };
        }
        let (mut an, mut bn) = (0i64, 0i64);
        if ar[i] == '0' || br[i] == '0' {
            let mut j = i;
            while j > 0 && ar[j - 1].is_numeric() {
                j -= 1;
                if ar[j] != '0' {
                    an = 1;
                    bn = 1;
                    break;
                }
            }
        }
        let mut ai = i;
        while ai < ar.len() && ar[ai].is_ascii_digit() {
            an = an
                .saturating_mul(10)
                .saturating_add(i64::from(u32::from(ar[ai]) - u32::from('0')));
            ai += 1;
        }
        let mut bi = i;
        while bi < br.len() && br[bi].is_ascii_digit() {
            bn = bn
                .saturating_mul(10)
                .saturating_add(i64::from(u32::from(br[bi]) - u32::from('0')));
            bi += 1;
        }
        if an != bn {
            return an < bn;
        }
        if ai != bi {
            return ai < bi;
        }
        return ar[i] < br[i];
    }
    ar.len() < br.len()
}

/// `sigs.k8s.io/yaml.Marshal` of a JSON value (the JSON re-marshalled by go-yaml v2): two
/// spaces of indent, a sequence under a key not indented, map keys in go-yaml's order.
pub(crate) fn marshal_k8s(value: &serde_json::Value) -> String {
    fn write(out: &mut String, value: &Yaml, indent: usize) {
        match value {
            Yaml::Map(entries) if !entries.is_empty() => {
                for (i, (key, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        pad(out, indent);
                    }
                    out.push_str(&scalar(key, true));
                    out.push(':');
                    match v {
                        Yaml::Map(m) if !m.is_empty() => {
                            out.push('\n');
                            pad(out, indent + 2);
                            write(out, v, indent + 2);
                        }
                        Yaml::Seq(s) if !s.is_empty() => {
                            out.push('\n');
                            pad(out, indent);
                            write(out, v, indent);
                        }
                        _ => {
                            out.push(' ');
                            write(out, v, indent + 2);
                        }
                    }
                }
            }
            Yaml::Seq(items) if !items.is_empty() => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        pad(out, indent);
                    }
                    out.push_str("- ");
                    write(out, item, indent + 2);
                }
            }
            Yaml::Str(s) => {
                out.push_str(&scalar(s, false));
                out.push('\n');
            }
            other => write_inline(out, other, indent),
        }
    }
    let mut out = String::new();
    write(&mut out, &from_json(value), 0);
    out
}

/// `yaml.Marshal(value)`.
pub(crate) fn marshal(value: &Yaml) -> String {
    let mut out = String::new();
    match value {
        Yaml::Map(entries) if !entries.is_empty() => write_map(&mut out, entries, 0, false),
        Yaml::Seq(items) if !items.is_empty() => write_seq(&mut out, items, 0, false),
        other => {
            // A scalar (or an empty collection) document; a block scalar at the root is
            // indented like one under a top-level key.
            write_inline(&mut out, other, next(0));
        }
    }
    out
}

/// go-yaml's indentation step: the next multiple of 4 above `indent`.
fn next(indent: usize) -> usize {
    4 * ((indent + 4) / 4)
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

/// Writes a block mapping whose keys sit at column `indent`; with `inline`, the first key
/// continues the current line (after `- `).
fn write_map(out: &mut String, entries: &[(String, Yaml)], indent: usize, inline: bool) {
    for (i, (key, value)) in entries.iter().enumerate() {
        if i > 0 || !inline {
            pad(out, indent);
        }
        out.push_str(&scalar(key, true));
        out.push(':');
        match value {
            Yaml::Map(nested) if !nested.is_empty() => {
                out.push('\n');
                write_map(out, nested, next(indent), false);
            }
            Yaml::Seq(items) if !items.is_empty() => {
                out.push('\n');
                write_seq(out, items, next(indent), false);
            }
            other => {
                out.push(' ');
                write_inline(out, other, next(indent));
            }
        }
    }
}

/// Writes a block sequence whose `- ` sit at column `indent`.
fn write_seq(out: &mut String, items: &[Yaml], indent: usize, inline: bool) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 || !inline {
            pad(out, indent);
        }
        out.push_str("- ");
        match item {
            Yaml::Map(nested) if !nested.is_empty() => write_map(out, nested, indent + 2, true),
            Yaml::Seq(nested) if !nested.is_empty() => write_seq(out, nested, indent + 2, true),
            other => write_inline(out, other, indent + 2),
        }
    }
}

/// Writes a value that fits on the current line, or a block scalar whose lines are indented
/// by `block_indent`; ends the line.
fn write_inline(out: &mut String, value: &Yaml, block_indent: usize) {
    match value {
        Yaml::Null => out.push_str("null\n"),
        Yaml::Bool(b) => {
            let _ = writeln!(out, "{b}");
        }
        Yaml::Int(n) => {
            let _ = writeln!(out, "{n}");
        }
        Yaml::Map(_) => out.push_str("{}\n"),
        Yaml::Seq(_) => out.push_str("[]\n"),
        Yaml::Str(s) => {
            if let Some(block) = literal(s, block_indent) {
                out.push_str(&block);
            } else {
                out.push_str(&scalar(s, false));
                out.push('\n');
            }
        }
    }
}

/// A multi-line string as a literal block scalar (`|`, `|-`, `|+`, with an indentation
/// indicator when it starts with a space), if go-yaml writes it as one.
fn literal(s: &str, indent: usize) -> Option<String> {
    if !s.contains('\n') || !should_use_literal_style(s) || !analyze(s).block_allowed {
        return None;
    }
    let mut out = String::from("|");
    if s.starts_with(' ') || s.starts_with('\n') {
        let _ = write!(out, "4");
    }
    let trailing = s.len() - s.trim_end_matches('\n').len();
    match trailing {
        0 => out.push('-'),
        1 => {}
        _ => out.push('+'),
    }
    out.push('\n');
    let body = s.strip_suffix('\n').unwrap_or(s);
    for line in body.split('\n') {
        if !line.is_empty() {
            pad(&mut out, indent);
            out.push_str(line);
        }
        out.push('\n');
    }
    Some(out)
}

/// go-yaml's `shouldUseLiteralStyle`: multi-line with something other than whitespace.
fn should_use_literal_style(s: &str) -> bool {
    s.len() >= 2 && s.contains('\n') && s.chars().any(|c| !c.is_whitespace())
}

/// How a plain scalar is styled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Plain,
    Single,
    Double,
}

/// A string scalar on one line: plain when go-yaml writes it plain, else quoted as it quotes.
fn scalar(s: &str, simple_key: bool) -> String {
    let analysis = analyze(s);
    // Representer: YAML 1.1 booleans, base-60 floats and the merge key are single-quoted; a
    // multi-line string that is not a literal block is double-quoted.
    let mut style = if s.contains('\n') {
        Style::Double
    } else if is_base60_float(s) || is_old_bool(s) || s == "<<" {
        Style::Single
    } else if !resolves_to_str(s) {
        // Desolver, legacy quote preference: a string that would read back as another type.
        Style::Double
    } else {
        Style::Plain
    };
    // Emitter: a plain scalar it cannot write plain takes the required (single) quotes.
    if style == Style::Plain
        && (!analysis.block_plain_allowed
            || (s.is_empty() && simple_key)
            || (simple_key && analysis.multiline))
    {
        style = Style::Single;
    }
    if style == Style::Single && !analysis.single_quoted_allowed {
        style = Style::Double;
    }
    match style {
        Style::Plain => s.to_owned(),
        Style::Single => format!("'{}'", s.replace('\'', "''")),
        Style::Double => double_quoted(s),
    }
}

fn double_quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\0' => out.push_str("\\0"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{b}' => out.push_str("\\v"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            '\u{1b}' => out.push_str("\\e"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{85}' => out.push_str("\\N"),
            '\u{a0}' => out.push_str("\\_"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if !is_printable(c) || c == '\u{feff}' => {
                let n = u32::from(c);
                let _ = match n {
                    0..=0xff => write!(out, "\\x{n:02X}"),
                    0x100..=0xffff => write!(out, "\\u{n:04X}"),
                    _ => write!(out, "\\U{n:08X}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// libyaml's printable set (with unicode output on).
fn is_printable(c: char) -> bool {
    matches!(u32::from(c), 0x0a | 0x20..=0x7e | 0x85 | 0xa0..=0xd7ff | 0xe000..=0xfffd | 0x10000..=0x10ffff)
        && c != '\u{feff}'
}

fn is_break(c: char) -> bool {
    matches!(c, '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// What the emitter's scalar analysis allows.
struct Analysis {
    multiline: bool,
    block_plain_allowed: bool,
    single_quoted_allowed: bool,
    block_allowed: bool,
}

/// The emitter's scalar analysis (go-yaml `analyzeScalar`), block context.
fn analyze(s: &str) -> Analysis {
    if s.is_empty() {
        return Analysis {
            multiline: false,
            block_plain_allowed: true,
            single_quoted_allowed: true,
            block_allowed: false,
        };
    }
    let mut block_indicators = s.starts_with("---") || s.starts_with("...");
    let (mut line_breaks, mut special, mut tabs) = (false, false, false);
    let (mut leading_space, mut leading_break) = (false, false);
    let (mut trailing_space, mut trailing_break) = (false, false);
    let (mut break_space, mut space_break) = (false, false);
    let (mut previous_space, mut previous_break) = (false, false);
    let mut preceded_by_whitespace = true;
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let followed_by_whitespace = chars.get(i + 1).is_none_or(|n| *n == ' ' || *n == '\t');
        if i == 0 {
            match c {
                '#' | ',' | '[' | ']' | '{' | '}' | '&' | '*' | '!' | '|' | '>' | '\'' | '"'
                | '%' | '@' | '`' => block_indicators = true,
                '?' | ':' | '-' if followed_by_whitespace => block_indicators = true,
                _ => {}
            }
        } else {
            match c {
                ':' if followed_by_whitespace => block_indicators = true,
                '#' if preceded_by_whitespace => block_indicators = true,
                _ => {}
            }
        }
        if c == '\t' {
            tabs = true;
        } else if !is_printable(c) {
            special = true;
        }
        let last = i + 1 == chars.len();
        if c == ' ' {
            leading_space |= i == 0;
            trailing_space |= last;
            break_space |= previous_break;
            previous_space = true;
            previous_break = false;
        } else if is_break(c) {
            line_breaks = true;
            leading_break |= i == 0;
            trailing_break |= last;
            space_break |= previous_space;
            previous_space = false;
            previous_break = true;
        } else {
            previous_space = false;
            previous_break = false;
        }
        preceded_by_whitespace = c == ' ' || c == '\t' || is_break(c) || c == '\0';
    }
    let mut analysis = Analysis {
        multiline: line_breaks,
        block_plain_allowed: true,
        single_quoted_allowed: true,
        block_allowed: true,
    };
    if leading_space || leading_break || trailing_space || trailing_break {
        analysis.block_plain_allowed = false;
    }
    if trailing_space {
        analysis.block_allowed = false;
    }
    if break_space {
        analysis.block_plain_allowed = false;
        analysis.single_quoted_allowed = false;
    }
    if space_break || tabs || special {
        analysis.block_plain_allowed = false;
        analysis.single_quoted_allowed = false;
    }
    if space_break || special {
        analysis.block_allowed = false;
    }
    if line_breaks || block_indicators {
        analysis.block_plain_allowed = false;
    }
    analysis
}

fn is_old_bool(s: &str) -> bool {
    matches!(
        s,
        "y" | "Y"
            | "yes"
            | "Yes"
            | "YES"
            | "on"
            | "On"
            | "ON"
            | "n"
            | "N"
            | "no"
            | "No"
            | "NO"
            | "off"
            | "Off"
            | "OFF"
    )
}

static BASE60_FLOAT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$").expect("regex")
});
static YAML_FLOAT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$").expect("regex")
});
static TIMESTAMP: LazyLock<Regex> = LazyLock::new(|| {
    // The formats go-yaml tries (date, then optionally a time, 'T', 't' or ' ' separated).
    Regex::new(
        r"^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt ][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}:[0-9]{2})?)?$",
    )
    .expect("regex")
});

fn is_base60_float(s: &str) -> bool {
    s.starts_with(|c: char| c == '+' || c == '-' || c.is_ascii_digit())
        && s.contains(':')
        && BASE60_FLOAT.is_match(s)
}

/// Go's `strconv.ParseInt(s, 0, 64)` / `ParseUint` acceptance (the value does not matter).
fn parses_as_go_int(s: &str) -> bool {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (digits, radix) = if let Some(rest) = unsigned
        .strip_prefix("0x")
        .or_else(|| unsigned.strip_prefix("0X"))
    {
        (rest, 16)
    } else if let Some(rest) = unsigned
        .strip_prefix("0o")
        .or_else(|| unsigned.strip_prefix("0O"))
    {
        (rest, 8)
    } else if let Some(rest) = unsigned
        .strip_prefix("0b")
        .or_else(|| unsigned.strip_prefix("0B"))
    {
        (rest, 2)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') {
        (&unsigned[1..], 8)
    } else {
        (unsigned, 10)
    };
    !digits.is_empty() && u64::from_str_radix(digits, radix).is_ok()
}

/// Whether go-yaml's resolver reads the plain scalar `s` back as a string.
fn resolves_to_str(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false; // "" is null
    };
    if matches!(
        s,
        "true"
            | "True"
            | "TRUE"
            | "false"
            | "False"
            | "FALSE"
            | "~"
            | "null"
            | "Null"
            | "NULL"
            | ".nan"
            | ".NaN"
            | ".NAN"
            | ".inf"
            | ".Inf"
            | ".INF"
            | "+.inf"
            | "+.Inf"
            | "+.INF"
            | "-.inf"
            | "-.Inf"
            | "-.INF"
            | "-0"
            | "-0.0"
            | "<<"
    ) {
        return false;
    }
    match first {
        '.' => s.parse::<f64>().is_err(),
        '+' | '-' | '0'..='9' => {
            if TIMESTAMP.is_match(s) {
                return false;
            }
            let plain = s.replace('_', "");
            !(parses_as_go_int(&plain) || YAML_FLOAT.is_match(&plain))
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(items: &[&str]) -> String {
        marshal(&Yaml::strs(items))
    }

    #[test]
    fn quotes_strings_as_go_yaml_does() {
        // Expected output from go.yaml.in/yaml/v4 v4.0.0-rc.6 yaml.Marshal.
        let got = seq(&[
            "a",
            "yes",
            "<<",
            "0x1f",
            "1e3",
            "1_000",
            "2024-01-02",
            "~",
            "null",
            ".5",
            "-",
            "- a",
            "a #b",
            "a#b",
            "#a",
            "café",
            "tab\tx",
            "x:",
            ":x",
            "a: b",
            "'x",
            "? x",
            "---",
            " x",
            "x ",
            "+1",
            "1.",
            "08",
            "1:30",
            "1:70",
            "NaN",
            "",
            "52:54:00:00:00:01",
            "10.5.0.2/24",
            "fe80::1/64",
            "shutting down",
        ]);
        let want = "- a\n- 'yes'\n- '<<'\n- \"0x1f\"\n- \"1e3\"\n- \"1_000\"\n- \"2024-01-02\"\n\
                    - \"~\"\n- \"null\"\n- \".5\"\n- '-'\n- '- a'\n- 'a #b'\n- a#b\n- '#a'\n\
                    - café\n- \"tab\\tx\"\n- 'x:'\n- :x\n- 'a: b'\n- '''x'\n- '? x'\n- '---'\n\
                    - ' x'\n- 'x '\n- \"+1\"\n- \"1.\"\n- \"08\"\n- '1:30'\n- 1:70\n- NaN\n\
                    - \"\"\n- '52:54:00:00:00:01'\n- 10.5.0.2/24\n- fe80::1/64\n- shutting down\n";
        assert_eq!(got, want);
    }

    #[test]
    fn nests_as_go_yaml_does() {
        let inner = Fields::new()
            .field("a", Yaml::str("1"))
            .field("l", Yaml::str("x\ny"))
            .field("m", Fields::new().field("x", Yaml::str("q")).done())
            .field(
                "s",
                Yaml::Seq(vec![Fields::new().field("x", Yaml::str("r")).done()]),
            )
            .done();
        assert_eq!(
            marshal(&Yaml::Seq(vec![inner])),
            "- a: \"1\"\n  l: |-\n    x\n    y\n  m:\n    x: q\n  s:\n    - x: r\n"
        );
        let top = Fields::new()
            .field("n", Yaml::Seq(Vec::new()))
            .field("m", Yaml::Map(Vec::new()))
            .field("r", Yaml::Seq(vec![Yaml::strs(&["a", "b"])]))
            .done();
        assert_eq!(marshal(&top), "'n': []\nm: {}\nr:\n    - - a\n      - b\n");
    }

    #[test]
    fn writes_a_document_string_as_a_literal_block() {
        assert_eq!(
            marshal(&Yaml::str(
                "version: v1alpha1\nmachine:\n  type: worker\n\n---\nkind: x\n"
            )),
            "|\n    version: v1alpha1\n    machine:\n      type: worker\n\n    ---\n    kind: x\n"
        );
        assert_eq!(marshal(&Yaml::str("a\n\n\n")), "|+\n    a\n\n\n");
        assert_eq!(marshal(&Yaml::str(" lead\nx\n")), "|4\n     lead\n    x\n");
        assert_eq!(marshal(&Yaml::str("trail \nx")), "\"trail \\nx\"\n");
    }
}

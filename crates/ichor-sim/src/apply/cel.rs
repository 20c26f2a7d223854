//! The CEL that Talos disk selectors are written in (`diskSelector.match`, talos-facts
//! §11.5): parsed, type-checked against the disk-locator environment (`disk` of type
//! `talos.resource.definitions.block.DiskSpec`, `system_disk`, the size units, `glob`) and
//! evaluated for one disk. The subset Talos selectors use; errors carry cel-go's position
//! and snippet.

use std::fmt;

use super::glob::glob;

/// A disk as the selector sees it (the `block.DiskSpec` fields the simulator fills).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DiskFields {
    pub(crate) dev_path: String,
    pub(crate) size: u64,
    pub(crate) pretty_size: String,
    pub(crate) readonly: bool,
    pub(crate) cdrom: bool,
    pub(crate) model: String,
    pub(crate) serial: String,
    pub(crate) modalias: String,
    pub(crate) wwid: String,
    pub(crate) uuid: String,
    pub(crate) bus_path: String,
    pub(crate) sub_system: String,
    pub(crate) transport: String,
    pub(crate) rotational: bool,
    /// What `system_disk` is for this disk: whether it is the system disk (the volume
    /// manager's `DiskContext.ToCELContext`; install selectors see false).
    pub(crate) system_disk: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Type {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List(Box<Type>),
    Disk,
    Dyn,
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bool => f.write_str("bool"),
            Self::Int => f.write_str("int"),
            Self::Uint => f.write_str("uint"),
            Self::Double => f.write_str("double"),
            Self::String => f.write_str("string"),
            Self::Bytes => f.write_str("bytes"),
            Self::Null => f.write_str("null_type"),
            Self::List(t) => write!(f, "list({t})"),
            Self::Disk => f.write_str("talos.resource.definitions.block.DiskSpec"),
            Self::Dyn => f.write_str("dyn"),
        }
    }
}

/// The `block.DiskSpec` fields and their CEL types.
fn disk_field(name: &str) -> Option<Type> {
    Some(match name {
        "size" | "io_size" | "sector_size" => Type::Uint,
        "readonly" | "rotational" | "cdrom" => Type::Bool,
        "model" | "serial" | "modalias" | "wwid" | "bus_path" | "sub_system" | "transport"
        | "dev_path" | "pretty_size" | "uuid" | "firmware_version" => Type::String,
        "secondary_disks" | "symlinks" => Type::List(Box::new(Type::String)),
        _ => return None,
    })
}

/// The size units the environment declares as `uint` constants.
fn unit(name: &str) -> Option<u64> {
    Some(match name {
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "PiB" => 1 << 50,
        "EiB" => 1 << 60,
        "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "PB" => 1_000_000_000_000_000,
        "EB" => 1_000_000_000_000_000_000,
        _ => return None,
    })
}

#[derive(Debug, Clone, PartialEq)]
enum Lit {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(String),
    Bytes(Vec<u8>),
    Null,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Lit(Lit),
    Ident(String),
    Select(Box<Node>, String),
    /// A function or operator: name (cel-go's `_>_` form for operators), target, arguments.
    Call(String, Option<Box<Node>>, Vec<Node>),
    List(Vec<Node>),
    Cond(Box<Node>, Box<Node>, Box<Node>),
}

/// An expression and the character offset cel-go reports it at.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    at: usize,
    expr: Expr,
}

/// A parsed and checked boolean selector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Selector {
    root: Node,
}

/// Formats a cel-go issue: `ERROR: <input>:line:col: message` and the snippet with a caret.
fn issue(source: &str, at: usize, message: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let at = at.min(chars.len());
    let line_start = chars[..at]
        .iter()
        .rposition(|c| *c == '\n')
        .map_or(0, |i| i + 1);
    let line_no = chars[..at].iter().filter(|c| **c == '\n').count() + 1;
    let col = at - line_start + 1;
    let line_end = chars[line_start..]
        .iter()
        .position(|c| *c == '\n')
        .map_or(chars.len(), |i| line_start + i);
    let snippet: String = chars[line_start..line_end].iter().collect();
    let dots: String = chars[line_start..at]
        .iter()
        .map(|c| if *c == '\t' { '\t' } else { '.' })
        .collect();
    format!("ERROR: <input>:{line_no}:{col}: {message}\n | {snippet}\n | {dots}^")
}

/// Parses and type-checks a boolean expression as Talos's `cel.ParseBooleanExpression` with
/// the disk-locator environment; the error is cel-go's text.
pub(crate) fn parse_bool(source: &str) -> Result<Selector, String> {
    let tokens = lex(source).map_err(|(at, m)| issue(source, at, &format!("Syntax error: {m}")))?;
    let mut parser = Parser { tokens, pos: 0 };
    let root = parser
        .expr()
        .and_then(|n| {
            if parser.pos < parser.tokens.len() {
                let t = &parser.tokens[parser.pos];
                Err((t.at, format!("extraneous input '{}'", t.text)))
            } else {
                Ok(n)
            }
        })
        .map_err(|(at, m)| issue(source, at, &format!("Syntax error: {m}")))?;
    let mut errors = Vec::new();
    let output = check(&root, &mut errors);
    if !errors.is_empty() {
        let text: Vec<String> = errors.iter().map(|(at, m)| issue(source, *at, m)).collect();
        return Err(text.join("\n"));
    }
    match output {
        Some(Type::Bool) => Ok(Selector { root }),
        Some(other) => Err(format!("expression output type is {other}, expected bool")),
        None => Err("expression output type is error, expected bool".into()),
    }
}

impl Selector {
    /// Whether the disk matches (`system_disk` is the disk's [`DiskFields::system_disk`]).
    pub(crate) fn matches(&self, disk: &DiskFields) -> Result<bool, String> {
        match eval(&self.root, disk)? {
            Val::Bool(b) => Ok(b),
            other => Err(format!(
                "expression output type is {}, expected bool",
                other.type_name()
            )),
        }
    }
}

// ---- lexer ----

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Lit(Lit),
    Punct(&'static str),
}

#[derive(Debug, Clone)]
struct Token {
    at: usize,
    tok: Tok,
    text: String,
}

const PUNCTS: &[&str] = &[
    "&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "+", "-", "*", "/", "%", "(", ")", "[", "]",
    "{", "}", ".", ",", "?", ":",
];

fn lex(source: &str) -> Result<Vec<Token>, (usize, String)> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        if c.is_ascii_alphabetic() || c == '_' {
            // b"..." bytes and r"..." raw strings.
            if (c == 'b' || c == 'B' || c == 'r' || c == 'R')
                && i + 1 < chars.len()
                && (chars[i + 1] == '"' || chars[i + 1] == '\'')
            {
                let (text, next) = string(&chars, i + 1, c == 'r' || c == 'R')?;
                i = next;
                let lit = if c == 'b' || c == 'B' {
                    Lit::Bytes(text.into_bytes())
                } else {
                    Lit::Str(text)
                };
                out.push(Token {
                    at: start,
                    tok: Tok::Lit(lit),
                    text: chars[start..i].iter().collect(),
                });
                continue;
            }
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let tok = match word.as_str() {
                "true" => Tok::Lit(Lit::Bool(true)),
                "false" => Tok::Lit(Lit::Bool(false)),
                "null" => Tok::Lit(Lit::Null),
                "in" => Tok::Punct("in"),
                _ => Tok::Ident(word.clone()),
            };
            out.push(Token {
                at: start,
                tok,
                text: word,
            });
            continue;
        }
        if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                if chars[i] == '.' && !(i + 1 < chars.len() && chars[i + 1].is_ascii_digit()) {
                    break;
                }
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let lit =
                number(&text).ok_or((start, format!("token recognition error at: '{text}'")))?;
            out.push(Token {
                at: start,
                tok: Tok::Lit(lit),
                text,
            });
            continue;
        }
        if c == '"' || c == '\'' {
            let (text, next) = string(&chars, i, false)?;
            i = next;
            out.push(Token {
                at: start,
                tok: Tok::Lit(Lit::Str(text)),
                text: chars[start..i].iter().collect(),
            });
            continue;
        }
        let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
        let Some(p) = PUNCTS.iter().find(|p| rest.starts_with(**p)) else {
            return Err((start, format!("token recognition error at: '{c}'")));
        };
        i += p.chars().count();
        out.push(Token {
            at: start,
            tok: Tok::Punct(p),
            text: (*p).to_owned(),
        });
    }
    Ok(out)
}

fn number(text: &str) -> Option<Lit> {
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        return match hex.strip_suffix(['u', 'U']) {
            Some(h) => u64::from_str_radix(h, 16).ok().map(Lit::Uint),
            None => i64::from_str_radix(hex, 16).ok().map(Lit::Int),
        };
    }
    if let Some(digits) = text.strip_suffix(['u', 'U']) {
        return digits.parse().ok().map(Lit::Uint);
    }
    if text.contains(['.', 'e', 'E']) {
        return text.parse().ok().map(Lit::Double);
    }
    text.parse().ok().map(Lit::Int)
}

fn string(chars: &[char], open: usize, raw: bool) -> Result<(String, usize), (usize, String)> {
    let quote = chars[open];
    let mut i = open + 1;
    let mut out = String::new();
    while i < chars.len() {
        let c = chars[i];
        if c == quote {
            return Ok((out, i + 1));
        }
        if c == '\\' && !raw && i + 1 < chars.len() {
            i += 1;
            out.push(match chars[i] {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                other => other,
            });
            i += 1;
            continue;
        }
        out.push(c);
        i += 1;
    }
    Err((open, "token recognition error: unterminated string".into()))
}

// ---- parser ----

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

type PResult = Result<Node, (usize, String)>;

impl Parser {
    fn peek_punct(&self, p: &str) -> bool {
        matches!(self.tokens.get(self.pos), Some(Token { tok: Tok::Punct(q), .. }) if *q == p)
    }

    fn end_at(&self) -> usize {
        self.tokens
            .last()
            .map_or(0, |t| t.at + t.text.chars().count())
    }

    fn unexpected(&self) -> (usize, String) {
        match self.tokens.get(self.pos) {
            Some(t) => (t.at, format!("mismatched input '{}'", t.text)),
            None => (self.end_at(), "mismatched input '<EOF>'".into()),
        }
    }

    fn expect(&mut self, p: &str) -> Result<usize, (usize, String)> {
        if self.peek_punct(p) {
            self.pos += 1;
            Ok(self.tokens[self.pos - 1].at)
        } else {
            Err(self.unexpected())
        }
    }

    fn expr(&mut self) -> PResult {
        let cond = self.or()?;
        if self.peek_punct("?") {
            let at = self.expect("?")?;
            let yes = self.or()?;
            self.expect(":")?;
            let no = self.expr()?;
            return Ok(Node {
                at,
                expr: Expr::Cond(Box::new(cond), Box::new(yes), Box::new(no)),
            });
        }
        Ok(cond)
    }

    fn binary(&mut self, ops: &[(&str, &str)], next: fn(&mut Self) -> PResult) -> PResult {
        let mut left = next(self)?;
        loop {
            let Some((p, name)) = ops.iter().find(|(p, _)| self.peek_punct(p)) else {
                return Ok(left);
            };
            let at = self.expect(p)?;
            let right = next(self)?;
            left = Node {
                at,
                expr: Expr::Call((*name).to_owned(), None, vec![left, right]),
            };
        }
    }

    fn or(&mut self) -> PResult {
        self.binary(&[("||", "_||_")], Self::and)
    }

    fn and(&mut self) -> PResult {
        self.binary(&[("&&", "_&&_")], Self::relation)
    }

    fn relation(&mut self) -> PResult {
        self.binary(
            &[
                ("==", "_==_"),
                ("!=", "_!=_"),
                ("<=", "_<=_"),
                (">=", "_>=_"),
                ("<", "_<_"),
                (">", "_>_"),
                ("in", "@in"),
            ],
            Self::addition,
        )
    }

    fn addition(&mut self) -> PResult {
        self.binary(&[("+", "_+_"), ("-", "_-_")], Self::multiplication)
    }

    fn multiplication(&mut self) -> PResult {
        self.binary(&[("*", "_*_"), ("/", "_/_"), ("%", "_%_")], Self::unary)
    }

    fn unary(&mut self) -> PResult {
        if self.peek_punct("!") {
            let at = self.expect("!")?;
            let operand = self.unary()?;
            return Ok(Node {
                at,
                expr: Expr::Call("!_".into(), None, vec![operand]),
            });
        }
        if self.peek_punct("-") {
            let at = self.expect("-")?;
            let operand = self.unary()?;
            return Ok(Node {
                at,
                expr: Expr::Call("-_".into(), None, vec![operand]),
            });
        }
        self.member()
    }

    fn member(&mut self) -> PResult {
        let mut node = self.primary()?;
        loop {
            if self.peek_punct(".") {
                let at = self.expect(".")?;
                let Some(Token {
                    tok: Tok::Ident(field),
                    ..
                }) = self.tokens.get(self.pos).cloned()
                else {
                    return Err(self.unexpected());
                };
                self.pos += 1;
                if self.peek_punct("(") {
                    let open = self.expect("(")?;
                    let args = self.args(")")?;
                    node = Node {
                        at: open,
                        expr: Expr::Call(field, Some(Box::new(node)), args),
                    };
                } else {
                    node = Node {
                        at,
                        expr: Expr::Select(Box::new(node), field),
                    };
                }
            } else if self.peek_punct("[") {
                let at = self.expect("[")?;
                let index = self.expr()?;
                self.expect("]")?;
                node = Node {
                    at,
                    expr: Expr::Call("_[_]".into(), None, vec![node, index]),
                };
            } else {
                return Ok(node);
            }
        }
    }

    fn args(&mut self, close: &str) -> Result<Vec<Node>, (usize, String)> {
        let mut args = Vec::new();
        if self.peek_punct(close) {
            self.pos += 1;
            return Ok(args);
        }
        loop {
            args.push(self.expr()?);
            if self.peek_punct(",") {
                self.pos += 1;
                continue;
            }
            self.expect(close)?;
            return Ok(args);
        }
    }

    fn primary(&mut self) -> PResult {
        let Some(token) = self.tokens.get(self.pos).cloned() else {
            return Err(self.unexpected());
        };
        match token.tok {
            Tok::Lit(lit) => {
                self.pos += 1;
                Ok(Node {
                    at: token.at,
                    expr: Expr::Lit(lit),
                })
            }
            Tok::Ident(name) => {
                self.pos += 1;
                if self.peek_punct("(") {
                    let open = self.expect("(")?;
                    let args = self.args(")")?;
                    return Ok(Node {
                        at: open,
                        expr: Expr::Call(name, None, args),
                    });
                }
                Ok(Node {
                    at: token.at,
                    expr: Expr::Ident(name),
                })
            }
            Tok::Punct("(") => {
                self.pos += 1;
                let inner = self.expr()?;
                self.expect(")")?;
                Ok(inner)
            }
            Tok::Punct("[") => {
                self.pos += 1;
                let items = self.args("]")?;
                Ok(Node {
                    at: token.at,
                    expr: Expr::List(items),
                })
            }
            Tok::Punct(_) => Err(self.unexpected()),
        }
    }
}

// ---- checker ----

fn lit_type(lit: &Lit) -> Type {
    match lit {
        Lit::Bool(_) => Type::Bool,
        Lit::Int(_) => Type::Int,
        Lit::Uint(_) => Type::Uint,
        Lit::Double(_) => Type::Double,
        Lit::Str(_) => Type::String,
        Lit::Bytes(_) => Type::Bytes,
        Lit::Null => Type::Null,
    }
}

fn numeric(t: &Type) -> bool {
    matches!(t, Type::Int | Type::Uint | Type::Double)
}

fn check(node: &Node, errors: &mut Vec<(usize, String)>) -> Option<Type> {
    match &node.expr {
        Expr::Lit(lit) => Some(lit_type(lit)),
        Expr::Ident(name) => match name.as_str() {
            "disk" => Some(Type::Disk),
            "system_disk" => Some(Type::Bool),
            n if unit(n).is_some() => Some(Type::Uint),
            _ => {
                errors.push((
                    node.at,
                    format!("undeclared reference to '{name}' (in container '')"),
                ));
                None
            }
        },
        Expr::Select(operand, field) => match check(operand, errors)? {
            Type::Disk => disk_field(field).or_else(|| {
                errors.push((node.at, format!("undefined field '{field}'")));
                None
            }),
            Type::Dyn => Some(Type::Dyn),
            other => {
                errors.push((
                    node.at,
                    format!("type '{other}' does not support field selection"),
                ));
                None
            }
        },
        Expr::List(items) => {
            let types: Vec<Option<Type>> = items.iter().map(|i| check(i, errors)).collect();
            let first = types.first().cloned().flatten().unwrap_or(Type::Dyn);
            let uniform = types.iter().all(|t| t.as_ref() == Some(&first));
            Some(Type::List(Box::new(if uniform {
                first
            } else {
                Type::Dyn
            })))
        }
        Expr::Cond(cond, yes, no) => {
            let c = check(cond, errors);
            let y = check(yes, errors);
            let n = check(no, errors);
            if let Some(c) = c
                && c != Type::Bool
            {
                errors.push((cond.at, format!("expected type 'bool' but found '{c}'")));
            }
            match (y, n) {
                (Some(y), Some(n)) if y == n => Some(y),
                (Some(_), Some(_)) => Some(Type::Dyn),
                _ => None,
            }
        }
        Expr::Call(name, target, args) => {
            let target_type = target.as_ref().map(|t| check(t, errors));
            let arg_types: Vec<Option<Type>> = args.iter().map(|a| check(a, errors)).collect();
            if target_type.as_ref().is_some_and(Option::is_none)
                || arg_types.iter().any(Option::is_none)
            {
                return None;
            }
            let target_type = target_type.flatten();
            let arg_types: Vec<Type> = arg_types.into_iter().flatten().collect();
            call_type(node, name, target_type.as_ref(), &arg_types, args, errors)
        }
    }
}

fn call_type(
    node: &Node,
    name: &str,
    target: Option<&Type>,
    args: &[Type],
    arg_nodes: &[Node],
    errors: &mut Vec<(usize, String)>,
) -> Option<Type> {
    let no_overload = |errors: &mut Vec<(usize, String)>| {
        let mut all: Vec<String> = target.iter().map(|t| t.to_string()).collect();
        all.extend(args.iter().map(Type::to_string));
        errors.push((
            node.at,
            format!(
                "found no matching overload for '{name}' applied to '({})'",
                all.join(", ")
            ),
        ));
        None
    };
    let same = |a: &Type, b: &Type| a == b || *a == Type::Dyn || *b == Type::Dyn;
    match (name, target, args) {
        ("_&&_" | "_||_", None, [a, b]) => {
            for (t, n) in [(a, &arg_nodes[0]), (b, &arg_nodes[1])] {
                if *t != Type::Bool && *t != Type::Dyn {
                    errors.push((n.at, format!("expected type 'bool' but found '{t}'")));
                }
            }
            Some(Type::Bool)
        }
        ("!_", None, [Type::Bool | Type::Dyn]) => Some(Type::Bool),
        ("-_", None, [t @ (Type::Int | Type::Double)]) => Some(t.clone()),
        ("_==_" | "_!=_", None, [a, b]) if same(a, b) => Some(Type::Bool),
        ("_<_" | "_<=_" | "_>_" | "_>=_", None, [a, b])
            if same(a, b)
                && (numeric(a) || matches!(a, Type::String | Type::Bytes | Type::Bool)) =>
        {
            Some(Type::Bool)
        }
        ("_+_", None, [a, b]) if same(a, b) && (numeric(a) || *a == Type::String) => {
            Some(a.clone())
        }
        ("_-_" | "_*_" | "_/_", None, [a, b]) if same(a, b) && numeric(a) => Some(a.clone()),
        ("_%_", None, [a, b]) if same(a, b) && matches!(a, Type::Int | Type::Uint) => {
            Some(a.clone())
        }
        ("@in", None, [a, Type::List(item)]) if same(a, item) => Some(Type::Bool),
        ("_[_]", None, [Type::List(item), Type::Int]) => Some((**item).clone()),
        ("glob", None, [Type::String, Type::String]) => Some(Type::Bool),
        ("size", None, [Type::String | Type::Bytes | Type::List(_)])
        | ("size", Some(Type::String | Type::Bytes | Type::List(_)), []) => Some(Type::Int),
        (
            "contains" | "startsWith" | "endsWith" | "matches",
            Some(Type::String),
            [Type::String],
        ) => Some(Type::Bool),
        ("int", None, [Type::Uint | Type::Double | Type::String | Type::Int]) => Some(Type::Int),
        ("uint", None, [Type::Int | Type::Double | Type::String | Type::Uint]) => Some(Type::Uint),
        ("double", None, [Type::Int | Type::Uint | Type::String | Type::Double]) => {
            Some(Type::Double)
        }
        ("string", None, [_]) => Some(Type::String),
        (
            "_&&_" | "_||_" | "!_" | "-_" | "_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_"
            | "_+_" | "_-_" | "_*_" | "_/_" | "_%_" | "@in" | "_[_]" | "glob" | "size" | "contains"
            | "startsWith" | "endsWith" | "matches" | "int" | "uint" | "double" | "string",
            _,
            _,
        ) => no_overload(errors),
        _ => {
            errors.push((
                node.at,
                format!("undeclared reference to '{name}' (in container '')"),
            ));
            None
        }
    }
}

// ---- evaluation ----

#[derive(Debug, Clone, PartialEq)]
enum Val {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(String),
    Bytes(Vec<u8>),
    Null,
    List(Vec<Val>),
    Disk,
}

impl Val {
    fn type_name(&self) -> &'static str {
        match self {
            Self::Bool(_) => "bool",
            Self::Int(_) => "int",
            Self::Uint(_) => "uint",
            Self::Double(_) => "double",
            Self::Str(_) => "string",
            Self::Bytes(_) => "bytes",
            Self::Null => "null_type",
            Self::List(_) => "list",
            Self::Disk => "talos.resource.definitions.block.DiskSpec",
        }
    }
}

fn field(disk: &DiskFields, name: &str) -> Val {
    match name {
        "size" => Val::Uint(disk.size),
        "io_size" | "sector_size" => Val::Uint(0),
        "readonly" => Val::Bool(disk.readonly),
        "rotational" => Val::Bool(disk.rotational),
        "cdrom" => Val::Bool(disk.cdrom),
        "model" => Val::Str(disk.model.clone()),
        "serial" => Val::Str(disk.serial.clone()),
        "modalias" => Val::Str(disk.modalias.clone()),
        "wwid" => Val::Str(disk.wwid.clone()),
        "bus_path" => Val::Str(disk.bus_path.clone()),
        "sub_system" => Val::Str(disk.sub_system.clone()),
        "transport" => Val::Str(disk.transport.clone()),
        "dev_path" => Val::Str(disk.dev_path.clone()),
        "pretty_size" => Val::Str(disk.pretty_size.clone()),
        "uuid" => Val::Str(disk.uuid.clone()),
        "secondary_disks" | "symlinks" => Val::List(Vec::new()),
        _ => Val::Str(String::new()),
    }
}

fn eval(node: &Node, disk: &DiskFields) -> Result<Val, String> {
    Ok(match &node.expr {
        Expr::Lit(lit) => match lit {
            Lit::Bool(b) => Val::Bool(*b),
            Lit::Int(i) => Val::Int(*i),
            Lit::Uint(u) => Val::Uint(*u),
            Lit::Double(d) => Val::Double(*d),
            Lit::Str(s) => Val::Str(s.clone()),
            Lit::Bytes(b) => Val::Bytes(b.clone()),
            Lit::Null => Val::Null,
        },
        Expr::Ident(name) => match name.as_str() {
            "disk" => Val::Disk,
            "system_disk" => Val::Bool(disk.system_disk),
            n => Val::Uint(unit(n).ok_or_else(|| format!("no such attribute: {n}"))?),
        },
        Expr::Select(operand, name) => match eval(operand, disk)? {
            Val::Disk => field(disk, name),
            other => return Err(format!("no such key: {name} on {}", other.type_name())),
        },
        Expr::List(items) => Val::List(
            items
                .iter()
                .map(|i| eval(i, disk))
                .collect::<Result<_, _>>()?,
        ),
        Expr::Cond(cond, yes, no) => match eval(cond, disk)? {
            Val::Bool(true) => eval(yes, disk)?,
            Val::Bool(false) => eval(no, disk)?,
            _ => return Err("no such overload".into()),
        },
        Expr::Call(name, target, args) => {
            if name == "_&&_" || name == "_||_" {
                let left = eval(&args[0], disk)?;
                let short = name != "_&&_";
                if left == Val::Bool(short) {
                    return Ok(Val::Bool(short));
                }
                return eval(&args[1], disk);
            }
            let target = target.as_ref().map(|t| eval(t, disk)).transpose()?;
            let values: Vec<Val> = args
                .iter()
                .map(|a| eval(a, disk))
                .collect::<Result<_, _>>()?;
            apply(name, target, &values)?
        }
    })
}

fn apply(name: &str, target: Option<Val>, args: &[Val]) -> Result<Val, String> {
    use Val::*;
    let overflow = || "return error for overflow".to_owned();
    Ok(match (name, target.as_ref(), args) {
        ("!_", None, [Bool(b)]) => Bool(!b),
        ("-_", None, [Int(i)]) => Int(i.checked_neg().ok_or_else(overflow)?),
        ("-_", None, [Double(d)]) => Double(-d),
        ("_==_", None, [a, b]) => Bool(a == b),
        ("_!=_", None, [a, b]) => Bool(a != b),
        ("_<_" | "_<=_" | "_>_" | "_>=_", None, [a, b]) => {
            let ordering = match (a, b) {
                (Int(x), Int(y)) => x.partial_cmp(y),
                (Uint(x), Uint(y)) => x.partial_cmp(y),
                (Double(x), Double(y)) => x.partial_cmp(y),
                (Str(x), Str(y)) => x.partial_cmp(y),
                (Bytes(x), Bytes(y)) => x.partial_cmp(y),
                (Bool(x), Bool(y)) => x.partial_cmp(y),
                _ => None,
            }
            .ok_or("no such overload")?;
            Bool(match name {
                "_<_" => ordering.is_lt(),
                "_<=_" => ordering.is_le(),
                "_>_" => ordering.is_gt(),
                _ => ordering.is_ge(),
            })
        }
        ("_+_", None, [Int(x), Int(y)]) => Int(x.checked_add(*y).ok_or_else(overflow)?),
        ("_+_", None, [Uint(x), Uint(y)]) => Uint(x.checked_add(*y).ok_or_else(overflow)?),
        ("_+_", None, [Double(x), Double(y)]) => Double(x + y),
        ("_+_", None, [Str(x), Str(y)]) => Str(format!("{x}{y}")),
        ("_-_", None, [Int(x), Int(y)]) => Int(x.checked_sub(*y).ok_or_else(overflow)?),
        ("_-_", None, [Uint(x), Uint(y)]) => Uint(x.checked_sub(*y).ok_or_else(overflow)?),
        ("_-_", None, [Double(x), Double(y)]) => Double(x - y),
        ("_*_", None, [Int(x), Int(y)]) => Int(x.checked_mul(*y).ok_or_else(overflow)?),
        ("_*_", None, [Uint(x), Uint(y)]) => Uint(x.checked_mul(*y).ok_or_else(overflow)?),
        ("_*_", None, [Double(x), Double(y)]) => Double(x * y),
        ("_/_", None, [Int(x), Int(y)]) => Int(x.checked_div(*y).ok_or("division by zero")?),
        ("_/_", None, [Uint(x), Uint(y)]) => Uint(x.checked_div(*y).ok_or("division by zero")?),
        ("_/_", None, [Double(x), Double(y)]) => Double(x / y),
        ("_%_", None, [Int(x), Int(y)]) => Int(x.checked_rem(*y).ok_or("modulus by zero")?),
        ("_%_", None, [Uint(x), Uint(y)]) => Uint(x.checked_rem(*y).ok_or("modulus by zero")?),
        ("@in", None, [a, List(items)]) => Bool(items.contains(a)),
        ("_[_]", None, [List(items), Int(i)]) => usize::try_from(*i)
            .ok()
            .and_then(|i| items.get(i).cloned())
            .ok_or("index out of range")?,
        ("glob", None, [Str(p), Str(s)]) => Bool(glob(p, s)),
        ("size", None, [Str(s)]) | ("size", Some(Str(s)), []) => {
            Int(i64::try_from(s.chars().count()).unwrap_or(i64::MAX))
        }
        ("size", None, [List(l)]) | ("size", Some(List(l)), []) => {
            Int(i64::try_from(l.len()).unwrap_or(i64::MAX))
        }
        ("contains", Some(Str(s)), [Str(p)]) => Bool(s.contains(p.as_str())),
        ("startsWith", Some(Str(s)), [Str(p)]) => Bool(s.starts_with(p.as_str())),
        ("endsWith", Some(Str(s)), [Str(p)]) => Bool(s.ends_with(p.as_str())),
        ("int", None, [Uint(u)]) => Int(i64::try_from(*u).map_err(|_| overflow())?),
        ("uint", None, [Int(i)]) => Uint(u64::try_from(*i).map_err(|_| overflow())?),
        ("string", None, [v]) => Str(match v {
            Str(s) => s.clone(),
            Int(i) => i.to_string(),
            Uint(u) => u.to_string(),
            Double(d) => d.to_string(),
            Bool(b) => b.to_string(),
            other => other.type_name().to_owned(),
        }),
        (other, _, _) => return Err(format!("no such overload: {other}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vda() -> DiskFields {
        DiskFields {
            dev_path: "/dev/vda".into(),
            size: 100_000_000_000,
            transport: "virtio".into(),
            ..Default::default()
        }
    }

    #[test]
    fn selectors_match_as_talos_evaluates_them() {
        let s = parse_bool("disk.size > 100u * GB && !disk.rotational").unwrap();
        assert!(!s.matches(&vda()).unwrap());
        let s = parse_bool("disk.size >= 100u * GB && !disk.rotational").unwrap();
        assert!(s.matches(&vda()).unwrap());
        let s = parse_bool(r#"disk.dev_path == "/dev/vda""#).unwrap();
        assert!(s.matches(&vda()).unwrap());
        let s = parse_bool(r#"glob("/dev/v*", disk.dev_path)"#).unwrap();
        assert!(s.matches(&vda()).unwrap());
    }

    #[test]
    fn type_errors_read_as_cel_go_writes_them() {
        assert_eq!(
            parse_bool("disk.nosuch == 1").unwrap_err(),
            "ERROR: <input>:1:5: undefined field 'nosuch'\n | disk.nosuch == 1\n | ....^"
        );
        assert_eq!(
            parse_bool("disk.size > 100").unwrap_err(),
            "ERROR: <input>:1:11: found no matching overload for '_>_' applied to '(uint, int)'\n | disk.size > 100\n | ..........^"
        );
        assert_eq!(
            parse_bool("disk.size").unwrap_err(),
            "expression output type is uint, expected bool"
        );
        assert_eq!(
            parse_bool("nosuch(\"x\")").unwrap_err(),
            "ERROR: <input>:1:7: undeclared reference to 'nosuch' (in container '')\n | nosuch(\"x\")\n | ......^"
        );
        assert_eq!(
            parse_bool(r#"disk.dev_path == "/dev/vda" || disk.size"#).unwrap_err(),
            "ERROR: <input>:1:36: expected type 'bool' but found 'uint'\n | disk.dev_path == \"/dev/vda\" || disk.size\n | ...................................^"
        );
    }
}

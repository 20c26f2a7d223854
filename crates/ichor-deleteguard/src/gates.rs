//! Rollout health gates: CEL expressions a platform team declares over objects of the workload
//! cluster, every one of which must hold before each node of a rollout starts.
//!
//! [`Gate::compile`] checks an expression once (its length, that it parses, how deep it nests
//! comprehension macros); [`evaluate`] gives the verdict over the objects the manager listed,
//! each bound in turn to the variable `object`. Pure: no client, no clock, no I/O.
//!
//! A gate is safe by construction: no object, too many objects, an evaluation error, a result
//! that is not a boolean, or a cost over the limit all fail it, and a failing gate holds the
//! rollout. The first failing object decides, and its message names it and what the gate saw.
//!
//! # Cost
//!
//! Before evaluating an object, [`evaluate`] estimates the expression's cost over it and refuses
//! an estimate over [`COST_LIMIT`], in the manner of Kubernetes's static estimate for its CEL
//! validation rules. The estimate is deliberately coarse, an upper bound rather than a
//! prediction, walking the expression (after macro expansion) with a bound on the length and
//! size of every value it can take:
//!
//! - every node costs 1;
//! - a comprehension's loop body (its loop condition and step) costs its own cost times the
//!   longest its range can be: the length of the list or map it reads from the object, or,
//!   for a list the expression builds, the bound of what it is built from (a list literal's
//!   elements, a `map` over a range as long as the range);
//! - a node that copies a value costs the size of that value, counted in JSON values: the CEL
//!   interpreter (the `cel` crate) copies every field it selects, every element it indexes or
//!   iterates, the accumulator of each loop step, the arguments of functions and the operands
//!   of comparisons, so `object.spec.items` costs the size of `spec` and of `items`.
//!
//! Nested comprehensions therefore multiply, a loop that rereads a large part of the object
//! at each step is expensive, and the arithmetic saturates. Since every step of an evaluation
//! is a node visited or a value copied, a gate that passes the estimate has a bounded
//! evaluation time.
//!
//! # Stack
//!
//! The CEL parser and interpreter recurse deeply: a hostile 2 KiB expression (a thousand
//! chained field selections, say) needs tens of megabytes of stack in a debug build, and a
//! stack overflow aborts the process instead of panicking. So [`Gate::compile`] and
//! [`evaluate`] each run on a scoped thread of their own with a large stack, and a panic of the
//! CEL library there becomes an error or a failing verdict.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr, operators,
};
use cel::objects::{Key, Map as CelMap};
use cel::{Context, ParseErrors, Program, Value as Cel};
use serde_json::Value;

/// Kubernetes's per-expression CEL cost limit, which a gate's estimate must stay within.
pub const COST_LIMIT: u64 = 1_000_000;
/// The longest gate expression, in bytes.
pub const MAX_EXPRESSION: usize = 2048;
/// The most objects one gate reads.
pub const MAX_OBJECTS: usize = 500;
/// The most comprehension macros (`all`, `exists`, `exists_one`, `map`, `filter`) one gate nests.
pub const MAX_NESTING: usize = 3;

/// The variable each object is bound to.
const OBJECT: &str = "object";
/// The deepest nesting of an object's JSON a gate reads (`serde_json`'s own parsing limit).
const MAX_DEPTH: usize = 128;
/// How many of the fields the expression selects a failure shows.
const SHOWN_FIELDS: usize = 4;
/// The longest value a message quotes, in characters.
const SHOWN_CHARS: usize = 120;
/// The most parts of an object the estimate follows one by one before bounding them together.
const MAX_TRACKED: usize = 4096;
/// The stack of the thread that parses or evaluates (reserved, not committed, until used).
const STACK: usize = 256 << 20;
/// The verdict over no object.
const NO_OBJECT: &str = "no object matched; a gate that reads nothing holds the rollout";
/// Functions whose result is a scalar, whatever their arguments.
const SCALAR_FUNCTIONS: &[&str] = &[
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "hasValue",
    "duration",
    "timestamp",
];

/// A compiled health gate: a name and a CEL expression over `object` that must be true.
#[derive(Debug)]
pub struct Gate {
    name: String,
    expression: String,
    program: Program,
}

/// Why a gate expression is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// The expression is longer than [`MAX_EXPRESSION`].
    #[error("the expression is {length} bytes long; a gate allows at most {MAX_EXPRESSION}")]
    TooLong {
        /// Its length, in bytes.
        length: usize,
    },
    /// The expression is not valid CEL, or uses what the CEL library cannot evaluate.
    #[error("the expression does not parse: {0}")]
    Parse(String),
    /// The expression nests more comprehension macros than [`MAX_NESTING`].
    #[error(
        "the expression nests {depth} comprehension macros (all, exists, exists_one, map, \
         filter); a gate allows at most {MAX_NESTING}"
    )]
    TooDeep {
        /// How deep it nests them.
        depth: usize,
    },
}

impl Gate {
    /// Compiles a gate; the error names what is wrong and what is allowed.
    ///
    /// # Errors
    ///
    /// The expression is too long, does not parse (the parser's words), builds a message, or
    /// nests too many comprehension macros.
    pub fn compile(name: &str, expression: &str) -> Result<Gate, GateError> {
        if expression.len() > MAX_EXPRESSION {
            return Err(GateError::TooLong {
                length: expression.len(),
            });
        }
        let program = on_large_stack(|| parse(expression))
            .map_err(|reason| GateError::Parse(format!("the CEL parser failed: {reason}")))??;
        Ok(Gate {
            name: name.to_owned(),
            expression: expression.to_owned(),
            program,
        })
    }

    /// The gate's name, as declared.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The gate's expression, as declared.
    #[must_use]
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

/// Parses and checks an expression.
fn parse(expression: &str) -> Result<Program, GateError> {
    let program = Program::compile(expression).map_err(|e| GateError::Parse(parse_text(&e)))?;
    if constructs_message(program.expression()) {
        return Err(GateError::Parse(
            "message construction (`Type{field: value}`) is not supported; a gate reads \
             `object` and builds lists and maps only"
                .to_owned(),
        ));
    }
    let depth = nesting(program.expression());
    if depth > MAX_NESTING {
        return Err(GateError::TooDeep { depth });
    }
    Ok(program)
}

/// Runs `work` on a scoped thread with a [`STACK`]-sized stack; the error says why it did not
/// finish (no thread, or a panic).
fn on_large_stack<T: Send>(work: impl FnOnce() -> T + Send) -> Result<T, String> {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("ichor-gate".to_owned())
            .stack_size(STACK)
            .spawn_scoped(scope, work)
            .map_err(|e| format!("no thread to run it on: {e}"))?;
        thread.join().map_err(|panic| {
            let text = panic
                .downcast_ref::<&str>()
                .map(ToString::to_string)
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            format!("it panicked {text}").trim_end().to_owned()
        })
    })
}

/// A gate's verdict over the objects it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every object read passes.
    Pass,
    /// What the gate saw: a sentence naming the first object that fails and why.
    Fail(String),
}

/// Evaluates `gate` over `objects` (each bound to the variable `object` in turn).
#[must_use]
pub fn evaluate(gate: &Gate, objects: &[Value]) -> Verdict {
    if objects.is_empty() {
        return Verdict::Fail(NO_OBJECT.to_owned());
    }
    if objects.len() > MAX_OBJECTS {
        return Verdict::Fail(format!(
            "the gate reads {} objects, more than the limit of {MAX_OBJECTS}; narrow it with a \
             namespace, name or label selector",
            objects.len()
        ));
    }
    on_large_stack(|| {
        let mut context = Context::default();
        for object in objects {
            if let Some(reason) = check_object(gate, &mut context, object) {
                return Verdict::Fail(format!("{}: {reason}", describe(object)));
            }
        }
        Verdict::Pass
    })
    .unwrap_or_else(|reason| Verdict::Fail(format!("the CEL interpreter failed: {reason}")))
}

/// Why `object` fails the gate, or `None` when it passes.
fn check_object(gate: &Gate, context: &mut Context<'_>, object: &Value) -> Option<String> {
    let measure = Measure::of(object);
    if measure.depth > MAX_DEPTH {
        return Some(format!(
            "the object nests {} levels deep; a gate reads at most {MAX_DEPTH}",
            measure.depth
        ));
    }
    let estimate = measure.estimate(gate.program.expression());
    if estimate > COST_LIMIT {
        return Some(format!(
            "the gate's estimated cost {estimate} exceeds the limit of {COST_LIMIT}; iterate \
             shorter lists, reread less of the object inside loops, or nest fewer macros"
        ));
    }
    context.add_variable_from_value(OBJECT, to_cel(object));
    match gate.program.execute(context) {
        Ok(Cel::Bool(true)) => None,
        Ok(Cel::Bool(false)) => Some(false_reason(gate, object)),
        Ok(other) => Some(format!(
            "the expression evaluates to a {} ({}), not a boolean",
            other.type_of(),
            shorten(&format!("{other:?}"))
        )),
        Err(e) => Some(format!("evaluation failed: {}", shorten(&e.to_string()))),
    }
}

/// The parser's errors, one sentence each.
fn parse_text(errors: &ParseErrors) -> String {
    let texts: Vec<String> = errors
        .errors
        .iter()
        .map(|e| {
            if e.pos.0 > 0 && e.pos.1 > 0 {
                format!("{} (line {}, column {})", e.msg, e.pos.0, e.pos.1)
            } else {
                e.msg.clone()
            }
        })
        .collect();
    if texts.is_empty() {
        "the parser gave no reason".to_owned()
    } else {
        texts.join("; ")
    }
}

/// `Kind namespace/name`, or `Kind name` when cluster-scoped.
fn describe(object: &Value) -> String {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
    let kind = text("/kind").unwrap_or("object");
    let name = text("/metadata/name").unwrap_or("(unnamed)");
    match text("/metadata/namespace") {
        Some(namespace) if !namespace.is_empty() => format!("{kind} {namespace}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

/// What a false gate saw: the values of the first fields it selects from `object`.
fn false_reason(gate: &Gate, object: &Value) -> String {
    let mut paths = Vec::new();
    collect_paths(gate.program.expression(), false, &mut paths);
    if paths.is_empty() {
        return "the expression is false".to_owned();
    }
    let seen: Vec<String> = paths
        .iter()
        .map(|path| {
            let value = path
                .iter()
                .try_fold(object, |value, field| value.get(field.as_str()))
                .map_or_else(|| "absent".to_owned(), |v| shorten(&v.to_string()));
            format!("{OBJECT}.{}={value}", path.join("."))
        })
        .collect();
    format!("the expression is false with {}", seen.join(", "))
}

/// Gathers, in order and once each, up to [`SHOWN_FIELDS`] field paths the expression selects
/// from `object` (not where a comprehension rebinds the name).
fn collect_paths(expr: &IdedExpr, shadowed: bool, paths: &mut Vec<Vec<String>>) {
    if paths.len() >= SHOWN_FIELDS {
        return;
    }
    if let Expr::Comprehension(c) = &expr.expr {
        let inner = shadowed || rebinds(c, OBJECT);
        collect_paths(&c.iter_range, shadowed, paths);
        collect_paths(&c.accu_init, shadowed, paths);
        for part in [&c.loop_cond, &c.loop_step, &c.result] {
            collect_paths(part, inner, paths);
        }
        return;
    }
    if !shadowed && let Some(path) = select_path(expr) {
        if !paths.contains(&path) {
            paths.push(path);
        }
        return;
    }
    for child in children(&expr.expr) {
        collect_paths(child, shadowed, paths);
    }
}

/// The fields of a selection chain rooted at `object`, outermost last.
fn select_path(expr: &IdedExpr) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut current = expr;
    while let Expr::Select(select) = &current.expr {
        fields.push(select.field.clone());
        current = &select.operand;
    }
    match &current.expr {
        Expr::Ident(name) if name == OBJECT && !fields.is_empty() => {
            fields.reverse();
            Some(fields)
        }
        _ => None,
    }
}

/// Whether a comprehension binds `name` for its loop.
fn rebinds(c: &ComprehensionExpr, name: &str) -> bool {
    c.iter_var == name || c.accu_var == name || c.iter_var2.as_deref() == Some(name)
}

/// The direct subexpressions of an expression.
fn children(expr: &Expr) -> Vec<&IdedExpr> {
    match expr {
        Expr::Call(call) => call
            .target
            .as_deref()
            .into_iter()
            .chain(call.args.iter())
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => entries(&map.entries),
        Expr::Struct(fields) => entries(&fields.entries),
        Expr::Select(select) => vec![&*select.operand],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

/// The subexpressions of map or struct entries.
fn entries(entries: &[IdedEntryExpr]) -> Vec<&IdedExpr> {
    entries
        .iter()
        .flat_map(|entry| match &entry.expr {
            EntryExpr::StructField(field) => vec![&field.value],
            EntryExpr::MapEntry(pair) => vec![&pair.key, &pair.value],
        })
        .collect()
}

/// Whether the expression builds a message (`Type{field: value}`), which the CEL library
/// parses but cannot evaluate (it panics).
fn constructs_message(expr: &IdedExpr) -> bool {
    let here = match &expr.expr {
        Expr::Struct(_) | Expr::Unspecified => true,
        Expr::Map(map) => map
            .entries
            .iter()
            .any(|entry| matches!(entry.expr, EntryExpr::StructField(_))),
        _ => false,
    };
    here || children(&expr.expr).into_iter().any(constructs_message)
}

/// How deep comprehensions nest: one inside another's loop body counts one level more; one in
/// its range, initial value or result (evaluated once) does not.
fn nesting(expr: &IdedExpr) -> usize {
    if let Expr::Comprehension(c) = &expr.expr {
        let once = [&c.iter_range, &c.accu_init, &c.result]
            .into_iter()
            .map(nesting)
            .max()
            .unwrap_or(0);
        let body = nesting(&c.loop_cond).max(nesting(&c.loop_step)) + 1;
        return once.max(body);
    }
    children(&expr.expr)
        .into_iter()
        .map(nesting)
        .max()
        .unwrap_or(0)
}

/// A bound on the values an expression can take.
#[derive(Clone)]
enum Bound<'a> {
    /// Parts of the object: any one of these JSON values.
    Read(Rc<[&'a Value]>),
    /// Anything else: at most `len` elements or entries, and `size` JSON values in all.
    Sized {
        /// The most elements or entries.
        len: u64,
        /// The most values, itself and everything it contains.
        size: u64,
    },
}

/// A boolean, number or string.
const SCALAR: Bound<'static> = Bound::Sized { len: 0, size: 1 };

/// The names in scope during the estimate, innermost last.
type Scope<'e, 'a> = Vec<(&'e str, Bound<'a>)>;

/// An object measured for the estimate: the size of each of its parts, and its depth.
struct Measure<'a> {
    object: &'a Value,
    /// The number of JSON values in each part, by address.
    sizes: HashMap<*const Value, u64>,
    depth: usize,
}

impl<'a> Measure<'a> {
    /// Measures an object without recursion, so that no object can exhaust the stack.
    fn of(object: &'a Value) -> Self {
        let mut sizes = HashMap::new();
        let mut depth = 0;
        let mut pending = vec![(object, 1, false)];
        while let Some((value, level, done)) = pending.pop() {
            depth = depth.max(level);
            if done {
                let size = members(value)
                    .filter_map(|member| sizes.get(&std::ptr::from_ref(member)))
                    .fold(1_u64, |sum, size| sum.saturating_add(*size));
                sizes.insert(std::ptr::from_ref(value), size);
            } else {
                pending.push((value, level, true));
                pending.extend(members(value).map(|member| (member, level + 1, false)));
            }
        }
        Measure {
            object,
            sizes,
            depth,
        }
    }

    /// The estimated cost of evaluating `expr` over the object.
    fn estimate(&self, expr: &IdedExpr) -> u64 {
        let mut scope = vec![(OBJECT, self.read(vec![self.object]))];
        self.cost(expr, &mut scope).0
    }

    /// A bound over parts of the object, followed one by one unless there are too many.
    fn read(&self, parts: Vec<&'a Value>) -> Bound<'a> {
        if parts.len() <= MAX_TRACKED {
            return Bound::Read(parts.into());
        }
        let read = Bound::Read(parts.into());
        Bound::Sized {
            len: Self::len(&read),
            size: self.size(&read),
        }
    }

    /// The most values a bound's value contains (at least 1).
    fn size(&self, bound: &Bound<'_>) -> u64 {
        match bound {
            Bound::Read(parts) => parts
                .iter()
                .filter_map(|part| self.sizes.get(&std::ptr::from_ref(*part)))
                .fold(1, |most, size| most.max(*size)),
            Bound::Sized { size, .. } => (*size).max(1),
        }
    }

    /// The most elements or entries a bound's value has.
    fn len(bound: &Bound<'_>) -> u64 {
        match bound {
            Bound::Read(parts) => parts.iter().fold(0, |most, part| {
                let len = match part {
                    Value::Array(items) => items.len(),
                    Value::Object(fields) => fields.len(),
                    _ => 0,
                };
                most.max(u64::try_from(len).unwrap_or(u64::MAX))
            }),
            Bound::Sized { len, .. } => *len,
        }
    }

    /// A field of a bound's value.
    fn field(&self, bound: &Bound<'a>, name: &str) -> Bound<'a> {
        match bound {
            Bound::Read(parts) => self.read(parts.iter().filter_map(|p| p.get(name)).collect()),
            Bound::Sized { .. } => bound.clone(),
        }
    }

    /// An element of a list or a value of a map: what indexing yields.
    fn member(&self, bound: &Bound<'a>) -> Bound<'a> {
        match bound {
            Bound::Read(parts) => self.read(parts.iter().flat_map(|p| members(p)).collect()),
            Bound::Sized { .. } => bound.clone(),
        }
    }

    /// What a loop over a bound's value binds: a list's elements, a map's keys (strings).
    fn item(&self, bound: &Bound<'a>) -> Bound<'a> {
        match bound {
            Bound::Read(parts) => self.read(
                parts
                    .iter()
                    .filter_map(|p| p.as_array())
                    .flatten()
                    .collect(),
            ),
            Bound::Sized { .. } => bound.clone(),
        }
    }

    /// A sized bound covering either of two.
    fn join(&self, a: &Bound<'a>, b: &Bound<'a>) -> Bound<'a> {
        Bound::Sized {
            len: Self::len(a).max(Self::len(b)),
            size: self.size(a).max(self.size(b)),
        }
    }

    /// `a + b`: a scalar for two scalars, else a concatenation.
    fn add(&self, a: &Bound<'a>, b: &Bound<'a>) -> Bound<'a> {
        if is_scalar(self, a) && is_scalar(self, b) {
            return SCALAR;
        }
        Bound::Sized {
            len: Self::len(a).saturating_add(Self::len(b)),
            size: self.size(a).saturating_add(self.size(b)),
        }
    }

    /// The cost of `expr` and a bound on its value, with `scope` naming what is in scope.
    fn cost<'e>(&self, expr: &'e IdedExpr, scope: &mut Scope<'e, 'a>) -> (u64, Bound<'a>) {
        match &expr.expr {
            Expr::Ident(name) => {
                let bound = scope.iter().rev().find(|(n, _)| n == name);
                (1, bound.map_or(SCALAR, |(_, bound)| bound.clone()))
            }
            Expr::Select(select) => {
                let (cost, operand) = self.cost(&select.operand, scope);
                if select.test {
                    return (cost.saturating_add(1), SCALAR);
                }
                let value = self.field(&operand, &select.field);
                (
                    cost.saturating_add(1).saturating_add(self.size(&value)),
                    value,
                )
            }
            Expr::Call(call) => self.call(call, scope),
            Expr::Comprehension(c) => self.comprehension(c, scope),
            Expr::List(_) | Expr::Map(_) | Expr::Struct(_) => self.literal(expr, scope),
            Expr::Literal(_) | Expr::Unspecified => (1, SCALAR),
        }
    }

    /// A list or map literal: it copies what it holds.
    fn literal<'e>(&self, expr: &'e IdedExpr, scope: &mut Scope<'e, 'a>) -> (u64, Bound<'a>) {
        let parts = children(&expr.expr);
        let len = match &expr.expr {
            Expr::List(list) => list.elements.len(),
            Expr::Map(map) => map.entries.len(),
            _ => 0,
        };
        let (mut cost, mut size) = (1_u64, 1_u64);
        for part in parts {
            let (part_cost, bound) = self.cost(part, scope);
            let part_size = self.size(&bound);
            cost = cost.saturating_add(part_cost).saturating_add(part_size);
            size = size.saturating_add(part_size);
        }
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        (cost, Bound::Sized { len, size })
    }

    /// A function or operator call.
    fn call<'e>(&self, call: &'e CallExpr, scope: &mut Scope<'e, 'a>) -> (u64, Bound<'a>) {
        let parts: Vec<(u64, Bound<'a>)> = call
            .target
            .as_deref()
            .into_iter()
            .chain(call.args.iter())
            .map(|part| self.cost(part, scope))
            .collect();
        let cost = parts
            .iter()
            .fold(1_u64, |sum, (cost, _)| sum.saturating_add(*cost));
        let copied = parts.iter().fold(0, |sum: u64, (_, bound)| {
            sum.saturating_add(self.size(bound))
        });
        let first = parts.first().map_or(SCALAR, |(_, bound)| bound.clone());
        let second = parts.get(1).map_or(SCALAR, |(_, bound)| bound.clone());
        let third = parts.get(2).map_or(SCALAR, |(_, bound)| bound.clone());
        let name = call.func_name.as_str();
        let (extra, value) = match name {
            operators::LOGICAL_AND
            | operators::LOGICAL_OR
            | operators::LOGICAL_NOT
            | operators::NOT_STRICTLY_FALSE => (0, SCALAR),
            operators::CONDITIONAL => (0, self.join(&second, &third)),
            operators::INDEX | operators::OPT_INDEX | operators::OPT_SELECT => {
                let value = self.member(&first);
                (self.size(&value).saturating_add(self.size(&second)), value)
            }
            operators::ADD => {
                let value = self.add(&first, &second);
                (self.size(&value), value)
            }
            _ if name.starts_with(['_', '@', '!', '-']) || SCALAR_FUNCTIONS.contains(&name) => {
                (copied, SCALAR)
            }
            _ => {
                let len = parts.iter().fold(0, |most, (_, b)| most.max(Self::len(b)));
                let size = copied.saturating_add(1);
                (copied, Bound::Sized { len, size })
            }
        };
        (cost.saturating_add(extra), value)
    }

    /// A comprehension: its range, initial value and result once, and its loop body once per
    /// element of the range, copying the element and the accumulator at each step.
    fn comprehension<'e>(
        &self,
        c: &'e ComprehensionExpr,
        scope: &mut Scope<'e, 'a>,
    ) -> (u64, Bound<'a>) {
        let (range_cost, range) = self.cost(&c.iter_range, scope);
        let (init_cost, init) = self.cost(&c.accu_init, scope);
        let steps = Self::len(&range).max(1);
        let item = self.item(&range);
        // What one step adds to an empty accumulator, `steps` times over.
        let empty = Bound::Sized { len: 0, size: 0 };
        let added = self.in_loop(c, &item, empty, scope, |m, scope| {
            m.cost(&c.loop_step, scope).1
        });
        let accumulator = if is_scalar(self, &added) && is_scalar(self, &init) {
            SCALAR
        } else {
            Bound::Sized {
                len: Self::len(&init).saturating_add(steps.saturating_mul(Self::len(&added))),
                size: self
                    .size(&init)
                    .saturating_add(steps.saturating_mul(self.size(&added))),
            }
        };
        let copies = self.size(&item).saturating_add(self.size(&accumulator));
        let body = self.in_loop(c, &item, accumulator.clone(), scope, |m, scope| {
            let condition = m.cost(&c.loop_cond, scope).0;
            condition.saturating_add(m.cost(&c.loop_step, scope).0)
        });
        let (result_cost, result) = self.in_loop(c, &SCALAR, accumulator, scope, |m, scope| {
            m.cost(&c.result, scope)
        });
        let once = [range_cost, init_cost, result_cost]
            .into_iter()
            .fold(1, u64::saturating_add);
        let each = body.saturating_add(copies);
        (once.saturating_add(steps.saturating_mul(each)), result)
    }

    /// Runs `work` with a comprehension's variables in scope.
    fn in_loop<'e, T>(
        &self,
        c: &'e ComprehensionExpr,
        item: &Bound<'a>,
        accumulator: Bound<'a>,
        scope: &mut Scope<'e, 'a>,
        work: impl FnOnce(&Self, &mut Scope<'e, 'a>) -> T,
    ) -> T {
        let outer = scope.len();
        scope.push((c.iter_var.as_str(), item.clone()));
        if let Some(second) = &c.iter_var2 {
            scope.push((second.as_str(), item.clone()));
        }
        scope.push((c.accu_var.as_str(), accumulator));
        let out = work(self, scope);
        scope.truncate(outer);
        out
    }
}

/// Whether a bound is at most one scalar value.
fn is_scalar(measure: &Measure<'_>, bound: &Bound<'_>) -> bool {
    Measure::len(bound) == 0 && measure.size(bound) <= 1
}

/// The elements of a list or the values of a map; nothing for a scalar.
fn members(value: &Value) -> Box<dyn Iterator<Item = &Value> + '_> {
    match value {
        Value::Array(items) => Box::new(items.iter()),
        Value::Object(fields) => Box::new(fields.values()),
        _ => Box::new(std::iter::empty()),
    }
}

/// A JSON value as CEL sees it: integers as `int` (`uint` beyond), like Kubernetes.
fn to_cel(value: &Value) -> Cel {
    match value {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => n
            .as_i64()
            .map(Cel::Int)
            .or_else(|| n.as_u64().map(Cel::UInt))
            .unwrap_or_else(|| Cel::Float(n.as_f64().unwrap_or(f64::NAN))),
        Value::String(text) => Cel::String(Arc::new(text.clone())),
        Value::Array(items) => Cel::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(fields) => {
            let map: HashMap<Key, Cel> = fields
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            Cel::Map(CelMap { map: Arc::new(map) })
        }
    }
}

/// `text`, cut to [`SHOWN_CHARS`] characters.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((end, _)) => format!("{}…", text.get(..end).unwrap_or(text)),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const AVAILABLE: &str = "object.status.availableReplicas == object.spec.replicas";
    const CUBIC: &str = "object.spec.items.all(a, object.spec.items.all(b, \
                         object.spec.items.all(c, a == b)))";

    fn gate(expression: &str) -> Gate {
        Gate::compile("test", expression).expect("compiles")
    }

    fn deployment(replicas: i64, available: i64) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"namespace": "apps", "name": "web"},
            "spec": {"replicas": replicas},
            "status": {"availableReplicas": available},
        })
    }

    fn estimate(g: &Gate, object: &Value) -> u64 {
        Measure::of(object).estimate(g.program.expression())
    }

    fn fail(verdict: Verdict) -> String {
        match verdict {
            Verdict::Fail(message) => message,
            Verdict::Pass => panic!("expected a failure"),
        }
    }

    fn items(n: usize) -> Value {
        json!({"kind": "List", "metadata": {"name": "l"}, "spec": {"items": vec![1; n]}})
    }

    #[test]
    fn gates_an_available_deployment() {
        let g = gate(AVAILABLE);
        assert_eq!(g.name(), "test");
        assert_eq!(g.expression(), AVAILABLE);
        assert_eq!(evaluate(&g, &[deployment(2, 2)]), Verdict::Pass);
    }

    #[test]
    fn gates_an_unavailable_deployment_naming_it_and_what_it_saw() {
        let message = fail(evaluate(&gate(AVAILABLE), &[deployment(2, 1)]));
        assert_eq!(
            message,
            "Deployment apps/web: the expression is false with \
             object.status.availableReplicas=1, object.spec.replicas=2"
        );
    }

    #[test]
    fn gates_on_the_first_failing_object_only() {
        let broken = json!({"kind": "Deployment", "metadata": {"name": "broken"}});
        let objects = [deployment(2, 2), deployment(3, 1), broken];
        let message = fail(evaluate(&gate(AVAILABLE), &objects));
        assert!(message.starts_with("Deployment apps/web:"), "{message}");
        assert!(message.contains("availableReplicas=1"), "{message}");
    }

    #[test]
    fn gates_a_missing_field_as_a_failure() {
        let mut object = deployment(2, 2);
        object["status"] = json!({});
        let message = fail(evaluate(&gate(AVAILABLE), &[object]));
        assert_eq!(
            message,
            "Deployment apps/web: evaluation failed: No such key: availableReplicas"
        );
    }

    #[test]
    fn gates_shows_absent_fields() {
        let g = gate("has(object.status.ready) && object.status.ready");
        let message = fail(evaluate(
            &g,
            &[json!({"kind": "Node", "metadata": {"name": "n1"}, "status": {}})],
        ));
        assert_eq!(
            message,
            "Node n1: the expression is false with object.status.ready=absent"
        );
    }

    #[test]
    fn gates_a_non_boolean_result_as_a_failure() {
        let message = fail(evaluate(&gate("object.spec.replicas"), &[deployment(3, 3)]));
        assert!(message.starts_with("Deployment apps/web: "), "{message}");
        assert!(message.contains("not a boolean"), "{message}");
        assert!(message.contains("int"), "{message}");
    }

    #[test]
    fn gates_nothing_read_as_a_failure() {
        assert_eq!(
            evaluate(&gate(AVAILABLE), &[]),
            Verdict::Fail(NO_OBJECT.to_owned())
        );
    }

    #[test]
    fn gates_refuse_too_many_objects() {
        let objects = vec![deployment(1, 1); MAX_OBJECTS + 1];
        let message = fail(evaluate(&gate(AVAILABLE), &objects));
        assert!(message.contains("501 objects"), "{message}");
        assert!(message.contains("limit of 500"), "{message}");
        assert!(message.contains("label selector"), "{message}");
        let objects = vec![deployment(1, 1); MAX_OBJECTS];
        assert_eq!(evaluate(&gate(AVAILABLE), &objects), Verdict::Pass);
    }

    #[test]
    fn gates_refuse_four_nested_macros() {
        let four = "object.a.all(a, a.all(b, b.exists(c, c.map(d, d).size() > 0)))";
        assert_eq!(
            Gate::compile("deep", four).unwrap_err(),
            GateError::TooDeep { depth: 4 }
        );
        let message = Gate::compile("deep", four).unwrap_err().to_string();
        assert!(
            message.contains("nests 4") && message.contains("at most 3"),
            "{message}"
        );
        // Three nested, and macros chained one after another, are allowed.
        gate("object.a.all(a, a.all(b, b.exists(c, c > 0)))");
        gate("object.a.map(x, x).filter(x, x > 0).map(x, x).all(x, x > 1)");
    }

    #[test]
    fn gates_refuse_an_estimate_over_the_limit_before_evaluating() {
        let g = gate(CUBIC);
        let message = fail(evaluate(&g, &[items(2000)]));
        assert!(
            message.starts_with("List l: the gate's estimated cost "),
            "{message}"
        );
        assert!(
            message.contains("exceeds the limit of 1000000"),
            "{message}"
        );
        assert!(estimate(&g, &items(2000)) > COST_LIMIT);
        assert_eq!(evaluate(&g, &[items(3)]), Verdict::Pass);
        assert!(estimate(&g, &items(3)) <= COST_LIMIT);
    }

    #[test]
    fn gates_charge_what_the_interpreter_copies() {
        // Rereading the whole list at each of its 2000 steps copies it 2000 times.
        let rereads = gate("object.spec.items.all(a, size(object.spec.items) > 0)");
        let message = fail(evaluate(&rereads, &[items(2000)]));
        assert!(message.contains("estimated cost"), "{message}");
        assert_eq!(evaluate(&rereads, &[items(100)]), Verdict::Pass);
        // Reading each element once is cheap.
        let once = gate("object.spec.items.all(a, a > 0)");
        assert_eq!(evaluate(&once, &[items(2000)]), Verdict::Pass);
        // A map copies its growing accumulator at each step.
        let mapped = gate("object.spec.items.map(a, a + 1).size() > 0");
        assert!(estimate(&mapped, &items(100)) > 100 * 100);
    }

    #[test]
    fn gates_a_ceph_cluster() {
        let g = gate("object.status.ceph.health == 'HEALTH_OK'");
        let ceph = |health: &str| {
            json!({
                "apiVersion": "ceph.rook.io/v1",
                "kind": "CephCluster",
                "metadata": {"namespace": "rook-ceph", "name": "rook-ceph"},
                "status": {"ceph": {"health": health}},
            })
        };
        assert_eq!(evaluate(&g, &[ceph("HEALTH_OK")]), Verdict::Pass);
        assert_eq!(
            fail(evaluate(&g, &[ceph("HEALTH_WARN")])),
            "CephCluster rook-ceph/rook-ceph: the expression is false with \
             object.status.ceph.health=\"HEALTH_WARN\""
        );
    }

    #[test]
    fn gates_a_cluster_scoped_object_by_kind_and_name() {
        let g = gate("object.spec.unschedulable != true");
        let node =
            json!({"kind": "Node", "metadata": {"name": "w1"}, "spec": {"unschedulable": true}});
        assert_eq!(
            fail(evaluate(&g, &[node])),
            "Node w1: the expression is false with object.spec.unschedulable=true"
        );
    }

    #[test]
    fn gates_refuse_an_expression_that_does_not_parse() {
        let error = Gate::compile("bad", "object.status. == 1").unwrap_err();
        let GateError::Parse(text) = &error else {
            panic!("{error:?}")
        };
        assert!(!text.is_empty());
        assert!(
            error
                .to_string()
                .starts_with("the expression does not parse: ")
        );
        assert!(text.contains("line 1"), "{text}");
    }

    #[test]
    fn gates_refuse_a_too_long_expression() {
        let long = format!("true{}", " && true".repeat(MAX_EXPRESSION / 8));
        assert_eq!(
            Gate::compile("long", &long).unwrap_err(),
            GateError::TooLong { length: long.len() }
        );
        assert!(
            Gate::compile("long", &long)
                .unwrap_err()
                .to_string()
                .contains("2048")
        );
    }

    #[test]
    fn gates_survive_hostile_input() {
        let deep = (0..1000).fold(json!(1), |inner, _| json!([inner]));
        let message = fail(evaluate(&gate("object == 1"), &[deep]));
        assert!(message.contains("levels deep"), "{message}");
        for expression in [
            "1 +",
            "(",
            ")",
            "",
            "object.a.all(1, 2)",
            "all(x, y)",
            "has(1)",
            &"(".repeat(MAX_EXPRESSION),
            &"!".repeat(MAX_EXPRESSION - 4),
            &format!("1{}", " + 1".repeat(500)),
            &format!("object{}", ".a".repeat(1020)),
            &format!("{}1", "true ? 1 : ".repeat(150)),
            &format!("{}1{}", "[".repeat(95), "]".repeat(95)),
            "[1, 2].all(i, v, v > 0)",
            "object.?spec",
        ] {
            if let Ok(g) = Gate::compile("hostile", expression) {
                let _ = evaluate(&g, &[deployment(1, 1), json!(null), json!([1, 2])]);
            }
        }
        for expression in [
            "object.spec.replicas / 0 == 1",
            "9223372036854775807 + object.spec.replicas > 0",
            "object[1] == 2",
            "object.spec.replicas.all(x, x)",
            "int('x') == 1",
            "object.metadata.name.matches('(') ",
            "size(object) == object",
        ] {
            let message = fail(evaluate(&gate(expression), &[deployment(1, 1)]));
            assert!(message.starts_with("Deployment apps/web: "), "{message}");
        }
    }

    #[test]
    fn gates_refuse_what_the_library_cannot_evaluate() {
        // The parser takes message construction, which the interpreter does not support.
        let error = Gate::compile("msg", "Foo{a: 1} == 1").unwrap_err();
        assert!(
            error.to_string().contains("message construction"),
            "{error}"
        );
        // Past the parser's recursion limit; in a debug build the parser panics on it.
        let chain = format!("{}1", "true ? 1 : ".repeat(150));
        let error = Gate::compile("chain", &chain).unwrap_err();
        assert!(matches!(error, GateError::Parse(_)), "{error}");
    }

    #[test]
    fn gates_read_a_realistic_node_within_the_limit() {
        let image = |i: usize| {
            json!({"names": [format!("registry.k8s.io/image-{i}@sha256:{}", "0".repeat(64))],
                   "sizeBytes": 1000 + i})
        };
        let condition = |kind: &str| {
            let status = if kind == "Ready" { "True" } else { "False" };
            let message = "kubelet is posting ready status ".repeat(4);
            json!({"type": kind, "status": status, "message": message})
        };
        let conditions: Vec<Value> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
            .into_iter()
            .map(condition)
            .collect();
        let images: Vec<Value> = (0..100).map(image).collect();
        let node = json!({
            "kind": "Node",
            "metadata": {"name": "w1", "labels": {"kubernetes.io/hostname": "w1"}},
            "status": {"conditions": conditions, "images": images},
        });
        let g = gate(
            "object.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True') && \
             object.status.conditions.all(c, c.type == 'Ready' || c.status == 'False')",
        );
        assert!(
            estimate(&g, &node) < COST_LIMIT / 10,
            "{}",
            estimate(&g, &node)
        );
        assert_eq!(evaluate(&g, &[node]), Verdict::Pass);
    }

    /// A random expression over `object`, mostly valid CEL.
    fn random_expression(rng: &mut ichor_testenv::rng::TestRng, depth: usize) -> String {
        const PATHS: &[&str] = &["object", "object.spec", "object.spec.items", "object.kind"];
        const LEAVES: &[&str] = &["1", "-1", "2.5", "'web'", "true", "null", "[]", "{}", "x"];
        const BINARY: &[&str] = &[
            "==", "!=", "<", ">=", "+", "-", "*", "/", "%", "&&", "||", "in",
        ];
        const MACROS: &[&str] = &["all", "exists", "exists_one", "map", "filter"];
        const FUNCTIONS: &[&str] = &["size", "int", "string", "matches", "startsWith", "max"];
        let pick = |rng: &mut ichor_testenv::rng::TestRng, from: &[&str]| {
            from[rng.below(from.len())].to_owned()
        };
        if depth == 0 {
            return if rng.chance(1, 2) {
                pick(rng, PATHS)
            } else {
                pick(rng, LEAVES)
            };
        }
        let sub = |rng: &mut ichor_testenv::rng::TestRng| random_expression(rng, depth - 1);
        match rng.below(8) {
            0 => format!("{} {} {}", sub(rng), pick(rng, BINARY), sub(rng)),
            1 => format!(
                "{}.{}(x, {})",
                pick(rng, PATHS),
                pick(rng, MACROS),
                sub(rng)
            ),
            2 => format!("{}({})", pick(rng, FUNCTIONS), sub(rng)),
            3 => format!("{}.{}({})", sub(rng), pick(rng, FUNCTIONS), sub(rng)),
            4 => format!("[{}, {}]", sub(rng), sub(rng)),
            5 => format!("{}[{}]", sub(rng), sub(rng)),
            6 => format!("{} ? {} : {}", sub(rng), sub(rng), sub(rng)),
            _ => format!("!({})", sub(rng)),
        }
    }

    #[test]
    fn gates_never_panic_on_random_expressions() {
        let mut rng = ichor_testenv::rng::seeded(11);
        let objects = [
            deployment(1, 1),
            items(3),
            json!(null),
            json!({"spec": "x"}),
        ];
        let mut compiled = 0;
        for _ in 0..300 {
            let expression = random_expression(&mut rng, 3);
            if let Ok(g) = Gate::compile("random", &expression) {
                compiled += 1;
                for object in &objects {
                    let verdict = evaluate(&g, std::slice::from_ref(object));
                    let panicked = matches!(&verdict, Verdict::Fail(m) if m.contains("panicked"));
                    assert!(!panicked, "{expression}: {verdict:?}");
                }
            }
        }
        assert!(compiled > 100, "{compiled}");
    }

    #[test]
    fn gates_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Gate>();
    }
}

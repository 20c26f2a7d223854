//! Label and id queries of List and Watch, matched as COSI matches them (talos-facts §13.2): a
//! resource matches a list of label queries when any of them matches, and a label query when
//! every term does; an id query is a regular expression on the id.

use std::collections::BTreeMap;

use ichor_talos::api::cosi::resource::label_term::Operation;
use ichor_talos::api::cosi::resource::{IdQuery, LabelQuery, LabelTerm};
use regex::Regex;
use tonic::Status;

/// A compiled query.
#[derive(Debug, Default)]
pub(crate) struct Query {
    labels: Vec<LabelQuery>,
    id: Option<Regex>,
}

impl Query {
    /// Compiles the options' queries; an id query that is no regular expression is
    /// `InvalidArgument`, an operator COSI does not know `Unimplemented`.
    pub(crate) fn new(labels: &[LabelQuery], id: Option<&IdQuery>) -> Result<Self, Status> {
        for term in labels.iter().flat_map(|q| &q.terms) {
            if Operation::try_from(term.op).is_err() {
                return Err(Status::unimplemented(format!(
                    "unsupported label query operator: {}",
                    term.op
                )));
            }
        }
        let id =
            match id.map(|q| q.regexp.as_str()) {
                None | Some("") => None,
                Some(pattern) => Some(Regex::new(pattern).map_err(|e| {
                    Status::invalid_argument(format!("failed to compile regexp: {e}"))
                })?),
            };
        Ok(Self {
            labels: labels.to_vec(),
            id,
        })
    }

    /// Whether a resource with this id and these labels matches.
    pub(crate) fn matches(&self, id: &str, labels: &BTreeMap<String, String>) -> bool {
        self.id.as_ref().is_none_or(|re| re.is_match(id))
            && (self.labels.is_empty()
                || self
                    .labels
                    .iter()
                    .any(|q| q.terms.iter().all(|t| term_matches(t, labels))))
    }
}

fn term_matches(term: &LabelTerm, labels: &BTreeMap<String, String>) -> bool {
    let op = Operation::try_from(term.op).unwrap_or(Operation::Exists);
    let comparison = matches!(
        op,
        Operation::Lt | Operation::Lte | Operation::LtNumeric | Operation::LteNumeric
    );
    let outcome = match labels.get(&term.key) {
        None if comparison => None,
        None => Some(false),
        Some(_) if op == Operation::Exists => Some(true),
        Some(_) if op == Operation::NotExists => Some(true),
        Some(_) if term.value.is_empty() => Some(false),
        Some(value) => match op {
            Operation::Equal => Some(*value == term.value[0]),
            Operation::In => Some(term.value.contains(value)),
            Operation::Lt => Some(*value < term.value[0]),
            Operation::Lte => Some(*value <= term.value[0]),
            Operation::LtNumeric => numbers(value, &term.value[0]).map(|(l, r)| l < r),
            Operation::LteNumeric => numbers(value, &term.value[0]).map(|(l, r)| l <= r),
            Operation::Exists | Operation::NotExists => Some(true),
        },
    };
    // NOT_EXISTS is EXISTS inverted, whatever the term's own invert (COSI's ConvertLabelQuery);
    // a comparison on a missing label or a non-number never matches, inverted or not.
    let invert = op == Operation::NotExists || term.invert;
    outcome.is_some_and(|m| m != invert)
}

/// Both sides as integers (COSI's `compare.GetNumbers`, without unit suffixes).
fn numbers(left: &str, right: &str) -> Option<(i64, i64)> {
    let parse = |s: &str| s.trim().parse::<i64>().ok();
    Some((parse(left)?, parse(right)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(key: &str, op: Operation, value: &[&str], invert: bool) -> LabelTerm {
        LabelTerm {
            key: key.into(),
            op: op as i32,
            value: value.iter().map(|v| (*v).to_owned()).collect(),
            invert,
        }
    }

    #[test]
    fn matches_label_terms_as_cosi_does() {
        let labels = BTreeMap::from([("a".to_owned(), "10".to_owned())]);
        let query = |terms: Vec<LabelTerm>| {
            Query::new(&[LabelQuery { terms }], None)
                .expect("query")
                .matches("x", &labels)
        };
        assert!(query(vec![term("a", Operation::Exists, &[], false)]));
        assert!(!query(vec![term("a", Operation::NotExists, &[], false)]));
        assert!(query(vec![term("b", Operation::NotExists, &[], false)]));
        assert!(query(vec![term("a", Operation::Equal, &["10"], false)]));
        assert!(query(vec![term("a", Operation::In, &["1", "10"], false)]));
        assert!(query(vec![term("a", Operation::LtNumeric, &["9"], true)]));
        assert!(!query(vec![term("b", Operation::Lt, &["9"], true)]));
        assert!(
            query(vec![term("a", Operation::Lt, &["9"], false)]),
            "as strings"
        );
    }

    #[test]
    fn id_queries_are_regular_expressions() {
        let query = Query::new(
            &[],
            Some(&IdQuery {
                regexp: "^eth".into(),
            }),
        )
        .expect("query");
        assert!(query.matches("eth0", &BTreeMap::new()));
        assert!(!query.matches("lo", &BTreeMap::new()));
        assert!(
            Query::new(&[], Some(&IdQuery { regexp: "(".into() })).is_err(),
            "not a regular expression"
        );
    }
}

//! The plan printed: sections of aligned columns and sentences for a person, or JSON.

use std::fmt::Write as _;

use super::report::{BatchStep, Report};
use crate::Error;
use crate::table;

/// The plan as JSON, pretty-printed, ending with a newline.
pub fn json(report: &Report) -> Result<String, Error> {
    serde_json::to_string_pretty(report)
        .map(|text| text + "\n")
        .map_err(|e| Error::Object(format!("cannot print the plan as JSON: {e}")))
}

/// The plan for a person.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "Plan for TalosCluster {} in namespace {}, at {}\n",
        report.cluster, report.namespace, report.at
    );
    section(
        &mut out,
        "Changes",
        &report.changes,
        "none: the manifest declares what is live",
    );
    if !report.refused.is_empty() {
        let refused: Vec<String> = report
            .refused
            .iter()
            .map(|r| format!("{}: {}", r.reason, r.message))
            .collect();
        section(&mut out, "Refused", &refused, "");
    }
    machines(&mut out, report);
    order(&mut out, &report.batches);
    let holds: Vec<String> = report
        .holds
        .iter()
        .map(|h| format!("{}: {}", h.reason, h.message))
        .collect();
    let no_hold = if report.batches.is_empty() {
        "none"
    } else {
        "none: the first batch starts at once"
    };
    section(&mut out, "Holds now", &holds, no_hold);
    section(&mut out, "Notes", &report.notes, "none");
    out
}

/// A titled list of lines, or `empty` when there are none.
fn section(out: &mut String, title: &str, lines: &[String], empty: &str) {
    let _ = write!(out, "\n{title}:\n");
    if lines.is_empty() {
        let _ = writeln!(out, "  {empty}");
    }
    for line in lines {
        let _ = writeln!(out, "  {line}");
    }
}

/// Each machine's step: a table, then what it gets in a sentence.
fn machines(out: &mut String, report: &Report) {
    if report.machines.is_empty() {
        return;
    }
    let rows: Vec<Vec<String>> = report
        .machines
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                m.role.clone(),
                m.change.clone(),
                if m.predicted {
                    format!("{} (predicted)", m.how)
                } else {
                    m.how.clone()
                },
                m.drain.clone(),
                m.policy.clone(),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table::table(
        &["MACHINE", "ROLE", "CHANGE", "HOW", "DRAIN", "POLICY"],
        &rows,
    ));
    // Each sentence once, with the machines it is said of.
    let mut said: Vec<(&str, Vec<&str>)> = Vec::new();
    for m in report.machines.iter().filter(|m| m.change != "none") {
        match said.iter_mut().find(|(detail, _)| *detail == m.detail) {
            Some((_, names)) => names.push(&m.name),
            None => said.push((&m.detail, vec![&m.name])),
        }
    }
    for (detail, names) in said {
        let _ = writeln!(out, "  {}: {detail}", names.join(", "));
    }
}

/// The batches in order, each with what stands before it.
fn order(out: &mut String, batches: &[BatchStep]) {
    let lines: Vec<String> = batches
        .iter()
        .map(|b| {
            let mut before = Vec::new();
            if !b.waits_for.is_empty() {
                before.push(format!("after {} is healthy again", b.waits_for.join(", ")));
            }
            if !b.drains.is_empty() {
                before.push(format!("drains {}", b.drains.join(", ")));
            }
            if b.window {
                before.push("in a maintenance window".to_owned());
            }
            if !b.gates.is_empty() {
                before.push(format!("gates {}", b.gates.join(", ")));
            }
            if let Some(backup) = &b.fresh_backup {
                before.push(format!("a backup {backup}"));
            }
            let before = if before.is_empty() {
                String::new()
            } else {
                format!("   ({})", before.join("; "))
            };
            format!("{}. {}{before}", b.number, b.machines.join(", "))
        })
        .collect();
    section(
        out,
        "Order (control planes one at a time, then workers up to maxUnavailable; each batch once the one before is healthy again)",
        &lines,
        "nothing rolls out",
    );
}

//! Prometheus metrics: reconciles and their durations per kind, errors by reason, machines by
//! phase. Rendered in the text exposition format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use ichor_api::machine::MachinePhase;

/// The manager's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    reconciles: Mutex<BTreeMap<String, (u64, f64)>>,
    errors: Mutex<BTreeMap<String, u64>>,
    phases: Mutex<BTreeMap<String, String>>,
}

impl Metrics {
    /// Counts one reconcile of `kind` that took `took`.
    pub fn reconciled(&self, kind: &str, took: Duration) {
        if let Ok(mut map) = self.reconciles.lock() {
            let entry = map.entry(kind.to_owned()).or_default();
            entry.0 += 1;
            entry.1 += took.as_secs_f64();
        }
    }

    /// Counts one failed reconcile by reason.
    pub fn error(&self, reason: &str) {
        if let Ok(mut map) = self.errors.lock() {
            *map.entry(reason.to_owned()).or_default() += 1;
        }
    }

    /// Records a machine's phase.
    pub fn phase(&self, machine: &str, phase: MachinePhase) {
        if let Ok(mut map) = self.phases.lock() {
            map.insert(machine.to_owned(), format!("{phase:?}"));
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP ichor_reconciles_total Reconciles by kind.\n# TYPE ichor_reconciles_total counter\n");
        out.push_str("# HELP ichor_reconcile_seconds_total Time spent reconciling by kind.\n# TYPE ichor_reconcile_seconds_total counter\n");
        if let Ok(map) = self.reconciles.lock() {
            for (kind, (count, seconds)) in map.iter() {
                let _ = writeln!(out, "ichor_reconciles_total{{kind=\"{kind}\"}} {count}");
                let _ = writeln!(
                    out,
                    "ichor_reconcile_seconds_total{{kind=\"{kind}\"}} {seconds}"
                );
            }
        }
        out.push_str("# HELP ichor_reconcile_errors_total Failed reconciles by reason.\n# TYPE ichor_reconcile_errors_total counter\n");
        if let Ok(map) = self.errors.lock() {
            for (reason, count) in map.iter() {
                let _ = writeln!(
                    out,
                    "ichor_reconcile_errors_total{{reason=\"{reason}\"}} {count}"
                );
            }
        }
        out.push_str("# HELP ichor_machines Machines by phase.\n# TYPE ichor_machines gauge\n");
        if let Ok(map) = self.phases.lock() {
            let mut by_phase: BTreeMap<&str, u64> = BTreeMap::new();
            for phase in map.values() {
                *by_phase.entry(phase).or_default() += 1;
            }
            for (phase, count) in by_phase {
                let _ = writeln!(out, "ichor_machines{{phase=\"{phase}\"}} {count}");
            }
        }
        out
    }
}

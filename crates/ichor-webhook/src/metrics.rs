//! The webhook's Prometheus metrics (`prometheus-client`): how long admission decisions take,
//! by resource, operation and result. Served over plain HTTP by `ichor_service::serve` when
//! the binary is given a metrics address.

use std::sync::Arc;
use std::time::Duration;

use ichor_service::Registry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// The labels of one admission decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    /// The resource (`talosmachines`, `talosclusters`, ...; `unknown` for an unreadable review).
    resource: String,
    /// `CREATE`, `UPDATE`, `DELETE`, `CONNECT` (`unknown` for an unreadable review).
    operation: String,
    /// `allowed` or `denied`.
    result: String,
}

/// Decisions take microseconds (no live state needed) to the 8 s decision limit.
fn admission_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

/// The webhook's metrics, registered in one registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    admissions: Family<AdmissionLabels, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let admissions: Family<AdmissionLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(admission_buckets as fn() -> Histogram);
        registry.register(
            "ichor_webhook_admission_duration_seconds",
            "How long admission decisions take, by resource, operation and result.",
            admissions.clone(),
        );
        Self {
            registry: Arc::new(registry),
            admissions,
        }
    }
}

impl Metrics {
    /// Records one decision on `operation` of `resource` that took `took`.
    pub fn admitted(&self, resource: &str, operation: &str, allowed: bool, took: Duration) {
        self.admissions
            .get_or_create(&AdmissionLabels {
                resource: resource.to_owned(),
                operation: operation.to_owned(),
                result: if allowed { "allowed" } else { "denied" }.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// The registry holding all of the above, for the HTTP endpoint.
    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }
}

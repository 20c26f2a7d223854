//! What can fail in a reconcile, and what each failure means: its [`Category`] decides the
//! requeue (wait for a change, back off, or retry slowly as a bug) and its reason names the
//! condition, the Event and the metric. Problems a reconciler reports itself as a condition
//! (a missing cluster, a refused config) are not errors here; these are the ones that end a
//! reconcile early.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ichor_api::names::reasons;
use kube::runtime::watcher::DefaultBackoff;

/// What kind of fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// A person must change the object: the reconcile waits for a change.
    UserFix,
    /// The network, a node or the apiserver failed for now: retried with backoff.
    Transient,
    /// An invariant broke: logged as an error and retried slowly.
    Bug,
    /// The reconcile panicked (a bug, caught): retried after a per-object backoff that grows
    /// to a cap (`crate::infra::panics`).
    Panicked,
}

/// What can fail in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
    /// A call to a node failed.
    #[error("{what}: {source}")]
    Talos {
        /// What was being done, e.g. `resetting tombstoned 10.0.0.5`.
        what: String,
        /// The node's error.
        #[source]
        source: ichor_talos::TalosError,
    },
    /// A spec field holds a value that cannot be used.
    #[error("{field}: {problem}")]
    Spec {
        /// The field, e.g. `spec.talosVersion`.
        field: &'static str,
        /// What is wrong and what is allowed.
        problem: String,
    },
    /// Minting credentials from a bundle that passed validation failed.
    #[error("cannot mint {what}: {source}")]
    Mint {
        /// What was minted, e.g. `the talosconfig`.
        what: &'static str,
        /// The PKI error.
        #[source]
        source: ichor_render::pki::PkiError,
    },
    /// Generating or encoding a new secrets bundle failed.
    #[error("cannot create a secrets bundle: {0}")]
    Bundle(#[source] ichor_render::BundleError),
    /// An object could not be encoded or decoded.
    #[error("cannot encode or decode an object: {0}")]
    Serde(#[from] serde_json::Error),
    /// A Secret Ichor did not create holds the name Ichor publishes under (ADR 0053);
    /// retried with backoff, so it is published once the name is free.
    #[error(transparent)]
    SecretNameTaken(#[from] crate::secrets::NameTaken),
    /// Something the code relies on did not hold.
    #[error("internal error: {0}")]
    Invariant(String),
    /// A watch cache has not received its first full list yet; retried.
    #[error("{0}")]
    NotSynced(&'static str),
    /// The reconcile panicked; caught where every controller runs its reconciles.
    #[error(
        "the {controller} controller panicked reconciling this object ({message}); retried in {retry:?}"
    )]
    Panicked {
        /// The controller (`ichor_api::names::controllers`).
        controller: &'static str,
        /// The panic's message, short and printable (`crate::infra::panics::summary`).
        message: String,
        /// When it is retried (its object's backoff).
        retry: Duration,
    },
}

impl Error {
    /// What kind of fault this is.
    pub fn category(&self) -> Category {
        match self {
            Self::Kube(error) => kube_category(error),
            Self::Talos { source, .. } => match source.category() {
                ichor_talos::Category::UserFix => Category::UserFix,
                ichor_talos::Category::Transient => Category::Transient,
                ichor_talos::Category::Bug => Category::Bug,
            },
            Self::Spec { .. } => Category::UserFix,
            Self::NotSynced(_) | Self::SecretNameTaken(_) => Category::Transient,
            // The bundle was validated before anything is minted from it, and a generated
            // bundle is ours: either failing is a bug.
            Self::Mint { .. } | Self::Bundle(_) | Self::Serde(_) | Self::Invariant(_) => {
                Category::Bug
            }
            Self::Panicked { .. } => Category::Panicked,
        }
    }

    /// The condition, Event and metric reason (a constant of `ichor_api::names::reasons`).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kube(_) | Self::NotSynced(_) => reasons::KUBERNETES_API,
            Self::Talos { source, .. } => match source {
                ichor_talos::TalosError::FingerprintMismatch { .. } => {
                    reasons::FINGERPRINT_MISMATCH
                }
                ichor_talos::TalosError::Connect { .. }
                | ichor_talos::TalosError::ConnectTimeout { .. } => reasons::NODE_UNREACHABLE,
                _ => reasons::TALOS_API,
            },
            Self::Spec { .. } => reasons::INVALID_SPEC,
            Self::SecretNameTaken(_) => reasons::SECRET_NAME_TAKEN,
            Self::Mint { .. } | Self::Bundle(_) => reasons::SECRETS_BUNDLE_UNAVAILABLE,
            Self::Serde(_) | Self::Invariant(_) => reasons::INTERNAL_ERROR,
            Self::Panicked { .. } => reasons::RECONCILE_PANICKED,
        }
    }

    /// When a panicked reconcile is retried (none for any other error).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Panicked { retry, .. } => Some(*retry),
            _ => None,
        }
    }

    /// A failed call to a node, with what was being done.
    pub fn talos(what: impl Into<String>, source: ichor_talos::TalosError) -> Self {
        Self::Talos {
            what: what.into(),
            source,
        }
    }
}

/// The category of a Kubernetes API error. Refusals that come back the same on every retry
/// of the same request (a malformed object, a body that does not decode) are bugs of ours;
/// everything else, RBAC included (it is fixed outside the object, so a backoff notices the
/// fix where waiting for a change would not), is transient.
fn kube_category(error: &kube::Error) -> Category {
    match error {
        kube::Error::Api(status) if status.is_invalid() => Category::Bug,
        kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) => Category::Bug,
        _ => Category::Transient,
    }
}

/// How long a bug waits before it is retried.
pub const BUG_REQUEUE: Duration = Duration::from_secs(300);

/// Per-object exponential backoff for transient errors (kube-runtime's default strategy:
/// 0.8 s doubling to 30 s, with jitter), forgotten once the object reconciles.
#[derive(Default)]
pub struct Backoff {
    objects: Mutex<HashMap<String, DefaultBackoff>>,
}

impl std::fmt::Debug for Backoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backing_off = self.objects.lock().map_or(0, |m| m.len());
        f.debug_struct("Backoff")
            .field("backing_off", &backing_off)
            .finish()
    }
}

impl Backoff {
    /// The next delay for `key` after another transient failure.
    pub fn next(&self, key: &str) -> Duration {
        let fallback = Duration::from_secs(30);
        let Ok(mut objects) = self.objects.lock() else {
            return fallback;
        };
        objects
            .entry(key.to_owned())
            .or_default()
            .next()
            .unwrap_or(fallback)
    }

    /// Forgets `key`'s failures (it reconciled).
    pub fn reset(&self, key: &str) {
        if let Ok(mut objects) = self.objects.lock() {
            objects.remove(key);
        }
    }
}

/// The backoff key of an object: kind, namespace and name.
pub fn key<K: kube::Resource<DynamicType = ()>>(object: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        object.meta().namespace.as_deref().unwrap_or_default(),
        object.meta().name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", reason).with_code(code),
        ))
    }

    #[test]
    fn categories_decide_between_waiting_backing_off_and_bugs() {
        assert_eq!(
            Error::from(api_error(409, "Conflict")).category(),
            Category::Transient
        );
        assert_eq!(
            Error::from(api_error(422, "Invalid")).category(),
            Category::Bug
        );
        let spec = Error::Spec {
            field: "spec.talosVersion",
            problem: "v1.2 is not supported".into(),
        };
        assert_eq!(spec.category(), Category::UserFix);
        assert_eq!(spec.reason(), reasons::INVALID_SPEC);
        let unreachable = Error::talos(
            "resetting 10.0.0.5",
            ichor_talos::TalosError::ConnectTimeout {
                endpoint: "10.0.0.5".into(),
                seconds: 10,
            },
        );
        assert_eq!(unreachable.category(), Category::Transient);
        assert_eq!(unreachable.reason(), reasons::NODE_UNREACHABLE);
        let bug = Error::Invariant("a reachable candidate has no client".into());
        assert_eq!(bug.category(), Category::Bug);
        assert_eq!(bug.reason(), reasons::INTERNAL_ERROR);
    }

    #[test]
    fn backoff_grows_per_object_and_resets_on_success() {
        let backoff = Backoff::default();
        let first = backoff.next("TalosMachine/ns/a");
        let mut last = first;
        for _ in 0..6 {
            last = backoff.next("TalosMachine/ns/a");
        }
        assert!(last > first, "{first:?} then {last:?}");
        assert!(last <= Duration::from_secs(60), "{last:?}");
        let other = backoff.next("TalosMachine/ns/b");
        assert!(
            other < last,
            "another object starts from the bottom: {other:?}"
        );
        backoff.reset("TalosMachine/ns/a");
        assert!(backoff.next("TalosMachine/ns/a") < last);
    }
}

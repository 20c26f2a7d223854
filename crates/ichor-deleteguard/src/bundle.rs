//! The secrets bundle: generated only for a cluster none of whose machines was ever configured,
//! and used only while it is the bundle the cluster was built with. A new bundle for a cluster
//! that has configured machines carries another CA: mutual TLS to every node breaks, and newly
//! approved machines would get another cluster's CA and tokens. So a missing bundle is lost,
//! not regenerated, and a different one under the same name is refused.

/// What the bundle Secret held when read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found<'a> {
    /// No Secret under the bundle's name.
    Nothing,
    /// A valid bundle whose OS CA has this fingerprint.
    Bundle(&'a str),
}

/// What to do about the bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BundleStep {
    /// Use the bundle found (and record its fingerprint if none is recorded).
    Use,
    /// Generate one: nothing was ever configured with a bundle of this cluster.
    Generate,
    /// The Secret named by `spec.secretsRef` does not exist: a person provides it.
    Missing,
    /// The bundle is gone although machines were configured with it: never regenerated;
    /// nothing is rendered or applied until it is restored.
    Lost,
    /// The Secret holds another bundle than the one the cluster was built with.
    Mismatch {
        /// The fingerprint recorded when the cluster first used its bundle.
        recorded: String,
        /// The fingerprint of the bundle found.
        found: String,
    },
}

/// The bundle decision. `recorded` is the OS CA fingerprint the cluster recorded (if it ever
/// used a bundle), `ever_configured` whether any of its machines was configured (a config
/// applied, an etcd member, or a phase past the first apply), `named_by_user` whether
/// `spec.secretsRef` names the Secret.
pub fn bundle_step(
    found: Found<'_>,
    recorded: Option<&str>,
    ever_configured: bool,
    named_by_user: bool,
) -> BundleStep {
    match found {
        Found::Bundle(fingerprint) => match recorded {
            Some(recorded) if recorded != fingerprint => BundleStep::Mismatch {
                recorded: recorded.to_owned(),
                found: fingerprint.to_owned(),
            },
            _ => BundleStep::Use,
        },
        Found::Nothing if ever_configured || recorded.is_some() => BundleStep::Lost,
        Found::Nothing if named_by_user => BundleStep::Missing,
        Found::Nothing => BundleStep::Generate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_is_generated_only_for_a_cluster_never_configured() {
        assert_eq!(
            bundle_step(Found::Nothing, None, false, false),
            BundleStep::Generate
        );
        assert_eq!(
            bundle_step(Found::Nothing, None, true, false),
            BundleStep::Lost,
            "configured machines: a new CA would cut them off"
        );
        assert_eq!(
            bundle_step(Found::Nothing, Some("sha256:a"), false, false),
            BundleStep::Lost,
            "a bundle was used before"
        );
        assert_eq!(
            bundle_step(Found::Nothing, None, false, true),
            BundleStep::Missing
        );
        assert_eq!(
            bundle_step(Found::Nothing, None, true, true),
            BundleStep::Lost
        );
    }

    #[test]
    fn only_the_bundle_the_cluster_was_built_with_is_used() {
        assert_eq!(
            bundle_step(Found::Bundle("sha256:a"), None, false, false),
            BundleStep::Use
        );
        assert_eq!(
            bundle_step(Found::Bundle("sha256:a"), Some("sha256:a"), true, false),
            BundleStep::Use
        );
        assert_eq!(
            bundle_step(Found::Bundle("sha256:b"), Some("sha256:a"), true, true),
            BundleStep::Mismatch {
                recorded: "sha256:a".into(),
                found: "sha256:b".into()
            }
        );
    }
}

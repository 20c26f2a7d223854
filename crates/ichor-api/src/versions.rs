//! The rules a change of `spec.talosVersion` or `spec.kubernetesVersion` must follow, from
//! Talos's own compatibility tables and Kubernetes' upgrade path (talos-facts §9.8, §9.9): the
//! webhook refuses a change that breaks one at the door, and the manager checks them again
//! before it rolls anything out.

use std::fmt;

/// A `major.minor.patch` version, with or without a leading `v` and a pre-release part (which
/// the rules ignore, as Talos's own comparisons do, talos-facts §9.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// The major version.
    pub major: u32,
    /// The minor version.
    pub minor: u32,
    /// The patch version.
    pub patch: u32,
}

impl Version {
    /// Reads `text`, e.g. `v1.14.2`, `1.36.3` or `v1.14.0-rc.1`.
    pub fn parse(text: &str) -> Option<Self> {
        let core = text.strip_prefix('v').unwrap_or(text);
        let core = core.split_once('-').map_or(core, |(core, _)| core);
        let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
        let version = Self {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next()??,
        };
        parts.next().is_none().then_some(version)
    }

    /// Its minor series, e.g. `1.14` for `v1.14.2`.
    pub fn series(self) -> Series {
        Series {
            major: self.major,
            minor: self.minor,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A minor series, e.g. Talos `1.14` or Kubernetes `1.37`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Series {
    /// The major version.
    pub major: u32,
    /// The minor version.
    pub minor: u32,
}

impl Series {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// Reads the series of a version, e.g. `1.14` of `v1.14.2` (`1.14` alone reads too).
    pub fn parse(text: &str) -> Option<Self> {
        let core = text.strip_prefix('v').unwrap_or(text);
        let mut parts = core.split(['.', '-']);
        Some(Self {
            major: parts.next()?.parse().ok()?,
            minor: parts.next()?.parse().ok()?,
        })
    }

    /// The series `n` minors later (earlier for a negative `n`), in the same major.
    fn shifted(self, n: i64) -> Option<Self> {
        let minor = u32::try_from(i64::from(self.minor) + n).ok()?;
        Some(Self::new(self.major, minor))
    }
}

impl fmt::Display for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The Kubernetes minors a Talos minor supports, oldest and newest, from Talos's
/// compatibility tables (`pkg/machinery/compatibility/talos1NN`, talos-facts §9.8). `None` for
/// a Talos Ichor has no table for: it is refused rather than guessed.
pub fn kubernetes_supported_by(talos: Series) -> Option<(Series, Series)> {
    let (oldest, newest) = match (talos.major, talos.minor) {
        (1, 12) => (30, 35),
        (1, 13) => (31, 36),
        (1, 14) => (32, 37),
        (1, 15) => (33, 38),
        _ => return None,
    };
    Some((Series::new(1, oldest), Series::new(1, newest)))
}

/// How many Talos minors an upgrade may take at once: a Talos installer installs over a host
/// at most two minors older (`MinimumHostUpgradeVersion`, talos-facts §9.8).
pub const TALOS_MINORS_PER_UPGRADE: u32 = 2;

/// A change of the declared versions that Ichor refuses, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionRefusal {
    /// A version that does not read as `major.minor.patch`.
    #[error("{field} {value:?} is not a version: write major.minor.patch, e.g. {example}")]
    Unreadable {
        /// `spec.talosVersion` or `spec.kubernetesVersion`.
        field: &'static str,
        /// The value.
        value: String,
        /// An example of the field's form.
        example: &'static str,
    },
    /// A Kubernetes minor downgrade.
    #[error(
        "spec.kubernetesVersion {to} is a minor downgrade from {from}: Kubernetes cannot go back a minor version (a patch-level change within {from_series} is allowed)"
    )]
    KubernetesDowngrade {
        /// The version declared before.
        from: Version,
        /// Its series.
        from_series: Series,
        /// The version declared now.
        to: Version,
    },
    /// A Kubernetes upgrade that skips a minor.
    #[error(
        "spec.kubernetesVersion {to} skips a minor version from {from}: Kubernetes upgrades one minor at a time; declare {next}.x first, then {to_series}.x once it rolled out"
    )]
    KubernetesSkip {
        /// The version declared before.
        from: Version,
        /// The version declared now.
        to: Version,
        /// The next minor, the one to declare first.
        next: Series,
        /// The series of `to`.
        to_series: Series,
    },
    /// A Talos downgrade below the config contract in force.
    #[error(
        "spec.talosVersion v{to} is older than the config contract in force, {contract}: the nodes' configs are written for Talos {contract}, which Talos {to_series} cannot read; declare {contract}.x or later"
    )]
    TalosBelowContract {
        /// The version declared now.
        to: Version,
        /// Its series.
        to_series: Series,
        /// The contract in force.
        contract: Series,
    },
    /// A Talos upgrade further than the installer goes in one step.
    #[error(
        "spec.talosVersion v{to} is more than {TALOS_MINORS_PER_UPGRADE} minor versions ahead of Talos {oldest}, which a node of the cluster runs: Talos's installer refuses that; upgrade through {via}.x first"
    )]
    TalosSkip {
        /// The version declared now.
        to: Version,
        /// The oldest Talos a node runs.
        oldest: Series,
        /// The series to go through first.
        via: Series,
    },
    /// A Talos minor Ichor has no support table for.
    #[error(
        "spec.talosVersion v{to}: Ichor does not know which Kubernetes versions Talos {series} supports (it knows 1.12 to 1.15), so it does not roll it out"
    )]
    UnknownTalos {
        /// The version declared.
        to: Version,
        /// Its series.
        series: Series,
    },
    /// A Talos and Kubernetes pair outside Talos's support matrix.
    #[error(
        "spec.kubernetesVersion {kubernetes} is not supported by Talos {talos} ({when}), which supports Kubernetes {oldest} to {newest} (talos-facts §9.8)"
    )]
    Unsupported {
        /// The Talos series.
        talos: Series,
        /// The Kubernetes version.
        kubernetes: Version,
        /// Which state of the rollout the pair is: the declared one, or the one on the way.
        when: &'static str,
        /// The oldest Kubernetes minor it supports.
        oldest: Series,
        /// The newest.
        newest: Series,
    },
}

/// The field name of the Talos version.
const TALOS: &str = "spec.talosVersion";
/// The field name of the Kubernetes version.
const KUBERNETES: &str = "spec.kubernetesVersion";

fn read(
    field: &'static str,
    value: &str,
    example: &'static str,
) -> Result<Version, VersionRefusal> {
    Version::parse(value).ok_or_else(|| VersionRefusal::Unreadable {
        field,
        value: value.to_owned(),
        example,
    })
}

/// Whether Talos `talos` supports Kubernetes `kubernetes`, `when` saying which state of the
/// rollout the pair is.
fn supported(
    talos: Series,
    kubernetes: Version,
    when: &'static str,
    declared: Version,
) -> Result<(), VersionRefusal> {
    let (oldest, newest) = kubernetes_supported_by(talos).ok_or(VersionRefusal::UnknownTalos {
        to: declared,
        series: talos,
    })?;
    let series = kubernetes.series();
    if series < oldest || series > newest {
        return Err(VersionRefusal::Unsupported {
            talos,
            kubernetes,
            when,
            oldest,
            newest,
        });
    }
    Ok(())
}

/// The declared versions of a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared<'a> {
    /// `spec.talosVersion`.
    pub talos: &'a str,
    /// `spec.kubernetesVersion`.
    pub kubernetes: &'a str,
}

/// Which version a rollout changes first when both change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum First {
    /// Talos first: the nodes run the new Talos with the Kubernetes they run now.
    Talos,
    /// Kubernetes first: the new Kubernetes runs on the Talos the nodes run now (the new
    /// Talos no longer supports the old Kubernetes).
    Kubernetes,
}

/// Checks a change of the declared versions from `before` to `after`, given the config
/// contract in force and the oldest Talos a node of the cluster runs (`None` when no node
/// reports one). A patch-level revert, as a GitOps revert makes, is allowed. Returns which
/// version rolls out first when both change: Talos, unless only Kubernetes first keeps every
/// step of the way inside Talos's support matrix.
pub fn check_change(
    before: Declared<'_>,
    after: Declared<'_>,
    contract: Series,
    oldest_running: Option<Series>,
) -> Result<First, VersionRefusal> {
    let talos = read(TALOS, after.talos, "v1.14.2")?;
    let kubernetes = read(KUBERNETES, after.kubernetes, "1.36.3")?;
    let was = read(KUBERNETES, before.kubernetes, "1.36.3")?;
    let talos_was = read(TALOS, before.talos, "v1.14.2")?;
    if kubernetes.series() < was.series() {
        return Err(VersionRefusal::KubernetesDowngrade {
            from: was,
            from_series: was.series(),
            to: kubernetes,
        });
    }
    if let Some(next) = was.series().shifted(1)
        && kubernetes.series() > next
    {
        return Err(VersionRefusal::KubernetesSkip {
            from: was,
            to: kubernetes,
            next,
            to_series: kubernetes.series(),
        });
    }
    if talos.series() < contract {
        return Err(VersionRefusal::TalosBelowContract {
            to: talos,
            to_series: talos.series(),
            contract,
        });
    }
    let oldest = oldest_running.map_or(talos_was.series(), |o| o.min(talos_was.series()));
    if oldest
        .shifted(i64::from(TALOS_MINORS_PER_UPGRADE))
        .is_some_and(|furthest| talos.series() > furthest)
    {
        return Err(VersionRefusal::TalosSkip {
            to: talos,
            oldest,
            via: oldest.shifted(1).unwrap_or(oldest),
        });
    }
    supported(talos.series(), kubernetes, "as declared", talos)?;
    if talos.series() == talos_was.series() || kubernetes.series() == was.series() {
        return Ok(First::Talos);
    }
    // Both minors change: each step of the way must be a supported pair.
    match supported(
        talos.series(),
        was,
        "on the way, Talos upgraded first",
        talos,
    ) {
        Ok(()) => Ok(First::Talos),
        Err(talos_first) => supported(
            talos_was.series(),
            kubernetes,
            "on the way, Kubernetes upgraded first",
            talos,
        )
        .map(|()| First::Kubernetes)
        .map_err(|_| talos_first),
    }
}

/// The oldest Talos the configured nodes of cluster `cluster` in `namespace` run, among
/// `machines`, as they recorded it (`status.talosVersion` of every approved machine with an
/// applied config that is not being deleted): the version as reported, and its reading.
pub fn oldest_running<'a>(
    machines: impl IntoIterator<Item = &'a crate::TalosMachine>,
    namespace: &str,
    cluster: &str,
) -> Option<(&'a str, Version)> {
    machines
        .into_iter()
        .filter(|m| {
            m.metadata.namespace.as_deref().unwrap_or_default() == namespace
                && m.spec.cluster_ref.name == cluster
                && m.spec.approval_state == crate::machine::ApprovalState::Approved
                && m.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|m| {
            let status = m.status.as_ref()?;
            status.applied.config_hash.as_ref()?;
            let text = status.inventory.talos_version.as_deref()?;
            Some((text, Version::parse(text)?))
        })
        .min_by_key(|(_, version)| *version)
}

/// The config contract in force for a cluster declaring Talos `declared` whose oldest node
/// runs `oldest`: the older of the two series (talos-facts §9.9).
pub fn contract_in_force(declared: &str, oldest: Option<Version>) -> Option<Series> {
    let declared = Series::parse(declared)?;
    Some(oldest.map_or(declared, |o| o.series().min(declared)))
}

/// Checks the versions a cluster is created with: readable, and a pair Talos supports.
pub fn check_declared(declared: Declared<'_>) -> Result<(), VersionRefusal> {
    let talos = read(TALOS, declared.talos, "v1.14.2")?;
    let kubernetes = read(KUBERNETES, declared.kubernetes, "1.36.3")?;
    supported(talos.series(), kubernetes, "as declared", talos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared<'a>(talos: &'a str, kubernetes: &'a str) -> Declared<'a> {
        Declared { talos, kubernetes }
    }

    const C14: Series = Series::new(1, 14);

    #[test]
    fn versions_read_with_or_without_v_and_ignore_pre_releases() {
        assert_eq!(
            Version::parse("v1.14.0-rc.1"),
            Some(Version {
                major: 1,
                minor: 14,
                patch: 0
            })
        );
        assert_eq!(
            Version::parse("1.36.3").map(Version::series),
            Some(Series::new(1, 36))
        );
        for bad in ["", "v1.14", "1.x.0", "1.2.3.4", "v"] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
        assert_eq!(Series::parse("v1.13.9"), Some(Series::new(1, 13)));
    }

    #[test]
    fn kubernetes_patch_changes_either_way_are_allowed_and_minors_go_one_up() {
        let before = declared("v1.14.1", "1.36.3");
        assert_eq!(
            check_change(before, declared("v1.14.1", "1.36.4"), C14, None),
            Ok(First::Talos)
        );
        assert_eq!(
            check_change(declared("v1.14.1", "1.36.4"), before, C14, None),
            Ok(First::Talos),
            "a GitOps revert of a patch bump"
        );
        assert!(check_change(before, declared("v1.14.1", "1.37.0"), C14, None).is_ok());
        let skip = check_change(before, declared("v1.14.1", "1.38.0"), C14, None).unwrap_err();
        assert!(
            matches!(skip, VersionRefusal::KubernetesSkip { .. }),
            "{skip}"
        );
        assert!(
            skip.to_string().starts_with("spec.kubernetesVersion"),
            "{skip}"
        );
        let down = check_change(before, declared("v1.14.1", "1.35.9"), C14, None).unwrap_err();
        assert!(
            matches!(down, VersionRefusal::KubernetesDowngrade { .. }),
            "{down}"
        );
        assert!(
            down.to_string()
                .starts_with("spec.kubernetesVersion 1.35.9 is a minor downgrade")
        );
    }

    #[test]
    fn talos_may_not_go_below_the_contract_or_skip_what_the_installer_refuses() {
        let before = declared("v1.14.1", "1.36.3");
        let below = check_change(before, declared("v1.13.9", "1.36.3"), C14, None).unwrap_err();
        assert!(
            matches!(below, VersionRefusal::TalosBelowContract { .. }),
            "{below}"
        );
        assert!(
            below.to_string().starts_with(
                "spec.talosVersion v1.13.9 is older than the config contract in force, 1.14"
            ),
            "{below}"
        );
        // Mid-rollout from 1.13 (the contract still 1.13): reverting to 1.13 is allowed.
        let c13 = Series::new(1, 13);
        assert!(check_change(before, declared("v1.13.9", "1.36.3"), c13, Some(c13)).is_ok());
        let far = check_change(
            declared("v1.13.9", "1.35.0"),
            declared("v1.15.0", "1.35.0"),
            c13,
            Some(Series::new(1, 12)),
        )
        .unwrap_err();
        assert!(matches!(far, VersionRefusal::TalosSkip { .. }), "{far}");
    }

    #[test]
    fn pairs_outside_the_matrix_are_refused_and_the_order_keeps_every_step_inside() {
        let unsupported = check_declared(declared("v1.14.0", "1.31.2")).unwrap_err();
        assert!(
            matches!(unsupported, VersionRefusal::Unsupported { .. }),
            "{unsupported}"
        );
        assert!(check_declared(declared("v1.14.0", "1.37.0")).is_ok());
        assert!(matches!(
            check_declared(declared("v1.16.0", "1.38.0")),
            Err(VersionRefusal::UnknownTalos { .. })
        ));
        // 1.13 + 1.36 → 1.14 + 1.37: Talos 1.14 runs 1.36 too, Talos first.
        assert_eq!(
            check_change(
                declared("v1.13.9", "1.36.3"),
                declared("v1.14.1", "1.37.0"),
                Series::new(1, 13),
                None
            ),
            Ok(First::Talos)
        );
        // 1.13 + 1.32 → 1.15 + 1.33: Talos 1.15 no longer runs 1.32, Kubernetes first.
        assert_eq!(
            check_change(
                declared("v1.13.9", "1.32.4"),
                declared("v1.15.0", "1.33.0"),
                Series::new(1, 13),
                None
            ),
            Ok(First::Kubernetes)
        );
    }
}

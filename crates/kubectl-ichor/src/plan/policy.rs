//! A rollout policy as the manifest declares it (`spec.rollout`, or a TalosMachineClass's),
//! read into the pure rules' [`Policy`]; what does not read names its field and what is
//! allowed.

use std::time::Duration;

use ichor_api::rollout::RolloutPolicy;
use ichor_api::time::parse_duration;
use ichor_deleteguard::rollout::{MaxUnavailable, Policy, Window};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::Error;

/// Reads `policy`, declared at `field` (e.g. `spec.rollout`), into the rules' policy.
pub fn read_policy(policy: &RolloutPolicy, field: &str) -> Result<Policy, Error> {
    let windows = policy
        .maintenance_windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let at = format!("{field}.maintenanceWindows[{i}]");
            let duration = parse_duration(&format!("{at}.duration"), &w.duration)
                .map_err(|e| Error::Manifest(e.to_string()))?;
            Window::parse(&w.schedule, duration, &w.time_zone)
                .map_err(|e| Error::Manifest(format!("{at}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let fresh_backup = policy
        .fresh_backup
        .as_ref()
        .map(|f| parse_duration(&format!("{field}.freshBackup.maxAge"), &f.max_age))
        .transpose()
        .map_err(|e| Error::Manifest(e.to_string()))?;
    let max_unavailable = policy
        .max_unavailable
        .as_ref()
        .map(|m| max_unavailable(m, field))
        .transpose()?
        .unwrap_or_default();
    Ok(Policy {
        windows,
        hold_live_changes: policy.hold_live_changes,
        suspended: policy.suspend,
        max_unavailable,
        spread_failure_domains: policy.failure_domain_label.is_some(),
        fresh_backup,
    })
}

/// `maxUnavailable`: a count of at least 1, or a percentage from 1% to 100%.
fn max_unavailable(value: &IntOrString, field: &str) -> Result<MaxUnavailable, Error> {
    let read = match value {
        IntOrString::Int(n) => u32::try_from(*n)
            .ok()
            .filter(|n| *n >= 1)
            .map(MaxUnavailable::Count),
        IntOrString::String(text) => text
            .strip_suffix('%')
            .and_then(|p| p.parse::<u32>().ok())
            .filter(|p| (1..=100).contains(p))
            .map(MaxUnavailable::Percent),
    };
    read.ok_or_else(|| {
        let shown = match value {
            IntOrString::Int(n) => n.to_string(),
            IntOrString::String(text) => format!("{text:?}"),
        };
        Error::Manifest(format!(
            "{field}.maxUnavailable {shown} is not a count of at least 1 or a percentage from 1% to 100%, e.g. 2 or 25%"
        ))
    })
}

/// How a policy's fresh-backup age reads in a message, e.g. `1h`.
pub fn age(duration: Duration) -> String {
    let secs = duration.as_secs();
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (h, 0, 0) if h > 0 => format!("{h}h"),
        (0, m, 0) if m > 0 => format!("{m}m"),
        _ => format!("{secs}s"),
    }
}

#[cfg(test)]
mod tests {
    use ichor_api::rollout::{FreshBackup, MaintenanceWindow};

    use super::*;

    fn window(schedule: &str, duration: &str, zone: &str) -> MaintenanceWindow {
        MaintenanceWindow {
            schedule: schedule.into(),
            duration: duration.into(),
            time_zone: zone.into(),
        }
    }

    fn refused(policy: &RolloutPolicy) -> String {
        read_policy(policy, "spec.rollout")
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn a_policy_reads_into_the_rules() {
        let policy = RolloutPolicy {
            suspend: true,
            maintenance_windows: vec![window("0 22 * * 1-5", "4h", "Europe/Berlin")],
            fresh_backup: Some(FreshBackup {
                max_age: "1h".into(),
            }),
            max_unavailable: Some(IntOrString::String("25%".into())),
            failure_domain_label: Some("topology.kubernetes.io/zone".into()),
            ..RolloutPolicy::default()
        };
        let read = read_policy(&policy, "spec.rollout").expect("reads");
        assert!(read.suspended && read.spread_failure_domains);
        assert_eq!(read.windows.len(), 1);
        assert_eq!(read.fresh_backup, Some(Duration::from_secs(3600)));
        assert_eq!(read.max_unavailable, MaxUnavailable::Percent(25));
        let two = RolloutPolicy {
            max_unavailable: Some(IntOrString::Int(2)),
            ..RolloutPolicy::default()
        };
        assert_eq!(
            read_policy(&two, "spec.rollout")
                .expect("reads")
                .max_unavailable,
            MaxUnavailable::Count(2)
        );
        assert_eq!(age(Duration::from_secs(3600)), "1h");
        assert_eq!(age(Duration::from_secs(90)), "90s");
    }

    #[test]
    fn a_bad_window_names_its_field_and_what_is_allowed() {
        let bad = |w: MaintenanceWindow| {
            refused(&RolloutPolicy {
                maintenance_windows: vec![window("0 1 * * *", "1h", "UTC"), w],
                ..RolloutPolicy::default()
            })
        };
        let schedule = bad(window("61 * * * *", "1h", "UTC"));
        assert!(
            schedule.starts_with("spec.rollout.maintenanceWindows[1]: schedule \"61 * * * *\""),
            "{schedule}"
        );
        assert!(schedule.contains("five-field cron"), "{schedule}");
        let zone = bad(window("0 1 * * *", "1h", "Mars/Olympus"));
        assert!(
            zone.contains("timeZone \"Mars/Olympus\" is not an IANA"),
            "{zone}"
        );
        let duration = bad(window("0 1 * * *", "soon", "UTC"));
        assert!(
            duration.starts_with("spec.rollout.maintenanceWindows[1].duration \"soon\""),
            "{duration}"
        );
        let long = bad(window("0 1 * * *", "200h", "UTC"));
        assert!(long.contains("between 1m and 168h"), "{long}");
    }

    #[test]
    fn a_bad_max_unavailable_says_what_is_allowed() {
        for value in [
            IntOrString::Int(0),
            IntOrString::String("0%".into()),
            IntOrString::String("two".into()),
        ] {
            let message = refused(&RolloutPolicy {
                max_unavailable: Some(value),
                ..RolloutPolicy::default()
            });
            assert!(
                message.starts_with("spec.rollout.maxUnavailable ")
                    && message.contains("e.g. 2 or 25%"),
                "{message}"
            );
        }
    }
}

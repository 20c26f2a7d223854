//! The BMC look's decisions, pure: when a machine's BMC is due to be read, which of its
//! systems is the machine, and what a read means for `status.bmc` and `BmcReachable`.

use std::time::Duration;

use ichor_api::bmc::BmcObservation;
use ichor_api::common::ConditionStatus;
use ichor_api::machine::TalosMachineStatus;
use ichor_api::names::{conditions, reasons};
use ichor_redfish::{Health, PowerState, System};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::Stop;
use crate::infra::clock::elapsed;
use crate::infra::conditions as cond;

/// How long until the BMC of a machine at `generation` is due to be read again, every `pace`:
/// `None` when it is due now (never read, its `spec.bmc` changed since, or read `pace` ago).
pub(crate) fn wait(
    status: Option<&TalosMachineStatus>,
    generation: Option<i64>,
    now: &Time,
    pace: Duration,
) -> Option<Duration> {
    let observed = status?.bmc.observed.as_ref()?;
    if observed.observed_generation != generation {
        return None;
    }
    let since = elapsed(observed.observed_at.as_ref()?.0, now.0);
    pace.checked_sub(since).filter(|left| !left.is_zero())
}

/// The system that is the machine among `systems` (as read): the one whose `Id` is `wanted`
/// (`spec.bmc.systemId`), else the one whose UUID is the node's SMBIOS UUID (`node_uuid`),
/// else, the node's UUID not known yet, the only one. A system named by its Id must also
/// report the node's UUID, when both are known.
pub(crate) fn choose_system<'a>(
    systems: &'a [System],
    wanted: Option<&str>,
    node_uuid: Option<&str>,
) -> Result<&'a System, Stop> {
    let uuid_of = |s: &System| s.uuid.clone().unwrap_or_default();
    if let Some(wanted) = wanted {
        let system = systems
            .iter()
            .find(|s| s.id.as_deref() == Some(wanted))
            .ok_or_else(|| {
                Stop::new(
                    reasons::BMC_SYSTEM_NOT_FOUND,
                    format!(
                        "the BMC lists no system with Id {wanted} (spec.bmc.systemId); it lists {}",
                        ids(systems)
                    ),
                )
            })?;
        return match node_uuid {
            Some(node) if !ichor_redfish::smbios_uuid_matches(&uuid_of(system), node) => {
                Err(Stop::new(
                    reasons::BMC_UUID_MISMATCH,
                    format!(
                        "the BMC's system {wanted} reports UUID {}, not the node's SMBIOS UUID {node}: it is another machine's BMC; check spec.bmc.address and spec.bmc.systemId",
                        shown(system.uuid.as_deref())
                    ),
                ))
            }
            _ => Ok(system),
        };
    }
    match node_uuid {
        Some(node) => systems
            .iter()
            .find(|s| ichor_redfish::smbios_uuid_matches(&uuid_of(s), node))
            .ok_or_else(|| {
                Stop::new(
                    reasons::BMC_SYSTEM_NOT_FOUND,
                    format!(
                        "no system of the BMC reports the node's SMBIOS UUID {node} (it lists {}); check spec.bmc.address, or name the system in spec.bmc.systemId",
                        ids(systems)
                    ),
                )
            }),
        None => match systems {
            [only] => Ok(only),
            _ => Err(Stop::new(
                reasons::BMC_SYSTEM_NOT_FOUND,
                format!(
                    "the node's SMBIOS UUID is not known yet and the BMC lists {} systems ({}): name the machine's in spec.bmc.systemId",
                    systems.len(),
                    ids(systems)
                ),
            )),
        },
    }
}

/// The systems' Ids, for a message.
fn ids(systems: &[System]) -> String {
    if systems.is_empty() {
        return "none".to_owned();
    }
    systems
        .iter()
        .map(|s| shown(s.id.as_deref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A value the BMC may leave out, for a message.
fn shown(value: Option<&str>) -> String {
    value.unwrap_or("(none)").to_owned()
}

/// What a read of the BMC came to: its system, or why not.
pub(crate) type Read = Result<System, Stop>;

/// The stop for a failed call to the BMC: the client's reason, and its message (which never
/// holds a password).
pub(crate) fn failed(error: &ichor_redfish::Error) -> Stop {
    Stop::new(error.reason(), truncated(&error.to_string(), MESSAGE_MAX))
}

/// The longest condition message written (the field holds 2048 characters).
const MESSAGE_MAX: usize = 2000;

/// Records `read` at `now` for `generation` in `status`: what the system reports and
/// `BmcReachable` true, or no report and `BmcReachable` false with the stop's reason.
pub(crate) fn record(
    status: &mut TalosMachineStatus,
    read: &Read,
    generation: Option<i64>,
    now: &Time,
) {
    let mut observed = BmcObservation {
        observed_at: Some(now.clone()),
        observed_generation: generation,
        ..BmcObservation::default()
    };
    match read {
        Ok(system) => {
            observed.power_state = system.power_state.as_ref().map(power_state);
            observed.health = system.health.as_ref().map(health);
            observed.state = system.state.as_deref().map(|v| truncated(v, 64));
            observed.system_id = system.id.as_deref().map(|v| truncated(v, 128));
            observed.uuid = system.uuid.as_deref().map(|v| truncated(v, 64));
            let message = format!(
                "the BMC answered: system {} is {}, health {}",
                shown(system.id.as_deref()),
                shown(observed.power_state.as_deref()),
                shown(observed.health.as_deref()),
            );
            cond::set(
                &mut status.conditions,
                conditions::BMC_REACHABLE,
                true,
                reasons::BMC_OBSERVED,
                message,
                generation,
                now,
            );
        }
        Err(stop) => stop.set_condition(
            &mut status.conditions,
            conditions::BMC_REACHABLE,
            generation,
            now,
        ),
    }
    status.bmc.observed = Some(observed);
}

/// Whether `status` holds anything read of a BMC (its fields or `BmcReachable`).
pub(crate) fn named(status: &TalosMachineStatus) -> bool {
    status.bmc.observed.is_some()
        || status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::BMC_REACHABLE)
}

/// Forgets what was read of a BMC the machine no longer names.
pub(crate) fn forget(status: &mut TalosMachineStatus) {
    status.bmc.observed = None;
    status
        .conditions
        .retain(|c| c.type_ != conditions::BMC_REACHABLE);
}

/// Whether `before` (the status as it was) already said what `after` says of the BMC's
/// reachability, so that no Event is due: the same status and reason.
pub(crate) fn same_reachability(
    before: Option<&TalosMachineStatus>,
    after: &TalosMachineStatus,
) -> bool {
    let of = |s: &TalosMachineStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == conditions::BMC_REACHABLE)
            .map(|c| (c.status, c.reason.clone()))
    };
    before.and_then(of) == of(after)
}

/// Whether `status` says the BMC is reachable.
pub(crate) fn reachable(status: &TalosMachineStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::BMC_REACHABLE && c.status == ConditionStatus::True)
}

/// A power state as Redfish spells it.
fn power_state(state: &PowerState) -> String {
    match state {
        PowerState::On => "On".to_owned(),
        PowerState::Off => "Off".to_owned(),
        PowerState::PoweringOn => "PoweringOn".to_owned(),
        PowerState::PoweringOff => "PoweringOff".to_owned(),
        PowerState::Paused => "Paused".to_owned(),
        PowerState::Other(other) => truncated(other, 64),
    }
}

/// A health as Redfish spells it.
fn health(health: &Health) -> String {
    match health {
        Health::Ok => "OK".to_owned(),
        Health::Warning => "Warning".to_owned(),
        Health::Critical => "Critical".to_owned(),
        Health::Other(other) => truncated(other, 64),
    }
}

/// A value of the BMC's own, cut to what its status field holds (`max` characters), so that
/// no answer makes the status write refused.
fn truncated(value: &str, max: usize) -> String {
    value.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use ichor_api::common::ConditionStatus;
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    /// The node's SMBIOS UUID as Talos reads it.
    const NODE: &str = "4c4c4544-0042-3510-8052-b3c04f4e3732";
    /// The same UUID with its first three fields byte-swapped, as some BMCs report it.
    const NODE_SWAPPED: &str = "44454C4C-4200-1035-8052-B3C04F4E3732";
    /// Another machine's.
    const OTHER: &str = "11111111-2222-3333-4444-555555555555";

    fn system(id: &str, uuid: &str) -> System {
        System {
            odata_id: format!("/redfish/v1/Systems/{id}"),
            id: Some(id.to_owned()),
            uuid: Some(uuid.to_owned()),
            power_state: Some(PowerState::On),
            health: Some(Health::Ok),
            state: Some("Enabled".to_owned()),
            boot: ichor_redfish::Boot::default(),
            reset: None,
            managed_by: Vec::new(),
            virtual_media: None,
            etag: None,
        }
    }

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + seconds).expect("a time"))
    }

    fn id(chosen: Result<&System, Stop>) -> Result<String, &'static str> {
        chosen
            .map(|s| s.id.clone().unwrap_or_default())
            .map_err(|stop| stop.reason)
    }

    #[test]
    fn the_system_is_the_one_reporting_the_nodes_uuid_in_either_byte_order() {
        let systems = [system("a", OTHER), system("b", NODE_SWAPPED)];
        assert_eq!(
            id(choose_system(&systems, None, Some(NODE))),
            Ok("b".into())
        );
        let systems = [system("a", OTHER)];
        assert_eq!(
            id(choose_system(&systems, None, Some(NODE))),
            Err(reasons::BMC_SYSTEM_NOT_FOUND)
        );
    }

    #[test]
    fn without_the_nodes_uuid_the_only_system_is_taken_and_two_are_refused() {
        let one = [system("only", OTHER)];
        assert_eq!(id(choose_system(&one, None, None)), Ok("only".into()));
        let two = [system("a", OTHER), system("b", NODE)];
        assert_eq!(
            id(choose_system(&two, None, None)),
            Err(reasons::BMC_SYSTEM_NOT_FOUND)
        );
        assert_eq!(
            id(choose_system(&[], None, None)),
            Err(reasons::BMC_SYSTEM_NOT_FOUND)
        );
    }

    #[test]
    fn a_system_named_by_id_must_report_the_nodes_uuid() {
        let systems = [system("a", OTHER), system("b", NODE)];
        assert_eq!(
            id(choose_system(&systems, Some("b"), Some(NODE))),
            Ok("b".into())
        );
        assert_eq!(
            id(choose_system(&systems, Some("a"), Some(NODE))),
            Err(reasons::BMC_UUID_MISMATCH)
        );
        assert_eq!(id(choose_system(&systems, Some("a"), None)), Ok("a".into()));
        assert_eq!(
            id(choose_system(&systems, Some("z"), Some(NODE))),
            Err(reasons::BMC_SYSTEM_NOT_FOUND)
        );
    }

    #[test]
    fn a_read_system_is_recorded_and_the_bmc_reachable() {
        let mut status = TalosMachineStatus::default();
        record(&mut status, &Ok(system("1", NODE)), Some(3), &at(0));
        let observed = status.bmc.observed.clone().expect("observed");
        assert_eq!(observed.power_state.as_deref(), Some("On"));
        assert_eq!(observed.health.as_deref(), Some("OK"));
        assert_eq!(observed.state.as_deref(), Some("Enabled"));
        assert_eq!(observed.system_id.as_deref(), Some("1"));
        assert_eq!(observed.uuid.as_deref(), Some(NODE));
        assert_eq!(observed.observed_generation, Some(3));
        assert!(reachable(&status));
        let condition = &status.conditions[0];
        assert_eq!(condition.reason, reasons::BMC_OBSERVED);
    }

    #[test]
    fn a_failed_read_says_why_and_keeps_no_stale_power_state() {
        let mut status = TalosMachineStatus::default();
        record(&mut status, &Ok(system("1", NODE)), Some(1), &at(0));
        let before = status.clone();
        let refused = ichor_redfish::Error::Unauthorized {
            endpoint: "https://10.0.0.5".into(),
            username: "admin".into(),
            path: "/redfish/v1/".into(),
            status: 401,
        };
        record(&mut status, &Err(failed(&refused)), Some(1), &at(60));
        let condition = &status.conditions[0];
        assert_eq!(condition.status, ConditionStatus::False);
        assert_eq!(condition.reason, reasons::BMC_UNAUTHORIZED);
        assert_eq!(condition.last_transition_time, at(60));
        let observed = status.bmc.observed.clone().expect("observed");
        assert_eq!(observed.power_state, None, "no power state it did not read");
        assert_eq!(observed.observed_at, Some(at(60)));
        assert!(
            !same_reachability(Some(&before), &status),
            "an Event is due"
        );
        assert!(same_reachability(Some(&status), &status.clone()));
    }

    #[test]
    fn the_bmc_is_read_at_the_settled_pace_and_at_once_when_its_spec_changes() {
        let pace = Duration::from_secs(60);
        assert_eq!(wait(None, Some(1), &at(0), pace), None, "never read");
        let mut status = TalosMachineStatus::default();
        record(&mut status, &Ok(system("1", NODE)), Some(1), &at(0));
        assert_eq!(
            wait(Some(&status), Some(1), &at(20), pace),
            Some(Duration::from_secs(40))
        );
        assert_eq!(wait(Some(&status), Some(1), &at(60), pace), None, "due");
        assert_eq!(
            wait(Some(&status), Some(2), &at(20), pace),
            None,
            "spec changed"
        );
    }

    #[test]
    fn forgetting_a_bmc_clears_its_fields_and_condition() {
        let mut status = TalosMachineStatus::default();
        record(&mut status, &Ok(system("1", NODE)), Some(1), &at(0));
        assert!(named(&status));
        forget(&mut status);
        assert!(!named(&status));
        assert_eq!(status.bmc.observed, None);
        assert!(status.conditions.is_empty());
    }

    #[test]
    fn every_client_reason_is_a_reason_constant() {
        let endpoint = || "https://10.0.0.5".to_owned();
        let errors = [
            ichor_redfish::Error::InvalidEndpoint {
                endpoint: endpoint(),
                detail: String::new(),
            },
            ichor_redfish::Error::Unauthorized {
                endpoint: endpoint(),
                username: String::new(),
                path: String::new(),
                status: 401,
            },
            ichor_redfish::Error::Unreachable {
                endpoint: endpoint(),
                detail: String::new(),
            },
            ichor_redfish::Error::Untrusted {
                endpoint: endpoint(),
                detail: String::new(),
            },
            ichor_redfish::Error::NotFound {
                endpoint: endpoint(),
                path: String::new(),
            },
            ichor_redfish::Error::Refused {
                endpoint: endpoint(),
                method: "GET".into(),
                path: String::new(),
                status: 400,
                messages: Vec::new(),
            },
            ichor_redfish::Error::ServerError {
                endpoint: endpoint(),
                method: "GET".into(),
                path: String::new(),
                status: 500,
                messages: Vec::new(),
            },
            ichor_redfish::Error::Protocol {
                endpoint: endpoint(),
                path: String::new(),
                detail: String::new(),
            },
            ichor_redfish::Error::TooLarge {
                endpoint: endpoint(),
                path: String::new(),
                limit: 1,
            },
            ichor_redfish::Error::Unsupported {
                endpoint: endpoint(),
                detail: String::new(),
            },
        ];
        let said: Vec<&str> = errors.iter().map(ichor_redfish::Error::reason).collect();
        assert_eq!(
            said,
            reasons::BMC_CLIENT,
            "the same words, in the same order"
        );
    }
}

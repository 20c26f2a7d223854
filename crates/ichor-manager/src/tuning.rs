//! The check that `docs/tuning.md` states the code's defaults: every row that names an item of
//! the manager, or of a crate it builds on, gives that item's value, so a default changed
//! without the page (or the page without the code) fails. The flags' defaults are checked by
//! the binary's own test.

use std::time::Duration;

use ichor_testenv::tuning::{assert_code_rows, shown};

use crate::{
    Settings, controller::backup, controller::machine, controller::operation, error, etcd,
    infra::panics, lock,
};
use crate::{controller::storage, renewal, secrets, workload};

/// The durations `docs/tuning.md` names by their code.
fn duration_defaults() -> Vec<(&'static str, Duration)> {
    let Settings {
        sweep,
        bootstrap_patience,
        progress_requeue,
        settled_requeue,
        settled_looks_per_second: _,
        install_stall_limit,
        reporter: _,
        instance: _,
        credential_lifetime,
        own_credential_lifetime,
        concurrency: _,
    } = Settings::default();
    let discovery: ichor_api::cluster::DiscoverySpec =
        serde_json::from_value(serde_json::json!({ "cidrs": [] })).expect("a discovery spec");
    let interval = ichor_api::time::parse_duration("interval", &discovery.interval);
    let max_age = u64::try_from(ichor_deleteguard::OBSERVATION_MAX_AGE).expect("positive");
    vec![
        ("Settings::progress_requeue", progress_requeue),
        ("Settings::settled_requeue", settled_requeue),
        (
            "ichor_api::cluster::DiscoverySpec::interval",
            interval.expect("it reads"),
        ),
        (
            "ichor_talos::discovery::SweepConfig::timeout",
            sweep.timeout,
        ),
        ("Settings::credential_lifetime", credential_lifetime),
        ("Settings::own_credential_lifetime", own_credential_lifetime),
        ("renewal::SLACK", renewal::SLACK),
        ("Settings::bootstrap_patience", bootstrap_patience),
        ("Settings::install_stall_limit", install_stall_limit),
        (
            "controller::operation::NODE_PATIENCE",
            operation::NODE_PATIENCE,
        ),
        ("workload::API_TIMEOUT", workload::API_TIMEOUT),
        (
            "ichor_deleteguard::OBSERVATION_MAX_AGE",
            Duration::from_secs(max_age),
        ),
    ]
}

/// The durations `docs/tuning.md` names that the code holds as constants.
fn constant_defaults() -> Vec<(&'static str, Duration)> {
    vec![
        ("etcd::OBSERVATION_REFRESH", etcd::OBSERVATION_REFRESH),
        (
            "controller::storage::PENDING_REQUEUE",
            storage::PENDING_REQUEUE,
        ),
        ("secrets::PROBE_PATIENCE", secrets::PROBE_PATIENCE),
        (
            "lock::LOCK_SECONDS",
            Duration::from_secs(lock::LOCK_SECONDS),
        ),
        ("infra::panics::FIRST_RETRY", panics::FIRST_RETRY),
        ("infra::panics::RETRY_CAP", panics::RETRY_CAP),
        ("error::BUG_REQUEUE", error::BUG_REQUEUE),
        (
            "controller::backup::plan::FAILURE_RETRY",
            backup::plan::FAILURE_RETRY,
        ),
        ("controller::backup::BUSY_RETRY", backup::BUSY_RETRY),
    ]
}

/// The Talos request limits `docs/tuning.md` names: the client's defaults, which the manager
/// keeps.
fn limit_defaults() -> Vec<(&'static str, Duration)> {
    let ichor_talos::Limits {
        quick,
        long,
        snapshot_idle,
        pull,
        upgrade,
    } = ichor_talos::Limits::default();
    vec![
        ("ichor_talos::Limits::quick", quick),
        ("ichor_talos::Limits::long", long),
        ("ichor_talos::Limits::snapshot_idle", snapshot_idle),
        ("ichor_talos::Limits::pull", pull),
        ("ichor_talos::Limits::upgrade", upgrade),
    ]
}

/// The counts and sizes `docs/tuning.md` names by their code, as it writes them.
fn count_defaults() -> Vec<(&'static str, String)> {
    let settings = Settings::default();
    vec![
        (
            "controller::machine::plan::PROGRESS_BACKOFF_MAX",
            machine::plan::PROGRESS_BACKOFF_MAX.to_string(),
        ),
        (
            "Settings::settled_looks_per_second",
            settings.settled_looks_per_second.to_string(),
        ),
        ("Settings::concurrency", settings.concurrency.to_string()),
        (
            "ichor_talos::discovery::SweepConfig::concurrency",
            settings.sweep.concurrency.to_string(),
        ),
        (
            "controller::backup::PARTS_IN_FLIGHT",
            backup::PARTS_IN_FLIGHT.to_string(),
        ),
        (
            "controller::backup::PART",
            format!("{} MiB", backup::PART / (1024 * 1024)),
        ),
        (
            "controller::backup::CHUNKS_QUEUED",
            backup::CHUNKS_QUEUED.to_string(),
        ),
        (
            "ichor_talos::discovery::MAX_CIDRS",
            ichor_talos::discovery::MAX_CIDRS.to_string(),
        ),
        (
            "ichor_talos::discovery::MIN_PREFIX",
            ichor_talos::discovery::MIN_PREFIX.to_string(),
        ),
    ]
}

/// Every default `docs/tuning.md` names by its code is the code's, and every code item it
/// names (but the webhook's, which `ichor-webhook` checks) is checked here: a default changed
/// on one side alone fails.
#[test]
fn tuning_doc_states_the_code_defaults() {
    let durations = duration_defaults()
        .into_iter()
        .chain(constant_defaults())
        .chain(limit_defaults());
    let durations = durations.map(|(item, duration)| (item, shown(duration)));
    let code: Vec<(&str, String)> = durations.chain(count_defaults()).collect();
    // The webhook's rows are checked by ichor-webhook; "—" names no code item.
    assert_code_rows(&code, |named| {
        named != "—" && !named.starts_with("ichor_webhook::")
    });
}

//! What turns API-supplied times and durations into deadlines (`ichor_api::time`): the one
//! duration parser (`spec.discovery.interval`, `spec.backup.retention.maxAge`, the schedule's
//! `@every`, the manager's lifetime flags) and the expiry of a Lease (the cluster lock, in a
//! tenant's namespace, and the leader's Lease).
//!
//! Input, one per line: a duration as written; a Lease spec as JSON, as the apiserver returns
//! it; the time now (RFC 3339; a fixed time if absent or unreadable).
//!
//! Invariants: nothing panics; a duration read is positive and can be added to the present
//! (a requeue's deadline); a Lease's expiry is `renewTime + leaseDurationSeconds < now` when
//! that end can be represented (a negative duration as zero), is never when it cannot, and
//! once expired stays expired at any later time.
#![no_main]

use std::time::Instant;

use ichor_api::time::{LeaseEnd, checked_after, lease_end, lease_expired, parse_duration};
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::jiff::Timestamp;
use libfuzzer_sys::fuzz_target;

fn check_duration(text: &str) {
    let Ok(duration) = parse_duration("spec.discovery.interval", text) else {
        return;
    };
    assert!(!duration.is_zero(), "{text:?} read as zero");
    assert!(
        Instant::now().checked_add(duration).is_some(),
        "{text:?} read as {duration:?}, past any deadline"
    );
    let _ = checked_after(Timestamp::now(), duration);
    let _ = checked_after(Timestamp::MAX, duration);
}

fn check_lease(spec: &LeaseSpec, now: Timestamp) {
    let expired = lease_expired(spec, now);
    match lease_end(spec) {
        LeaseEnd::Unrenewed => {
            assert!(spec.renew_time.is_none() || spec.lease_duration_seconds.is_none());
            assert!(expired);
        }
        LeaseEnd::At(end) => {
            let renewed = spec.renew_time.as_ref().expect("renewed").0;
            let seconds = spec.lease_duration_seconds.expect("a duration").max(0);
            let want = renewed.as_nanosecond() + i128::from(seconds) * 1_000_000_000;
            assert_eq!(end.as_nanosecond(), want);
            assert_eq!(expired, end < now);
        }
        LeaseEnd::Never => {
            let renewed = spec.renew_time.as_ref().expect("renewed").0;
            let seconds = spec.lease_duration_seconds.expect("a duration").max(0);
            let end = renewed.as_nanosecond() + i128::from(seconds) * 1_000_000_000;
            assert!(
                end > Timestamp::MAX.as_nanosecond(),
                "{end} ns is representable"
            );
            assert!(!expired);
        }
    }
    // Once run out, a Lease stays run out; not yet run out, it was not before.
    if expired {
        assert!(
            lease_expired(spec, Timestamp::MAX),
            "expired at {now}, then not"
        );
    } else {
        assert!(
            !lease_expired(spec, Timestamp::MIN),
            "current at {now}, expired before"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = input.split('\n');
    check_duration(lines.next().unwrap_or_default());
    let spec = lines
        .next()
        .and_then(|json| serde_json::from_str::<LeaseSpec>(json).ok());
    let now = lines
        .next()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .unwrap_or_else(|| "2026-12-06T10:00:00Z".parse().expect("a time"));
    if let Some(spec) = spec {
        check_lease(&spec, now);
    }
});

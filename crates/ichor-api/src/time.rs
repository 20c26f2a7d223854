//! Durations and deadlines from values that come from outside: the one duration syntax of
//! Ichor's spec fields and flags ([`parse_duration`], jiff's parser: docs/adr/0048), and when a
//! `coordination.k8s.io` Lease runs out ([`lease_expired`]).
//!
//! Every step is checked: a number too large is an error, a time past the last one that can be
//! represented is a stated outcome, never a panic or a value that wrapped.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::jiff::{SignedDuration, Span, SpanRelativeTo, Timestamp};

/// What a duration is written as, for the messages that refuse one.
pub const DURATION_FORMS: &str = "a positive number and a unit (ns, us, ms, s, m, h, d or w), e.g. 30s, 5m, 1h, 1m30s, 1.5h or 365d";

/// A duration Ichor cannot use, with the field (or flag) that holds it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {text:?} is not a duration Ichor can use ({problem}): write {DURATION_FORMS}")]
pub struct InvalidDuration {
    /// The field or flag, e.g. `spec.discovery.interval`.
    pub field: String,
    /// The value as written.
    pub text: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Reads the duration `text` of `field`: Go's syntax, which the apiserver's CEL `duration()`
/// checks spec fields with (`30s`, `5m`, `1h`, `1m30s`, `1.5h`, `300ms`), and days and weeks of
/// 24-hour days (`365d`, `2w`) for the flags. Jiff's friendly format and ISO 8601 (`PT5M`) read
/// too. Zero, negative, months and years, and numbers past jiff's range (about 20 000 years)
/// are refused.
///
/// ```
/// use std::time::Duration;
///
/// use ichor_api::time::parse_duration;
///
/// let read = |text| parse_duration("spec.discovery.interval", text);
/// assert_eq!(read("1m30s")?, Duration::from_secs(90));
/// assert_eq!(read("365d")?, Duration::from_secs(365 * 86_400));
/// assert_eq!(read("1.5h")?, Duration::from_secs(5_400));
/// let refused = read("5 fortnights").unwrap_err().to_string();
/// assert!(refused.starts_with("spec.discovery.interval \"5 fortnights\""), "{refused}");
/// assert!(refused.contains("e.g. 30s, 5m"), "{refused}");
/// # Ok::<(), ichor_api::time::InvalidDuration>(())
/// ```
pub fn parse_duration(field: &str, text: &str) -> Result<Duration, InvalidDuration> {
    let invalid = |problem: &str| InvalidDuration {
        field: field.to_owned(),
        text: text.to_owned(),
        problem: problem.to_owned(),
    };
    let span: Span = text.parse().map_err(|_| {
        // The same words with every number made small read: the numbers are too large.
        if small_numbers(text).parse::<Span>().is_ok() {
            invalid("it is too large")
        } else {
            invalid("it does not read as a duration")
        }
    })?;
    if span.is_negative() {
        return Err(invalid("it is negative"));
    }
    if span.get_years() != 0 || span.get_months() != 0 {
        return Err(invalid("months and years have no fixed length"));
    }
    let signed = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|_| invalid("it is too large"))?;
    let duration = Duration::try_from(signed).map_err(|_| invalid("it is negative"))?;
    if duration.is_zero() {
        return Err(invalid("it is zero"));
    }
    Ok(duration)
}

/// `text` with every run of digits replaced by `1`.
fn small_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('1');
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
    out
}

/// `at + duration`, or `None` past the last time a [`Timestamp`] holds (the end of year 9999).
pub fn checked_after(at: Timestamp, duration: Duration) -> Option<Timestamp> {
    at.checked_add(SignedDuration::try_from(duration).ok()?)
        .ok()
}

/// When a Lease held as `spec` says runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    /// It was never renewed, or says for how long: it counts as run out already.
    Unrenewed,
    /// At this time (`renewTime + leaseDurationSeconds`; a negative duration counts as zero).
    At(Timestamp),
    /// Past the last time that can be represented (a `renewTime` near the year 9999): never.
    /// Such a Lease is held, as one renewed in the far future is; deleting it frees it.
    Never,
}

/// When the Lease `spec` runs out.
pub fn lease_end(spec: &LeaseSpec) -> LeaseEnd {
    let (Some(renewed), Some(seconds)) = (&spec.renew_time, spec.lease_duration_seconds) else {
        return LeaseEnd::Unrenewed;
    };
    let seconds = u64::try_from(seconds).unwrap_or(0);
    match checked_after(renewed.0, Duration::from_secs(seconds)) {
        Some(end) => LeaseEnd::At(end),
        None => LeaseEnd::Never,
    }
}

/// Whether the Lease `spec` has run out at `now`: renewed longer ago than its duration, or never
/// renewed. One whose end cannot be represented has not ([`LeaseEnd::Never`]).
pub fn lease_expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    match lease_end(spec) {
        LeaseEnd::Unrenewed => true,
        LeaseEnd::At(end) => end < now,
        LeaseEnd::Never => false,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn read(text: &str) -> Result<Duration, InvalidDuration> {
        parse_duration("retention.maxAge", text)
    }

    #[test]
    fn durations_read_as_the_crds_and_flags_document_them() {
        for (text, seconds) in [
            ("30s", 30),
            ("5m", 300),
            ("1h", 3_600),
            ("720h", 720 * 3_600),
            ("365d", 365 * 86_400),
            ("1m30s", 90),
            ("1d12h", 36 * 3_600),
            ("1h0m0s", 3_600),
            ("1.5h", 5_400),
            ("2w", 14 * 86_400),
        ] {
            assert_eq!(read(text), Ok(Duration::from_secs(seconds)), "{text}");
        }
        assert_eq!(read("300ms"), Ok(Duration::from_millis(300)));
    }

    #[test]
    fn bad_durations_say_which_field_and_what_is_allowed() {
        for (text, problem) in [
            ("", "it does not read as a duration"),
            ("10", "it does not read as a duration"),
            ("5x", "it does not read as a duration"),
            ("0s", "it is zero"),
            ("-5m", "it is negative"),
            ("1y", "months and years have no fixed length"),
            ("2mo", "months and years have no fixed length"),
            // Go reads a fraction before another unit; jiff only on the last unit.
            ("1.5h30m", "it does not read as a duration"),
        ] {
            let error = read(text).expect_err(text);
            assert_eq!(error.problem, problem, "{text}");
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("retention.maxAge {text:?}")),
                "{message}"
            );
            assert!(message.contains("e.g. 30s, 5m, 1h, 1m30s"), "{message}");
        }
    }

    /// The old parser multiplied and added without checks: these panicked (debug) or wrapped.
    #[test]
    fn huge_durations_are_refused_not_wrapped() {
        for text in [
            "18446744073709551615s",
            "99999999999999999999999999s",
            "9223372036854775807h",
            "213503982334601d",
            "5124095576030431h",
            "9999999999d",
            "175307616000h",
        ] {
            let error = read(text).expect_err(text);
            assert_eq!(error.problem, "it is too large", "{text}: {error}");
        }
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a time")
    }

    fn lease(renewed: Option<&str>, seconds: Option<i32>) -> LeaseSpec {
        lease_at(renewed.map(at), seconds)
    }

    fn lease_at(renewed: Option<Timestamp>, seconds: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some("removal/abc".into()),
            renew_time: renewed.map(MicroTime),
            lease_duration_seconds: seconds,
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_runs_out_a_duration_after_its_renewal() {
        let spec = lease(Some("2026-12-06T10:00:00Z"), Some(60));
        assert!(!lease_expired(&spec, at("2026-12-06T10:01:00Z")));
        assert!(lease_expired(&spec, at("2026-12-06T10:01:00.000001Z")));
        assert_eq!(lease_end(&spec), LeaseEnd::At(at("2026-12-06T10:01:00Z")));
        assert!(lease_expired(
            &lease(None, Some(60)),
            at("2026-12-06T10:00:00Z")
        ));
        assert!(lease_expired(
            &lease(Some("2026-12-06T10:00:00Z"), None),
            at("2026-12-06T10:00:00Z")
        ));
    }

    /// A Lease renewed in the year 9999 made `renewTime + leaseDuration` panic in a worker.
    #[test]
    fn a_lease_renewed_in_the_year_9999_is_held_not_a_panic() {
        let now = at("2026-12-06T10:00:00Z");
        for seconds in [60, i32::MAX] {
            let spec = lease_at(Some(Timestamp::MAX), Some(seconds));
            assert_eq!(lease_end(&spec), LeaseEnd::Never, "{seconds}");
            assert!(!lease_expired(&spec, now));
            assert!(!lease_expired(&spec, Timestamp::MAX));
        }
        let spec = lease(Some("9999-12-30T21:59:30Z"), Some(60));
        assert_eq!(lease_end(&spec), LeaseEnd::Never);
        let spec = lease(Some("9999-01-01T00:00:00Z"), Some(60));
        assert!(!lease_expired(&spec, now));
    }

    #[test]
    fn the_longest_lease_duration_is_about_68_years() {
        let spec = lease(Some("2026-12-06T10:00:00Z"), Some(i32::MAX));
        assert!(!lease_expired(&spec, at("2094-01-01T00:00:00Z")));
        assert!(lease_expired(&spec, at("2095-01-01T00:00:00Z")));
    }

    #[test]
    fn a_negative_lease_duration_counts_as_zero() {
        for seconds in [-1, i32::MIN] {
            let spec = lease(Some("2026-12-06T10:00:00Z"), Some(seconds));
            assert_eq!(lease_end(&spec), LeaseEnd::At(at("2026-12-06T10:00:00Z")));
            assert!(!lease_expired(&spec, at("2026-12-06T10:00:00Z")));
            assert!(lease_expired(&spec, at("2026-12-06T10:00:01Z")));
        }
        let spec = lease_at(Some(Timestamp::MIN), Some(-5));
        assert!(lease_expired(&spec, at("2026-12-06T10:00:00Z")));
    }

    #[test]
    fn checked_after_stops_at_the_last_time() {
        assert_eq!(
            checked_after(at("2026-12-06T10:00:00Z"), Duration::from_secs(60)),
            Some(at("2026-12-06T10:01:00Z"))
        );
        assert_eq!(checked_after(Timestamp::MAX, Duration::from_secs(1)), None);
        assert_eq!(checked_after(Timestamp::MIN, Duration::MAX), None);
    }
}

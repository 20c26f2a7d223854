//! When credentials are minted anew (pure, ADR 0022): at two thirds of their lifetime, and at
//! once when they are missing, point somewhere else than they should, or outlive a lifetime
//! that was shortened since they were minted. The published kubeconfig and talosconfig and the
//! manager's own cached credentials all follow it.

use std::time::{Duration, SystemTime};

use ichor_api::names::reasons;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// How much longer than its lifetime a certificate may still run before it is taken for one
/// minted under a longer lifetime (certificates are backdated a minute for slow clocks).
pub(crate) const SLACK: Duration = Duration::from_secs(120);

/// A client certificate's validity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Its `notBefore` (backdated a minute when minted).
    pub not_before: Timestamp,
    /// Its `notAfter`.
    pub not_after: Timestamp,
}

impl Validity {
    /// From the system times a certificate carries; `None` if out of range.
    pub fn from_system(not_before: SystemTime, not_after: SystemTime) -> Option<Self> {
        Some(Self {
            not_before: Timestamp::try_from(not_before).ok()?,
            not_after: Timestamp::try_from(not_after).ok()?,
        })
    }
}

/// Why credentials are minted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// None are there (or they cannot be read).
    Missing,
    /// They point elsewhere than they should (endpoint, nodes, CA).
    Changed,
    /// Two thirds of their lifetime have passed.
    Due,
    /// They run longer than the lifetime now configured.
    Shortened,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Missing => "none were published",
            Self::Changed => "what they point at changed",
            Self::Due => "two thirds of their lifetime have passed",
            Self::Shortened => "they outlive the configured lifetime",
        })
    }
}

impl Why {
    /// The reason of the Event that says so: none for a first mint, `CredentialsReminted` for
    /// a changed target, `CredentialsRenewed` for a renewal.
    pub fn event_reason(self) -> Option<&'static str> {
        match self {
            Self::Missing => None,
            Self::Changed => Some(reasons::CREDENTIALS_REMINTED),
            Self::Due | Self::Shortened => Some(reasons::CREDENTIALS_RENEWED),
        }
    }
}

/// What to do with credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Mint new ones now.
    Mint(Why),
    /// Keep them until `renew_at`.
    Keep {
        /// When they are due.
        renew_at: Timestamp,
    },
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// When a certificate of `validity`, minted to live `lifetime`, is due: a third of its lifetime
/// before it expires (its `notBefore` is backdated, so the lifetime is the configured one unless
/// the certificate is shorter).
pub fn renew_at(validity: Validity, lifetime: Duration) -> Timestamp {
    let span = Duration::try_from(validity.not_after.duration_since(validity.not_before))
        .unwrap_or_default();
    let third = lifetime.min(span) / 3;
    validity
        .not_after
        .checked_sub(signed(third))
        .unwrap_or(validity.not_before)
}

/// When credentials just minted to live `lifetime`, expiring at `expires`, are due.
pub fn due_after_mint(expires: Timestamp, lifetime: Duration) -> Timestamp {
    let minted = expires.checked_sub(signed(lifetime)).unwrap_or(expires);
    renew_at(
        Validity {
            not_before: minted,
            not_after: expires,
        },
        lifetime,
    )
}

/// What to do with credentials whose certificate has `held` validity (`None`: there are none)
/// and which point where they should when `current`, under `lifetime`, at `now`.
pub fn decide(
    held: Option<Validity>,
    current: bool,
    lifetime: Duration,
    now: Timestamp,
) -> Renewal {
    let Some(validity) = held else {
        return Renewal::Mint(Why::Missing);
    };
    if !current {
        return Renewal::Mint(Why::Changed);
    }
    let due = renew_at(validity, lifetime);
    if now >= due {
        return Renewal::Mint(Why::Due);
    }
    let left = validity.not_after.duration_since(now);
    if left > signed(lifetime + SLACK) {
        return Renewal::Mint(Why::Shortened);
    }
    Renewal::Keep { renew_at: due }
}

/// How long from `now` until `renew_at` (zero if it passed), for a requeue.
pub fn until(renew_at: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(renew_at.duration_since(now)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    /// A certificate minted at `minted` to live `lifetime`, backdated a minute.
    fn minted(minted: &str, lifetime: Duration) -> Validity {
        let minted = at(minted);
        Validity {
            not_before: minted - SignedDuration::from_secs(60),
            not_after: minted + signed(lifetime),
        }
    }

    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

    #[test]
    fn missing_or_changed_credentials_are_minted_at_once() {
        let now = at("2026-12-03T10:00:00Z");
        assert_eq!(decide(None, true, YEAR, now), Renewal::Mint(Why::Missing));
        let fresh = minted("2026-12-03T09:59:00Z", YEAR);
        assert_eq!(
            decide(Some(fresh), false, YEAR, now),
            Renewal::Mint(Why::Changed)
        );
    }

    #[test]
    fn credentials_are_renewed_at_two_thirds_of_their_lifetime() {
        let lifetime = Duration::from_secs(45);
        let held = minted("2026-12-03T10:00:00Z", lifetime);
        // Minted at 10:00:00 to live 45 s: due at 10:00:30, 15 s before they expire.
        let due = at("2026-12-03T10:00:30Z");
        assert_eq!(renew_at(held, lifetime), due);
        assert_eq!(
            decide(Some(held), true, lifetime, at("2026-12-03T10:00:10Z")),
            Renewal::Keep { renew_at: due }
        );
        assert_eq!(
            until(due, at("2026-12-03T10:00:10Z")),
            Duration::from_secs(20)
        );
        assert_eq!(
            decide(Some(held), true, lifetime, due),
            Renewal::Mint(Why::Due)
        );
        assert_eq!(
            decide(Some(held), true, lifetime, at("2026-12-03T10:01:00Z")),
            Renewal::Mint(Why::Due),
            "expired ones too"
        );
        assert_eq!(until(due, at("2026-12-03T10:01:00Z")), Duration::ZERO);
    }

    #[test]
    fn just_minted_credentials_are_due_a_third_of_their_lifetime_before_they_expire() {
        let expires = at("2026-12-03T10:00:45Z");
        let lifetime = Duration::from_secs(45);
        assert_eq!(
            due_after_mint(expires, lifetime),
            at("2026-12-03T10:00:30Z")
        );
        let held = minted("2026-12-03T10:00:00Z", lifetime);
        assert_eq!(
            due_after_mint(held.not_after, lifetime),
            renew_at(held, lifetime)
        );
    }

    #[test]
    fn only_a_renewal_or_a_re_mint_is_announced() {
        assert_eq!(Why::Missing.event_reason(), None);
        assert_eq!(
            Why::Changed.event_reason(),
            Some(reasons::CREDENTIALS_REMINTED)
        );
        for why in [Why::Due, Why::Shortened] {
            assert_eq!(why.event_reason(), Some(reasons::CREDENTIALS_RENEWED));
        }
    }

    #[test]
    fn a_year_long_certificate_is_kept_for_eight_months() {
        let held = minted("2026-01-01T00:00:00Z", YEAR);
        let Renewal::Keep { renew_at } = decide(Some(held), true, YEAR, at("2026-06-01T00:00:00Z"))
        else {
            panic!("kept");
        };
        let kept = Duration::try_from(renew_at.duration_since(at("2026-01-01T00:00:00Z")))
            .expect("positive");
        assert_eq!(kept, YEAR * 2 / 3);
    }

    #[test]
    fn a_shortened_lifetime_re_mints_longer_credentials_and_a_longer_one_keeps_them() {
        let now = at("2026-12-03T10:00:00Z");
        let long = minted("2026-12-03T09:00:00Z", YEAR);
        assert_eq!(
            decide(Some(long), true, Duration::from_secs(60), now),
            Renewal::Mint(Why::Shortened)
        );
        let short = minted("2026-12-03T09:59:50Z", Duration::from_secs(60));
        assert!(matches!(
            decide(Some(short), true, YEAR, now),
            Renewal::Keep { renew_at } if renew_at == at("2026-12-03T10:00:10Z")
        ));
    }
}

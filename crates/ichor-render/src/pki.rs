//! PKI helpers: node serving certificates and role-bearing client certificates from the OS CA.
//!
//! Certificate fingerprints (what `talosctl --cert-fingerprint` pins) are not here: the Talos
//! client owns them, `ichor_talos::tls::fingerprint_der` (docs/adr/0005).

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyUsagePurpose, SanType};

use crate::bundle::{BundleError, SecretsBundle, ed25519_key};

/// What went wrong minting a certificate.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// The bundle's CA could not be used.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The certificate could not be signed.
    #[error("cannot sign a {what} certificate")]
    Sign {
        /// Which certificate.
        what: &'static str,
    },
}

/// A certificate and its key, both PEM. `Debug` hides the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PEM (PKCS#8 under the Talos Ed25519 label).
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Talos API roles carried in a client certificate's Organization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Full access.
    Admin,
    /// Operator: reboots and the like.
    Operator,
    /// Read-only.
    Reader,
    /// etcd snapshots (and the etcd reads a backup needs), nothing else.
    EtcdBackup,
}

impl Role {
    /// The Organization value, e.g. `os:admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "os:admin",
            Self::Operator => "os:operator",
            Self::Reader => "os:reader",
            Self::EtcdBackup => "os:etcd:backup",
        }
    }
}

/// The current time, for certificate validity.
pub(crate) fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

/// `start + ttl`, at most 9999-12-31T23:59:59Z: the last time X.509 writes, which RFC 5280
/// (4.1.2.5) gives to a certificate with no well-defined expiration. A lifetime too long for
/// the calendar (a flag's `99999999d`) yields such a certificate, not a panic.
pub(crate) fn not_after(start: time::OffsetDateTime, ttl: Duration) -> time::OffsetDateTime {
    let last = time::Date::from_calendar_date(9999, time::Month::December, 31)
        .ok()
        .and_then(|day| day.with_hms(23, 59, 59).ok())
        .map_or(start, time::PrimitiveDateTime::assume_utc);
    time::Duration::try_from(ttl)
        .ok()
        .and_then(|ttl| start.checked_add(ttl))
        .map_or(last, |end| end.min(last))
}

/// Leaf-certificate parameters: the subject, one extended key usage, and a validity from a
/// minute ago (for clocks slightly behind ours) to `ttl` from now.
pub(crate) fn leaf_params(
    common_name: &str,
    organization: Option<&str>,
    usage: ExtendedKeyUsagePurpose,
    ttl: Duration,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        params
            .distinguished_name
            .push(DnType::OrganizationName, organization);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    let now = now();
    params.not_before = now - Duration::from_secs(60);
    params.not_after = not_after(now, ttl);
    params
}

/// Signs `params` with the OS CA for a new Ed25519 key.
fn sign_with_os_ca(
    bundle: &SecretsBundle,
    params: &CertificateParams,
    what: &'static str,
) -> Result<Issued, PkiError> {
    let issuer = bundle.os_issuer()?;
    let (key, key_pem) = ed25519_key()?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|_| PkiError::Sign { what })?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem,
    })
}

/// Mints an OS-CA-signed client certificate with `role` in its Organization and ExtKeyUsage
/// exactly ClientAuth (Talos 1.12+ requires exactly that), Ed25519 like the CA.
pub fn client_certificate(
    bundle: &SecretsBundle,
    common_name: &str,
    role: Role,
    ttl: Duration,
) -> Result<Issued, PkiError> {
    let params = leaf_params(
        common_name,
        Some(role.as_str()),
        ExtendedKeyUsagePurpose::ClientAuth,
        ttl,
    );
    sign_with_os_ca(bundle, &params, "client")
}

/// Mints an OS-CA-signed serving certificate for a node, with its addresses and hostname as SANs.
pub fn node_server_certificate(
    bundle: &SecretsBundle,
    hostname: &str,
    addresses: &[IpAddr],
    ttl: Duration,
) -> Result<Issued, PkiError> {
    let mut params = leaf_params(hostname, None, ExtendedKeyUsagePurpose::ServerAuth, ttl);
    params.subject_alt_names = addresses.iter().map(|a| SanType::IpAddress(*a)).collect();
    if !hostname.is_empty() {
        let name = hostname
            .to_owned()
            .try_into()
            .map_err(|_| PkiError::Sign { what: "node" })?;
        params.subject_alt_names.push(SanType::DnsName(name));
    }
    sign_with_os_ca(bundle, &params, "node")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lifetime_past_the_calendar_ends_at_the_last_x509_time() {
        let start = time::OffsetDateTime::UNIX_EPOCH;
        assert_eq!(
            not_after(start, Duration::from_secs(86_400)),
            start + time::Duration::days(1)
        );
        for ttl in [
            Duration::from_secs(99_999_999 * 86_400),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ] {
            let end = not_after(start, ttl);
            assert_eq!(
                (end.year(), end.month(), end.day()),
                (9999, time::Month::December, 31)
            );
            assert_eq!((end.hour(), end.minute(), end.second()), (23, 59, 59));
        }
    }
}

//! PKI helpers: node serving certificates and role-bearing client certificates from the OS CA,
//! and certificate fingerprints computed exactly as Talos computes them.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyUsagePurpose, SanType};

use crate::bundle::{BundleError, SecretsBundle, ed25519_key};

/// What went wrong minting a certificate or computing a fingerprint.
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
    /// The input is not a certificate.
    #[error("not a PEM or DER X.509 certificate")]
    NotACertificate,
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
}

impl Role {
    /// The Organization value, e.g. `os:admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "os:admin",
            Self::Operator => "os:operator",
            Self::Reader => "os:reader",
        }
    }
}

fn validity(params: &mut CertificateParams, ttl: Duration) {
    let now = rcgen::date_time_ymd(1970, 1, 1)
        + SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
    // A minute of slack for clocks slightly behind ours.
    params.not_before = now - Duration::from_secs(60);
    params.not_after = now + ttl;
}

/// Mints an OS-CA-signed client certificate with `roles` in its Organization and ExtKeyUsage
/// exactly ClientAuth (Talos 1.12+ requires exactly that), Ed25519 like the CA.
pub fn client_certificate(
    bundle: &SecretsBundle,
    common_name: &str,
    role: Role,
    ttl: Duration,
) -> Result<Issued, PkiError> {
    let issuer = bundle.os_issuer()?;
    let (key, key_pem) = ed25519_key()?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, role.as_str());
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut params, ttl);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|_| PkiError::Sign { what: "client" })?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem,
    })
}

/// Mints an OS-CA-signed serving certificate for a node, with its addresses and hostname as SANs.
pub fn node_server_certificate(
    bundle: &SecretsBundle,
    hostname: &str,
    addresses: &[IpAddr],
    ttl: Duration,
) -> Result<Issued, PkiError> {
    let issuer = bundle.os_issuer()?;
    let (key, key_pem) = ed25519_key()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, hostname);
    params.subject_alt_names = addresses.iter().map(|a| SanType::IpAddress(*a)).collect();
    if !hostname.is_empty() {
        let name = hostname
            .to_owned()
            .try_into()
            .map_err(|_| PkiError::Sign { what: "node" })?;
        params.subject_alt_names.push(SanType::DnsName(name));
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, ttl);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|_| PkiError::Sign { what: "node" })?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem,
    })
}

/// The certificate fingerprint `talosctl --cert-fingerprint` takes: base64 (standard alphabet)
/// of SHA-256 over the certificate's SubjectPublicKeyInfo DER (talos-facts §2).
pub fn fingerprint_der(cert_der: &[u8]) -> Result<String, PkiError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der).map_err(|_| PkiError::NotACertificate)?;
    let spki = cert.tbs_certificate.subject_pki.raw;
    Ok(STANDARD.encode(ring::digest::digest(&ring::digest::SHA256, spki)))
}

/// [`fingerprint_der`] of a PEM certificate.
pub fn fingerprint_pem(cert_pem: &str) -> Result<String, PkiError> {
    let parsed = pem::parse(cert_pem).map_err(|_| PkiError::NotACertificate)?;
    fingerprint_der(parsed.contents())
}

//! TLS for the two kinds of Talos connection.
//!
//! Maintenance mode serves a self-signed certificate regenerated on every boot and asks for no
//! client certificate (talos-facts §2): the only trust is the pinned fingerprint. The pinning
//! verifier accepts exactly the pinned SubjectPublicKeyInfo and still verifies the handshake
//! signature, so a server without the matching private key cannot pass.
//!
//! The fingerprint itself ([`fingerprint_der`], [`fingerprint_pem`]) is defined here, once, for
//! every crate that pins or reports one (the client, the simulator, the manager's tests).

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

/// The input is not an X.509 certificate a fingerprint can be computed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a PEM or DER X.509 certificate")]
pub struct NotACertificate;

/// The certificate fingerprint `talosctl --cert-fingerprint` takes: base64 (standard alphabet)
/// of SHA-256 over the certificate's SubjectPublicKeyInfo DER (talos-facts §2).
///
/// The certificate is parsed by the same parser (rustls-webpki) that checks the handshake
/// signature of a pinned connection, so any certificate a node can be pinned by has a
/// fingerprint here.
///
/// ```
/// let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
/// let cert = rcgen::CertificateParams::new(vec!["talos".to_owned()])
///     .unwrap()
///     .self_signed(&key)
///     .unwrap();
/// let fingerprint = ichor_talos::tls::fingerprint_der(cert.der()).unwrap();
/// assert_eq!(fingerprint.len(), 44); // 32 bytes of SHA-256, base64 with padding
/// assert_eq!(ichor_talos::tls::fingerprint_pem(&cert.pem()).unwrap(), fingerprint);
/// assert!(ichor_talos::tls::fingerprint_der(b"not a certificate").is_err());
/// ```
pub fn fingerprint_der(cert_der: &[u8]) -> Result<String, NotACertificate> {
    use base64::Engine as _;
    let der = CertificateDer::from(cert_der);
    let cert = webpki::EndEntityCert::try_from(&der).map_err(|_| NotACertificate)?;
    let spki = cert.subject_public_key_info();
    Ok(base64::engine::general_purpose::STANDARD
        .encode(ring::digest::digest(&ring::digest::SHA256, spki.as_ref())))
}

/// [`fingerprint_der`] of the first `CERTIFICATE` block of a PEM text.
pub fn fingerprint_pem(cert_pem: &str) -> Result<String, NotACertificate> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|_| NotACertificate)?;
    fingerprint_der(&der)
}

/// Accepts the server certificate whose SPKI fingerprint equals the pin (or, for discovery's
/// first look, any certificate), and records what it saw so a mismatch can be reported with
/// the observed fingerprint. Handshake signatures are verified either way.
#[derive(Debug)]
pub struct PinningVerifier {
    pinned: Option<String>,
    observed: Arc<Mutex<Option<String>>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinningVerifier {
    /// A verifier for `pinned` (base64 SHA-256 of the SPKI, as `talosctl --cert-fingerprint`).
    pub fn new(pinned: impl Into<String>) -> Self {
        Self {
            pinned: Some(pinned.into()),
            observed: Arc::default(),
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        }
    }

    /// A verifier that accepts any certificate and records its fingerprint: only for
    /// discovery, which reads and never writes, to learn the fingerprint a person then pins.
    pub fn recording() -> Self {
        Self {
            pinned: None,
            observed: Arc::default(),
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        }
    }

    /// Where the fingerprint of the certificate last presented is recorded.
    pub fn observed(&self) -> Arc<Mutex<Option<String>>> {
        Arc::clone(&self.observed)
    }
}

impl ServerCertVerifier for PinningVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let seen = fingerprint_der(end_entity)
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if let Ok(mut observed) = self.observed.lock() {
            *observed = Some(seen.clone());
        }
        // Fingerprints are public values: a plain comparison leaks nothing.
        if self.pinned.as_ref().is_none_or(|pin| *pin == seen) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use rcgen::{CertificateParams, KeyPair, PublicKeyData as _};

    use super::*;

    /// base64 SHA-256 of `spki`, computed apart from the function under test.
    fn expected(spki: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD
            .encode(ring::digest::digest(&ring::digest::SHA256, spki))
    }

    #[test]
    fn the_fingerprint_is_the_sha256_of_the_spki_for_every_key_type_talos_uses() {
        for algorithm in [&rcgen::PKCS_ED25519, &rcgen::PKCS_ECDSA_P256_SHA256] {
            let key = KeyPair::generate_for(algorithm).expect("key");
            let cert = CertificateParams::new(vec!["talos".to_owned()])
                .expect("params")
                .self_signed(&key)
                .expect("certificate");
            let want = expected(&key.subject_public_key_info());
            assert_eq!(fingerprint_der(cert.der()).expect("der"), want);
            assert_eq!(fingerprint_pem(&cert.pem()).expect("pem"), want);
        }
    }

    #[test]
    fn an_ed25519_spki_is_the_fixed_prefix_and_the_raw_key() {
        // The 12-byte DER header of an Ed25519 SubjectPublicKeyInfo (RFC 8410), then the key.
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key");
        let cert = CertificateParams::new(vec!["talos".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("certificate");
        let mut spki = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        spki.extend_from_slice(key.public_key_raw());
        assert_eq!(fingerprint_der(cert.der()).expect("der"), expected(&spki));
    }

    #[test]
    fn what_is_not_a_certificate_has_no_fingerprint() {
        assert_eq!(fingerprint_pem("not a certificate"), Err(NotACertificate));
        assert_eq!(
            fingerprint_der(b"\x30\x03\x02\x01\x01"),
            Err(NotACertificate)
        );
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key");
        // A PEM of another kind is not a certificate either.
        assert_eq!(fingerprint_pem(&key.public_key_pem()), Err(NotACertificate));
    }
}

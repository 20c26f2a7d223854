//! TLS for the two kinds of Talos connection.
//!
//! Maintenance mode serves a self-signed certificate regenerated on every boot and asks for no
//! client certificate (talos-facts §2): the only trust is the pinned fingerprint. The pinning
//! verifier accepts exactly the pinned SubjectPublicKeyInfo and still verifies the handshake
//! signature, so a server without the matching private key cannot pass.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

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
        let seen = ichor_render::pki::fingerprint_der(end_entity)
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

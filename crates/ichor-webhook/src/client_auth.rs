//! How the webhook knows that a review comes from the apiserver (ADR 0051): with a client CA
//! configured, the TLS handshake verifies any client certificate against it (a certificate of
//! another CA ends the handshake), and `POST /validate` refuses a request whose connection
//! presented none, before reading it. The handshake itself admits a client without a
//! certificate, so that the kubelet's HTTPS probes of `/healthz` keep working.
//!
//! The apiserver presents its certificate through its admission configuration
//! (`--admission-control-config-file`, a `WebhookAdmissionConfiguration` whose `kubeConfigFile`
//! names the client certificate per webhook host); `docs/install.md` shows the files.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

/// What can be wrong with a client CA.
#[derive(Debug, thiserror::Error)]
pub enum ClientAuthError {
    /// The file could not be read.
    #[error("cannot read the client CA file {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The PEM holds no certificate, or one that does not parse.
    #[error("the client CA holds no usable certificate: {0}")]
    Certificates(String),
    /// rustls refused the verifier.
    #[error("cannot build the client certificate verifier: {0}")]
    Verifier(String),
}

/// The CAs one of which must have signed the client certificate the apiserver presents.
#[derive(Clone)]
pub struct ClientAuth {
    roots: Arc<RootCertStore>,
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth")
            .field("roots", &self.roots.len())
            .finish()
    }
}

impl ClientAuth {
    /// The CAs of a PEM bundle (one or more `CERTIFICATE` blocks).
    pub fn from_pem(pem: &[u8]) -> Result<Self, ClientAuthError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| ClientAuthError::Certificates(e.to_string()))?;
            roots
                .add(cert)
                .map_err(|e| ClientAuthError::Certificates(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(ClientAuthError::Certificates(
                "no CERTIFICATE block".to_owned(),
            ));
        }
        Ok(Self {
            roots: Arc::new(roots),
        })
    }

    /// The CAs of a PEM file.
    pub fn from_pem_file(path: &Path) -> Result<Self, ClientAuthError> {
        let pem = std::fs::read(path).map_err(|source| ClientAuthError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_pem(&pem)
    }

    /// The handshake's verifier: a presented certificate must chain to these CAs (with the
    /// client-auth usage); a client may present none, and `/validate` then refuses it.
    pub(crate) fn verifier(
        &self,
        provider: Arc<CryptoProvider>,
    ) -> Result<Arc<dyn ClientCertVerifier>, ClientAuthError> {
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&self.roots), provider)
            .allow_unauthenticated()
            .build()
            .map_err(|e| ClientAuthError::Verifier(e.to_string()))
    }
}

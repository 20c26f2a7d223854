//! The simulator's own TLS termination, so a node's certificate (and faults in it) can change
//! at run time, and client certificates reach the handlers once a node is configured.

use std::sync::{Arc, RwLock};

use rcgen::{CertificateParams, KeyPair, PKCS_ED25519};
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::SimError;
use crate::cut::Cut;

/// A certificate with the fingerprint `talosctl` would pin.
pub(crate) struct BootCertificate {
    pub(crate) certified: Arc<CertifiedKey>,
    pub(crate) der: CertificateDer<'static>,
    pub(crate) fingerprint: String,
}

impl BootCertificate {
    /// The certificate served with `key`, and its fingerprint.
    fn new(cert: &rcgen::Certificate, key: &KeyPair) -> Result<Self, SimError> {
        let der = cert.der().clone();
        let fingerprint =
            ichor_talos::tls::fingerprint_der(&der).expect("a certificate rcgen just made parses");
        Ok(Self {
            certified: Arc::new(CertifiedKey::new(vec![der.clone()], signing_key(key)?)),
            der,
            fingerprint,
        })
    }
}

/// A fresh self-signed Ed25519 certificate: Talos generates its maintenance certificate in
/// memory on every boot (talos-facts §2 "Maintenance mode", §8.2).
pub(crate) fn boot_certificate() -> Result<BootCertificate, SimError> {
    let key = KeyPair::generate_for(&PKCS_ED25519)?;
    let cert = CertificateParams::new(vec!["talos".to_owned()])?.self_signed(&key)?;
    BootCertificate::new(&cert, &key)
}

fn signing_key(key: &KeyPair) -> Result<Arc<dyn rustls::sign::SigningKey>, SimError> {
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    any_supported_type(&der).map_err(|e| SimError::TlsSetup(e.to_string()))
}

/// Serves whatever certificate is current: faults swap it while the node runs.
#[derive(Debug)]
pub(crate) struct Resolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl Resolver {
    pub(crate) fn new(certified: Arc<CertifiedKey>) -> Self {
        Self {
            current: RwLock::new(certified),
        }
    }

    pub(crate) fn set(&self, certified: Arc<CertifiedKey>) {
        if let Ok(mut current) = self.current.write() {
            *current = certified;
        }
    }

    /// The boot certificate, signing with an unrelated key: a server that does not hold the key
    /// of the certificate it presents.
    pub(crate) fn mismatched(der: &CertificateDer<'static>) -> Result<Arc<CertifiedKey>, SimError> {
        let other = KeyPair::generate_for(&PKCS_ED25519)?;
        Ok(Arc::new(CertifiedKey::new(
            vec![der.clone()],
            signing_key(&other)?,
        )))
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| Arc::clone(&c))
    }
}

/// TLS streams for tonic to serve.
pub(crate) type Incoming = tokio_stream::wrappers::ReceiverStream<
    Result<TlsStream<Cut<tokio::net::TcpStream>>, std::io::Error>,
>;

/// Who may connect: anyone (maintenance mode neither requests nor verifies client
/// certificates, talos-facts §2), or holders of a certificate from the OS CA (configured mode).
pub(crate) enum ClientAuth {
    /// No client certificate.
    None,
    /// A client certificate signed by one of these CAs (PEM) is required.
    Required(Vec<String>),
}

/// Accepts TCP on `listener`, terminates TLS, and yields the TLS streams; the task owns the
/// listener, so aborting it frees the address. Every connection stalls while `cut` is true
/// ([`Cut`]).
pub(crate) fn incoming(
    listener: TcpListener,
    resolver: Arc<Resolver>,
    client_auth: ClientAuth,
    cut: tokio::sync::watch::Receiver<bool>,
) -> Result<(Incoming, JoinHandle<()>), SimError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions");
    let builder = match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Required(cas) => {
            use rustls::pki_types::pem::PemObject as _;
            let mut roots = rustls::RootCertStore::empty();
            for pem in cas {
                for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    let cert = cert.map_err(|e| SimError::TlsSetup(format!("OS CA: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| SimError::TlsSetup(format!("OS CA: {e}")))?;
                }
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| SimError::TlsSetup(format!("client verifier: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let (tx, rx) = mpsc::channel(64);
    let accept = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let tcp = Cut::new(tcp, cut.clone());
            tokio::spawn(async move {
                // A failed handshake is the client's problem; the node keeps serving.
                if let Ok(stream) = acceptor.accept(tcp).await {
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
    });
    Ok((tokio_stream::wrappers::ReceiverStream::new(rx), accept))
}

/// A serving certificate for a configured node, signed by the OS CA of its config: the node's
/// addresses and hostname as SANs (talos-facts §2 "Normal mode").
pub(crate) fn node_certificate(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    ip: std::net::IpAddr,
) -> Result<BootCertificate, SimError> {
    let ca_key = ichor_render::bundle::os_ca_key("machine.ca.key", ca_key_pem)
        .map_err(|e| SimError::TlsSetup(e.to_string()))?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)
        .map_err(|e| SimError::TlsSetup(format!("OS CA: {e}")))?;
    let key = KeyPair::generate_for(&PKCS_ED25519)?;
    let mut params = CertificateParams::new(vec!["talos".to_owned()])?;
    params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer)?;
    BootCertificate::new(&cert, &key)
}

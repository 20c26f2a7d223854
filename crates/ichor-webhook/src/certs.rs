//! The webhook's own certificates: a CA kept in a Secret (created if missing, safely when
//! replicas race), a serving leaf per replica with the Service's DNS names and the replica's pod
//! IP, the CA injected into the webhook configuration's `caBundle`, and the leaf renewed when the
//! CA changes or the leaf nears expiry — without a restart.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The Secret key holding the CA certificate (PEM).
pub const CA_CERT_KEY: &str = "ca.crt";
/// The Secret key holding the CA key (PEM).
pub const CA_KEY_KEY: &str = "ca.key";

/// What went wrong with certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Generating or signing failed.
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The Kubernetes API failed.
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
    /// The Secret holds something that is not a usable CA.
    #[error("Secret {secret} does not hold a usable CA ({CA_CERT_KEY}, {CA_KEY_KEY}): {reason}")]
    InvalidSecret {
        /// The Secret.
        secret: String,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the key.
    #[error("cannot use the serving key: {0}")]
    Tls(String),
}

/// Where the webhook's certificates live and what they name.
#[derive(Debug, Clone)]
pub struct CertSettings {
    /// The namespace of the Secret and the Service.
    pub namespace: String,
    /// The Service name (the leaf's DNS SANs derive from it).
    pub service: String,
    /// This replica's pod IP (an IP SAN).
    pub pod_ip: IpAddr,
    /// The Secret holding the CA.
    pub secret: String,
    /// The ValidatingWebhookConfiguration whose `caBundle` gets the CA.
    pub webhook_configuration: String,
    /// How long a leaf is valid.
    pub leaf_validity: Duration,
    /// Renew the leaf when less than this is left.
    pub renew_before: Duration,
}

impl CertSettings {
    /// The DNS names of the Service.
    pub fn dns_names(&self) -> Vec<String> {
        let (service, namespace) = (&self.service, &self.namespace);
        vec![
            service.clone(),
            format!("{service}.{namespace}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ]
    }
}

/// The CA, as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct Ca {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Key, PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA (ECDSA P-256, ten years).
    pub fn generate() -> Result<Self, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "ichor-webhook-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = SystemTime::now().into();
        params.not_after = (SystemTime::now() + Duration::from_secs(10 * 365 * 24 * 3600)).into();
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn from_secret(secret: &Secret, name: &str) -> Result<Self, CertError> {
        let data = secret.data.clone().unwrap_or_default();
        let field = |key: &str| {
            data.get(key)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .ok_or_else(|| CertError::InvalidSecret {
                    secret: name.to_owned(),
                    reason: format!("{key} is missing"),
                })
        };
        let ca = Self {
            cert_pem: field(CA_CERT_KEY)?,
            key_pem: field(CA_KEY_KEY)?,
        };
        ca.issuer().map_err(|e| CertError::InvalidSecret {
            secret: name.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(ca)
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, rcgen::Error> {
        let key = KeyPair::from_pem(&self.key_pem)?;
        Issuer::from_ca_cert_pem(&self.cert_pem, key)
    }

    /// A serving leaf for this replica; returns it with its expiry.
    pub fn issue_leaf(
        &self,
        settings: &CertSettings,
    ) -> Result<(Arc<CertifiedKey>, SystemTime), CertError> {
        let issuer = self.issuer()?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(settings.dns_names())?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(settings.pod_ip));
        params.distinguished_name.push(
            DnType::CommonName,
            format!("{}.{}.svc", settings.service, settings.namespace),
        );
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let not_after = SystemTime::now() + settings.leaf_validity;
        params.not_before = (SystemTime::now() - Duration::from_secs(60)).into();
        params.not_after = not_after.into();
        let cert = params.signed_by(&key, &issuer)?;
        let der = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
            .map_err(|e| CertError::Tls(e.to_string()))?;
        let signing = any_supported_type(&der).map_err(|e| CertError::Tls(e.to_string()))?;
        let chain = vec![
            cert.der().clone(),
            CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
                .map_err(|e| CertError::Tls(e.to_string()))?,
        ];
        Ok((Arc::new(CertifiedKey::new(chain, signing)), not_after))
    }
}

/// Whether a Secret holds no CA at all: the empty Secret an installer (the Helm chart) creates
/// for the webhook to fill. A Secret with one of the two keys is not empty: it is invalid.
fn unfilled(secret: &Secret) -> bool {
    let data = secret.data.as_ref();
    let has = |key: &str| data.is_some_and(|d| d.get(key).is_some_and(|v| !v.0.is_empty()));
    !has(CA_CERT_KEY) && !has(CA_KEY_KEY)
}

fn ca_data(ca: &Ca) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        (
            CA_CERT_KEY.to_owned(),
            ByteString(ca.cert_pem.clone().into_bytes()),
        ),
        (
            CA_KEY_KEY.to_owned(),
            ByteString(ca.key_pem.clone().into_bytes()),
        ),
    ])
}

/// Reads the CA from its Secret, creating the Secret when it does not exist, or filling it when
/// it exists empty (as the Helm chart ships it). Two replicas may race: the loser's create
/// fails with `AlreadyExists`, or its fill with `Conflict` (the write is guarded by the
/// Secret's resourceVersion), and it reads the winner's.
pub async fn ensure_ca(client: &kube::Client, settings: &CertSettings) -> Result<Ca, CertError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    if let Some(secret) = secrets.get_opt(&settings.secret).await? {
        if !unfilled(&secret) {
            return Ca::from_secret(&secret, &settings.secret);
        }
        let ca = Ca::generate()?;
        let mut filled = secret;
        filled.data = Some(ca_data(&ca));
        return match secrets
            .replace(&settings.secret, &PostParams::default(), &filled)
            .await
        {
            Ok(_) => Ok(ca),
            Err(kube::Error::Api(status)) if status.is_conflict() => {
                let winner = secrets.get(&settings.secret).await?;
                Ca::from_secret(&winner, &settings.secret)
            }
            Err(error) => Err(error.into()),
        };
    }
    let ca = Ca::generate()?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(settings.secret.clone()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "ichor-webhook".to_owned(),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(ca_data(&ca)),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(ca),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let winner = secrets.get(&settings.secret).await?;
            Ca::from_secret(&winner, &settings.secret)
        }
        Err(error) => Err(error.into()),
    }
}

/// Puts the CA into the `caBundle` of every webhook of the configuration; writes only when it
/// differs, retrying on conflicts. Returns false when the configuration does not exist yet.
pub async fn inject_ca_bundle(
    client: &kube::Client,
    settings: &CertSettings,
    ca: &Ca,
) -> Result<bool, CertError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for _ in 0..8 {
        let Some(mut config) = api.get_opt(&settings.webhook_configuration).await? else {
            return Ok(false);
        };
        let bundle = ByteString(ca.cert_pem.clone().into_bytes());
        let mut changed = false;
        for webhook in config.webhooks.iter_mut().flatten() {
            if webhook.client_config.ca_bundle.as_ref() != Some(&bundle) {
                webhook.client_config.ca_bundle = Some(bundle.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(true);
        }
        match api
            .replace(
                &settings.webhook_configuration,
                &PostParams::default(),
                &config,
            )
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.is_conflict() => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(false)
}

/// Serves whichever leaf is current.
#[derive(Debug, Default)]
pub struct LeafResolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl LeafResolver {
    /// Installs a new leaf.
    pub fn set(&self, leaf: Arc<CertifiedKey>) {
        if let Ok(mut current) = self.current.write() {
            *current = Some(leaf);
        }
    }

    /// Whether a leaf is loaded.
    pub fn ready(&self) -> bool {
        self.current.read().is_ok_and(|c| c.is_some())
    }
}

impl ResolvesServerCert for LeafResolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().and_then(|c| c.clone())
    }
}

/// Whether a new serving leaf is due at `now`: the CA changed (or none was issued yet), or
/// the leaf expiring at `expires` has less than `renew_before` left.
pub fn leaf_due(
    ca_changed: bool,
    expires: SystemTime,
    renew_before: Duration,
    now: SystemTime,
) -> bool {
    let renew_at = expires
        .checked_sub(renew_before)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    ca_changed || now >= renew_at
}

/// Keeps the leaf and the `caBundle` current: on every tick, reads (or recreates) the CA;
/// issues a new leaf when the CA changed or the leaf nears expiry; injects the CA.
pub struct Refresher {
    client: kube::Client,
    settings: CertSettings,
    resolver: Arc<LeafResolver>,
    ca: Option<Ca>,
    expires: SystemTime,
}

impl Refresher {
    /// A refresher serving through `resolver`.
    pub fn new(client: kube::Client, settings: CertSettings, resolver: Arc<LeafResolver>) -> Self {
        Self {
            client,
            settings,
            resolver,
            ca: None,
            expires: SystemTime::UNIX_EPOCH,
        }
    }

    /// One round. Returns the CA in use.
    pub async fn refresh(&mut self) -> Result<Ca, CertError> {
        let ca = ensure_ca(&self.client, &self.settings).await?;
        let ca_changed = self.ca.as_ref() != Some(&ca);
        if leaf_due(
            ca_changed,
            self.expires,
            self.settings.renew_before,
            SystemTime::now(),
        ) {
            let (leaf, expires) = ca.issue_leaf(&self.settings)?;
            self.resolver.set(leaf);
            self.expires = expires;
            if self.ca.is_some() {
                tracing::info!("serving a new leaf certificate");
            }
            self.ca = Some(ca.clone());
        }
        if !inject_ca_bundle(&self.client, &self.settings, &ca).await? {
            tracing::warn!(
                configuration = %self.settings.webhook_configuration,
                "the webhook configuration does not exist yet; the CA is injected once it does"
            );
        }
        Ok(ca)
    }

    /// Refreshes every `interval` until the task is dropped; failures are logged and retried.
    pub async fn run(mut self, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            if let Err(error) = self.refresh().await {
                tracing::warn!(%error, "certificate refresh failed; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-01T00:00:00Z plus `hours`.
    fn at(hours: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600 + hours * 3600)
    }

    #[test]
    fn a_leaf_is_renewed_once_less_than_the_margin_is_left() {
        let (expires, margin) = (at(168), Duration::from_secs(56 * 3600));
        assert!(!leaf_due(false, expires, margin, at(0)));
        assert!(!leaf_due(false, expires, margin, at(111)));
        assert!(leaf_due(false, expires, margin, at(112)), "56 h left");
        assert!(leaf_due(false, expires, margin, at(200)), "expired");
    }

    #[test]
    fn a_changed_ca_or_no_leaf_yet_means_a_new_leaf_now() {
        let margin = Duration::from_secs(3600);
        assert!(leaf_due(true, at(168), margin, at(0)), "the CA changed");
        assert!(
            leaf_due(false, SystemTime::UNIX_EPOCH, margin, at(0)),
            "never issued"
        );
    }
}

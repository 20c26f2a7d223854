//! The Talos secrets bundle, in the `talosctl gen secrets` YAML format (talos-facts §4.6):
//! generate one, parse one (ours or talosctl's), validate it.
//!
//! Every type here holds secrets, so `Debug` prints a redacted form and no error message ever
//! includes a secret value.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use getrandom::SysRng;
use getrandom::rand_core::TryRng as _;
use p256::elliptic_curve::Generate as _;
use p256::pkcs8::{EncodePrivateKey as _, LineEnding};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ED25519,
};
use rsa::pkcs1::{DecodeRsaPrivateKey as _, EncodeRsaPrivateKey as _};
use serde::{Deserialize, Serialize};

use crate::Contract;

/// CA validity: 87600 hours (10 years), as Talos generates them.
const CA_VALIDITY_DAYS: i64 = 3650;

/// What is wrong with a secrets bundle. Messages name the field, never its value.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The YAML does not parse as a bundle.
    #[error("secrets bundle is not valid YAML in the talosctl gen secrets format: {0}")]
    Parse(String),
    /// A required field is empty.
    #[error("secrets bundle field {field} is missing")]
    Missing {
        /// The bundle field, e.g. `certs.os.key`.
        field: &'static str,
    },
    /// A field has the wrong shape.
    #[error("secrets bundle field {field} is invalid: {reason}")]
    Invalid {
        /// The bundle field.
        field: &'static str,
        /// What is wrong with it (never the value).
        reason: String,
    },
    /// Key or certificate generation failed.
    #[error("cannot generate {what}")]
    Generate {
        /// What was being generated.
        what: &'static str,
    },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> BundleError {
    BundleError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// PEM text carried base64-encoded in the YAML, as Talos writes `crt` and `key` values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Pem(pub String);

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<pem>")
    }
}

impl Serialize for Pem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(self.0.as_bytes()))
    }
}

impl<'de> Deserialize<'de> for Pem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| serde::de::Error::custom("a crt or key is not base64"))?;
        String::from_utf8(bytes)
            .map(Pem)
            .map_err(|_| serde::de::Error::custom("a crt or key is not PEM text"))
    }
}

/// A secret string: serialized as is, never printed.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A CA certificate and its private key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertKey {
    /// The certificate, PEM.
    pub crt: Pem,
    /// The private key, PEM (redacted from `Debug`).
    pub key: Pem,
}

/// A private key alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyOnly {
    /// The private key, PEM.
    pub key: Pem,
}

/// `cluster`: the cluster's identity and discovery secret.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSecrets {
    /// Base64 of 32 random bytes (URL-safe alphabet on contract 1.13, standard from 1.14).
    pub id: Secret,
    /// Base64 of 32 random bytes.
    pub secret: Secret,
}

/// `secrets`: Kubernetes bootstrap token and encryption secrets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secrets {
    /// `[a-z0-9]{6}.[a-z0-9]{16}`.
    #[serde(rename = "bootstraptoken")]
    pub bootstrap_token: Secret,
    /// Base64 of 32 random bytes.
    #[serde(rename = "secretboxencryptionsecret", default)]
    pub secretbox_encryption_secret: Secret,
    /// Only for contracts up to 1.2.
    #[serde(
        rename = "aescbcencryptionsecret",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub aescbc_encryption_secret: Option<Secret>,
}

/// `trustdinfo`: the machine token workers use with trustd.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustdInfo {
    /// `[a-z0-9]{6}.[a-z0-9]{16}`.
    pub token: Secret,
}

/// `certs`: the cluster's CAs and the service-account key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Certs {
    /// etcd CA (ECDSA P-256, `O=etcd`).
    pub etcd: CertKey,
    /// Kubernetes CA (ECDSA P-256, `O=kubernetes`).
    pub k8s: CertKey,
    /// Aggregation-layer CA (ECDSA P-256, `CN=front-proxy`).
    #[serde(rename = "k8saggregator")]
    pub k8s_aggregator: CertKey,
    /// Service-account signing key (RSA 4096, PKCS#1).
    #[serde(rename = "k8sserviceaccount")]
    pub k8s_service_account: KeyOnly,
    /// Talos OS CA (Ed25519, `O=talos`).
    pub os: CertKey,
}

/// A whole secrets bundle.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretsBundle {
    /// Cluster identity.
    pub cluster: ClusterSecrets,
    /// Tokens and encryption secrets.
    pub secrets: Secrets,
    /// The trustd token.
    #[serde(rename = "trustdinfo")]
    pub trustd_info: TrustdInfo,
    /// CAs and keys.
    pub certs: Certs,
}

fn random_bytes<const N: usize>() -> Result<[u8; N], BundleError> {
    let mut buf = [0u8; N];
    SysRng
        .try_fill_bytes(&mut buf)
        .map_err(|_| BundleError::Generate {
            what: "random bytes",
        })?;
    Ok(buf)
}

/// A token in the `[a-z0-9]{6}.[a-z0-9]{16}` format.
fn token() -> Result<Secret, BundleError> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let bytes = random_bytes::<22>()?;
    let chars: String = bytes
        .iter()
        // 256 % 36 != 0: the bias is under 2 % per symbol, as with the reference generator's
        // own modulo; the token is still 22 symbols of ~5.2 bits.
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect();
    Ok(Secret(format!("{}.{}", &chars[..6], &chars[6..])))
}

fn ca_params(organization: Option<&str>, common_name: Option<&str>) -> CertificateParams {
    let mut params = CertificateParams::default();
    // No default subject: Talos CAs carry exactly the O or CN given.
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    if let Some(o) = organization {
        params.distinguished_name.push(DnType::OrganizationName, o);
    }
    if let Some(cn) = common_name {
        params.distinguished_name.push(DnType::CommonName, cn);
    }
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = crate::pki::now();
    params.not_before = now;
    params.not_after = now + std::time::Duration::from_secs(CA_VALIDITY_DAYS as u64 * 86_400);
    params
}

/// An ECDSA P-256 CA: certificate, and the key as SEC1 `EC PRIVATE KEY` PEM.
fn ecdsa_ca(organization: Option<&str>, common_name: Option<&str>) -> Result<CertKey, BundleError> {
    let what = "an ECDSA CA";
    let secret = p256::SecretKey::try_generate_from_rng(&mut SysRng)
        .map_err(|_| BundleError::Generate { what })?;
    let pkcs8 = secret
        .to_pkcs8_der()
        .map_err(|_| BundleError::Generate { what })?;
    let key =
        KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8.as_bytes().into(), &PKCS_ECDSA_P256_SHA256)
            .map_err(|_| BundleError::Generate { what })?;
    let cert = ca_params(organization, common_name)
        .self_signed(&key)
        .map_err(|_| BundleError::Generate { what })?;
    let sec1 = secret
        .to_sec1_pem(LineEnding::LF)
        .map_err(|_| BundleError::Generate { what })?;
    Ok(CertKey {
        crt: Pem(cert.pem()),
        key: Pem(sec1.to_string()),
    })
}

/// The PKCS#8 v1 prefix of an Ed25519 private key, before its 32-byte seed (RFC 8410).
const ED25519_PKCS8_V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The PEM label Talos uses for Ed25519 keys (PKCS#8 DER under a non-standard label).
pub const ED25519_PEM_LABEL: &str = "ED25519 PRIVATE KEY";

/// An Ed25519 key: its rcgen key pair and its PKCS#8 v1 PEM under the Talos label.
pub(crate) fn ed25519_key() -> Result<(KeyPair, String), BundleError> {
    let what = "an Ed25519 key";
    let seed = random_bytes::<32>()?;
    let mut der = ED25519_PKCS8_V1_PREFIX.to_vec();
    der.extend_from_slice(&seed);
    let key = KeyPair::from_pkcs8_der_and_sign_algo(&der.as_slice().into(), &PKCS_ED25519)
        .map_err(|_| BundleError::Generate { what })?;
    let pem = pem::encode_config(
        &pem::Pem::new(ED25519_PEM_LABEL, der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    );
    Ok((key, pem))
}

impl SecretsBundle {
    /// Generates a new bundle for `contract`, as `talosctl gen secrets` would: an Ed25519 OS
    /// CA, ECDSA etcd, Kubernetes and aggregator CAs, an RSA-4096 service-account key, the
    /// cluster identity, tokens and encryption secret, all from the OS random source.
    ///
    /// ```
    /// use ichor_render::{Contract, SecretsBundle};
    ///
    /// let bundle = SecretsBundle::generate(Contract::V1_14)?;
    /// // The `talosctl gen secrets` format, which `talosctl gen config --with-secrets` reads.
    /// let yaml = bundle.to_yaml()?;
    /// assert_eq!(SecretsBundle::from_yaml(&yaml)?, bundle);
    /// // Debug output never shows a secret.
    /// assert!(!format!("{bundle:?}").contains(&bundle.trustd_info.token.0));
    /// # Ok::<(), ichor_render::BundleError>(())
    /// ```
    pub fn generate(contract: Contract) -> Result<Self, BundleError> {
        let id_alphabet = if contract < Contract::V1_14 {
            &URL_SAFE
        } else {
            &STANDARD
        };
        let (os_key, os_key_pem) = ed25519_key()?;
        let os_cert = ca_params(Some("talos"), None)
            .self_signed(&os_key)
            .map_err(|_| BundleError::Generate { what: "the OS CA" })?;
        let rsa = rsa::PrivateKey::new(&mut SysRng, 4096).map_err(|_| BundleError::Generate {
            what: "the service-account key",
        })?;
        let rsa_pem =
            rsa.to_pkcs1_pem(rsa::pkcs1::LineEnding::LF)
                .map_err(|_| BundleError::Generate {
                    what: "the service-account key",
                })?;
        Ok(Self {
            cluster: ClusterSecrets {
                id: Secret(id_alphabet.encode(random_bytes::<32>()?)),
                secret: Secret(STANDARD.encode(random_bytes::<32>()?)),
            },
            secrets: Secrets {
                bootstrap_token: token()?,
                secretbox_encryption_secret: Secret(STANDARD.encode(random_bytes::<32>()?)),
                aescbc_encryption_secret: None,
            },
            trustd_info: TrustdInfo { token: token()? },
            certs: Certs {
                etcd: ecdsa_ca(Some("etcd"), None)?,
                k8s: ecdsa_ca(Some("kubernetes"), None)?,
                k8s_aggregator: ecdsa_ca(None, Some("front-proxy"))?,
                k8s_service_account: KeyOnly {
                    key: Pem(rsa_pem.to_string()),
                },
                os: CertKey {
                    crt: Pem(os_cert.pem()),
                    key: Pem(os_key_pem),
                },
            },
        })
    }

    /// Parses and validates a bundle from its YAML (ours, or one `talosctl gen secrets` wrote).
    pub fn from_yaml(yaml: &str) -> Result<Self, BundleError> {
        let bundle: Self = serde_saphyr::from_str(yaml).map_err(|e| {
            // The parser's message may quote the document; keep only its first line, which
            // names the position and the expectation.
            BundleError::Parse(e.to_string().lines().next().unwrap_or_default().to_owned())
        })?;
        bundle.validate()?;
        Ok(bundle)
    }

    /// The bundle as YAML, in the `talosctl gen secrets` format.
    pub fn to_yaml(&self) -> Result<String, BundleError> {
        serde_saphyr::to_string(self).map_err(|e| BundleError::Parse(e.to_string()))
    }

    /// Checks every field: presence, token formats, base64 lengths, CAs that parse, are CAs and
    /// match their keys.
    pub fn validate(&self) -> Result<(), BundleError> {
        check_b64_32("cluster.id", &self.cluster.id.0, true)?;
        check_b64_32("cluster.secret", &self.cluster.secret.0, false)?;
        check_token("secrets.bootstraptoken", &self.secrets.bootstrap_token.0)?;
        check_b64_32(
            "secrets.secretboxencryptionsecret",
            &self.secrets.secretbox_encryption_secret.0,
            false,
        )?;
        check_token("trustdinfo.token", &self.trustd_info.token.0)?;
        check_ca("certs.etcd", &self.certs.etcd, KeyKind::EcdsaSec1)?;
        check_ca("certs.k8s", &self.certs.k8s, KeyKind::EcdsaSec1)?;
        check_ca(
            "certs.k8saggregator",
            &self.certs.k8s_aggregator,
            KeyKind::EcdsaSec1,
        )?;
        check_ca("certs.os", &self.certs.os, KeyKind::Ed25519)?;
        let sa = &self.certs.k8s_service_account.key.0;
        if sa.trim().is_empty() {
            return Err(BundleError::Missing {
                field: "certs.k8sserviceaccount.key",
            });
        }
        if rsa::PrivateKey::from_pkcs1_pem(sa).is_err()
            && p256::SecretKey::from_sec1_pem(sa).is_err()
        {
            return Err(invalid(
                "certs.k8sserviceaccount.key",
                "not an RSA (PKCS#1) or ECDSA (SEC1) private key",
            ));
        }
        Ok(())
    }

    /// The OS CA as an rcgen issuer, for signing node and client certificates.
    pub fn os_issuer(&self) -> Result<rcgen::Issuer<'static, KeyPair>, BundleError> {
        issuer("certs.os", &self.certs.os, KeyKind::Ed25519)
    }

    /// The Kubernetes CA as an rcgen issuer, for signing workload client certificates.
    pub fn k8s_issuer(&self) -> Result<rcgen::Issuer<'static, KeyPair>, BundleError> {
        issuer("certs.k8s", &self.certs.k8s, KeyKind::EcdsaSec1)
    }
}

fn check_b64_32(
    field: &'static str,
    value: &str,
    url_safe_allowed: bool,
) -> Result<(), BundleError> {
    if value.is_empty() {
        return Err(BundleError::Missing { field });
    }
    let decoded = STANDARD
        .decode(value)
        .or_else(|e| {
            if url_safe_allowed {
                URL_SAFE.decode(value)
            } else {
                Err(e)
            }
        })
        .map_err(|_| invalid(field, "not base64"))?;
    if decoded.len() != 32 {
        return Err(invalid(
            field,
            format!("decodes to {} bytes, expected 32", decoded.len()),
        ));
    }
    Ok(())
}

fn check_token(field: &'static str, value: &str) -> Result<(), BundleError> {
    if value.is_empty() {
        return Err(BundleError::Missing { field });
    }
    let ok = value.len() == 23
        && value.as_bytes()[6] == b'.'
        && value
            .bytes()
            .enumerate()
            .all(|(i, b)| i == 6 || b.is_ascii_lowercase() || b.is_ascii_digit());
    if !ok {
        return Err(invalid(
            field,
            "not in the [a-z0-9]{6}.[a-z0-9]{16} token format",
        ));
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum KeyKind {
    EcdsaSec1,
    Ed25519,
}

/// Reads an OS CA key in Talos's form (PKCS#8, under `ED25519 PRIVATE KEY` or `PRIVATE KEY`),
/// e.g. from an applied config's `machine.ca.key`; `field` names it in errors.
pub fn os_ca_key(field: &'static str, pem_text: &str) -> Result<KeyPair, BundleError> {
    key_pair(field, pem_text, KeyKind::Ed25519)
}

/// Reads a CA's key into an rcgen key pair (accepting PKCS#8 too, for bundles from elsewhere).
fn key_pair(field: &'static str, pem_text: &str, kind: KeyKind) -> Result<KeyPair, BundleError> {
    let parsed = pem::parse(pem_text).map_err(|_| invalid(field, "key is not PEM"))?;
    let result = match (kind, parsed.tag()) {
        (KeyKind::EcdsaSec1, "EC PRIVATE KEY") => p256::SecretKey::from_sec1_der(parsed.contents())
            .ok()
            .and_then(|k| k.to_pkcs8_der().ok())
            .and_then(|d| {
                KeyPair::from_pkcs8_der_and_sign_algo(&d.as_bytes().into(), &PKCS_ECDSA_P256_SHA256)
                    .ok()
            }),
        (KeyKind::EcdsaSec1, "PRIVATE KEY") => KeyPair::from_pkcs8_der_and_sign_algo(
            &parsed.contents().into(),
            &PKCS_ECDSA_P256_SHA256,
        )
        .ok(),
        (KeyKind::Ed25519, ED25519_PEM_LABEL | "PRIVATE KEY") => {
            KeyPair::from_pkcs8_der_and_sign_algo(&parsed.contents().into(), &PKCS_ED25519).ok()
        }
        (_, other) => {
            return Err(invalid(
                field,
                format!("unexpected key PEM label {other:?}"),
            ));
        }
    };
    result.ok_or_else(|| invalid(field, "key does not parse"))
}

fn check_ca(field: &'static str, pair: &CertKey, kind: KeyKind) -> Result<(), BundleError> {
    issuer(field, pair, kind).map(drop)
}

fn issuer(
    field: &'static str,
    pair: &CertKey,
    kind: KeyKind,
) -> Result<rcgen::Issuer<'static, KeyPair>, BundleError> {
    if pair.crt.0.trim().is_empty() {
        return Err(BundleError::Missing { field });
    }
    if pair.key.0.trim().is_empty() {
        return Err(BundleError::Missing { field });
    }
    let cert = pem::parse(&pair.crt.0).map_err(|_| invalid(field, "crt is not PEM"))?;
    let (_, x509) = x509_parser::parse_x509_certificate(cert.contents())
        .map_err(|_| invalid(field, "crt is not an X.509 certificate"))?;
    if !x509.is_ca() {
        return Err(invalid(field, "crt is not a CA certificate"));
    }
    let key = key_pair(field, &pair.key.0, kind)?;
    if x509.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(invalid(field, "key does not match crt"));
    }
    rcgen::Issuer::from_ca_cert_der(&cert.contents().to_vec().into(), key)
        .map_err(|_| invalid(field, "crt cannot be used as an issuer"))
}

//! Certificates for a test control plane: one CA that signs the apiserver's serving certificate
//! and every client certificate (the admin in `system:masters`, and any user a test asks for),
//! and a CA of its own for the client certificate the apiserver presents to webhooks.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::Error;

const CA_COMMON_NAME: &str = "ichor-testenv-ca";

/// A PEM certificate and its PEM (PKCS#8) private key.
#[derive(Clone)]
pub struct CertAndKey {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAndKey")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

fn ca_params(common_name: &str) -> Result<CertificateParams, Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// Mints a new self-signed CA.
pub fn new_ca() -> Result<CertAndKey, Error> {
    new_ca_named(CA_COMMON_NAME)
}

/// Mints a new self-signed CA named `common_name`.
pub fn new_ca_named(common_name: &str) -> Result<CertAndKey, Error> {
    let key = KeyPair::generate()?;
    let cert = ca_params(common_name)?.self_signed(&key)?;
    Ok(CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The issuer of a CA minted here (its subject read from its certificate).
fn issuer(ca: &CertAndKey) -> Result<Issuer<'static, KeyPair>, Error> {
    issuer_from_pem(ca)
}

/// Mints a serving certificate for loopback (`127.0.0.1`, `localhost`) signed by `ca`.
pub fn loopback_server_cert(ca: &CertAndKey, common_name: &str) -> Result<CertAndKey, Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params.signed_by(&key, &issuer(ca)?)?;
    Ok(CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Mints a client certificate for `user`, optionally in `group` (the Organization), signed by
/// `ca`. Kubernetes reads the user from the Common Name and groups from Organization entries.
pub fn client_cert(ca: &CertAndKey, user: &str, group: Option<&str>) -> Result<CertAndKey, Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    if let Some(group) = group {
        params
            .distinguished_name
            .push(DnType::OrganizationName, group);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, &issuer(ca)?)?;
    Ok(CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Mints a service-account signing key pair: `(private PEM, public PEM)`.
pub fn service_account_keys() -> Result<(String, String), Error> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

/// The issuer of a CA given as PEM: a certificate of any subject, and its private key as PKCS#8
/// (`PRIVATE KEY`, or Talos's `ED25519 PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`, as Talos writes
/// an ECDSA Kubernetes CA key). ECDSA P-256 and P-384, Ed25519 and RSA keys are read.
pub fn issuer_from_pem(ca: &CertAndKey) -> Result<Issuer<'static, KeyPair>, Error> {
    Ok(Issuer::from_ca_cert_pem(
        &ca.cert_pem,
        key_pair_from_pem(&ca.key_pem)?,
    )?)
}

/// Reads a private key from PEM: PKCS#8 under any label, or a SEC1 `EC PRIVATE KEY`.
pub fn key_pair_from_pem(pem: &str) -> Result<KeyPair, Error> {
    let (label, der) = pem_block(pem).ok_or(rcgen::Error::CouldNotParseKeyPair)?;
    let pkcs8 = if label == "EC PRIVATE KEY" {
        sec1_to_pkcs8(&der).ok_or(rcgen::Error::CouldNotParseKeyPair)?
    } else {
        der
    };
    Ok(KeyPair::try_from(pkcs8.as_slice())?)
}

/// The label and contents of the first PEM block of `text`.
fn pem_block(text: &str) -> Option<(String, Vec<u8>)> {
    use base64::Engine as _;
    let mut lines = text.lines().map(str::trim);
    let label = lines
        .find_map(|l| l.strip_prefix("-----BEGIN ")?.strip_suffix("-----"))?
        .to_owned();
    let end = format!("-----END {label}-----");
    let mut body = String::new();
    for line in lines {
        if line == end {
            let der = base64::engine::general_purpose::STANDARD
                .decode(body)
                .ok()?;
            return Some((label, der));
        }
        body.push_str(line);
    }
    None
}

/// A DER length.
fn der_length(len: usize) -> Vec<u8> {
    match len {
        0..0x80 => vec![len as u8],
        0x80..0x100 => vec![0x81, len as u8],
        _ => vec![0x82, (len >> 8) as u8, len as u8],
    }
}

/// A DER element: tag, length, contents.
fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend(der_length(contents.len()));
    out.extend_from_slice(contents);
    out
}

/// Wraps a SEC1 `ECPrivateKey` (RFC 5915) in a PKCS#8 `PrivateKeyInfo` (RFC 5208), naming the
/// curve from the private key's length (32 bytes: P-256, 48: P-384).
fn sec1_to_pkcs8(sec1: &[u8]) -> Option<Vec<u8>> {
    // ECPrivateKey ::= SEQUENCE { version INTEGER (1), privateKey OCTET STRING, ... }
    let (&tag, rest) = sec1.split_first()?;
    if tag != 0x30 {
        return None;
    }
    let rest = match rest.first()? {
        n if *n < 0x80 => &rest[1..],
        0x81 => rest.get(2..)?,
        0x82 => rest.get(3..)?,
        _ => return None,
    };
    // version: 02 01 01; then 04 <len> <key>.
    if rest.get(..3)? != [0x02, 0x01, 0x01] || *rest.get(3)? != 0x04 {
        return None;
    }
    const ID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    const P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    const P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
    let curve = match *rest.get(4)? {
        32 => P256,
        48 => P384,
        _ => return None,
    };
    let mut algorithm = der(0x06, ID_EC_PUBLIC_KEY);
    algorithm.extend(der(0x06, curve));
    let mut info = vec![0x02, 0x01, 0x00];
    info.extend(der(0x30, &algorithm));
    info.extend(der(0x04, sec1));
    Some(der(0x30, &info))
}

/// A serving certificate signed by `issuer` for `common_name`, valid for `names` (each an IP
/// address or a DNS name).
pub fn server_cert_signed_by(
    issuer: &Issuer<'_, KeyPair>,
    common_name: &str,
    names: &[String],
) -> Result<CertAndKey, Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    for name in names {
        params.subject_alt_names.push(match name.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(name.as_str().try_into()?),
        });
    }
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params.signed_by(&key, issuer)?;
    Ok(CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A client certificate signed by `issuer` for `user`, optionally in `group` (the
/// Organization).
pub fn client_cert_signed_by(
    issuer: &Issuer<'_, KeyPair>,
    user: &str,
    group: Option<&str>,
) -> Result<CertAndKey, Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    if let Some(group) = group {
        params
            .distinguished_name
            .push(DnType::OrganizationName, group);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, issuer)?;
    Ok(CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    fn pem(label: &str, der: &[u8]) -> String {
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    /// The `privateKey` OCTET STRING of a PKCS#8 `PrivateKeyInfo`: for ECDSA, the SEC1 key.
    fn pkcs8_inner(pkcs8: &[u8]) -> Vec<u8> {
        fn header(der: &[u8]) -> (usize, usize) {
            match der[1] {
                n if n < 0x80 => (2, n as usize),
                0x81 => (3, der[2] as usize),
                _ => (4, (der[2] as usize) << 8 | der[3] as usize),
            }
        }
        let (outer, _) = header(pkcs8);
        let mut rest = &pkcs8[outer..];
        for _ in 0..2 {
            let (h, len) = header(rest);
            rest = &rest[h + len..];
        }
        let (h, len) = header(rest);
        rest[h..h + len].to_vec()
    }

    fn ca_with_key(key: &KeyPair, key_pem: String) -> CertAndKey {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "kubernetes");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        CertAndKey {
            cert_pem: params.self_signed(key).expect("CA").pem(),
            key_pem,
        }
    }

    #[test]
    fn reads_a_sec1_p256_key_as_talos_writes_it() {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let sec1 = pkcs8_inner(&key.serialize_der());
        let read = key_pair_from_pem(&pem("EC PRIVATE KEY", &sec1)).expect("SEC1 key");
        assert_eq!(read.public_key_pem(), key.public_key_pem());

        let ca = ca_with_key(&key, pem("EC PRIVATE KEY", &sec1));
        let issuer = issuer_from_pem(&ca).expect("issuer");
        let leaf =
            server_cert_signed_by(&issuer, "kube-apiserver", &["127.0.31.1".into()]).expect("leaf");
        assert!(leaf.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn reads_an_ed25519_key_under_talos_label() {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key");
        let ca = ca_with_key(&key, pem("ED25519 PRIVATE KEY", &key.serialize_der()));
        let issuer = issuer_from_pem(&ca).expect("issuer");
        client_cert_signed_by(&issuer, "admin", Some("system:masters")).expect("client cert");
    }

    #[test]
    fn refuses_what_is_not_a_key() {
        assert!(key_pair_from_pem("not a key").is_err());
        assert!(
            key_pair_from_pem(&pem("EC PRIVATE KEY", &[0x30, 0x03, 0x02, 0x01, 0x00])).is_err()
        );
    }
}

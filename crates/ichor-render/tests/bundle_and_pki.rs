//! Secrets bundles and certificates: generated, parsed, validated, never printed.

use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use ichor_render::bundle::{BundleError, Pem, Secret};
use ichor_render::pki::{self, Role};
use ichor_render::{Contract, SecretsBundle};

/// One generated bundle per test process: RSA-4096 generation takes a moment.
fn bundle() -> &'static SecretsBundle {
    static BUNDLE: OnceLock<SecretsBundle> = OnceLock::new();
    BUNDLE.get_or_init(|| SecretsBundle::generate(Contract::V1_14).expect("generate"))
}

/// Every secret string in the bundle, for leak checks.
fn secret_values(b: &SecretsBundle) -> Vec<String> {
    vec![
        b.cluster.id.0.clone(),
        b.cluster.secret.0.clone(),
        b.secrets.bootstrap_token.0.clone(),
        b.secrets.secretbox_encryption_secret.0.clone(),
        b.trustd_info.token.0.clone(),
        b.certs.os.key.0.clone(),
        b.certs.etcd.key.0.clone(),
        b.certs.k8s.key.0.clone(),
        b.certs.k8s_aggregator.key.0.clone(),
        b.certs.k8s_service_account.key.0.clone(),
    ]
}

#[test]
fn a_generated_bundle_validates_and_round_trips_through_yaml() {
    let b = bundle();
    b.validate().expect("valid");
    let yaml = b.to_yaml().expect("yaml");
    for key in [
        "cluster:",
        "bootstraptoken:",
        "secretboxencryptionsecret:",
        "trustdinfo:",
        "k8saggregator:",
        "k8sserviceaccount:",
        "os:",
    ] {
        assert!(yaml.contains(key), "talosctl key {key} in:\n{yaml}");
    }
    let parsed = SecretsBundle::from_yaml(&yaml).expect("parse");
    assert_eq!(&parsed, b);
}

#[test]
fn keys_use_the_formats_talos_writes() {
    let b = bundle();
    assert!(
        b.certs
            .os
            .key
            .0
            .starts_with("-----BEGIN ED25519 PRIVATE KEY-----")
    );
    assert!(
        b.certs
            .etcd
            .key
            .0
            .starts_with("-----BEGIN EC PRIVATE KEY-----")
    );
    assert!(
        b.certs
            .k8s
            .key
            .0
            .starts_with("-----BEGIN EC PRIVATE KEY-----")
    );
    assert!(
        b.certs
            .k8s_service_account
            .key
            .0
            .starts_with("-----BEGIN RSA PRIVATE KEY-----")
    );
    let token = &b.secrets.bootstrap_token.0;
    assert_eq!(token.len(), 23);
    assert_eq!(&token[6..7], ".");
}

#[test]
fn contract_1_13_ids_use_the_url_safe_alphabet() {
    // Only the alphabet differs; validation accepts both.
    let b = SecretsBundle::generate(Contract::V1_13).expect("generate");
    b.validate().expect("valid");
    let decoded = base64::engine::general_purpose::URL_SAFE.decode(&b.cluster.id.0);
    assert_eq!(decoded.expect("url-safe base64").len(), 32);
}

#[test]
fn debug_output_never_contains_a_secret() {
    let b = bundle();
    let debug = format!("{b:?}");
    for secret in secret_values(b) {
        assert!(!debug.contains(&secret), "a secret leaked into Debug");
    }
    let issued = pki::client_certificate(b, "admin", Role::Admin, Duration::from_secs(3600))
        .expect("client certificate");
    assert!(!format!("{issued:?}").contains(&issued.key_pem));
}

#[test]
fn validation_names_the_field_and_never_the_value() {
    let mut b = bundle().clone();
    b.trustd_info.token = Secret("NOT-A-TOKEN-but-secret".into());
    let err = b.validate().expect_err("bad token");
    assert!(
        matches!(
            err,
            BundleError::Invalid {
                field: "trustdinfo.token",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.to_string().contains("NOT-A-TOKEN"), "{err}");

    let mut b = bundle().clone();
    b.certs.os.key = Pem(String::new());
    let err = b.validate().expect_err("missing key");
    assert!(err.to_string().contains("certs.os"), "{err}");

    let mut b = bundle().clone();
    b.certs.k8s.key = bundle().certs.etcd.key.clone();
    let err = b.validate().expect_err("swapped key");
    assert!(
        err.to_string()
            .contains("certs.k8s is invalid: key does not match crt"),
        "{err}"
    );

    let mut b = bundle().clone();
    b.cluster.secret = Secret("c2hvcnQ=".into());
    let err = b.validate().expect_err("short secret");
    assert!(err.to_string().contains("cluster.secret"), "{err}");
    assert!(!err.to_string().contains("c2hvcnQ="), "{err}");

    let err = SecretsBundle::from_yaml("cluster: [1, 2]").expect_err("not a bundle");
    assert!(
        err.to_string().contains("talosctl gen secrets format"),
        "{err}"
    );
}

/// A node's serving certificate: signed by the OS CA, its addresses and hostname as SANs,
/// exactly ServerAuth. (Its fingerprint is `ichor_talos::tls::fingerprint_der`'s, tested there.)
#[test]
fn node_certificates_name_the_node_and_serve_only() {
    let b = bundle();
    let issued = pki::node_server_certificate(
        b,
        "cp-1",
        &["192.168.10.21".parse().expect("ip")],
        Duration::from_secs(3600),
    )
    .expect("server certificate");
    let der = pem::parse(&issued.cert_pem)
        .expect("pem")
        .contents()
        .to_vec();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    let sans: Vec<String> = cert
        .subject_alternative_name()
        .expect("san")
        .expect("present")
        .value
        .general_names
        .iter()
        .map(|name| match name {
            x509_parser::extensions::GeneralName::IPAddress(ip) => format!("ip {ip:?}"),
            other => format!("{other}"),
        })
        .collect();
    assert_eq!(sans, ["ip [192, 168, 10, 21]", "DNSName(cp-1)"], "{sans:?}");
    let eku = cert
        .extended_key_usage()
        .expect("eku")
        .expect("present")
        .value;
    assert!(eku.server_auth && !eku.client_auth && eku.other.is_empty());
    let ca_der = pem::parse(&b.certs.os.crt.0)
        .expect("pem")
        .contents()
        .to_vec();
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("ca");
    assert_eq!(cert.issuer(), ca.subject());
    cert.verify_signature(Some(ca.public_key()))
        .expect("signed by the OS CA");
}

#[test]
fn client_certificates_carry_the_role_and_exactly_client_auth() {
    let b = bundle();
    let issued =
        pki::client_certificate(b, "ichor", Role::Admin, Duration::from_secs(365 * 86_400))
            .expect("client certificate");
    assert!(
        issued
            .key_pem
            .starts_with("-----BEGIN ED25519 PRIVATE KEY-----")
    );
    let der = pem::parse(&issued.cert_pem)
        .expect("pem")
        .contents()
        .to_vec();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    let orgs: Vec<_> = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .collect();
    assert_eq!(orgs, ["os:admin"]);
    let eku = cert
        .extended_key_usage()
        .expect("eku")
        .expect("present")
        .value;
    assert!(eku.client_auth && !eku.server_auth && eku.other.is_empty());
    let ca_der = pem::parse(&b.certs.os.crt.0)
        .expect("pem")
        .contents()
        .to_vec();
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("ca");
    assert_eq!(cert.issuer(), ca.subject());
    let days =
        (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()) / 86_400;
    assert!((364..=366).contains(&days), "one-year TTL: {days} days");
}

//! The webhook's own certificates, with two real webhook processes: started together against
//! a cluster without the CA Secret they make exactly one CA, both serve leaves that verify
//! against the one `caBundle` (with the pod IP as an IP SAN), and a rotated Secret is picked
//! up without a restart.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ichor_testenv::TestEnv;
use ichor_testenv::wait::eventually;
use ichor_webhook::certs::{CA_CERT_KEY, CA_KEY_KEY, Ca};
use ichor_webhook::{CERT_SECRET, WEBHOOK_CONFIGURATION};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};

/// How long the webhook and the apiserver get for what a test waits for.
const WAIT: Duration = Duration::from_secs(20);

/// Starts one webhook process; returns it and its port.
async fn webhook(kubeconfig: &std::path::Path, ns: &str) -> (Child, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ichor-webhook"))
        .args([
            "--namespace",
            ns,
            "--pod-ip",
            "127.0.0.1",
            "--port",
            "0",
            "--refresh-seconds",
            "1",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ichor-webhook");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the webhook starts")
        .expect("read")
        .expect("a line");
    let port = line
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (child, port)
}

/// A TLS handshake to 127.0.0.1:`port` trusting only `ca_pem` and checking the IP SAN, then
/// `GET /healthz`.
async fn healthy_with(ca_pem: &[u8], port: u16) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: webhook\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    tls.read_to_string(&mut reply)
        .await
        .map_err(|e| e.to_string())?;
    if reply.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(reply)
    }
}

async fn ca_bundle(env: &TestEnv) -> Option<Vec<u8>> {
    let config = Api::<ValidatingWebhookConfiguration>::all(env.client())
        .get(WEBHOOK_CONFIGURATION)
        .await
        .ok()?;
    config
        .webhooks?
        .first()?
        .client_config
        .ca_bundle
        .clone()
        .map(|b| b.0)
}

/// A private control plane with the webhook configuration registered (no CA yet), a namespace
/// named after `prefix`, and an admin kubeconfig file (kept while the folder lives).
async fn control_plane(prefix: &str) -> (TestEnv, String, tempfile::TempDir, std::path::PathBuf) {
    let env = TestEnv::private().await.expect("private control plane");
    let ns = env.namespace(prefix).await.expect("namespace");
    env.register_webhook(
        WEBHOOK_CONFIGURATION,
        "https://127.0.0.1:1/validate",
        "",
        Vec::<RuleWithOperations>::new(),
    )
    .await
    .expect("register");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, env.connection().kubeconfig()).expect("kubeconfig");
    (env, ns, dir, kubeconfig)
}

#[tokio::test]
async fn two_replicas_share_one_ca_and_follow_a_rotation() {
    let (env, ns, _dir, kubeconfig) = control_plane("certs").await;

    // Both start at once against a namespace without the Secret.
    let ((mut a, port_a), (mut b, port_b)) =
        tokio::join!(webhook(&kubeconfig, &ns), webhook(&kubeconfig, &ns));
    let secrets: Api<Secret> = Api::namespaced(env.client(), &ns);
    let secret = secrets.get(CERT_SECRET).await.expect("one Secret");
    let ca = secret.data.clone().expect("data")[CA_CERT_KEY].0.clone();
    eventually("the CA in the caBundle", WAIT, || async {
        ca_bundle(&env).await.as_ref() == Some(&ca)
    })
    .await;
    let bundle = ca_bundle(&env).await.expect("bundle");
    healthy_with(&bundle, port_a)
        .await
        .expect("replica A verifies");
    healthy_with(&bundle, port_b)
        .await
        .expect("replica B verifies");

    // Rotation: a new CA in the Secret reaches both leaves and the caBundle without restarts.
    let rotated = Ca::generate().expect("new CA");
    let mut next = secret.clone();
    let data = next.data.get_or_insert_default();
    data.insert(
        CA_CERT_KEY.into(),
        ByteString(rotated.cert_pem.clone().into_bytes()),
    );
    data.insert(
        CA_KEY_KEY.into(),
        ByteString(rotated.key_pem.clone().into_bytes()),
    );
    secrets
        .replace(CERT_SECRET, &PostParams::default(), &next)
        .await
        .expect("rotate");
    let new_ca = rotated.cert_pem.as_bytes().to_vec();
    eventually("both replicas serving from the new CA", WAIT, || async {
        healthy_with(&new_ca, port_a).await.is_ok() && healthy_with(&new_ca, port_b).await.is_ok()
    })
    .await;
    eventually("the new CA in the caBundle", WAIT, || async {
        ca_bundle(&env).await.as_ref() == Some(&new_ca)
    })
    .await;
    assert!(
        healthy_with(&ca, port_a).await.is_err(),
        "the old CA no longer verifies the served leaf"
    );
    assert!(a.try_wait().expect("status").is_none(), "no restart");
    assert!(b.try_wait().expect("status").is_none(), "no restart");
    let _ = a.kill().await;
    let _ = b.kill().await;
}

#[tokio::test]
async fn an_empty_secret_from_the_installer_is_filled_once() {
    let (env, ns, _dir, kubeconfig) = control_plane("certs-empty").await;
    // The Helm chart ships the Secret empty.
    let secrets: Api<Secret> = Api::namespaced(env.client(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(CERT_SECRET.into()),
                    ..Default::default()
                },
                type_: Some("Opaque".into()),
                ..Default::default()
            },
        )
        .await
        .expect("empty Secret");

    // Two replicas race to fill it: one CA wins, both serve from it.
    let ((mut a, port_a), (mut b, port_b)) =
        tokio::join!(webhook(&kubeconfig, &ns), webhook(&kubeconfig, &ns));
    let secret = secrets.get(CERT_SECRET).await.expect("the Secret");
    let ca = secret.data.clone().expect("filled")[CA_CERT_KEY].0.clone();
    assert!(!ca.is_empty());
    eventually("the CA in the caBundle", WAIT, || async {
        ca_bundle(&env).await.as_ref() == Some(&ca)
    })
    .await;
    healthy_with(&ca, port_a).await.expect("replica A verifies");
    healthy_with(&ca, port_b).await.expect("replica B verifies");
    let _ = a.kill().await;
    let _ = b.kill().await;
}

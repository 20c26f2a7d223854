//! What the webhook's tests share: AdmissionReview bodies as the apiserver sends them, and
//! Ichor's objects created in a test namespace as the manager would leave them.
// Each test uses part of it.
#![allow(dead_code)]

use ichor_api::common::Role;
use ichor_api::testing::MachineBuilder;
use ichor_testenv::TestEnv;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Ichor's objects of `kind` in the namespace `ns`, untyped (as the apiserver stores them).
pub fn api(env: &TestEnv, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(ichor_api::GROUP, ichor_api::VERSION, kind);
    Api::namespaced_with(env.client(), ns, &ApiResource::from_gvk(&gvk))
}

/// Creates `machine` with the removal finalizer the manager would add; `applied` records, as
/// the manager does after an apply, a config hash and (for a control plane) a healthy etcd
/// voter observed now (the webhook counts a voter never observed, or observed too long ago, as
/// unhealthy). Returns the stored object.
pub async fn create_machine(
    env: &TestEnv,
    ns: &str,
    machine: MachineBuilder,
    applied: bool,
) -> DynamicObject {
    let machines = api(env, ns, "TalosMachine");
    let machine = machine.removal_finalizer().build();
    let name = machine.metadata.name.clone().expect("a name");
    let object: DynamicObject =
        serde_json::from_value(serde_json::to_value(&machine).expect("json")).expect("machine");
    let created = machines
        .create(&PostParams::default(), &object)
        .await
        .expect("create machine");
    if !applied {
        return created;
    }
    let etcd = (machine.spec.role == Some(Role::ControlPlane)).then(
        || json!({"voter": true, "healthy": true, "observedAt": Timestamp::now().to_string()}),
    );
    machines
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"appliedConfigHash": "sha256:0123", "etcd": etcd}})),
        )
        .await
        .expect("status")
}

pub use ichor_api::testing::machine_review;

/// POSTs `body` to the webhook at 127.0.0.1:`port` over TLS, trusting only `ca_pem`, presenting
/// `client` as its client certificate (or none); the reply's JSON body, or why there is none
/// (a refused handshake shows as an error here, on the first read in TLS 1.3).
pub async fn post_review(
    port: u16,
    ca_pem: &str,
    client: Option<&ichor_testenv::CertAndKey>,
    body: &str,
) -> Result<Value, String> {
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("a certificate")).expect("a root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots);
    let config = match client {
        Some(client) => {
            let chain = CertificateDer::pem_slice_iter(client.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("the client certificate");
            let key =
                PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes()).expect("the client key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("a client identity")
        }
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let request = format!(
        "POST /validate HTTP/1.1\r\nhost: webhook\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = String::new();
    tls.read_to_string(&mut reply)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let (head, json) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP reply: {reply:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("HTTP error: {head}"));
    }
    serde_json::from_str(json).map_err(|e| format!("not JSON ({e}): {json}"))
}

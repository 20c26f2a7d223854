//! The manager's own credentials for each cluster (ADR 0022): short-lived client certificates
//! it mints for itself from the cluster's bundle and keeps in memory, one per cluster and use,
//! renewed at two thirds of their lifetime ([`crate::renewal`]) or when the cluster's identity,
//! bundle or endpoint changed. Nothing it publishes is used for its own calls.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use ichor_api::TalosCluster;
use ichor_render::SecretsBundle;
use ichor_talos::Credentials;
use kube::ResourceExt as _;

use super::Context;
use crate::renewal::{self, Renewal, Validity};
use crate::{Error, secrets};

/// What a cached credential is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Purpose {
    /// `os:admin` on the cluster's nodes.
    Talos,
    /// `system:masters` on the workload cluster's API.
    Workload,
}

/// What the manager holds for one purpose.
#[derive(Clone)]
enum Held {
    Talos(Credentials),
    Workload(kube::Client),
}

struct Entry {
    /// What it was minted for: the cluster's uid, bundle fingerprint and (workload) endpoint.
    identity: String,
    validity: Validity,
    held: Held,
}

/// The cache, keyed by cluster (`namespace/name`) and purpose.
#[derive(Default)]
pub(crate) struct Cache {
    entries: Mutex<BTreeMap<(String, Purpose), Entry>>,
}

impl Cache {
    /// What is held for `key` if it was minted for `identity` and is not due at `now`.
    fn get(
        &self,
        key: &(String, Purpose),
        identity: &str,
        lifetime: Duration,
        now: k8s_openapi::jiff::Timestamp,
    ) -> Option<Held> {
        let entries = self.entries.lock().ok()?;
        let entry = entries.get(key)?;
        let current = entry.identity == identity;
        match renewal::decide(Some(entry.validity), current, lifetime, now) {
            Renewal::Keep { .. } => Some(entry.held.clone()),
            Renewal::Mint(_) => None,
        }
    }

    fn put(&self, key: (String, Purpose), identity: String, validity: Validity, held: Held) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(
                key,
                Entry {
                    identity,
                    validity,
                    held,
                },
            );
        }
    }

    /// Forgets what is held for the cluster `namespace/name`.
    pub(crate) fn forget(&self, cluster: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|(c, _), _| c != cluster);
        }
    }
}

/// `namespace/name` of `cluster`.
pub(crate) fn cluster_key(cluster: &TalosCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// Mints `os:admin` credentials for the cluster's nodes, valid for `ttl`.
pub fn mint_node_credentials(bundle: &SecretsBundle, ttl: Duration) -> Result<Credentials, Error> {
    let issued = ichor_render::pki::client_certificate(
        bundle,
        "ichor-manager",
        ichor_render::pki::Role::Admin,
        ttl,
    )
    .map_err(|source| Error::Mint {
        what: "node credentials",
        source,
    })?;
    Ok(Credentials {
        ca_pem: bundle.certs.os.crt.0.clone(),
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem,
    })
}

/// The validity of the certificate `pem` just minted; its absence is a broken invariant.
fn validity_of(pem: &[u8]) -> Result<Validity, Error> {
    ichor_render::credentials::certificate_validity(pem)
        .and_then(|(from, to)| Validity::from_system(from, to))
        .ok_or_else(|| {
            Error::Invariant("a certificate just minted has no readable validity".into())
        })
}

/// A workload client from a kubeconfig the manager minted; drains see a PodDisruptionBudget's
/// 429 at once rather than have the client retry it with backoff, and an API that does not
/// answer is given up on after `workload::API_TIMEOUT`.
async fn workload_client(kubeconfig: kube::config::Kubeconfig) -> Option<kube::Client> {
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .ok()?;
    config.default_retry = false;
    // A workload API that does not answer is reported soon (ADR 0021).
    config.connect_timeout = Some(crate::workload::API_TIMEOUT);
    config.read_timeout = Some(crate::workload::API_TIMEOUT);
    kube::Client::try_from(config).ok()
}

impl Context {
    /// Forgets the manager's own credentials for `cluster` (torn down).
    pub fn forget_credentials(&self, cluster: &TalosCluster) {
        self.own.forget(&cluster_key(cluster));
    }

    /// The manager's own `os:admin` credentials for `cluster`'s nodes, minted from `bundle`
    /// and cached until two thirds of their lifetime have passed.
    pub fn node_credentials(
        &self,
        cluster: &TalosCluster,
        bundle: &SecretsBundle,
    ) -> Result<Credentials, Error> {
        let key = (cluster_key(cluster), Purpose::Talos);
        let identity = format!(
            "{}|{}",
            cluster.uid().unwrap_or_default(),
            secrets::fingerprint(bundle)
        );
        let lifetime = self.settings.own_credential_lifetime;
        if let Some(Held::Talos(held)) = self.own.get(&key, &identity, lifetime, self.clock.now()) {
            return Ok(held);
        }
        let minted = mint_node_credentials(bundle, lifetime)?;
        let validity = validity_of(minted.cert_pem.as_bytes())?;
        self.own
            .put(key, identity, validity, Held::Talos(minted.clone()));
        Ok(minted)
    }

    /// The manager's own client for `cluster`'s workload API (`spec.endpoint`), from a
    /// short-lived `system:masters` certificate minted from the cluster's bundle and cached
    /// until two thirds of its lifetime have passed; `None` while the bundle is unavailable.
    pub async fn workload_client(&self, cluster: &TalosCluster) -> Option<kube::Client> {
        let key = (cluster_key(cluster), Purpose::Workload);
        let recorded = cluster.status.as_ref()?.core.bundle_fingerprint.clone()?;
        let identity = format!(
            "{}|{recorded}|{}",
            cluster.uid().unwrap_or_default(),
            cluster.spec.endpoint
        );
        let lifetime = self.settings.own_credential_lifetime;
        if let Some(Held::Workload(held)) =
            self.own.get(&key, &identity, lifetime, self.clock.now())
        {
            return Some(held);
        }
        let bundle = secrets::bundle(self, cluster).await.ok()?.ok()?;
        let (name, endpoint) = (cluster.name_any(), cluster.spec.endpoint.clone());
        // Minting signs, and the YAML parser recurses deeply: a reconcile that gets here
        // through a rollout's turn is already deep in its worker's stack, where a debug build
        // overflowed it. Done on a blocking thread, from the bottom of its own stack.
        let (kubeconfig, validity) = tokio::task::spawn_blocking(move || {
            let minted = ichor_render::credentials::kubeconfig_for(
                &bundle,
                &name,
                &endpoint,
                "ichor-manager",
                lifetime,
            )
            .ok()?;
            let read = ichor_render::credentials::read_kubeconfig(&minted.file.0)?;
            let validity = Validity::from_system(read.not_before, read.not_after)?;
            let kubeconfig = kube::config::Kubeconfig::from_yaml(&minted.file.0).ok()?;
            Some((kubeconfig, validity))
        })
        .await
        .ok()??;
        let client = workload_client(kubeconfig).await?;
        self.own
            .put(key, identity, validity, Held::Workload(client.clone()));
        Some(client)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn bundle() -> SecretsBundle {
        SecretsBundle::generate(ichor_render::Contract::V1_14).expect("bundle")
    }

    fn ctx(lifetime: Duration) -> (Context, Arc<crate::TestClock>) {
        let settings = crate::Settings {
            own_credential_lifetime: lifetime,
            ..crate::Settings::default()
        };
        let clock = Arc::new(crate::TestClock::new(k8s_openapi::jiff::Timestamp::now()));
        let ctx =
            Context::nowhere(settings).with_clock(Arc::clone(&clock) as Arc<dyn crate::Clock>);
        (ctx, clock)
    }

    #[tokio::test]
    async fn node_credentials_are_cached_per_cluster_and_bundle_and_renewed_when_due() {
        let (ctx, clock) = ctx(Duration::from_secs(60));
        let cluster = TalosCluster::test("lab").build();
        let b = bundle();
        let first = ctx.node_credentials(&cluster, &b).expect("mint");
        let again = ctx.node_credentials(&cluster, &b).expect("cached");
        assert_eq!(first.cert_pem, again.cert_pem, "cached, not minted again");
        let other = TalosCluster::test("other").build();
        let theirs = ctx.node_credentials(&other, &b).expect("mint");
        assert_ne!(theirs.cert_pem, first.cert_pem, "one per cluster");
        let rebuilt = ctx.node_credentials(&cluster, &bundle()).expect("mint");
        assert_ne!(rebuilt.cert_pem, first.cert_pem, "another bundle");
        assert_eq!(rebuilt.ca_pem, bundle_ca(&ctx, &cluster));
        clock.advance(Duration::from_secs(41));
        let renewed = ctx.node_credentials(&cluster, &b).expect("renew");
        assert_ne!(renewed.cert_pem, rebuilt.cert_pem, "renewed at two thirds");
        ctx.own.forget(&cluster_key(&cluster));
        let forgotten = ctx.node_credentials(&cluster, &b).expect("mint");
        assert_ne!(forgotten.cert_pem, renewed.cert_pem);
    }

    fn bundle_ca(ctx: &Context, cluster: &TalosCluster) -> String {
        let key = (cluster_key(cluster), Purpose::Talos);
        let entries = ctx.own.entries.lock().expect("lock");
        match &entries.get(&key).expect("held").held {
            Held::Talos(c) => c.ca_pem.clone(),
            Held::Workload(_) => String::new(),
        }
    }
}

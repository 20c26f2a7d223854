//! The cluster's Secrets: the secrets bundle (given, or generated once with **no owner
//! reference**, so deleting the cluster never garbage-collects the CA keys, and never while a
//! node at the cluster's addresses already runs configured), and the Secrets Ichor publishes
//! (talosconfig, workload kubeconfig, applied configs), written only when Ichor created them
//! (ADR 0053). Secret contents are never logged.

use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex};

use std::net::{IpAddr, Ipv4Addr};

use ichor_api::names::{labels, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{BundleStep, Found, bundle_step};
use ichor_render::{BundleError, Contract, SecretsBundle};
use ichor_talos::discovery::{self, SweepConfig};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource, ResourceExt as _};

use crate::infra::shared::Shared;
use crate::{Context, Error};

/// The Secret keys, shared with the plugin.
pub use ichor_api::names::secrets::{BUNDLE_KEY, KUBECONFIG_KEY, TALOSCONFIG_KEY};

/// The name of the bundle Secret: the referenced one, or `<cluster>-secrets`.
pub fn bundle_secret_name(cluster: &TalosCluster) -> String {
    cluster.spec.secrets_ref.as_ref().map_or_else(
        || format!("{}-secrets", cluster.name_any()),
        |r| r.name.clone(),
    )
}

/// Why the bundle is not available.
#[derive(Debug, thiserror::Error)]
pub enum BundleUnavailable {
    /// The referenced Secret does not exist.
    #[error(
        "Secret {0} named by spec.secretsRef does not exist: create it with key {BUNDLE_KEY} (talosctl gen secrets), or remove secretsRef to have one generated"
    )]
    Missing(String),
    /// Not generated yet: the cluster controller generates it.
    #[error("Secret {0} with the cluster's secrets bundle is not generated yet")]
    NotYet(String),
    /// Gone although machines were configured with it: never regenerated.
    #[error(
        "Secret {0} with the cluster's secrets bundle is gone, and machines of this cluster were configured with it: a new bundle would carry another CA and cut them off, so none is generated and nothing is rendered or applied. Restore the Secret (key {BUNDLE_KEY}) from a backup; work resumes once it is back"
    )]
    Lost(String),
    /// Another bundle than the one the cluster was built with.
    #[error(
        "Secret {secret} holds a bundle whose OS CA ({found}) is not the one this cluster was built with ({recorded}): nothing is rendered or applied. Restore the original bundle under {BUNDLE_KEY}"
    )]
    Mismatch {
        /// The Secret.
        secret: String,
        /// The fingerprint the cluster recorded.
        recorded: String,
        /// The fingerprint found.
        found: String,
    },
    /// None exists, and a node at the cluster's endpoint or a machine's address already runs
    /// configured: a new bundle would carry another CA, so none is generated.
    #[error(
        "no Secret {secret} with the cluster's secrets bundle exists, yet a Talos node at {address} answers in configured mode (it asks for a client certificate): this cluster's nodes already run, and a new bundle would carry another CA than the one they trust, so none is generated and nothing is rendered or applied. Restore the bundle Secret {secret} (key {BUNDLE_KEY}) from a backup, or adopt the running cluster (a TalosCluster with spec.adopt and spec.secretsRef naming its bundle); if that node is no node of this cluster, correct spec.endpoint or the machines' addresses"
    )]
    NodesRun {
        /// The bundle Secret that would have been generated.
        secret: String,
        /// Where a configured node answered.
        address: String,
    },
    /// The Secret exists but its content is not a valid bundle.
    #[error("Secret {secret} does not hold a valid bundle under {BUNDLE_KEY}: {reason}")]
    Invalid {
        /// The Secret.
        secret: String,
        /// What is wrong.
        reason: String,
    },
}

impl BundleUnavailable {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Lost(_) => reasons::SECRETS_BUNDLE_LOST,
            Self::Mismatch { .. } => reasons::SECRETS_BUNDLE_MISMATCH,
            Self::NodesRun { .. } => reasons::SECRETS_BUNDLE_NOT_GENERATED,
            Self::Missing(_) | Self::NotYet(_) | Self::Invalid { .. } => {
                reasons::SECRETS_BUNDLE_UNAVAILABLE
            }
        }
    }
}

fn labelled(cluster: &TalosCluster, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: cluster.namespace(),
        labels: Some(BTreeMap::from([
            (labels::CLUSTER.to_owned(), cluster.name_any()),
            (
                labels::MANAGED_BY.to_owned(),
                labels::MANAGED_BY_VALUE.to_owned(),
            ),
        ])),
        ..Default::default()
    }
}

/// The fingerprint that identifies a bundle: `sha256:` and the hex digest of its OS CA
/// certificate's PEM (the same content hash as a config's, `ichor_render::config_hash`).
pub fn fingerprint(bundle: &SecretsBundle) -> String {
    ichor_render::config_hash(bundle.certs.os.crt.0.trim())
}

/// Reads the cluster's bundle for rendering and connecting; never generates one (only the
/// cluster controller does, in [`ensure`]). A bundle other than the one the cluster recorded
/// is refused.
pub async fn bundle(
    ctx: &Context,
    cluster: &TalosCluster,
) -> Result<Result<SecretsBundle, BundleUnavailable>, Error> {
    let recorded = recorded(cluster);
    // Absent: lost once the cluster recorded a bundle, not generated yet before.
    load(ctx, cluster, recorded.is_some()).await
}

/// The cluster controller's read: generates and stores the bundle when the cluster names none,
/// none exists, none of its machines was ever configured (`ever_configured`), and no node at
/// `addresses` answers in configured mode ([`configured_node`], probed with `sweep`'s
/// timeout or 5 s, whichever is longer);
/// otherwise as [`bundle`] (a missing bundle of a configured cluster is lost, never
/// regenerated).
pub async fn ensure(
    ctx: &Context,
    cluster: &TalosCluster,
    ever_configured: bool,
    (addresses, sweep): (&[String], SweepConfig),
) -> Result<Result<SecretsBundle, BundleUnavailable>, Error> {
    match load(ctx, cluster, ever_configured).await? {
        Err(BundleUnavailable::NotYet(name)) => {
            // A cluster re-created without its status (GitOps, a restored management
            // cluster) whose bundle Secret is gone looks new: its nodes say otherwise.
            // Probed with patience, as adoption probes: a sweep's short timeout is for many
            // silent addresses, and a busy node's handshake can outlast it.
            let patient = SweepConfig {
                timeout: sweep.timeout.max(PROBE_PATIENCE),
                ..sweep
            };
            if let Some(address) = configured_node(addresses, patient).await {
                return Ok(Err(BundleUnavailable::NodesRun {
                    secret: name,
                    address,
                }));
            }
            generate(&ctx.client, cluster, &name).await?;
            load(ctx, cluster, ever_configured).await
        }
        other => Ok(other),
    }
}

/// The least a probe for running nodes waits for each step (connect, handshake, answer).
pub(crate) const PROBE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Where a cluster's nodes would answer if they already ran: the host of `spec.endpoint` and
/// every address its machines name (`status.address`, `spec.endpoints`), each once.
pub fn node_addresses(cluster: &TalosCluster, machines: &[TalosMachine]) -> Vec<String> {
    let mut addresses: Vec<String> = Vec::new();
    let machine_addresses = machines.iter().flat_map(|m| {
        let recorded = m.status.as_ref().and_then(|s| s.inventory.address.clone());
        recorded.into_iter().chain(m.spec.endpoints.iter().cloned())
    });
    for address in endpoint_host(&cluster.spec.endpoint)
        .map(str::to_owned)
        .into_iter()
        .chain(machine_addresses)
    {
        if !address.is_empty() && !addresses.contains(&address) {
            addresses.push(address);
        }
    }
    addresses
}

/// The host of an `https://host[:port][/path]` endpoint (brackets of an IPv6 literal removed).
pub fn endpoint_host(endpoint: &str) -> Option<&str> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.0,
        None => authority.split(':').next()?,
    };
    (!host.is_empty()).then_some(host)
}

/// The first of `addresses` (IPv4 addresses or host names, without a port) where a Talos node
/// answers in configured mode: its TLS handshake asks for a client certificate (a node in
/// maintenance mode asks for none). Probed at once, on `sweep`'s port within its timeout; a
/// host name is resolved first (IPv4 only, as discovery probes).
pub async fn configured_node(addresses: &[String], sweep: SweepConfig) -> Option<String> {
    let probes = addresses.iter().map(|address| async move {
        let ips: Vec<Ipv4Addr> = match address.parse::<Ipv4Addr>() {
            Ok(ip) => vec![ip],
            Err(_) => {
                let lookup = tokio::net::lookup_host((address.as_str(), sweep.port));
                match tokio::time::timeout(sweep.timeout, lookup).await {
                    Ok(Ok(found)) => found
                        .filter_map(|a| match a.ip() {
                            IpAddr::V4(ip) => Some(ip),
                            IpAddr::V6(_) => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                }
            }
        };
        for ip in ips {
            let socket = std::net::SocketAddr::from((ip, sweep.port));
            if discovery::asks_for_client_certificate(socket, sweep.timeout).await == Some(true) {
                return Some(address.clone());
            }
        }
        None
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .next()
}

/// The fingerprint the cluster recorded, if it ever used a bundle.
fn recorded(cluster: &TalosCluster) -> Option<&str> {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.core.bundle_fingerprint.as_deref())
}

/// Reads and checks the bundle Secret (the planner's `bundle_step`).
async fn load(
    ctx: &Context,
    cluster: &TalosCluster,
    ever_configured: bool,
) -> Result<Result<SecretsBundle, BundleUnavailable>, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let name = bundle_secret_name(cluster);
    let existing = ctx.secrets.get(&secrets, &namespace, &name).await?;
    let parsed = match &existing {
        None => None,
        Some(secret) => {
            let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(BUNDLE_KEY)) else {
                return Ok(Err(BundleUnavailable::Invalid {
                    secret: name,
                    reason: format!("no key {BUNDLE_KEY}"),
                }));
            };
            let text = String::from_utf8_lossy(&bytes.0);
            match parse(&text) {
                Ok(bundle) => Some(bundle),
                Err(e) => {
                    return Ok(Err(BundleUnavailable::Invalid {
                        secret: name,
                        reason: e.to_string(),
                    }));
                }
            }
        }
    };
    let found_print = parsed.as_ref().map(fingerprint);
    let found = found_print.as_deref().map_or(Found::Nothing, Found::Bundle);
    Ok(
        match bundle_step(
            found,
            recorded(cluster),
            ever_configured,
            cluster.spec.secrets_ref.is_some(),
        ) {
            BundleStep::Use => parsed.ok_or(BundleUnavailable::NotYet(name)),
            BundleStep::Generate => Err(BundleUnavailable::NotYet(name)),
            BundleStep::Missing => Err(BundleUnavailable::Missing(name)),
            BundleStep::Lost => Err(BundleUnavailable::Lost(name)),
            BundleStep::Mismatch { recorded, found } => Err(BundleUnavailable::Mismatch {
                secret: name,
                recorded,
                found,
            }),
        },
    )
}

/// Bundles parsed and validated, by the hash of their YAML. Validation checks every key, the
/// RSA service-account key above all, and was about a fifth of the manager's CPU over an idle
/// fleet of 1000 machines (ADR 0040); the same bytes always make the same bundle, so each
/// bundle is checked once. Kept for at most [`PARSED_KEPT`] bundles, then started afresh.
static PARSED: LazyLock<Mutex<HashMap<String, SecretsBundle>>> = LazyLock::new(Mutex::default);

/// How many parsed bundles [`PARSED`] keeps (one per cluster is what it needs).
const PARSED_KEPT: usize = 256;

/// `text` as a valid bundle: [`SecretsBundle::from_yaml`] then `validate`, once per content.
fn parse(text: &str) -> Result<SecretsBundle, BundleError> {
    let key = ichor_render::config_hash(text);
    let parsed = || crate::controller::machine::lock(&PARSED);
    if let Some(bundle) = parsed().get(&key) {
        return Ok(bundle.clone());
    }
    let bundle = SecretsBundle::from_yaml(text).and_then(|b| b.validate().map(|()| b))?;
    let mut kept = parsed();
    if kept.len() >= PARSED_KEPT {
        kept.clear();
    }
    kept.insert(key, bundle.clone());
    Ok(bundle)
}

/// Generates a bundle and stores it under `name` (create-if-absent: a concurrent creator wins).
async fn generate(client: &kube::Client, cluster: &TalosCluster, name: &str) -> Result<(), Error> {
    let secrets: Api<Secret> =
        Api::namespaced(client.clone(), &cluster.namespace().unwrap_or_default());
    let contract =
        Contract::from_version(&cluster.spec.talos_version).map_err(|e| Error::Spec {
            field: "spec.talosVersion",
            problem: e.to_string(),
        })?;
    let generated = SecretsBundle::generate(contract).map_err(Error::Bundle)?;
    let yaml = generated.to_yaml().map_err(Error::Bundle)?;
    let secret = Secret {
        metadata: labelled(cluster, name),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            BUNDLE_KEY.to_owned(),
            ByteString(yaml.into_bytes()),
        )])),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Whether Ichor may write the Secret found under a name it publishes for an object (ADR 0053).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// No Secret has the name: Ichor creates it.
    Free,
    /// Ichor created it for this object: labelled [`labels::PUBLISHED`], the object its
    /// controller.
    Ours,
    /// Written for this object by an Ichor from before the label: the object its controller
    /// and Ichor's managed-by label on it. Ichor's; labelled at once.
    Earlier,
    /// Created by Ichor for an earlier object of this kind and name, since deleted (a machine
    /// replaced under its name, a cluster created again): labelled [`labels::PUBLISHED`], its
    /// controller that earlier object. Ichor's; taken over for this object, its content not read.
    Bequeathed,
    /// Anyone else's: never written.
    Foreign,
}

/// The object a Secret is published for, as its controller reference names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    /// Its kind, e.g. `TalosMachine`.
    pub kind: std::borrow::Cow<'static, str>,
    /// Its name.
    pub name: &'a str,
    /// Its uid (empty: it owns nothing).
    pub uid: &'a str,
}

/// Who holds `found` (the Secret under a name Ichor publishes for `owner`): only a Secret Ichor
/// labelled whose controller reference is that very object, or an earlier object of its kind
/// and name, is Ichor's.
pub fn holder(found: Option<&Secret>, owner: &Owner<'_>) -> Holder {
    let Some(secret) = found else {
        return Holder::Free;
    };
    let controller = secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let controlled = !owner.uid.is_empty() && controller.is_some_and(|o| o.uid == owner.uid);
    // An object of this kind and name with another uid is gone: names are unique while an
    // object lives, so the Secret was published for its predecessor.
    let predecessor = !owner.uid.is_empty()
        && controller.is_some_and(|o| {
            o.uid != owner.uid
                && o.kind == owner.kind
                && o.name == owner.name
                && o.api_version.starts_with(ICHOR_GROUP)
        });
    let label = |key: &str, value: &str| {
        secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .is_some_and(|v| v == value)
    };
    match (
        controlled,
        label(labels::PUBLISHED, "true"),
        label(labels::MANAGED_BY, labels::MANAGED_BY_VALUE),
    ) {
        (true, true, _) => Holder::Ours,
        (true, false, true) => Holder::Earlier,
        (false, true, _) if predecessor => Holder::Bequeathed,
        _ => Holder::Foreign,
    }
}

/// The API group of Ichor's kinds, as an owner reference's `apiVersion` begins.
const ICHOR_GROUP: &str = "ichor.maesh.dev/";

/// A name Ichor publishes under is held by a Secret it did not create: nothing is written
/// there, and the Secret is left as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Secret {secret} already exists and was not created by Ichor for {owner} (it lacks the {label} label or {owner}'s controller reference): Ichor writes only Secrets it created, so {what} is not published and that Secret is left as it is. Rename or delete that Secret (or, if it is meant to be the secrets bundle, name another in spec.secretsRef); {what} is published once the name is free",
    label = labels::PUBLISHED
)]
pub struct NameTaken {
    /// The Secret holding the name.
    pub secret: String,
    /// The object it would have been published for, `<Kind> <name>`.
    pub owner: String,
    /// What would have been published there, e.g. `the talosconfig`.
    pub what: &'static str,
}

impl NameTaken {
    fn of<K: Resource<DynamicType = ()>>(owner: &K, secret: &str, what: &'static str) -> Self {
        Self {
            secret: secret.to_owned(),
            owner: format!(
                "{} {}",
                K::kind(&()),
                owner.meta().name.as_deref().unwrap_or_default()
            ),
            what,
        }
    }
}

/// `owner` as [`holder`] judges a Secret for it.
fn owner_of<K: Resource<DynamicType = ()>>(owner: &K) -> Owner<'_> {
    Owner {
        kind: K::kind(&()),
        name: owner.meta().name.as_deref().unwrap_or_default(),
        uid: owner.meta().uid.as_deref().unwrap_or_default(),
    }
}

/// What Ichor publishes: a Secret named `name` for `owner` with `labels` (plus
/// [`labels::PUBLISHED`] and `owner` as its controller) and `data`.
fn published<K: Resource<DynamicType = ()>>(
    owner: &K,
    name: &str,
    mut labels: BTreeMap<String, String>,
    data: BTreeMap<String, ByteString>,
) -> Secret {
    labels.insert(labels::PUBLISHED.to_owned(), "true".to_owned());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: owner.meta().namespace.clone(),
            labels: Some(labels),
            owner_references: owner.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// Whether `existing` already is `wanted`: the same data, the same controller, and every label
/// wanted.
fn unchanged(existing: &Secret, wanted: &Secret) -> bool {
    let has_labels = wanted.metadata.labels.iter().flatten().all(|(k, v)| {
        existing
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .is_some_and(|x| x == v)
    });
    existing.data == wanted.data
        && existing.metadata.owner_references == wanted.metadata.owner_references
        && has_labels
}

/// Publishes `data` in Secret `name` for `owner` (`what` says what it is, for the refusal):
/// created when absent (by create, so a Secret someone else creates meanwhile is found, not
/// replaced), rewritten only when it is Ichor's ([`holder`]); a name held by another Secret is
/// [`NameTaken`], and that Secret is left as it is.
pub async fn publish<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    owner: &K,
    (name, what): (&str, &'static str),
    labels: BTreeMap<String, String>,
    data: BTreeMap<String, ByteString>,
) -> Result<Result<(), NameTaken>, Error> {
    let namespace = owner.meta().namespace.clone().unwrap_or_default();
    // What this writes is read again from the apiserver, not from what was kept of before.
    ctx.secrets.forget(&namespace, name);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut wanted = published(owner, name, labels, data);
    let mut found = secrets.get_opt(name).await?;
    // At most twice: a Secret created between the read and the create is read and judged.
    for _ in 0..2 {
        match (holder(found.as_ref(), &owner_of(owner)), found) {
            (Holder::Free, _) => match secrets.create(&PostParams::default(), &wanted).await {
                Ok(_) => return Ok(Ok(())),
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    found = secrets.get_opt(name).await?;
                }
                Err(error) => return Err(error.into()),
            },
            (Holder::Foreign, _) => return Ok(Err(NameTaken::of(owner, name, what))),
            (Holder::Ours | Holder::Earlier | Holder::Bequeathed, Some(existing)) => {
                if !unchanged(&existing, &wanted) {
                    wanted.metadata.resource_version = existing.metadata.resource_version;
                    secrets
                        .replace(name, &PostParams::default(), &wanted)
                        .await?;
                }
                return Ok(Ok(()));
            }
            (Holder::Ours | Holder::Earlier | Holder::Bequeathed, None) => {
                return Err(Error::Invariant(format!(
                    "Secret {name} judged without one"
                )));
            }
        }
    }
    Err(Error::Invariant(format!(
        "Secret {name} was created by another writer and then gone, twice"
    )))
}

/// Whether Ichor may publish under `name` for `owner`: the name is free or the Secret is
/// Ichor's (read only; [`publish`] writes).
pub async fn writable<K: Resource<DynamicType = ()>>(
    client: &kube::Client,
    owner: &K,
    (name, what): (&str, &'static str),
) -> Result<Result<(), NameTaken>, Error> {
    let namespace = owner.meta().namespace.clone().unwrap_or_default();
    let found = Api::<Secret>::namespaced(client.clone(), &namespace)
        .get_opt(name)
        .await?;
    Ok(match holder(found.as_ref(), &owner_of(owner)) {
        Holder::Foreign => Err(NameTaken::of(owner, name, what)),
        Holder::Free | Holder::Ours | Holder::Earlier | Holder::Bequeathed => Ok(()),
    })
}

/// Reads `key` of the Secret `name` Ichor published for `owner`: `None` when the name is free,
/// [`NameTaken`] when another Secret holds it (its content is never read). A Secret an earlier
/// Ichor wrote ([`Holder::Earlier`]) is labelled [`labels::PUBLISHED`] on the way.
pub async fn read_published<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    owner: &K,
    (name, what): (&str, &'static str),
    key: &str,
) -> Result<Result<Option<String>, NameTaken>, Error> {
    let namespace = owner.meta().namespace.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let found = ctx.secrets.get(&secrets, &namespace, name).await?;
    let secret = match (holder(found.as_ref(), &owner_of(owner)), found) {
        (Holder::Foreign, _) => return Ok(Err(NameTaken::of(owner, name, what))),
        // A predecessor's content is not this object's: nothing published yet.
        (Holder::Free | Holder::Bequeathed, _) | (_, None) => return Ok(Ok(None)),
        (Holder::Ours, Some(secret)) => secret,
        (Holder::Earlier, Some(mut secret)) => {
            ctx.secrets.forget(&namespace, name);
            secret
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(labels::PUBLISHED.to_owned(), "true".to_owned());
            secrets
                .replace(name, &PostParams::default(), &secret)
                .await?
        }
    };
    Ok(Ok(secret.data.and_then(|d| {
        d.get(key)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    })))
}

/// The label selector of the Secrets [`Cache`] watches (metadata only): Ichor's own
/// (`managed-by`) but the applied configs (one per machine, each read once), that is the
/// bundles Ichor generated and the Secrets it published for a cluster.
fn watched() -> String {
    format!(
        "{}={},!{}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::MACHINE
    )
}

/// Ichor's cluster Secrets as last read (the bundle, the published talosconfig and
/// kubeconfig), each kept while a metadata-only watch of the Secrets labelled `watched` says
/// it has not changed since: a reconcile reads such a Secret from the apiserver only when it
/// changed, was written, or is not Ichor's (a bundle `spec.secretsRef` names). No other Secret
/// is watched or kept, and a Secret's content never reaches the watch.
#[derive(Default)]
pub struct Cache {
    /// The metadata of the watched Secrets (their `resourceVersion`).
    versions: Shared<PartialObjectMeta<Secret>>,
    /// The Secrets read, by namespace and name.
    read: Mutex<HashMap<(String, String), Secret>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The kept Secrets' contents are never printed.
        f.debug_struct("Cache").finish_non_exhaustive()
    }
}

impl Cache {
    /// The watch of the Secrets' metadata, for the caller to run as long as the manager does;
    /// `None` once taken.
    pub fn watch(&self, client: &kube::Client) -> Option<futures::future::BoxFuture<'static, ()>> {
        let events = watcher(
            Api::<PartialObjectMeta<Secret>>::all(client.clone()),
            watcher::Config::default().labels(&watched()),
        )
        .modify(|secret| secret.metadata.managed_fields = None);
        self.versions.watch(events)
    }

    /// The Secret `name` of `namespace`: as kept when the watch says it did not change since,
    /// else read (and kept when the watch knows it).
    pub async fn get(
        &self,
        secrets: &Api<Secret>,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Secret>, kube::Error> {
        let key = (namespace.to_owned(), name.to_owned());
        let current = self.current_version(namespace, name);
        if let Some(version) = &current {
            let kept = self.kept().get(&key).cloned();
            if let Some(secret) =
                kept.filter(|s| s.metadata.resource_version.as_ref() == Some(version))
            {
                return Ok(Some(secret));
            }
        }
        let found = secrets.get_opt(name).await?;
        let mut kept = self.kept();
        match &found {
            Some(secret) if current.is_some() => {
                kept.insert(key, secret.clone());
            }
            _ => {
                kept.remove(&key);
            }
        }
        Ok(found)
    }

    /// Forgets what was kept of the Secret `name` of `namespace` (about to be written).
    pub fn forget(&self, namespace: &str, name: &str) {
        self.kept().remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// The `resourceVersion` the watch last saw of the Secret, if it watches it.
    fn current_version(&self, namespace: &str, name: &str) -> Option<String> {
        let store = self.versions.store();
        let key = kube::runtime::reflector::ObjectRef::new(name).within(namespace);
        store.get(&key)?.metadata.resource_version.clone()
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Secret>> {
        self.read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The `CredentialsPublished` condition (holds, reason, message) after a cluster's Secrets
/// were published, `taken` the names held by other Secrets.
pub fn published_condition(taken: &[NameTaken]) -> (bool, &'static str, String) {
    if taken.is_empty() {
        return (
            true,
            reasons::PUBLISHED,
            "the talosconfig (and, once bootstrapped, the kubeconfig) are published in Secrets Ichor created".into(),
        );
    }
    let messages: Vec<String> = taken.iter().map(ToString::to_string).collect();
    (false, reasons::SECRET_NAME_TAKEN, messages.join("; "))
}

/// The labels of a Secret published for `cluster`.
pub fn cluster_labels(cluster: &TalosCluster) -> BTreeMap<String, String> {
    labelled(cluster, "").labels.unwrap_or_default()
}

/// Whether a Secret exists.
pub async fn exists(client: &kube::Client, namespace: &str, name: &str) -> Result<bool, Error> {
    Ok(Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .is_some())
}

/// Reads one key of a Secret.
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<Option<String>, Error> {
    Ok(Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .and_then(|s| s.data)
        .and_then(|d| {
            d.get(key)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ichor_sim::{Hardware, SimNode};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn secret(labels: &[(&str, &str)], controller: Option<(&str, bool)>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("lab-kubeconfig".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                owner_references: controller.map(|(uid, controller)| {
                    vec![OwnerReference {
                        api_version: "ichor.maesh.dev/v1alpha1".into(),
                        kind: "TalosCluster".into(),
                        name: "lab".into(),
                        uid: uid.into(),
                        controller: Some(controller),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The cluster `lab` of uid `uid`, as a Secret's holder is judged for it.
    fn lab(uid: &str) -> Owner<'_> {
        Owner {
            kind: "TalosCluster".into(),
            name: "lab",
            uid,
        }
    }

    #[test]
    fn only_a_secret_labelled_published_and_controlled_by_the_owner_is_ours() {
        let published = (labels::PUBLISHED, "true");
        let managed = (labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
        assert_eq!(holder(None, &lab("u1")), Holder::Free);
        assert_eq!(
            holder(Some(&secret(&[published], Some(("u1", true)))), &lab("u1")),
            Holder::Ours
        );
        assert_eq!(
            holder(Some(&secret(&[managed], Some(("u1", true)))), &lab("u1")),
            Holder::Earlier,
            "written by an Ichor from before the label"
        );
        for (found, why) in [
            (secret(&[], None), "a user's Secret"),
            (
                secret(&[published, managed], None),
                "labels alone prove nothing",
            ),
            (
                secret(&[published], Some(("u1", false))),
                "an owner, not the controller",
            ),
            (
                secret(&[], Some(("u1", true))),
                "a controller reference without any Ichor label",
            ),
        ] {
            assert_eq!(holder(Some(&found), &lab("u1")), Holder::Foreign, "{why}");
        }
        assert_eq!(
            holder(Some(&secret(&[published], Some(("", true)))), &lab("")),
            Holder::Foreign,
            "an owner without a uid owns nothing"
        );
    }

    #[test]
    fn a_secret_published_for_a_predecessor_of_the_same_kind_and_name_passes_on() {
        let published = (labels::PUBLISHED, "true");
        let bequeathed = secret(&[published], Some(("u0", true)));
        assert_eq!(
            holder(Some(&bequeathed), &lab("u1")),
            Holder::Bequeathed,
            "published for a cluster of the same name, deleted and created again"
        );
        let elsewhere = Owner {
            name: "other",
            ..lab("u1")
        };
        let machine = Owner {
            kind: "TalosMachine".into(),
            ..lab("u1")
        };
        let mut other_group = bequeathed.clone();
        for o in other_group.metadata.owner_references.iter_mut().flatten() {
            o.api_version = "example.com/v1".into();
        }
        for (found, owner, why) in [
            (
                secret(
                    &[(labels::MANAGED_BY, labels::MANAGED_BY_VALUE)],
                    Some(("u0", true)),
                ),
                lab("u1"),
                "a predecessor's Secret from before the label",
            ),
            (
                bequeathed.clone(),
                elsewhere,
                "published for another cluster",
            ),
            (
                bequeathed,
                machine,
                "published for an object of another kind",
            ),
            (other_group, lab("u1"), "a controller of another API group"),
        ] {
            assert_eq!(holder(Some(&found), &owner), Holder::Foreign, "{why}");
        }
    }

    #[test]
    fn a_taken_name_is_named_in_the_condition() {
        assert_eq!(published_condition(&[]).1, reasons::PUBLISHED);
        let taken = NameTaken::of(
            &TalosCluster::test("lab").build(),
            "lab-kubeconfig",
            "the workload kubeconfig",
        );
        let (holds, reason, message) = published_condition(&[taken]);
        assert!(!holds);
        assert_eq!(reason, reasons::SECRET_NAME_TAKEN);
        assert!(
            message.starts_with("Secret lab-kubeconfig already exists")
                && message.contains("TalosCluster lab")
                && message.contains(labels::PUBLISHED),
            "{message}"
        );
    }

    #[test]
    fn node_addresses_are_the_endpoint_host_and_each_machine_address_once() {
        let cluster = TalosCluster::test("lab")
            .endpoint("https://10.0.0.10:6443")
            .build();
        let mut seen = TalosMachine::test("a").at("10.0.0.11").build();
        seen.status = Some(ichor_api::machine::TalosMachineStatus {
            inventory: ichor_api::machine::MachineInventory {
                address: Some("10.0.0.12".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let again = TalosMachine::test("b").at("10.0.0.10").build();
        assert_eq!(
            node_addresses(&cluster, &[seen, again]),
            ["10.0.0.10", "10.0.0.12", "10.0.0.11"]
        );
        for (endpoint, host) in [
            ("https://10.0.0.10:6443", Some("10.0.0.10")),
            ("https://api.lab.example/", Some("api.lab.example")),
            ("https://[fd00::1]:6443", Some("fd00::1")),
            ("https://", None),
        ] {
            assert_eq!(endpoint_host(endpoint), host, "{endpoint}");
        }
    }

    /// A rendered config for a simulated control plane with a bundle of its own.
    fn running_config() -> String {
        let bundle = SecretsBundle::generate(Contract::V1_14).expect("bundle");
        let spec = TalosCluster::test("lab").spec();
        ichor_render::render(&ichor_render::RenderInput::plain(
            "lab",
            &spec,
            ichor_api::common::Role::ControlPlane,
            &bundle,
        ))
        .expect("render")
        .yaml
    }

    #[tokio::test]
    async fn a_configured_node_is_found_and_a_maintenance_one_is_not() {
        let any = "127.0.0.1:0".parse().expect("address");
        let fresh = SimNode::start(any, "v1.14.1").await.expect("maintenance");
        let running =
            SimNode::start_configured(any, "v1.14.1", Hardware::vm(5301), &running_config())
                .await
                .expect("configured");
        let sweep = |node: &SimNode| SweepConfig {
            port: node.addr().port(),
            timeout: Duration::from_secs(2),
            ..SweepConfig::default()
        };
        let here = ["127.0.0.1".to_owned()];
        assert_eq!(configured_node(&here, sweep(&fresh)).await, None);
        assert_eq!(
            configured_node(&here, sweep(&running)).await.as_deref(),
            Some("127.0.0.1"),
            "a configured node asks for a client certificate"
        );
        let silent = ["127.0.0.1".to_owned(), "localhost".to_owned()];
        assert_eq!(
            configured_node(
                &silent[..1],
                SweepConfig {
                    port: 9,
                    ..sweep(&fresh)
                }
            )
            .await,
            None,
            "nothing answers"
        );
        assert_eq!(
            configured_node(&silent[1..], sweep(&running))
                .await
                .as_deref(),
            Some("localhost"),
            "a host name is resolved"
        );
        fresh.stop().await;
        running.stop().await;
    }

    #[test]
    fn a_bundle_is_parsed_once_per_content_and_a_bad_one_is_refused_each_time() {
        let yaml = SecretsBundle::generate(Contract::V1_14)
            .expect("bundle")
            .to_yaml()
            .expect("yaml");
        let first = parse(&yaml).expect("valid");
        assert!(
            PARSED
                .lock()
                .expect("lock")
                .contains_key(&ichor_render::config_hash(&yaml)),
            "kept after the first parse"
        );
        assert_eq!(parse(&yaml).expect("kept"), first);
        let broken = yaml.replacen("bootstraptoken:", "bootstraptoken: x\n  unused:", 1);
        assert!(parse(&broken).is_err());
        assert!(parse(&broken).is_err(), "a refusal is never kept");
        assert!(
            !PARSED
                .lock()
                .expect("lock")
                .contains_key(&ichor_render::config_hash(&broken))
        );
    }
}

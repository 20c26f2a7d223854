//! What a backup reads: the store's credentials Secret (and a restore's age identity), the
//! operation and the cluster as stored, a backup's record as the store holds it, the bundle,
//! the cluster's machines, and which control plane answers with a healthy etcd member. Nothing
//! here writes.

use std::sync::Arc;

use ichor_api::TalosCluster;
use ichor_api::TalosOperation;
use ichor_api::backup::{BackupRecord, BackupSpec, ObjectStoreSpec};
use ichor_api::names::{reasons, secrets as keys};
use ichor_talos::TalosClient;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::Api;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};

use super::plan::{self, Plan, Record, Schedule, Source};
use super::{Trigger, api};
use crate::backup_store::seal::Sealer;
use crate::backup_store::{self, StoreError, StoreSettings};
use crate::{Context, Error, Stop};

/// The cluster as stored (`None`: it is gone).
pub(super) async fn read_fresh(
    ctx: &Context,
    cluster: &TalosCluster,
) -> Result<Option<TalosCluster>, Error> {
    Ok(api(ctx, cluster).get_opt(&cluster.name_any()).await?)
}

/// A cluster's store, opened from its spec and credentials Secret.
pub struct Destination {
    /// The S3 client, for the bucket.
    pub store: Arc<dyn ObjectStore>,
    /// The settings it was built from.
    pub settings: StoreSettings,
    /// The key prefix.
    pub prefix: String,
}

/// Reads the credentials Secret `spec` names (in `namespace`) and opens the bucket. A missing
/// Secret or key is named.
pub async fn destination(
    client: &kube::Client,
    namespace: &str,
    spec: &ObjectStoreSpec,
) -> Result<Destination, Stop> {
    let secret_name = &spec.credentials_secret_ref.name;
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(secret_name)
        .await
        .map_err(|err| {
            Stop::new(
                reasons::STORE_UNREACHABLE,
                format!("cannot read Secret {secret_name}: {err}"),
            )
        })?
        .ok_or_else(|| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!("store.credentialsSecretRef: Secret {secret_name} does not exist in namespace {namespace}"),
            )
        })?;
    let value = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let required = |key: &str| {
        value(key).ok_or_else(|| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!(
                    "store.credentialsSecretRef: Secret {secret_name} has no key {key} (it needs {} and {})",
                    keys::ACCESS_KEY_ID_KEY,
                    keys::SECRET_ACCESS_KEY_KEY
                ),
            )
        })
    };
    let settings = StoreSettings {
        endpoint: spec.endpoint.clone(),
        region: spec.region.clone(),
        bucket: spec.bucket.clone(),
        access_key: required(keys::ACCESS_KEY_ID_KEY)?,
        secret_key: required(keys::SECRET_ACCESS_KEY_KEY)?,
        ca_pem: value(keys::STORE_CA_KEY),
    };
    let store = backup_store::s3_store(&settings).map_err(Stop::from)?;
    Ok(Destination {
        store,
        settings,
        prefix: spec.prefix.clone(),
    })
}

/// Reads the age identity of a restore's `encryption` Secret: only a restore reads one.
pub async fn age_identity(
    client: &kube::Client,
    namespace: &str,
    secret_name: &str,
) -> Result<String, Stop> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(secret_name)
        .await
        .map_err(|err| {
            Stop::new(
                reasons::KUBERNETES_API,
                format!("cannot read Secret {secret_name}: {err}"),
            )
        })?
        .ok_or_else(|| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!("encryption.keySecretRef: Secret {secret_name} does not exist in namespace {namespace}"),
            )
        })?;
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(keys::AGE_KEY))
        .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!(
                    "encryption.keySecretRef: Secret {secret_name} has no key {} (an age identity, AGE-SECRET-KEY-1…)",
                    keys::AGE_KEY
                ),
            )
        })
}

/// Whether a backup is still asked for, judged on the objects as stored.
pub(super) enum Asked {
    /// Take it.
    Take,
    /// The schedule: none is due (the last backup's status had not reached the copy the
    /// reconcile started from).
    NotDue,
    /// The operation: its backup was taken (its status names the key); this is its record, or
    /// why it cannot be read back.
    Taken(Result<BackupRecord, Stop>),
}

/// Whether `trigger` still asks for a backup of `cluster` (as stored). A reconcile may start
/// from a cached copy one write behind its own last one: a scheduled backup whose success is
/// not in that copy looks due again, and an operation whose step is not yet recorded done
/// looks as if it had not asked yet. Each would take a second backup, and with retention's
/// count the second can push out a backup whose key another operation reported.
pub(super) async fn asked(
    ctx: &Context,
    cluster: &TalosCluster,
    trigger: &Trigger,
) -> Result<Asked, Error> {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        // prepare() names it.
        return Ok(Asked::Take);
    };
    let operation = match trigger {
        Trigger::Scheduled => {
            let due = Schedule::parse(&spec.schedule).is_ok_and(|schedule| {
                plan::plan(&schedule, &plan::facts(ctx.clock.now(), cluster, spec)) == Plan::Run
            });
            return Ok(if due { Asked::Take } else { Asked::NotDue });
        }
        Trigger::Operation { operation, .. } => operation,
        Trigger::Rollout { max_age, .. } => {
            return Ok(
                match plan::fresh_success(cluster, ctx.clock.now(), *max_age) {
                    Some(record) => Asked::Taken(Ok(record)),
                    None => Asked::Take,
                },
            );
        }
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let stored = Api::<TalosOperation>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(operation)
        .await?;
    let Some(key) = stored.and_then(|o| o.status).and_then(|s| s.backup.key) else {
        return Ok(Asked::Take);
    };
    let last = cluster
        .status
        .as_ref()
        .and_then(|s| s.backup.record.as_ref())
        .and_then(|b| b.last_success.clone())
        .filter(|r| r.key == key);
    Ok(Asked::Taken(match last {
        Some(record) => Ok(record),
        // A later backup is the cluster's last: the record beside the object says the rest.
        None => recorded(ctx, &namespace, spec, &key, operation).await,
    }))
}

/// The record of the backup at `key`, which `operation` asked for, as the store holds it.
async fn recorded(
    ctx: &Context,
    namespace: &str,
    spec: &BackupSpec,
    key: &str,
    operation: &str,
) -> Result<BackupRecord, Stop> {
    let dest = destination(&ctx.client, namespace, &spec.store).await?;
    let record_key = plan::record_key(key);
    let read = match dest.store.get(&ObjectPath::from(record_key.as_str())).await {
        Ok(got) => got.bytes().await,
        Err(err) => Err(err),
    };
    let body = read.map_err(|err| Stop::from(StoreError::classify(&dest.settings.bucket, &err)))?;
    let unreadable = |why: String| {
        Stop::new(
            reasons::STORE_WRITE_REFUSED,
            format!(
                "{key} was taken for this operation, but its record {record_key} does not read as one: {why}"
            ),
        )
    };
    let record: Record = serde_json::from_slice(&body)
        .map_err(|err| unreadable(backup_store::printable(&err.to_string())))?;
    record
        .check_shape()
        .map_err(|problem| unreadable(problem.to_string()))?;
    let taken_at = record
        .taken_at
        .parse::<Timestamp>()
        .map_err(|err| unreadable(err.to_string()))?;
    Ok(BackupRecord {
        key: key.to_owned(),
        taken_at: Time(taken_at),
        size: i64::try_from(record.size).unwrap_or(i64::MAX),
        sha256: record.sha256,
        duration_seconds: 0.0,
        machine: record.machine,
        operation: Some(operation.to_owned()),
    })
}

/// What a backup needs before it streams: the store, the sealer, the bundle's fingerprint, and
/// a client to a healthy source.
pub(super) struct Prepared<'a> {
    /// The cluster's `spec.backup`.
    pub(super) spec: &'a BackupSpec,
    /// The store, opened.
    pub(super) dest: Destination,
    /// The age sealer, when the backup is encrypted.
    pub(super) sealer: Option<Sealer>,
    /// The fingerprint of the bundle the cluster runs on.
    pub(super) bundle_fingerprint: String,
    /// The control plane the snapshot comes from.
    pub(super) source: Source,
    /// A client to it.
    pub(super) client: TalosClient,
}

/// Opens the store (checking the bucket), the sealer and the bundle, and picks the source.
pub(super) async fn prepare<'a>(
    ctx: &Context,
    cluster: &'a TalosCluster,
    trigger: &Trigger,
) -> Result<Result<Prepared<'a>, Stop>, Error> {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return Ok(Err(Stop::new(
            reasons::BACKUP_NOT_CONFIGURED,
            "the cluster does not set spec.backup",
        )));
    };
    if let Some(message) = plan::plain_http_refusal(
        &spec.store.endpoint,
        spec.encryption.is_some(),
        spec.store.allow_plain_http,
    ) {
        return Ok(Err(Stop::new(reasons::STORE_PLAIN_HTTP_REFUSED, message)));
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let dest = match destination(&ctx.client, &namespace, &spec.store).await {
        Ok(dest) => dest,
        Err(failure) => return Ok(Err(failure)),
    };
    if let Err(error) =
        backup_store::check_bucket(dest.store.as_ref(), &dest.settings.bucket, &dest.prefix).await
    {
        return Ok(Err(Stop::from(error)));
    }
    let sealer = match plan::sealer(spec) {
        Ok(sealer) => sealer,
        Err(failure) => return Ok(Err(failure)),
    };
    let bundle = match crate::secrets::bundle(ctx, cluster).await? {
        Ok(bundle) => bundle,
        Err(unavailable) => {
            return Ok(Err(Stop::new(
                unavailable.reason(),
                unavailable.to_string(),
            )));
        }
    };
    let credentials = ctx.node_credentials(cluster, &bundle)?;
    let machines = crate::cluster_machines(ctx, cluster).await?;
    let candidates = plan::candidates(&machines, trigger);
    let Some((source, client)) = first_healthy(&plan::sources(&candidates), &credentials).await
    else {
        return Ok(Err(Stop::new(
            reasons::NO_SNAPSHOT_SOURCE,
            "no Ready control plane that is not being removed answers with a healthy etcd member",
        )));
    };
    Ok(Ok(Prepared {
        spec,
        dest,
        sealer,
        bundle_fingerprint: crate::secrets::fingerprint(&bundle),
        source: source.clone(),
        client,
    }))
}

/// The first source, in order, whose etcd member answers healthy, and a client to it.
async fn first_healthy<'a>(
    sources: &[&'a Source],
    credentials: &ichor_talos::Credentials,
) -> Option<(&'a Source, TalosClient)> {
    for source in sources {
        let Some(client) = crate::connect(&source.address, credentials).await else {
            continue;
        };
        match client.etcd_status().await {
            Ok(status) if !status.learner && status.errors.is_empty() => {
                return Some((source, client));
            }
            _ => {}
        }
    }
    None
}

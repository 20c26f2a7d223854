//! What the restore reads: the backup `spec.restoreFrom` names (or the newest taken with this
//! cluster's bundle), its record beside it, the identity that opens it, and the object read
//! through (hashed as stored, decrypted when sealed, checked as an etcd snapshot). Nothing here
//! writes: the upload to the bootstrap node (`act`) reads through the same way.

use std::io::Read as _;
use std::sync::Arc;

use age::x25519::Identity;
use bytes::Bytes;
use futures::StreamExt as _;
use ichor_api::TalosCluster;
use ichor_api::backup::{RestoreSpec, RestoreStatus};
use ichor_api::names::reasons;
use ichor_talos::snapshot::SnapshotCheck;
use kube::ResourceExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use tokio::sync::mpsc;

use super::plan::{checked, plain_http};
use crate::backup_store::StoreError;
use crate::controller::backup::plan::{self, Digest, Hasher, Record};
use crate::controller::backup::{self, Destination};
use crate::{Context, Stop};

/// Plaintext chunks queued between the store and their reader.
pub(super) const CHUNKS_QUEUED: usize = 64;
/// How much of a decrypted stream is read at a time.
const READ: usize = 64 * 1024;

/// The backup to restore, as the store, its key and its record.
struct Found {
    dest: Destination,
    key: String,
    record: Record,
}

/// Finds the backup `spec` names (or the newest taken with this bundle) and reads its record.
async fn find(
    ctx: &Context,
    cluster: &TalosCluster,
    spec: &RestoreSpec,
    bundle_fingerprint: &str,
) -> Result<Found, Stop> {
    if let Some(message) = plan::plain_http_refusal(
        &spec.store.endpoint,
        spec.encryption.is_some(),
        spec.store.allow_plain_http,
    ) {
        return Err(plain_http(message));
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let dest = backup::destination(&ctx.client, &namespace, &spec.store).await?;
    let store = Arc::clone(&dest.store);
    let bucket = dest.settings.bucket.clone();
    let key = match &spec.key {
        Some(key) => key.clone(),
        None => {
            latest(
                store.as_ref(),
                &bucket,
                &spec.store.prefix,
                bundle_fingerprint,
            )
            .await?
        }
    };
    let record = read_record(store.as_ref(), &bucket, &key).await?;
    // Over plain http, an unencrypted backup would be read in the clear: refused like the
    // spec would be, whatever the restore expected.
    if let Some(message) = plan::plain_http_refusal(
        &spec.store.endpoint,
        record.encrypted,
        spec.store.allow_plain_http,
    ) {
        return Err(plain_http(format!("{key} is not encrypted: {message}")));
    }
    Ok(Found { dest, key, record })
}

/// The newest backup under `prefix` whose record names `bundle`.
async fn latest(
    store: &dyn ObjectStore,
    bucket: &str,
    prefix: &str,
    bundle: &str,
) -> Result<String, Stop> {
    use futures::TryStreamExt as _;
    let prefix_path = ObjectPath::from(prefix.trim_matches('/'));
    let keys: Vec<String> = store
        .list(Some(&prefix_path))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .map_err(|err| Stop::from(StoreError::classify(bucket, &err)))?;
    let mut records = Vec::new();
    for key in keys.into_iter().filter(|k| plan::is_backup_key(k)) {
        if let Ok(record) = read_record(store, bucket, &key).await {
            records.push((key, record));
        }
    }
    plan::latest_for_bundle(&records, bundle)
        .map(|(key, _)| key.clone())
        .ok_or_else(|| Stop {
            reason: reasons::RESTORE_OBJECT_MISSING,
            message: format!(
                "no complete backup under prefix {prefix:?} of bucket {bucket} was taken with the bundle spec.secretsRef holds ({bundle}); name one in restoreFrom.key"
            ),
        })
}

/// Reads the record beside `key`: a backup without one is missing, or incomplete.
pub(super) async fn read_record(
    store: &dyn ObjectStore,
    bucket: &str,
    key: &str,
) -> Result<Record, Stop> {
    let missing = |what: &str| Stop {
        reason: reasons::RESTORE_OBJECT_MISSING,
        message: format!("restoreFrom: {what}"),
    };
    if let Err(err) = store.head(&ObjectPath::from(key)).await {
        return Err(match err {
            object_store::Error::NotFound { .. } => {
                missing(&format!("bucket {bucket} has no object {key}"))
            }
            other => Stop::from(StoreError::classify(bucket, &other)),
        });
    }
    let record_key = plan::record_key(key);
    let body = match store.get(&ObjectPath::from(record_key.as_str())).await {
        Ok(got) => got.bytes().await,
        Err(err) => Err(err),
    };
    let body = body.map_err(|err| match err {
        object_store::Error::NotFound { .. } => missing(&format!(
            "{key} has no record beside it ({record_key}): the backup did not complete"
        )),
        other => Stop::from(StoreError::classify(bucket, &other)),
    })?;
    let record: Record = serde_json::from_slice(&body).map_err(|err| {
        missing(&format!(
            "the record {record_key} is not a backup record: {}",
            crate::backup_store::printable(&err.to_string())
        ))
    })?;
    record.check_shape().map_err(|why| {
        missing(&format!(
            "the record {record_key} is not a backup record: {why}"
        ))
    })?;
    Ok(record)
}

/// The identity to open `record`'s backup with, when it is sealed.
pub(super) async fn identity_for(
    ctx: &Context,
    cluster: &TalosCluster,
    spec: &RestoreSpec,
    key: &str,
    record: &Record,
) -> Result<Option<Identity>, Stop> {
    if !record.encrypted {
        return Ok(None);
    }
    let wrong = |message: String| Stop {
        reason: reasons::RESTORE_KEY_WRONG,
        message,
    };
    let Some(encryption) = spec.encryption.as_ref() else {
        return Err(wrong(format!(
            "{key} is encrypted with age: set restoreFrom.encryption.keySecretRef to the Secret holding its identity"
        )));
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let text =
        backup::age_identity(&ctx.client, &namespace, &encryption.key_secret_ref.name).await?;
    crate::backup_store::seal::identity(&text)
        .map(Some)
        .map_err(|message| wrong(format!("restoreFrom.encryption: {message}")))
}

/// Checks the backup `spec` names, before any bootstrap: present with its record, taken with
/// this bundle, decryptable, whole, and the snapshot the record describes.
pub(super) async fn check(
    ctx: &Context,
    cluster: &TalosCluster,
    spec: &RestoreSpec,
    bundle_fingerprint: &str,
) -> Result<RestoreStatus, Stop> {
    let found = find(ctx, cluster, spec, bundle_fingerprint).await?;
    if found.record.bundle_fingerprint != bundle_fingerprint {
        return Err(Stop {
            reason: reasons::RESTORE_BUNDLE_MISMATCH,
            message: format!(
                "{} was taken with the bundle whose OS CA is {}, and spec.secretsRef holds {}: restore with the original bundle",
                found.key, found.record.bundle_fingerprint, bundle_fingerprint
            ),
        });
    }
    let identity = identity_for(ctx, cluster, spec, &found.key, &found.record).await?;
    let (object, snapshot) = read_through(&found.dest, &found.key, identity, None).await?;
    let digests = checked(&found.key, &found.record, object, snapshot)?;
    let vouched = found.record.vouched(&digests);
    Ok(RestoreStatus {
        size: i64::try_from(vouched.size).unwrap_or(i64::MAX),
        sha256: vouched.sha256.clone(),
        key: found.key,
        checked_at: ctx.now(),
        completed_at: None,
    })
}

/// The bytes of object `key`, as they arrive.
async fn open(
    dest: &Destination,
    key: &str,
) -> Result<futures::stream::BoxStream<'static, object_store::Result<Bytes>>, Stop> {
    let bucket = dest.settings.bucket.as_str();
    let got = dest
        .store
        .get(&ObjectPath::from(key))
        .await
        .map_err(|err| match err {
            object_store::Error::NotFound { .. } => Stop {
                reason: reasons::RESTORE_OBJECT_MISSING,
                message: format!("restoreFrom: bucket {bucket} has no object {key}"),
            },
            other => Stop::from(StoreError::classify(bucket, &other)),
        })?;
    Ok(got.into_stream())
}

/// Reads backup `key` through: hashes the object as stored, decrypts it with `identity` when
/// given, checks the plaintext as an etcd snapshot (size, SHA-256 trailer) and sends it to
/// `out` when given. Returns the object's digest, and the snapshot's or why it is none.
pub(super) async fn read_through(
    dest: &Destination,
    key: &str,
    identity: Option<Identity>,
    out: Option<mpsc::Sender<Vec<u8>>>,
) -> Result<(Digest, Result<Digest, Stop>), Stop> {
    let bucket = dest.settings.bucket.as_str();
    let mut raw = open(dest, key).await?;
    let (plain_tx, mut plain_rx) = mpsc::channel::<Vec<u8>>(CHUNKS_QUEUED);
    let producer = async move {
        let mut object = Hasher::default();
        match identity {
            None => {
                while let Some(chunk) = raw.next().await {
                    let chunk =
                        chunk.map_err(|err| Stop::from(StoreError::classify(bucket, &err)))?;
                    object.update(&chunk);
                    if plain_tx.send(chunk.to_vec()).await.is_err() {
                        break;
                    }
                }
            }
            Some(identity) => {
                decrypt(bucket, key, &mut raw, &mut object, identity, plain_tx).await?;
            }
        }
        Ok::<_, Stop>(object.finish())
    };
    // The consumer owns the receiver, so a consumer that stops early stops the producer too.
    let consumer = async move {
        let mut check = SnapshotCheck::default();
        while let Some(chunk) = plain_rx.recv().await {
            check.update(&chunk);
            if let Some(out) = out.as_ref()
                && out.send(chunk).await.is_err()
            {
                return Err(Stop {
                    reason: reasons::TALOS_API,
                    message: "the bootstrap node stopped taking the snapshot".to_owned(),
                });
            }
        }
        drop(out);
        Ok(check
            .finish()
            .map(|summary| Digest {
                size: summary.size,
                sha256: summary.sha256,
            })
            .map_err(|problem| Stop {
                reason: reasons::RESTORE_CHECKSUM_MISMATCH,
                message: format!("{key} is not a whole etcd snapshot: {problem}"),
            }))
    };
    let (object, snapshot) = tokio::join!(producer, consumer);
    Ok((object?, snapshot?))
}

/// Decrypts the age stream `raw` on a blocking thread (age reads synchronously) into `out`.
async fn decrypt(
    bucket: &str,
    key: &str,
    raw: &mut futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    object: &mut Hasher,
    identity: Identity,
    out: mpsc::Sender<Vec<u8>>,
) -> Result<(), Stop> {
    let (raw_tx, raw_rx) = mpsc::channel::<Bytes>(CHUNKS_QUEUED);
    let key_name = key.to_owned();
    let opener = tokio::task::spawn_blocking(move || {
        let reader = ChannelReader {
            rx: raw_rx,
            pending: Bytes::new(),
        };
        let mut plain = crate::backup_store::seal::open(reader, &identity).map_err(|err| Stop {
            reason: reasons::RESTORE_KEY_WRONG,
            message: format!("{key_name} does not open with the identity given: {err}"),
        })?;
        let mut buf = vec![0u8; READ];
        loop {
            let n = plain.read(&mut buf).map_err(|err| Stop {
                reason: reasons::RESTORE_CHECKSUM_MISMATCH,
                message: format!("{key_name} does not decrypt whole: {err}"),
            })?;
            if n == 0 || out.blocking_send(buf[..n].to_vec()).is_err() {
                return Ok::<_, Stop>(());
            }
        }
    });
    let feed = async {
        while let Some(chunk) = raw.next().await {
            let chunk = chunk.map_err(|err| Stop::from(StoreError::classify(bucket, &err)))?;
            object.update(&chunk);
            if raw_tx.send(chunk).await.is_err() {
                break;
            }
        }
        drop(raw_tx);
        Ok::<(), Stop>(())
    };
    let (fed, opened) = tokio::join!(feed, opener);
    let opened = opened.map_err(|err| Stop {
        reason: reasons::INTERNAL_ERROR,
        message: format!("the decryption thread failed: {err}"),
    })?;
    opened?;
    fed
}

/// A synchronous reader over chunks arriving on a channel (read on a blocking thread).
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    pending: Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.pending = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending.split_to(n));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_reader_reads_chunks_through() {
        let (tx, rx) = mpsc::channel(4);
        let reader = std::thread::spawn(move || {
            let mut reader = ChannelReader {
                rx,
                pending: Bytes::new(),
            };
            let mut all = Vec::new();
            reader.read_to_end(&mut all).expect("read");
            all
        });
        tx.blocking_send(Bytes::from_static(b"abc")).expect("send");
        tx.blocking_send(Bytes::from_static(b"")).expect("send");
        tx.blocking_send(Bytes::from_static(b"defg")).expect("send");
        drop(tx);
        assert_eq!(reader.join().expect("join"), b"abcdefg");
    }
}

//! The object store backups go to: any S3-compatible server, reached through `object_store`
//! (its `aws-base` S3 client over reqwest, TLS by rustls on ring, the workspace's one crypto
//! provider; ADR 0025), and its failures sorted into what a person can act on: credentials
//! refused, no such bucket, the store unreachable, the store full.

pub mod seal;

use std::sync::{Arc, Once};
use std::time::Duration;

use ichor_api::names::reasons;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt as _, RetryConfig};

/// Where the store is and who Ichor is to it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreSettings {
    /// The S3 endpoint, `https://host[:port]` (plain `http://` is allowed here; whether a
    /// backup may use it is `crate::controller::backup::plan::plain_http_refusal`'s to say).
    pub endpoint: String,
    /// The region requests are signed for.
    pub region: String,
    /// The bucket.
    pub bucket: String,
    /// The access key id.
    pub access_key: String,
    /// The secret access key.
    pub secret_key: String,
    /// Extra CA certificates (PEM) to trust for the endpoint, beside the system's.
    pub ca_pem: Option<String>,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// Why the store could not be used, in the terms a person acts on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The settings themselves are unusable (an endpoint that is no URL, a CA that is no PEM).
    #[error("the object store settings are invalid: {0}")]
    Settings(String),
    /// The store refused the credentials, or refused them this request.
    #[error("the object store refused the credentials: {0}")]
    Denied(String),
    /// The bucket does not exist.
    #[error("bucket {bucket} does not exist")]
    NoSuchBucket {
        /// The bucket named in the settings.
        bucket: String,
    },
    /// The store could not be reached (connection refused, timed out, TLS failed).
    #[error("the object store is unreachable: {0}")]
    Unreachable(String),
    /// The store says it has no room for the object (HTTP 507, `InsufficientStorage`,
    /// `QuotaExceeded`, MinIO's `XMinioStorageFull`).
    #[error("the object store is full: {0}")]
    Full(String),
    /// The store failed a write with a server error. Some stores answer a full disk so:
    /// SeaweedFS answers `500 InternalError` when no volume has room
    /// (`weed/s3api/s3api_object_handlers_put.go`, `mapChunkedUploadErrorToS3Error`).
    #[error("the object store failed to store the object (it may be full, or failing): {0}")]
    WriteRefused(String),
    /// Any other failure of a request.
    #[error("the object store failed: {0}")]
    Request(String),
}

/// The most of a store's own words (an error and the body it answered with) that reaches a
/// status or an Event, in characters: an error body is the store's to choose, any size and any
/// bytes.
pub const STORE_TEXT_LIMIT: usize = 512;

/// `text` as a status or an Event may repeat it: printable ASCII only (any other character,
/// control characters and escape sequences included, is dropped; a run of whitespace is one
/// space), at most [`STORE_TEXT_LIMIT`] characters, a cut one ending in ` [truncated]`.
pub fn printable(text: &str) -> String {
    const CUT: &str = " [truncated]";
    let mut out = String::new();
    for c in text.chars() {
        let c = if c.is_whitespace() { ' ' } else { c };
        let blank = c == ' ' && (out.is_empty() || out.ends_with(' '));
        if !(c.is_ascii_graphic() || c == ' ') || blank {
            continue;
        }
        if out.len() == STORE_TEXT_LIMIT {
            out.truncate(STORE_TEXT_LIMIT - CUT.len());
            out.push_str(CUT);
            return out;
        }
        out.push(c);
    }
    out.trim_end().to_owned()
}

impl StoreError {
    /// Sorts an `object_store` error by what its message and kind say. The text kept is
    /// [`printable`]: the store's answer is not trusted to be short, or text.
    pub fn classify(bucket: &str, error: &object_store::Error) -> Self {
        let full = chain(error);
        let lower = full.to_ascii_lowercase();
        let text = printable(&full);
        if lower.contains("nosuchbucket") || lower.contains("bucket does not exist") {
            return Self::NoSuchBucket {
                bucket: bucket.to_owned(),
            };
        }
        if matches!(
            error,
            object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        ) || [
            "invalidaccesskeyid",
            "signaturedoesnotmatch",
            "accessdenied",
        ]
        .iter()
        .any(|code| lower.contains(code))
        {
            return Self::Denied(text);
        }
        if [
            "507 insufficient storage",
            "insufficientstorage",
            "quotaexceeded",
            "storagefull",
            "no space left",
        ]
        .iter()
        .any(|sign| lower.contains(sign))
        {
            return Self::Full(text);
        }
        if [
            "error sending request",
            "connection refused",
            "connect",
            "timed out",
            "dns error",
            "certificate",
        ]
        .iter()
        .any(|sign| lower.contains(sign))
        {
            return Self::Unreachable(text);
        }
        Self::Request(text)
    }

    /// Sorts the failure of a write: a server error on a write is [`StoreError::WriteRefused`].
    pub fn classify_write(bucket: &str, error: &object_store::Error) -> Self {
        let server_error = chain(error).contains("status code: 5");
        match Self::classify(bucket, error) {
            Self::Request(text) if server_error => Self::WriteRefused(text),
            other => other,
        }
    }
}

/// A store failure as the user sees it: the condition reason of its kind, and its text.
impl From<StoreError> for crate::Stop {
    fn from(error: StoreError) -> Self {
        let reason = match &error {
            StoreError::Settings(_) => reasons::BACKUP_SETTINGS_INVALID,
            StoreError::Denied(_) => reasons::STORE_CREDENTIALS_REFUSED,
            StoreError::NoSuchBucket { .. } => reasons::STORE_BUCKET_MISSING,
            StoreError::Unreachable(_) => reasons::STORE_UNREACHABLE,
            StoreError::Full(_) | StoreError::WriteRefused(_) | StoreError::Request(_) => {
                reasons::STORE_WRITE_REFUSED
            }
        };
        Self::new(reason, error.to_string())
    }
}

/// An error and its causes on one line.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Installs ring as the process's rustls provider, which reqwest (built without one of its
/// own) uses. Installing twice is harmless; the first wins.
fn install_ring_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A client for the bucket in `settings`. Requests time out after a minute, connections after
/// ten seconds, and a failed request is retried twice within 30 seconds, so that an
/// unreachable store is reported promptly rather than retried for minutes.
pub fn s3_store(settings: &StoreSettings) -> Result<Arc<dyn ObjectStore>, StoreError> {
    install_ring_provider();
    let url = reqwest::Url::parse(&settings.endpoint).map_err(|err| {
        StoreError::Settings(format!(
            "endpoint {:?} is not a URL: {err}",
            settings.endpoint
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(StoreError::Settings(format!(
            "endpoint {:?} must start with https:// or http://",
            settings.endpoint
        )));
    }
    let mut options = ClientOptions::new()
        .with_timeout(Duration::from_secs(60))
        .with_connect_timeout(Duration::from_secs(10))
        .with_allow_http(url.scheme() == "http");
    if let Some(pem) = &settings.ca_pem {
        let certificates = object_store::Certificate::from_pem_bundle(pem.as_bytes())
            .map_err(|err| StoreError::Settings(format!("the CA bundle is not PEM: {err}")))?;
        if certificates.is_empty() {
            return Err(StoreError::Settings(
                "the CA bundle holds no certificate".to_owned(),
            ));
        }
        for certificate in certificates {
            options = options.with_root_certificate(certificate);
        }
    }
    let retry = RetryConfig {
        max_retries: 2,
        retry_timeout: Duration::from_secs(30),
        ..RetryConfig::default()
    };
    let store = AmazonS3Builder::new()
        .with_endpoint(settings.endpoint.trim_end_matches('/'))
        .with_region(&settings.region)
        .with_bucket_name(&settings.bucket)
        .with_access_key_id(&settings.access_key)
        .with_secret_access_key(&settings.secret_key)
        .with_virtual_hosted_style_request(false)
        .with_client_options(options)
        .with_retry(retry)
        .build()
        .map_err(|err| StoreError::Settings(chain(&err)))?;
    Ok(Arc::new(store))
}

/// Checks that the bucket exists and the credentials may list it, by listing at most one key
/// under `prefix`.
pub async fn check_bucket(
    store: &dyn ObjectStore,
    bucket: &str,
    prefix: &str,
) -> Result<(), StoreError> {
    use futures::TryStreamExt as _;
    let prefix = ObjectPath::from(prefix.trim_matches('/'));
    let mut listing = store.list(Some(&prefix));
    listing
        .try_next()
        .await
        .map(|_| ())
        .map_err(|err| StoreError::classify(bucket, &err))
}

/// Deletes `key`, sorting a failure.
pub async fn delete(store: &dyn ObjectStore, bucket: &str, key: &str) -> Result<(), StoreError> {
    store
        .delete(&ObjectPath::from(key))
        .await
        .map_err(|err| StoreError::classify(bucket, &err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_answer_reaches_status_short_and_printable() {
        assert_eq!(
            printable("  AccessDenied:\r\n\tno\u{1b}[31m way\u{202e} \u{0} "),
            "AccessDenied: no[31m way"
        );
        let long = format!("<Error>{}</Error>", "x\u{7}".repeat(10_000));
        let short = printable(&long);
        assert_eq!(short.len(), STORE_TEXT_LIMIT);
        assert!(short.ends_with(" [truncated]"), "{short}");
        assert!(short.starts_with("<Error>xxx"), "{short}");
        let fits = "y".repeat(STORE_TEXT_LIMIT);
        assert_eq!(printable(&fits), fits, "exactly the limit is whole");
    }
}

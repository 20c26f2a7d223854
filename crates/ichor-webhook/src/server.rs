//! The HTTPS admission server: `POST /validate` takes an `AdmissionReview` v1 and always
//! answers with a well-formed one, timing each decision into [`Metrics`]; `GET /healthz` says
//! whether a serving certificate is loaded. With a client CA ([`ClientAuth`]), `/validate`
//! refuses, unread, a request whose connection presented no client certificate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json};
use axum_server::tls::TlsInfo;
use ichor_api::names::reasons;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

use crate::Error;
use crate::certs::{CertSettings, LeafResolver, Refresher};
use crate::client_auth::ClientAuth;
use crate::guard::{Cache, Decision, Guard, unavailable};
use crate::metrics::Metrics;

/// How long a decision may take: under the webhook's 10 s timeout, so the apiserver gets a
/// refusal rather than a timeout.
pub(crate) const DECISION_TIMEOUT: Duration = Duration::from_secs(8);

/// What the server needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where to listen (port 0 picks one).
    pub bind: SocketAddr,
    /// Certificate settings.
    pub certs: CertSettings,
    /// How often the certificates are checked.
    pub refresh: Duration,
    /// The apiserver's client CA: when set, `/validate` answers only a caller that presented
    /// a certificate it signed (ADR 0051); when unset, any caller that reaches the port.
    pub client_auth: Option<ClientAuth>,
}

#[derive(Clone)]
struct AppState {
    guard: Guard,
    resolver: Arc<LeafResolver>,
    metrics: Arc<Metrics>,
    /// Whether `/validate` needs a client certificate (the handshake verified any presented).
    client_certificate_required: bool,
}

/// What a review was about: the resource and the operation, as metric labels.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Subject {
    resource: String,
    operation: &'static str,
}

impl Subject {
    const UNKNOWN: &'static str = "unknown";

    fn unknown() -> Self {
        Self {
            resource: Self::UNKNOWN.to_owned(),
            operation: Self::UNKNOWN,
        }
    }

    fn of(request: &AdmissionRequest<DynamicObject>) -> Self {
        Self {
            resource: request.resource.resource.clone(),
            operation: match request.operation {
                Operation::Create => "CREATE",
                Operation::Update => "UPDATE",
                Operation::Delete => "DELETE",
                Operation::Connect => "CONNECT",
            },
        }
    }
}

/// An answer for a request that could not be read: refused, with the request's uid when
/// one can be found.
fn invalid(body: &[u8], why: &str) -> AdmissionReview<DynamicObject> {
    let mut response = AdmissionResponse::invalid(format!("unreadable admission review: {why}"));
    response.result.reason = reasons::INVALID_REVIEW.to_owned();
    response.result.code = 400;
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(uid) = value["request"]["uid"].as_str()
    {
        uid.clone_into(&mut response.uid);
    }
    response.into_review()
}

/// The answer to a caller that presented no client certificate where one is required:
/// refused, its body read for nothing but the uid to echo.
fn unauthenticated(body: &[u8]) -> AdmissionReview<DynamicObject> {
    let mut response = AdmissionResponse::invalid(
        "refused: the webhook answers only the apiserver, which must present a client certificate signed by the webhook's client CA (docs/install.md, *Who may call the webhook*)",
    );
    response.result.reason = reasons::CLIENT_CERTIFICATE_REQUIRED.to_owned();
    response.result.code = 401;
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(uid) = value["request"]["uid"].as_str()
    {
        uid.clone_into(&mut response.uid);
    }
    response.into_review()
}

/// Decides on one review body.
pub async fn review(guard: &Guard, body: &[u8]) -> AdmissionReview<DynamicObject> {
    decide(guard, body).await.0
}

/// Decides on one review body and records how long it took in `metrics`.
pub async fn review_timed(
    guard: &Guard,
    metrics: &Metrics,
    body: &[u8],
) -> AdmissionReview<DynamicObject> {
    let started = Instant::now();
    let (answer, subject) = decide(guard, body).await;
    let allowed = answer.response.as_ref().is_some_and(|r| r.allowed);
    metrics.admitted(
        &subject.resource,
        subject.operation,
        allowed,
        started.elapsed(),
    );
    answer
}

/// The answer to one review body, and what it was about.
async fn decide(guard: &Guard, body: &[u8]) -> (AdmissionReview<DynamicObject>, Subject) {
    let parsed: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => return (invalid(body, &error.to_string()), Subject::unknown()),
    };
    let request: AdmissionRequest<DynamicObject> = match parsed.try_into() {
        Ok(request) => request,
        Err(_) => return (invalid(body, "it carries no request"), Subject::unknown()),
    };
    let subject = Subject::of(&request);
    let response = AdmissionResponse::from(&request);
    let (uid, name) = (request.uid.clone(), request.name.clone());
    let decision = match tokio::time::timeout(DECISION_TIMEOUT, guard.decide(request)).await {
        Ok(Ok(decision)) => decision,
        Ok(Err(error)) => {
            tracing::warn!(%error, %uid, "admission refused: live state unavailable");
            unavailable(&error)
        }
        Err(_) => Decision::Deny {
            reason: reasons::LIVE_STATE_UNAVAILABLE.to_owned(),
            message: "refused because live state could not be read in time; retry shortly"
                .to_owned(),
        },
    };
    let response = match decision {
        Decision::Allow => response,
        Decision::Deny { reason, message } => {
            tracing::info!(%reason, %name, "admission refused");
            let mut denied = response.deny(message);
            denied.result.reason = reason;
            denied.result.code = 403;
            denied
        }
    };
    (response.into_review(), subject)
}

async fn validate(
    State(state): State<AppState>,
    tls: Option<Extension<Arc<TlsInfo>>>,
    body: Bytes,
) -> Json<AdmissionReview<DynamicObject>> {
    let presented = tls.is_some_and(|Extension(info)| !info.peer_certificates.is_empty());
    if state.client_certificate_required && !presented {
        tracing::warn!("admission refused: the caller presented no client certificate");
        let started = Instant::now();
        let subject = Subject::unknown();
        let answer = unauthenticated(&body);
        state.metrics.admitted(
            &subject.resource,
            subject.operation,
            false,
            started.elapsed(),
        );
        return Json(answer);
    }
    Json(review_timed(&state.guard, &state.metrics, &body).await)
}

async fn healthz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.resolver.ready() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no serving certificate yet",
        )
    }
}

/// A running webhook.
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    handle: axum_server::Handle<SocketAddr>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    refresher: tokio::task::JoinHandle<()>,
    metrics: Arc<Metrics>,
}

impl Running {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its metrics (serve them with `ichor_service::serve(addr, running.metrics().registry(), ..)`).
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Stops it.
    pub async fn stop(self) {
        self.refresher.abort();
        self.handle.graceful_shutdown(Some(Duration::from_secs(1)));
        let _ = self.server.await;
    }

    /// Waits until it stops (a serving error or a shutdown).
    pub async fn wait(self) -> Result<(), Error> {
        let result = self.server.await;
        self.refresher.abort();
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(Error::Serve(error)),
            Err(error) => Err(Error::Serve(std::io::Error::other(error))),
        }
    }

    /// Begins a graceful shutdown.
    pub fn shutdown(&self) {
        self.handle.graceful_shutdown(Some(Duration::from_secs(5)));
    }
}

/// Gets the certificates (creating the CA if needed), then serves.
pub async fn start(client: kube::Client, settings: Settings) -> Result<Running, Error> {
    let resolver = Arc::new(LeafResolver::default());
    let mut refresher = Refresher::new(
        client.clone(),
        settings.certs.clone(),
        Arc::clone(&resolver),
    );
    refresher.refresh().await?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = match &settings.client_auth {
        Some(auth) => builder.with_client_cert_verifier(auth.verifier(provider)?),
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder
        .with_cert_resolver(Arc::clone(&resolver) as Arc<dyn rustls::server::ResolvesServerCert>);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let metrics = Arc::new(Metrics::default());
    let app = axum::Router::new()
        .route("/validate", post(validate))
        .route("/healthz", get(healthz))
        .with_state(AppState {
            guard: Guard::new(client.clone()).with_cache(Cache::start(&client)),
            resolver,
            metrics: Arc::clone(&metrics),
            client_certificate_required: settings.client_auth.is_some(),
        });
    let handle = axum_server::Handle::new();
    let server = tokio::spawn(
        axum_server::bind_rustls(
            settings.bind,
            axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls)),
        )
        .handle(handle.clone())
        .serve(app.into_make_service()),
    );
    let addr = handle.listening().await.ok_or(Error::Bind(settings.bind))?;
    let refresher = tokio::spawn(refresher.run(settings.refresh));
    Ok(Running {
        addr,
        handle,
        server,
        refresher,
        metrics,
    })
}

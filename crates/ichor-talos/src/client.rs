//! Connections to a Talos node and the typed operations on them.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tonic::codegen::{GrpcMethod, Service, http};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::api::machine::machine_service_client::MachineServiceClient;
use crate::limits::{self, LimitKind, Limited, Limits};
use crate::tls::PinningVerifier;

/// How long a TCP connect plus TLS handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a whole connect (TCP, TLS handshake, HTTP/2) may take. Calls have their own
/// limits, per method ([`Limits`]).
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

/// One finished Talos API call, as an [`observe`]r sees it.
#[derive(Debug, Clone, Copy)]
pub struct Rpc<'a> {
    /// The gRPC service (`machine.MachineService`, `cosi.resource.State`, ...).
    pub service: &'a str,
    /// The method (`Version`, `Get`, ...).
    pub method: &'a str,
    /// The result: the code of a trailers-only reply (how servers report a failed call),
    /// `Unavailable` when the transport failed, else `Ok`.
    pub code: tonic::Code,
    /// From the call to the reply's headers (for a stream: to its start).
    pub took: Duration,
}

/// Something told about every Talos API call a [`TalosClient`] makes.
pub type Observer = Arc<dyn Fn(&Rpc<'_>) + Send + Sync>;

static OBSERVER: OnceLock<Observer> = OnceLock::new();

/// Installs the process-wide observer of every call made through a [`TalosClient`]'s typed
/// operations (a metrics histogram, say); set once, for the life of the process. Returns
/// false (and keeps the first) when one is already installed. Calls made on the raw
/// [`TalosClient::channel`] are not observed.
pub fn observe(observer: Observer) -> bool {
    OBSERVER.set(observer).is_ok()
}

/// A [`Channel`] whose calls are held to their method's [`Limits`] and reported to the
/// [`observe`]r, if one is installed.
#[derive(Debug, Clone)]
pub struct Observed {
    inner: Channel,
    limits: Limits,
}

impl Service<http::Request<tonic::body::Body>> for Observed {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let observer = OBSERVER.get().cloned();
        let names = request
            .extensions()
            .get::<GrpcMethod>()
            .map(|m| (m.service().to_owned(), m.method().to_owned()));
        let limit = names
            .as_ref()
            .map(|(service, method)| self.limits.of(service, method))
            .unwrap_or_else(|| self.limits.of("", ""));
        let call = self.inner.call(request);
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            let method = names
                .as_ref()
                .map(|(service, method)| format!("{service}/{method}"))
                .unwrap_or_default();
            let result = match limits::first(limit) {
                Some((kind, first)) => match tokio::time::timeout(first, call).await {
                    Ok(result) => result,
                    Err(_) => Ok(limits::exceeded(&method, kind, first).into_http()),
                },
                None => call.await,
            };
            let result = result.map(|reply| {
                reply.map(|body| {
                    tonic::body::Body::new(Limited::new(body, method.clone(), limit, started))
                })
            });
            if let Some(observer) = observer {
                let (service, method) = names.unwrap_or_default();
                observer(&Rpc {
                    service: &service,
                    method: &method,
                    code: reply_code(&result),
                    took: started.elapsed(),
                });
            }
            result
        })
    }
}

/// The code a reply's headers carry (a trailers-only reply: a failed call), else `Ok`.
fn reply_code<B, E>(result: &Result<http::Response<B>, E>) -> tonic::Code {
    match result {
        Err(_) => tonic::Code::Unavailable,
        Ok(reply) => reply
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
            .map_or(tonic::Code::Ok, tonic::Code::from_i32),
    }
}

/// What went wrong talking to a node.
#[derive(Debug, thiserror::Error)]
pub enum TalosError {
    /// The node presented a certificate other than the pinned one.
    #[error("{endpoint} presented certificate fingerprint {observed}, not the pinned {pinned}")]
    FingerprintMismatch {
        /// The node's address.
        endpoint: String,
        /// The pinned fingerprint.
        pinned: String,
        /// The fingerprint the node presented.
        observed: String,
    },
    /// The endpoint is not a valid address.
    #[error("invalid endpoint {endpoint}")]
    InvalidEndpoint {
        /// The address given.
        endpoint: String,
        /// The parse error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The connection could not be made.
    #[error("cannot connect to {endpoint}")]
    Connect {
        /// The node's address.
        endpoint: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The connection (TCP, TLS handshake, HTTP/2) did not complete in time.
    #[error("connecting to {endpoint} did not complete within {seconds} s")]
    ConnectTimeout {
        /// The node's address.
        endpoint: String,
        /// The limit.
        seconds: u64,
    },
    /// A call passed its limit ([`Limits`]): the node took too long to answer, or sent
    /// nothing for too long in the middle of a stream.
    #[error("{method} on {endpoint} {}", limit_passed(*.kind, *.limit))]
    Timeout {
        /// The RPC.
        method: &'static str,
        /// The node's address.
        endpoint: String,
        /// Which limit passed.
        kind: LimitKind,
        /// The limit.
        limit: Duration,
    },
    /// An RPC failed.
    #[error("{method} on {endpoint} failed: {status}")]
    Rpc {
        /// The RPC.
        method: &'static str,
        /// The node's address.
        endpoint: String,
        /// The gRPC status.
        status: tonic::Status,
    },
    /// The node answered, but its reply carried an error (a wrapped per-node error).
    #[error("{method} on {endpoint}: the node reported: {message}")]
    Node {
        /// The RPC.
        method: &'static str,
        /// The node's address.
        endpoint: String,
        /// The node's error.
        message: String,
    },
}

/// What a configured node trusts a client by: the OS CA, and a client certificate and key
/// signed by it (from a talosconfig or minted from the bundle). `Debug` hides the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The OS CA certificate, PEM.
    pub ca_pem: String,
    /// The client certificate, PEM; its Organization carries the roles.
    pub cert_pem: String,
    /// The client key, PEM (Talos's `ED25519 PRIVATE KEY` label is accepted).
    pub key_pem: String,
}

/// How a [`TalosError::Timeout`] says which limit passed.
fn limit_passed(kind: LimitKind, limit: Duration) -> String {
    match kind {
        LimitKind::Overall => format!("did not finish within {limit:?}, its overall limit"),
        LimitKind::Idle => format!("sent nothing for {limit:?}, its idle limit"),
    }
}

impl TalosError {
    /// The gRPC code of a failed call, if the failure was one; a call past its limit is
    /// `DeadlineExceeded`, as gRPC reports a deadline the caller set.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Rpc { status, .. } => Some(status.code()),
            Self::Timeout { .. } => Some(tonic::Code::DeadlineExceeded),
            _ => None,
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The key as standard PKCS#8 PEM: Talos writes Ed25519 keys as PKCS#8 under the
    /// non-standard label `ED25519 PRIVATE KEY` (talos-facts §2, "Rust/rustls PEM quirk").
    fn standard_key_pem(&self) -> String {
        self.key_pem.replace("ED25519 PRIVATE KEY", "PRIVATE KEY")
    }
}

/// How a config is applied; always explicit, since the protocol's default (0) is `REBOOT`,
/// which contract 1.14 refuses on configured nodes (talos-facts §1.2, §8.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyMode {
    /// Let the node decide (1.14: never reboots).
    Auto,
    /// Apply live, never reboot.
    NoReboot,
    /// Apply on the next reboot.
    Staged,
    /// Apply, and roll back unless confirmed.
    Try,
    /// Apply and reboot (1.13 and earlier only).
    Reboot,
}

impl ApplyMode {
    fn to_proto(self) -> crate::api::machine::apply_configuration_request::Mode {
        use crate::api::machine::apply_configuration_request::Mode;
        match self {
            Self::Auto => Mode::Auto,
            Self::NoReboot => Mode::NoReboot,
            Self::Staged => Mode::Staged,
            Self::Try => Mode::Try,
            Self::Reboot => Mode::Reboot,
        }
    }
}

/// What the node did with an applied config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The mode the node actually used (e.g. maintenance mode maps `REBOOT` to `NO_REBOOT`).
    pub mode: String,
    /// The node's explanation.
    pub details: String,
    /// Warnings about the config.
    pub warnings: Vec<String>,
}

/// A connection to one Talos node.
#[derive(Debug, Clone)]
pub struct TalosClient {
    endpoint: String,
    channel: Channel,
    /// The node the endpoint forwards calls to (the `node` metadata key), if not itself.
    target: Option<String>,
    /// How long each call may take.
    limits: Limits,
}

fn url(endpoint: &str) -> String {
    if endpoint.contains(':')
        && !endpoint.starts_with('[')
        && endpoint.parse::<std::net::Ipv6Addr>().is_err()
    {
        format!("https://{endpoint}")
    } else {
        format!("https://{endpoint}:{}", crate::TALOS_API_PORT)
    }
}

/// Runs a connect with an overall limit: tonic's connect timeout covers the TCP connect
/// only, and a node that accepts but never finishes the TLS handshake (one going down) must
/// not hold its caller forever.
async fn connect_within<T>(
    endpoint: &str,
    connect: impl std::future::Future<Output = T>,
) -> Result<T, TalosError> {
    tokio::time::timeout(CONNECT_LIMIT, connect)
        .await
        .map_err(|_| TalosError::ConnectTimeout {
            endpoint: endpoint.to_owned(),
            seconds: CONNECT_LIMIT.as_secs(),
        })
}

/// The end of a dry run's answer when the node runs the config already (see
/// [`TalosClient::runs_config`]).
const NO_CHANGES: &str = "Config diff:\n\nNo changes.";

impl TalosClient {
    /// Connects to a node in maintenance mode (`host` or `host:port`), trusting only the
    /// certificate whose fingerprint is `pinned`. A different certificate is refused with
    /// [`TalosError::FingerprintMismatch`] carrying the observed fingerprint.
    ///
    /// ```
    /// use ichor_talos::{TalosClient, TalosError};
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let node = ichor_sim::SimNode::start("127.0.0.1:0".parse()?, "v1.14.1").await?;
    /// let endpoint = node.addr().to_string();
    /// let pinned = node.fingerprint();
    /// let client = TalosClient::connect_maintenance(&endpoint, &pinned).await?;
    /// assert_eq!(client.version().await?, "v1.14.1");
    ///
    /// // A reboot in maintenance mode regenerates the certificate: the old pin is refused,
    /// // and the error names the fingerprint the node showed, for a person to check.
    /// node.reboot().await?;
    /// match TalosClient::connect_maintenance(&endpoint, &pinned).await {
    ///     Err(TalosError::FingerprintMismatch { observed, .. }) => {
    ///         assert_eq!(observed, node.fingerprint());
    ///     }
    ///     other => panic!("expected a fingerprint mismatch, got {other:?}"),
    /// }
    /// node.stop().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_maintenance(endpoint: &str, pinned: &str) -> Result<Self, TalosError> {
        let verifier = PinningVerifier::new(pinned);
        let observed = verifier.observed();
        let tls = ClientTlsConfig::new().domain_name("talos");
        let channel_endpoint = Endpoint::from_shared(url(endpoint))
            .map_err(|source| TalosError::InvalidEndpoint {
                endpoint: endpoint.to_owned(),
                source,
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tls_config_with_verifier(tls, Arc::new(verifier))
            .map_err(|source| TalosError::InvalidEndpoint {
                endpoint: endpoint.to_owned(),
                source,
            })?;
        match connect_within(endpoint, channel_endpoint.connect()).await? {
            Ok(channel) => Ok(Self {
                endpoint: endpoint.to_owned(),
                channel,
                target: None,
                limits: Limits::default(),
            }),
            Err(source) => {
                let seen = observed.lock().ok().and_then(|o| o.clone());
                match seen {
                    Some(observed) if observed != pinned => Err(TalosError::FingerprintMismatch {
                        endpoint: endpoint.to_owned(),
                        pinned: pinned.to_owned(),
                        observed,
                    }),
                    _ => Err(TalosError::Connect {
                        endpoint: endpoint.to_owned(),
                        source,
                    }),
                }
            }
        }
    }

    /// Connects to a configured node (`host` or `host:port`) with mutual TLS: the node's
    /// certificate must chain to the OS CA and name the address; the client presents
    /// `credentials`.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use ichor_render::pki::{Role, client_certificate};
    /// use ichor_talos::{Credentials, TalosClient};
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let cluster = serde_json::from_value(serde_json::json!({
    /// #     "talosVersion": "v1.14.1",
    /// #     "kubernetesVersion": "1.36.3",
    /// #     "endpoint": "https://127.0.0.1:6443",
    /// #     "controlPlane": {"count": 1},
    /// # }))?;
    /// let bundle = ichor_render::SecretsBundle::generate(ichor_render::Contract::V1_14)?;
    /// # let config = ichor_render::render(&ichor_render::RenderInput {
    /// #     hostname: Some("cp-1"),
    /// #     ..ichor_render::RenderInput::plain(
    /// #         "lab",
    /// #         &cluster,
    /// #         ichor_api::common::Role::ControlPlane,
    /// #         &bundle,
    /// #     )
    /// # })?;
    /// // A control plane already running a config rendered from `bundle`.
    /// let node = ichor_sim::SimNode::start_configured(
    ///     "127.0.0.1:0".parse()?,
    ///     "v1.14.1",
    ///     ichor_sim::Hardware::vm(1),
    ///     &config.yaml,
    /// )
    /// .await?;
    /// // An os:admin client certificate from the bundle's OS CA.
    /// let issued = client_certificate(&bundle, "my-tool", Role::Admin, Duration::from_secs(3600))?;
    /// let credentials = Credentials {
    ///     ca_pem: bundle.certs.os.crt.0.clone(),
    ///     cert_pem: issued.cert_pem,
    ///     key_pem: issued.key_pem,
    /// };
    /// // The node's API comes up a moment after it boots.
    /// let endpoint = node.addr().to_string();
    /// let mut tries = 0;
    /// let client = loop {
    ///     match TalosClient::connect(&endpoint, &credentials).await {
    ///         Ok(client) if client.version().await.is_ok() => break client,
    ///         _ if tries < 100 => tries += 1,
    ///         other => panic!("the node never answered: {other:?}"),
    ///     }
    ///     tokio::time::sleep(Duration::from_millis(50)).await;
    /// };
    /// assert_eq!(client.hostname().await?, "cp-1");
    /// node.stop().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(endpoint: &str, credentials: &Credentials) -> Result<Self, TalosError> {
        let invalid = |source| TalosError::InvalidEndpoint {
            endpoint: endpoint.to_owned(),
            source,
        };
        let tls = ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&credentials.ca_pem))
            .identity(tonic::transport::Identity::from_pem(
                &credentials.cert_pem,
                credentials.standard_key_pem(),
            ));
        let channel = Endpoint::from_shared(url(endpoint))
            .map_err(invalid)?
            .connect_timeout(CONNECT_TIMEOUT)
            .tls_config(tls)
            .map_err(invalid)?;
        let channel = connect_within(endpoint, channel.connect())
            .await?
            .map_err(|source| TalosError::Connect {
                endpoint: endpoint.to_owned(),
                source,
            })?;
        Ok(Self {
            endpoint: endpoint.to_owned(),
            channel,
            target: None,
            limits: Limits::default(),
        })
    }

    /// The same connection, with every call sent on to `node` (an IP or hostname, no port)
    /// by the endpoint (the `node` metadata key, talos-facts §2 "Routing to nodes").
    pub fn for_node(&self, node: &str) -> Self {
        Self {
            target: Some(node.to_owned()),
            ..self.clone()
        }
    }

    /// The same connection, with calls held to `limits` instead of [`Limits::default`].
    pub fn with_limits(self, limits: Limits) -> Self {
        Self { limits, ..self }
    }

    /// The limits calls are held to.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A request carrying the target node, if any.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(target) = &self.target
            && let Ok(value) = target.parse()
        {
            request.metadata_mut().insert("node", value);
        }
        request
    }

    /// Maps a failed call to [`TalosError::Rpc`], or to [`TalosError::Timeout`] when it
    /// passed its limit.
    pub(crate) fn rpc_error(
        &self,
        method: &'static str,
    ) -> impl FnOnce(tonic::Status) -> TalosError + '_ {
        move |status| match limits::passed(&status) {
            Some((kind, limit)) => TalosError::Timeout {
                method,
                endpoint: self.describe(),
                kind,
                limit,
            },
            None => TalosError::Rpc {
                method,
                endpoint: self.describe(),
                status,
            },
        }
    }

    /// The endpoint, and the node behind it when the call is forwarded.
    pub(crate) fn describe(&self) -> String {
        match &self.target {
            Some(target) => format!("{target} (through {})", self.endpoint),
            None => self.endpoint.clone(),
        }
    }

    /// A [`TalosError::Node`] for `method`.
    pub(crate) fn node_error(&self, method: &'static str, message: String) -> TalosError {
        TalosError::Node {
            method,
            endpoint: self.describe(),
            message,
        }
    }

    /// The one reply of a call to one node: wrapped responses carry a list of per-node
    /// messages whose metadata may hold the node's error instead of a result (talos-facts
    /// §1.1), which is surfaced, never taken for success.
    pub(crate) fn single<T>(
        &self,
        method: &'static str,
        messages: Vec<T>,
        metadata: impl Fn(&T) -> Option<&crate::api::common::Metadata>,
    ) -> Result<T, TalosError> {
        crate::decode::single(messages, metadata).map_err(|e| self.node_error(method, e))
    }

    /// The underlying channel, for calls without a typed wrapper yet: not [`observe`]d, and
    /// held to no [`Limits`] (bound such a call with `tonic::Request::set_timeout`).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The channel the typed operations use: every call is held to its method's limit and
    /// reported to the [`observe`]r.
    pub fn transport(&self) -> Observed {
        Observed {
            inner: self.channel.clone(),
            limits: self.limits,
        }
    }

    /// The node's address.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Applies a machine config (the full multi-document YAML) with an explicit mode.
    pub async fn apply_configuration(
        &self,
        config: &[u8],
        mode: ApplyMode,
    ) -> Result<Applied, TalosError> {
        self.apply(config, mode, false).await
    }

    /// Whether the node runs `config` already, by a `NO_REBOOT` dry run: Talos diffs its
    /// running config against it and answers `Config diff:\n\nNo changes.` when they are the
    /// same (siderolabs/talos, `internal/app/machined/internal/server/v1alpha1/
    /// v1alpha1_server.go`, `ApplyConfiguration` with `DryRun` and `generateDiff`). Nothing
    /// changes on the node.
    pub async fn runs_config(&self, config: &[u8]) -> Result<bool, TalosError> {
        let answer = self.apply(config, ApplyMode::NoReboot, true).await?;
        Ok(answer.details.trim_end().ends_with(NO_CHANGES))
    }

    async fn apply(
        &self,
        config: &[u8],
        mode: ApplyMode,
        dry_run: bool,
    ) -> Result<Applied, TalosError> {
        const METHOD: &str = "ApplyConfiguration";
        let reply = MachineServiceClient::new(self.transport())
            .apply_configuration(
                self.request(crate::api::machine::ApplyConfigurationRequest {
                    data: config.to_vec(),
                    mode: mode.to_proto() as i32,
                    dry_run,
                    try_mode_timeout: None,
                }),
            )
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        let first = self.single(METHOD, reply.messages, |m| m.metadata.as_ref())?;
        let mode = crate::api::machine::apply_configuration_request::Mode::try_from(first.mode)
            .map(|m| m.as_str_name().to_owned())
            .unwrap_or_else(|_| first.mode.to_string());
        Ok(Applied {
            mode,
            details: first.mode_details,
            warnings: first.warnings,
        })
    }

    /// The Talos version the node runs (`VersionInfo.tag`, e.g. `v1.14.1`).
    pub async fn version(&self) -> Result<String, TalosError> {
        const METHOD: &str = "Version";
        let reply = MachineServiceClient::new(self.transport())
            .version(self.request(()))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        crate::decode::version(reply).map_err(|e| self.node_error(METHOD, e))
    }
}

#[cfg(test)]
mod observer_tests {
    use super::*;

    fn reply(status: Option<&str>) -> Result<http::Response<()>, ()> {
        let mut builder = http::Response::builder();
        if let Some(status) = status {
            builder = builder.header("grpc-status", status);
        }
        Ok(builder.body(()).expect("a response"))
    }

    #[test]
    fn a_reply_code_is_the_trailers_only_status_else_ok() {
        assert_eq!(reply_code(&reply(None)), tonic::Code::Ok);
        assert_eq!(reply_code(&reply(Some("0"))), tonic::Code::Ok);
        assert_eq!(
            reply_code(&reply(Some("9"))),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(reply_code(&reply(Some("nonsense"))), tonic::Code::Ok);
        assert_eq!(reply_code::<(), ()>(&Err(())), tonic::Code::Unavailable);
    }
}

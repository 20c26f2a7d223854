//! One endpoint's HTTP: its own client (rustls on ring, HTTP/1.1, no proxy, redirects kept to
//! its origin), its limits (a semaphore of requests in flight, one time limit over a whole
//! call, a bounded answer), Basic authentication on every request, and the sorting of what
//! came back into [`Error`]s. Paths come from the BMC's own links and are refused unless they
//! stay on the endpoint's origin, so no answer can send the credentials elsewhere.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE, ETAG, HeaderValue, IF_MATCH};
use reqwest::{Method, StatusCode, Url};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::sync::Semaphore;

use crate::endpoint::{Credentials, Endpoint, Limits, Trust};
use crate::error::Error;
use crate::model::{self, Unreadable};

/// The longest path taken from a BMC's links.
const MAX_PATH: usize = 2048;
/// How many redirects, on the endpoint's origin, one request follows.
const MAX_REDIRECTS: usize = 3;

/// A successful answer: its `ETag` header and body, with the path it answered.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) path: String,
    pub(crate) etag: Option<String>,
    pub(crate) body: Vec<u8>,
}

/// One endpoint's HTTP client and limits.
pub(crate) struct Transport {
    http: reqwest::Client,
    origin: Url,
    /// The origin as errors name it (`https://host:port`).
    pub(crate) endpoint: String,
    credentials: Credentials,
    limits: Limits,
    in_flight: Arc<Semaphore>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("endpoint", &self.endpoint)
            .field("credentials", &self.credentials)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// Checks `endpoint` and builds its client.
    pub(crate) fn new(endpoint: Endpoint) -> Result<Self, Error> {
        let invalid = |detail: String| Error::InvalidEndpoint {
            endpoint: without_userinfo(&endpoint.url),
            detail,
        };
        let origin = origin_of(&endpoint.url, endpoint.plain_http).map_err(invalid)?;
        check_limits(&endpoint.limits).map_err(invalid)?;
        let tls = tls_config(&endpoint.trust).map_err(invalid)?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .https_only(!endpoint.plain_http)
            .http1_only()
            .no_proxy()
            .connect_timeout(endpoint.limits.connect_timeout)
            .timeout(endpoint.limits.request_timeout)
            .pool_max_idle_per_host(endpoint.limits.max_in_flight)
            .pool_idle_timeout(Duration::from_secs(30))
            .redirect(same_origin_redirects())
            .user_agent(concat!("ichor-redfish/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| invalid(format!("its HTTP client cannot be built: {err}")))?;
        Ok(Self {
            http,
            endpoint: origin.origin().ascii_serialization(),
            origin,
            credentials: endpoint.credentials,
            in_flight: Arc::new(Semaphore::new(endpoint.limits.max_in_flight)),
            limits: endpoint.limits,
        })
    }

    /// `GET path`.
    pub(crate) async fn get(&self, path: &str) -> Result<Answer, Error> {
        self.call(Method::GET, path, None, None).await
    }

    /// `POST path` with a JSON body.
    pub(crate) async fn post(&self, path: &str, body: &serde_json::Value) -> Result<Answer, Error> {
        self.call(Method::POST, path, Some(body), None).await
    }

    /// `PATCH path` with a JSON body, conditional on `if_match` when given.
    pub(crate) async fn patch(
        &self,
        path: &str,
        body: &serde_json::Value,
        if_match: Option<&str>,
    ) -> Result<Answer, Error> {
        self.call(Method::PATCH, path, Some(body), if_match).await
    }

    /// Reads `answer` as `T`, or fails naming the field.
    pub(crate) fn read<T: serde::de::DeserializeOwned>(&self, answer: &Answer) -> Result<T, Error> {
        model::parse(&answer.body).map_err(|unreadable| self.unreadable(&answer.path, unreadable))
    }

    /// The protocol error for `path`'s answer that did not read.
    pub(crate) fn unreadable(&self, path: &str, Unreadable(detail): Unreadable) -> Error {
        Error::Protocol {
            endpoint: self.endpoint.clone(),
            path: path.to_owned(),
            detail,
        }
    }

    /// One request within the endpoint's time limit: a place among the requests in flight,
    /// the request, and its whole answer.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, Error> {
        let url = self.resource_url(path)?;
        let limit = self.limits.request_timeout;
        let started = std::time::Instant::now();
        let outcome =
            tokio::time::timeout(limit, self.call_now(&method, url, path, body, if_match)).await;
        let result = outcome.unwrap_or_else(|_| {
            Err(self.unreachable(format!("no answer to {method} {path} within {limit:?}")))
        });
        tracing::debug!(
            endpoint = %self.endpoint,
            %method,
            path,
            took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            outcome = result.as_ref().map_or_else(Error::reason, |_| "ok"),
            "redfish request"
        );
        result
    }

    async fn call_now(
        &self,
        method: &Method,
        url: Url,
        path: &str,
        body: Option<&serde_json::Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, Error> {
        let _place = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| self.unreachable("the endpoint's client was closed".to_owned()))?;
        let mut request = self
            .http
            .request(method.clone(), url)
            .basic_auth(
                self.credentials.username(),
                Some(self.credentials.password()),
            )
            .header(ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        if let Some(body) = body {
            request = request
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        if let Some(etag) = if_match.and_then(|e| HeaderValue::from_str(e).ok()) {
            request = request.header(IF_MATCH, etag);
        }
        let response = request.send().await.map_err(|err| self.failed(&err))?;
        let status = response.status();
        let etag = response
            .headers()
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = self.read_body(response, path).await?;
        self.sort(method, path, status, etag, body)
    }

    /// The answer's body, up to the endpoint's limit.
    async fn read_body(
        &self,
        mut response: reqwest::Response,
        path: &str,
    ) -> Result<Vec<u8>, Error> {
        let limit = self.limits.max_answer_bytes;
        let too_large = || Error::TooLarge {
            endpoint: self.endpoint.clone(),
            path: path.to_owned(),
            limit,
        };
        if response
            .content_length()
            .is_some_and(|len| usize::try_from(len).map_or(true, |len| len > limit))
        {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|err| self.failed(&err))? {
            if body.len().saturating_add(chunk.len()) > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// A successful answer, or the error its status says.
    fn sort(
        &self,
        method: &Method,
        path: &str,
        status: StatusCode,
        etag: Option<String>,
        body: Vec<u8>,
    ) -> Result<Answer, Error> {
        let endpoint = self.endpoint.clone();
        let path = path.to_owned();
        let code = status.as_u16();
        match code {
            200..=299 => Ok(Answer { path, etag, body }),
            401 | 403 => Err(Error::Unauthorized {
                endpoint,
                username: self.credentials.username().to_owned(),
                path,
                status: code,
            }),
            404 => Err(Error::NotFound { endpoint, path }),
            400..=499 => Err(Error::Refused {
                endpoint,
                method: method.to_string(),
                path,
                status: code,
                messages: model::error_messages(&body),
            }),
            500..=599 => Err(Error::ServerError {
                endpoint,
                method: method.to_string(),
                path,
                status: code,
                messages: model::error_messages(&body),
            }),
            300..=399 => Err(Error::Protocol {
                endpoint,
                path,
                detail: format!("a redirect ({code}) off its origin or past {MAX_REDIRECTS} hops"),
            }),
            _ => Err(Error::Protocol {
                endpoint,
                path,
                detail: format!("an unexpected status ({code})"),
            }),
        }
    }

    /// The URL of `path`, a path on the endpoint's origin taken from the BMC's links.
    fn resource_url(&self, path: &str) -> Result<Url, Error> {
        let refuse = |why: &str| Error::Protocol {
            endpoint: self.endpoint.clone(),
            path: path.chars().take(200).collect(),
            detail: format!("a link that is not a path on its origin ({why})"),
        };
        if !path.starts_with('/') || path.starts_with("//") {
            return Err(refuse("it must start with a single /"));
        }
        if path.len() > MAX_PATH {
            return Err(refuse("too long"));
        }
        if path.chars().any(|c| c.is_control() || c == '\\') {
            return Err(refuse("a control character or a backslash"));
        }
        let url = self
            .origin
            .join(path)
            .map_err(|_| refuse("it does not parse"))?;
        if url.origin() != self.origin.origin() {
            return Err(refuse("another origin"));
        }
        Ok(url)
    }

    /// The error for a request that got no answer: untrusted, timed out, or unreachable.
    fn failed(&self, err: &reqwest::Error) -> Error {
        let detail = causes(err);
        if untrusted_certificate(err) {
            return Error::Untrusted {
                endpoint: self.endpoint.clone(),
                detail,
            };
        }
        if err.is_timeout() && err.is_connect() {
            return self.unreachable(format!(
                "no connection within {:?} ({detail})",
                self.limits.connect_timeout
            ));
        }
        if err.is_timeout() {
            return self.unreachable(format!(
                "no answer within {:?} ({detail})",
                self.limits.request_timeout
            ));
        }
        self.unreachable(detail)
    }

    fn unreachable(&self, detail: String) -> Error {
        Error::Unreachable {
            endpoint: self.endpoint.clone(),
            detail,
        }
    }
}

/// The endpoint's origin (`scheme://host:port/`) from its URL: `https` (or `http` with the
/// opt-in), a host, no credentials, and no path but `/redfish/v1`.
fn origin_of(text: &str, plain_http: bool) -> Result<Url, String> {
    let url = Url::parse(text.trim()).map_err(|err| format!("the URL does not parse: {err}"))?;
    match url.scheme() {
        "https" => {}
        "http" if plain_http => {}
        "http" => {
            return Err(
                "plain http sends the credentials in clear text: use https, or opt in to plain http"
                    .to_owned(),
            );
        }
        other => return Err(format!("the scheme {other} is neither https nor http")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("the URL carries credentials: give them as credentials instead".to_owned());
    }
    if url.host().is_none() {
        return Err("the URL has no host".to_owned());
    }
    if !matches!(url.path(), "" | "/" | "/redfish/v1" | "/redfish/v1/")
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err("the URL may name a host and port, and /redfish/v1, nothing else".to_owned());
    }
    let mut origin = url;
    origin.set_path("/");
    Ok(origin)
}

/// `text` with anything before an `@` in its authority left out, for errors about a URL that
/// may carry credentials.
fn without_userinfo(text: &str) -> String {
    match text.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host);
            format!("{scheme}://{host}{path}")
        }
        None => text
            .rsplit_once('@')
            .map_or(text, |(_, host)| host)
            .to_owned(),
    }
}

fn check_limits(limits: &Limits) -> Result<(), String> {
    if limits.connect_timeout.is_zero() || limits.request_timeout.is_zero() {
        return Err("its time limits must be more than zero".to_owned());
    }
    if limits.max_answer_bytes == 0 || limits.max_in_flight == 0 {
        return Err("its answer size and requests in flight must be more than zero".to_owned());
    }
    Ok(())
}

/// Redirects followed only on the same origin (a Basic `Authorization` header must not travel
/// elsewhere), at most [`MAX_REDIRECTS`]; any other is returned as the answer.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if same_origin && attempt.previous().len() <= MAX_REDIRECTS {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// The rustls configuration `trust` asks for, on ring, offering HTTP/1.1.
fn tls_config(trust: &Trust) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("TLS cannot be set up: {err}"))?;
    let mut config = match trust {
        Trust::CaBundle(pem) => builder
            .with_root_certificates(roots(pem)?)
            .with_no_client_auth(),
        Trust::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate::new(&provider)))
            .with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The CA certificates of a PEM bundle.
fn roots(pem: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|err| format!("the CA bundle does not read: {err}"))?;
        roots
            .add(cert)
            .map_err(|err| format!("the CA bundle holds a certificate that is not a CA: {err}"))?;
    }
    if roots.is_empty() {
        return Err("the CA bundle holds no certificate".to_owned());
    }
    Ok(roots)
}

/// Accepts any server certificate (the explicit [`Trust::InsecureSkipVerify`]) but still checks
/// the handshake's signatures with the certificate it presented.
#[derive(Debug)]
struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl AnyCertificate {
    fn new(provider: &CryptoProvider) -> Self {
        Self {
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Every error under `err` (an `io::Error`'s inner error included), outermost first.
fn chain<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut found = Vec::new();
    let mut next = Some(err);
    while let Some(current) = next {
        found.push(current);
        next = current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static))
            .or_else(|| current.source());
        if found.len() > 16 {
            break;
        }
    }
    found
}

/// What went wrong under a request's error, its causes joined, without the request's URL.
fn causes(err: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in chain(err).into_iter().skip(1) {
        let text = cause.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
    }
    if parts.is_empty() {
        "the request failed".to_owned()
    } else {
        parts.join(": ")
    }
}

/// Whether the TLS handshake failed on the server's certificate.
fn untrusted_certificate(err: &reqwest::Error) -> bool {
    chain(err).into_iter().any(|cause| {
        matches!(
            cause.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport(url: &str) -> Result<Transport, Error> {
        Transport::new(Endpoint::new(
            url,
            Credentials::new("admin", "hunter2"),
            Trust::InsecureSkipVerify,
        ))
    }

    #[test]
    fn an_endpoint_is_an_https_origin() {
        for url in [
            "https://10.0.0.5",
            "https://10.0.0.5:8443/",
            "https://bmc.example/redfish/v1",
            "https://[fd00::5]/redfish/v1/",
        ] {
            let transport = transport(url).expect(url);
            assert!(transport.endpoint.starts_with("https://"), "{url}");
        }
        assert_eq!(
            transport("https://10.0.0.5:443/redfish/v1")
                .expect("parses")
                .endpoint,
            "https://10.0.0.5"
        );
    }

    #[test]
    fn refuses_what_is_not_an_https_origin() {
        for url in [
            "http://10.0.0.5",
            "ftp://10.0.0.5",
            "10.0.0.5",
            "https://10.0.0.5/other",
            "https://10.0.0.5/redfish/v1?x=1",
            "https://admin:hunter2@10.0.0.5",
        ] {
            let err = transport(url).expect_err(url);
            assert_eq!(err.reason(), "BmcEndpointInvalid", "{url}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        let plain = Endpoint::new(
            "http://127.0.0.1:8000",
            Credentials::new("admin", "pw"),
            Trust::InsecureSkipVerify,
        )
        .allow_plain_http();
        assert!(Transport::new(plain).is_ok(), "plain http with the opt-in");
    }

    #[test]
    fn a_ca_bundle_must_hold_a_certificate() {
        let endpoint = |pem: &str| {
            Endpoint::new(
                "https://10.0.0.5",
                Credentials::new("admin", "pw"),
                Trust::CaBundle(pem.to_owned()),
            )
        };
        let err = Transport::new(endpoint("not PEM")).expect_err("no certificate");
        assert!(err.to_string().contains("no certificate"), "{err}");
    }

    #[test]
    fn limits_of_zero_are_refused() {
        let endpoint = Endpoint::new(
            "https://10.0.0.5",
            Credentials::new("admin", "pw"),
            Trust::InsecureSkipVerify,
        )
        .limits(Limits {
            max_in_flight: 0,
            ..Limits::default()
        });
        assert!(Transport::new(endpoint).is_err());
    }

    #[test]
    fn links_stay_on_the_origin() {
        let transport = transport("https://10.0.0.5").expect("parses");
        let ok = transport
            .resource_url("/redfish/v1/Systems/1")
            .expect("a path");
        assert_eq!(ok.as_str(), "https://10.0.0.5/redfish/v1/Systems/1");
        for link in [
            "https://evil.example/redfish/v1",
            "//evil.example/redfish/v1",
            "redfish/v1/Systems",
            "/redfish/v1/\nSystems",
            "/\\evil.example",
            "",
        ] {
            let err = transport.resource_url(link).expect_err(link);
            assert_eq!(err.reason(), "BmcProtocolError", "{link:?}");
        }
        let long = format!("/{}", "a".repeat(MAX_PATH));
        assert!(transport.resource_url(&long).is_err());
    }

    #[test]
    fn statuses_sort_into_causes() {
        let transport = transport("https://10.0.0.5").expect("parses");
        let sort = |code: u16, body: &[u8]| {
            transport.sort(
                &Method::POST,
                "/p",
                StatusCode::from_u16(code).expect("a status"),
                None,
                body.to_vec(),
            )
        };
        assert!(sort(204, b"").is_ok());
        let reasons: Vec<&str> = [401, 403, 404, 400, 409, 412, 500, 503, 302]
            .into_iter()
            .map(|code| sort(code, b"{}").expect_err("an error").reason())
            .collect();
        assert_eq!(
            reasons,
            [
                "BmcUnauthorized",
                "BmcUnauthorized",
                "BmcResourceNotFound",
                "BmcRefused",
                "BmcRefused",
                "BmcRefused",
                "BmcServerError",
                "BmcServerError",
                "BmcProtocolError",
            ]
        );
        let refused = sort(400, br#"{"error": {"message": "no"}}"#).expect_err("refused");
        assert!(matches!(refused, Error::Refused { ref messages, .. } if messages == &["no"]));
    }

    #[test]
    fn a_url_with_credentials_is_named_without_them() {
        assert_eq!(
            without_userinfo("https://admin:hunter2@10.0.0.5/redfish/v1"),
            "https://10.0.0.5/redfish/v1"
        );
        assert_eq!(without_userinfo("admin:pw@10.0.0.5"), "10.0.0.5");
        assert_eq!(without_userinfo("https://10.0.0.5"), "https://10.0.0.5");
    }
}

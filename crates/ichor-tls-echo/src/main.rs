//! `ichor-tls-echo`: the physical limit of the webhook benchmark. The same stack as
//! `ichor-webhook` (axum on axum-server, rustls on ring, h2 and HTTP/1.1, a self-signed ECDSA
//! P-256 certificate like the webhook's leaf) reads each `POST /validate` body whole and answers
//! with one fixed JSON body of a chosen size, deciding nothing and calling no one.
//!
//! Prints `listening on ADDR` once it listens; stops on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::header::CONTENT_TYPE;
use axum::routing::post;
use clap::Parser;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// A bare TLS server answering every `POST /validate` with one fixed JSON body.
#[derive(Debug, Parser)]
#[command(version)]
struct Options {
    /// Where to listen (port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// The size of the answer in bytes: an AdmissionReview answer's.
    #[arg(long, default_value = "256")]
    body_bytes: usize,
}

/// A JSON AdmissionReview answer of exactly `size` bytes (or its smallest form, when `size` is
/// smaller), padded in the status message.
fn answer(size: usize) -> Bytes {
    let head = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"00000000-0000-0000-0000-000000000000","allowed":true,"status":{"message":""#;
    let tail = r#""}}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    Bytes::from(format!("{head}{}{tail}", "x".repeat(pad)))
}

fn tls() -> Result<rustls::ServerConfig, Box<dyn std::error::Error>> {
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])?;
    let key = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

async fn run(options: Options) -> Result<(), Box<dyn std::error::Error>> {
    let body = answer(options.body_bytes);
    let app = axum::Router::new().route(
        "/validate",
        post(move |request: Bytes| {
            let body = body.clone();
            async move {
                drop(request);
                ([(CONTENT_TYPE, "application/json")], body)
            }
        }),
    );
    let handle = axum_server::Handle::new();
    let server = tokio::spawn(
        axum_server::bind_rustls(
            options.bind,
            axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls()?)),
        )
        .handle(handle.clone())
        .serve(app.into_make_service()),
    );
    let addr = handle
        .listening()
        .await
        .ok_or_else(|| format!("cannot listen on {}", options.bind))?;
    println!("listening on {addr}");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        result = server => return Ok(result??),
    }
    handle.shutdown();
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Options::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ichor-tls-echo: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_has_the_size_asked_for_and_is_json() {
        let body = answer(300);
        assert_eq!(body.len(), 300);
        assert!(std::str::from_utf8(&body).is_ok_and(|text| text.ends_with("\"}}}")));
        assert!(answer(10).len() > 10, "never cut below its smallest form");
    }
}

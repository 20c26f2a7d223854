//! The client's own guards, against a loopback HTTP server that answers what a broken or hostile
//! BMC could: an answer over the size limit (announced, or chunked without a length), a link or
//! a redirect to another origin (which must never receive the credentials), and bodies that are
//! not Redfish. Redfish behaviour itself is tested against sushy-tools (`tests/sushy.rs`); these
//! are answers no real service gives on purpose.
#![warn(clippy::pedantic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ichor_redfish::{Bmc, Credentials, Endpoint, Limits, Trust};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// A server that answers every request on its port with `response` (a whole HTTP/1.1 answer),
/// counting the connections it took.
async fn serve(response: String) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("its address");
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let response = response.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0_u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 65536 {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (address, connections)
}

fn answer(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn bmc(address: SocketAddr, max_answer_bytes: usize) -> Bmc {
    let endpoint = Endpoint::new(
        format!("http://{address}"),
        Credentials::new("admin", "never-sent-elsewhere"),
        Trust::InsecureSkipVerify,
    )
    .allow_plain_http()
    .limits(Limits {
        max_answer_bytes,
        ..Limits::default()
    });
    Bmc::new(endpoint).expect("a client")
}

#[tokio::test]
async fn an_answer_over_the_limit_is_refused_announced_or_not() {
    let big = format!(
        "{{\"Systems\": {{\"@odata.id\": \"/{}\"}}}}",
        "a".repeat(4096)
    );
    let (announced, _) = serve(answer("200 OK", "", &big)).await;
    let err = bmc(announced, 1024).systems().await.expect_err("too large");
    assert_eq!(err.reason(), "BmcAnswerTooLarge", "{err}");

    let chunk = format!("200\r\n{}\r\n", " ".repeat(0x200));
    let chunks = chunk.repeat(8);
    let chunked = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{chunks}0\r\n\r\n"
    );
    let (unannounced, _) = serve(chunked).await;
    let err = bmc(unannounced, 1024)
        .systems()
        .await
        .expect_err("too large");
    assert_eq!(err.reason(), "BmcAnswerTooLarge", "{err}");
}

#[tokio::test]
async fn a_link_to_another_origin_is_never_followed() {
    let (elsewhere, reached) = serve(answer("200 OK", "", "{}")).await;
    let root =
        format!("{{\"Systems\": {{\"@odata.id\": \"http://{elsewhere}/redfish/v1/Systems\"}}}}");
    let (bmc_address, _) = serve(answer("200 OK", "", &root)).await;
    let err = bmc(bmc_address, 1 << 20)
        .systems()
        .await
        .expect_err("another origin");
    assert_eq!(err.reason(), "BmcProtocolError", "{err}");
    assert_eq!(reached.load(Ordering::SeqCst), 0, "nothing went elsewhere");
}

#[tokio::test]
async fn a_redirect_to_another_origin_is_not_followed() {
    let (elsewhere, reached) = serve(answer("200 OK", "", "{}")).await;
    let location = format!("Location: http://{elsewhere}/redfish/v1/\r\n");
    let (bmc_address, _) = serve(answer("307 Temporary Redirect", &location, "")).await;
    let err = bmc(bmc_address, 1 << 20)
        .systems()
        .await
        .expect_err("a redirect off the origin");
    assert_eq!(err.reason(), "BmcProtocolError", "{err}");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the credentials stayed home"
    );
}

#[tokio::test]
async fn bodies_that_are_not_redfish_are_protocol_errors_naming_the_field() {
    let cases = [
        ("not json at all", "Redfish resource expected"),
        ("{\"Systems\": \"/redfish/v1/Systems\"}", "Systems"),
        ("{\"Systems\": {\"@odata.id\": 7}}", "Systems.@odata.id"),
        ("{}", "without a Systems link"),
    ];
    for (body, field) in cases {
        let (address, _) = serve(answer("200 OK", "", body)).await;
        let err = bmc(address, 1 << 20)
            .systems()
            .await
            .expect_err("not Redfish");
        assert_eq!(err.reason(), "BmcProtocolError", "{err}");
        assert!(err.to_string().contains(field), "{err} should name {field}");
    }
}

#[tokio::test]
async fn a_server_error_carries_the_bmcs_message() {
    let body = r#"{"error": {"code": "Base.1.8.InternalError", "message": "see ExtendedInfo",
        "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.InternalError",
        "Message": "The request failed due to an internal service error."}]}}"#;
    let (address, _) = serve(answer("500 Internal Server Error", "", body)).await;
    let err = bmc(address, 1 << 20)
        .systems()
        .await
        .expect_err("a server error");
    assert_eq!(err.reason(), "BmcServerError", "{err}");
    assert!(err.is_transient());
    assert!(
        err.to_string()
            .ends_with("(500): The request failed due to an internal service error."),
        "{err}"
    );
}

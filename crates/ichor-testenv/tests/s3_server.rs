//! The S3 server of the backup tests starts, takes buckets, refuses unsigned requests, serves
//! HTTPS when asked, and stops for good.

use std::time::Duration;

use ichor_testenv::S3Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The reply to an unsigned `GET /<bucket>` over plain HTTP; a failure names the tail of the
/// server's log.
async fn unsigned_get(server: &S3Server, bucket: &str) -> String {
    let addr = server.endpoint().trim_start_matches("http://");
    let log = || ichor_testenv::process::log_tail(&server.dir().join("weed.log"), 40);
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("connect to the gateway");
    let request = format!("GET /{bucket} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
        .await
        .expect("an answer within 10 s")
        .unwrap_or_else(|err| panic!("read: {err:?}; the server's log ends:\n{}", log()));
    String::from_utf8_lossy(&reply).into_owned()
}

#[tokio::test]
async fn the_gateway_takes_buckets_and_refuses_anonymous_requests() {
    let mut server = S3Server::start().await.expect("start weed");
    assert!(server.endpoint().starts_with("http://127.0.0.1:"));
    assert_ne!(
        server.credentials(),
        server.read_only_credentials(),
        "two identities"
    );
    server
        .create_bucket("ichor-a")
        .await
        .expect("create a bucket");
    assert!(
        server.create_bucket("ichor-a").await.is_err(),
        "an existing bucket is not created twice"
    );
    let reply = unsigned_get(&server, "ichor-a").await;
    assert!(
        reply.starts_with("HTTP/1.1 403"),
        "an anonymous listing is refused: {reply}"
    );
    server.stop();
    assert!(
        TcpStream::connect(server.endpoint().trim_start_matches("http://"))
            .await
            .is_err(),
        "a stopped server refuses connections"
    );
}

#[tokio::test]
async fn a_tls_server_names_its_ca_and_a_limited_one_starts() {
    let tls = S3Server::builder()
        .tls()
        .start()
        .await
        .expect("start weed with TLS");
    assert!(tls.endpoint().starts_with("https://127.0.0.1:"));
    assert!(
        tls.ca_pem()
            .is_some_and(|pem| pem.contains("BEGIN CERTIFICATE")),
        "the CA is handed out"
    );
    let limited = S3Server::builder()
        .size_limit(96)
        .start()
        .await
        .expect("start weed on a 96 MiB filesystem");
    limited
        .create_bucket("small")
        .await
        .expect("create a bucket");
}

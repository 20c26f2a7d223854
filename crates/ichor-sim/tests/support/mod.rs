//! What the simulator's tests share: the renderer's golden files, and an `os:admin` client of a
//! configured node.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor_render::SecretsBundle;
use ichor_render::pki::{self, Role as TalosRole};
use ichor_sim::SimNode;
use ichor_talos::{Credentials, TalosClient};

/// The renderer's golden files: bundles and configs rendered for each contract.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ichor-render/tests/golden")
}

/// The golden file `name`.
pub fn golden(name: &str) -> String {
    std::fs::read_to_string(golden_dir().join(name)).expect("read a golden file")
}

/// A mutual-TLS `os:admin` client of `node`, configured from the golden bundle `bundle`,
/// once the node answers (within ten seconds).
pub async fn admin(bundle: &str, node: &SimNode) -> TalosClient {
    let bundle = SecretsBundle::from_yaml(&golden(bundle)).expect("the test bundle");
    let issued =
        pki::client_certificate(&bundle, "test", TalosRole::Admin, Duration::from_secs(600))
            .expect("a client certificate");
    let credentials = Credentials {
        ca_pem: bundle.certs.os.crt.0.clone(),
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(client) = TalosClient::connect(&node.addr().to_string(), &credentials).await
            && client.version().await.is_ok()
        {
            return client;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node never answered with mutual TLS"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

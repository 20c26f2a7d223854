//! A secrets bundle's YAML, as the manager reads it from the bundle Secret (ours, or one
//! `talosctl gen secrets` wrote): `SecretsBundle::from_yaml`, which parses and validates it.
//!
//! Invariants: nothing panics; a bundle that validates writes back to YAML that reads as the
//! same bundle; it yields the OS and Kubernetes issuers that minting needs (validation promises
//! usable CAs); its `Debug` output shows none of its secrets; a refused bundle says why.
#![no_main]

use ichor_render::SecretsBundle;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let bundle = match SecretsBundle::from_yaml(text) {
        Ok(bundle) => bundle,
        Err(error) => {
            assert!(!error.to_string().is_empty(), "a refusal without a reason");
            return;
        }
    };
    let yaml = bundle.to_yaml().expect("a valid bundle writes");
    let again = SecretsBundle::from_yaml(&yaml).expect("a written bundle reads back");
    assert_eq!(again, bundle, "the bundle changed through its YAML");
    bundle.os_issuer().expect("a valid bundle has an OS issuer");
    bundle
        .k8s_issuer()
        .expect("a valid bundle has a Kubernetes issuer");
    let shown = format!("{bundle:?}");
    for secret in [
        &bundle.trustd_info.token.0,
        &bundle.secrets.bootstrap_token.0,
        &bundle.cluster.secret.0,
        &bundle.secrets.secretbox_encryption_secret.0,
        &bundle.certs.os.key.0,
    ] {
        assert!(!shown.contains(secret.as_str()), "Debug shows a secret");
    }
});

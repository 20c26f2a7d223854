//! A kubeconfig or talosconfig as the manager reads a published one back (where it points,
//! which CA it trusts, when its client certificate expires): `read_kubeconfig` and
//! `read_talosconfig` of `ichor_render::credentials`, and the certificate parsing under them.
//!
//! Invariants: nothing panics; what a file says does not change when the file is written out
//! again (YAML → value → YAML) and re-read.
#![no_main]

use ichor_render::credentials::{Published, read_kubeconfig, read_talosconfig};
use libfuzzer_sys::fuzz_target;

fn rewritten(text: &str) -> Option<String> {
    let value: serde_json::Value = serde_saphyr::from_str(text).ok()?;
    serde_saphyr::to_string(&value).ok()
}

fn same(first: &Published, second: &Published) {
    assert_eq!(first.endpoints, second.endpoints);
    assert_eq!(first.nodes, second.nodes);
    assert_eq!(first.ca_pem, second.ca_pem);
    assert_eq!(first.not_before, second.not_before);
    assert_eq!(first.not_after, second.not_after);
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The talosconfig's context is the one it names, else the cluster the manager would ask for.
    let context = serde_saphyr::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v["context"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "lab".to_owned());
    let kube = read_kubeconfig(text);
    let talos = read_talosconfig(text, &context);
    if kube.is_none() && talos.is_none() {
        return;
    }
    let text = rewritten(text).expect("a file that reads writes out again");
    if let Some(first) = kube {
        same(&first, &read_kubeconfig(&text).expect("it still reads"));
    }
    if let Some(first) = talos {
        same(
            &first,
            &read_talosconfig(&text, &context).expect("it still reads"),
        );
    }
});

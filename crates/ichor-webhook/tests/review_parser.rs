//! The review parser never panics and always answers with a well-formed AdmissionReview:
//! arbitrary bytes, JSON of the wrong shape, reviews without a request.

mod support;

use ichor_webhook::Guard;
use ichor_webhook::server::review;
use proptest::prelude::*;

/// A guard whose Kubernetes API is unreachable: decisions that need live state are refused.
fn guard() -> Guard {
    let config = kube::Config::new("https://127.0.0.1:1".parse().expect("url"));
    Guard::new(kube::Client::try_from(config).expect("client"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn well_formed(bytes: &[u8]) -> serde_json::Value {
    let rt = runtime();
    let answer = rt.block_on(async { review(&guard(), bytes).await });
    let value = serde_json::to_value(&answer).expect("serializes");
    assert_eq!(value["kind"], "AdmissionReview");
    assert_eq!(value["apiVersion"], "admission.k8s.io/v1");
    assert!(value["response"]["allowed"].is_boolean(), "{value}");
    value
}

#[test]
fn unreadable_reviews_are_refused_with_their_uid_when_known() {
    let answer = well_formed(b"not json");
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["reason"], "InvalidReview");
    let answer = well_formed(
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"abc"}}"#,
    );
    assert_eq!(answer["response"]["uid"], "abc");
    assert_eq!(answer["response"]["allowed"], false);
    let answer = well_formed(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#);
    assert_eq!(answer["response"]["allowed"], false);
}

#[test]
fn a_delete_it_cannot_check_is_refused_not_allowed() {
    let mut old = ichor_api::TalosMachine::test("cp-1")
        .namespace("lab")
        .control_plane()
        .approved()
        .build();
    old.metadata.uid = Some("x".into());
    let body = support::machine_review(
        "u-1",
        "DELETE",
        "cp-1",
        "lab",
        Some(serde_json::to_value(&old).expect("the machine as JSON")),
    );
    let answer = well_formed(body.to_string().as_bytes());
    assert_eq!(answer["response"]["uid"], "u-1");
    assert_eq!(
        answer["response"]["allowed"], false,
        "fail closed: {answer}"
    );
    assert_eq!(
        answer["response"]["status"]["reason"],
        "LiveStateUnavailable"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        well_formed(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics(
        uid in "[a-z0-9-]{0,12}",
        operation in prop_oneof!["CREATE", "UPDATE", "DELETE", "CONNECT", "BOGUS"],
        kind in prop_oneof!["TalosMachine", "TalosCluster", "Pod", ""],
        old in prop_oneof![Just(serde_json::Value::Null), Just(serde_json::json!({})), Just(serde_json::json!({"spec": 1}))],
    ) {
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": kind},
                "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": "x"},
                "operation": operation,
                "userInfo": {},
                "oldObject": old,
                "object": old
            }
        });
        well_formed(body.to_string().as_bytes());
    }
}

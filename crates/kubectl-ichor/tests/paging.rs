//! The plugin lists in pages, against a real apiserver: a fleet larger than a page takes one
//! call per page and nothing is lost between pages.

use ichor_testenv::TestEnv;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

#[tokio::test]
async fn a_list_larger_than_a_page_takes_one_call_per_page_and_loses_nothing() {
    let env = TestEnv::shared().await.expect("control plane");
    let namespace = env.namespace("paging").await.expect("namespace");
    let api: Api<ConfigMap> = Api::namespaced(env.client(), &namespace);
    for i in 0..7 {
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("m{i}")),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &map)
            .await
            .expect("create");
    }
    let (items, calls) = kubectl_ichor::connect::list_pages(&api, "ConfigMaps", 3)
        .await
        .expect("list");
    let mut names: Vec<String> = items
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .filter(|n| n.starts_with('m'))
        .collect();
    names.sort();
    assert_eq!(names, (0..7).map(|i| format!("m{i}")).collect::<Vec<_>>());
    // 7 maps (plus the namespace's kube-root-ca.crt when a controller made it) in pages of 3.
    assert_eq!(calls, items.len().div_ceil(3), "{} objects", items.len());
    assert!(calls >= 3);
}

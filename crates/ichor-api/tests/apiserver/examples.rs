//! Every manifest under `examples/` is accepted as it is.

use kube::Api;
use kube::api::{DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};

use crate::support::{repo_root, setup};

#[tokio::test]
async fn every_example_is_accepted() {
    let (env, ns) = setup("examples").await;
    let dir = repo_root().join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/ exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "examples: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read example");
        let docs: Vec<DynamicObject> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{} parses: {e}", file.display()));
        for doc in docs {
            let types = doc.types.clone().expect("apiVersion and kind");
            let (group, version) = types.api_version.split_once('/').expect("group/version");
            let gvk = GroupVersionKind::gvk(group, version, &types.kind);
            let api: Api<DynamicObject> =
                Api::namespaced_with(env.client(), &ns, &ApiResource::from_gvk(&gvk));
            if let Err(err) = api.create(&PostParams::default(), &doc).await {
                panic!("{} is refused: {err}", file.display());
            }
        }
    }
}

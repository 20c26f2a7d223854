//! The `Version` reply as machined fills it (talos-facts §10.8): the build's tag, SHA, empty
//! build time, Go version, and the Go runtime's OS and architecture; the platform; and the
//! features, only once the node has a config.

use ichor_talos::api::machine::{
    FeaturesInfo, PlatformInfo, Version, VersionInfo, VersionResponse,
};

/// The SHA (8-hex `git describe` abbreviation of the tag's commit) and the Go version of
/// each Talos release build the simulator knows; other versions (simulated upgrade targets)
/// report the machinery module's `undefined` SHA and their release line's Go.
fn build(tag: &str) -> (&'static str, &'static str) {
    match tag {
        "v1.14.1" => ("2f86b9d2", "go1.26.8"),
        "v1.13.9" => ("3ebd10a7", "go1.26.6"),
        t if t.starts_with("v1.13.") => ("undefined", "go1.26.6"),
        _ => ("undefined", "go1.26.8"),
    }
}

/// The reply for a node running `tag`; `configured` once it has a machine config.
pub(crate) fn reply(tag: &str, configured: bool) -> VersionResponse {
    let (sha, go_version) = build(tag);
    VersionResponse {
        messages: vec![Version {
            metadata: None,
            version: Some(VersionInfo {
                tag: tag.to_owned(),
                sha: sha.into(),
                built: String::new(),
                go_version: go_version.into(),
                os: "linux".into(),
                arch: "amd64".into(),
            }),
            platform: Some(PlatformInfo {
                name: "metal".into(),
                mode: "metal".into(),
            }),
            features: configured.then_some(FeaturesInfo { rbac: true }),
        }],
    }
}

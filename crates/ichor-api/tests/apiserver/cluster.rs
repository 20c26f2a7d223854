//! TalosCluster rules.

use serde_json::json;

use crate::support::{api, cluster, create_ok, merge, merge_status, refused, setup};

#[tokio::test]
async fn accepts_a_valid_cluster_and_fills_defaults() {
    let (env, ns) = setup("tc-valid").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let created = create_ok(
        &clusters,
        cluster(
            "lab",
            json!({"discovery": {"cidrs": ["127.0.10.0/24", "192.168.10.0/24"]}}),
        ),
    )
    .await;
    let spec = &created["spec"];
    assert_eq!(spec["cni"]["preset"], "flannel");
    assert_eq!(spec["kubeProxy"], "enabled");
    assert_eq!(spec["network"]["podSubnets"], json!(["10.244.0.0/16"]));
    assert_eq!(spec["network"]["serviceSubnets"], json!(["10.96.0.0/12"]));
    assert_eq!(spec["network"]["dnsDomain"], "cluster.local");
    assert_eq!(spec["discovery"]["interval"], "5m");
}

#[tokio::test]
async fn discovery_cidrs_must_be_ipv4_valid_and_at_most_a_slash_24() {
    let (env, ns) = setup("tc-cidr").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |cidrs: serde_json::Value| cluster("c", json!({"discovery": {"cidrs": cidrs}}));
    refused(
        &clusters,
        with(json!(["fd00::/120"])),
        "discovery CIDRs must be IPv4",
    )
    .await;
    refused(
        &clusters,
        with(json!(["10.20.0.0/16"])),
        "no larger than a /24",
    )
    .await;
    refused(
        &clusters,
        with(json!(["10.20.0.300/24"])),
        "must be in CIDR notation",
    )
    .await;
    refused(
        &clusters,
        with(json!(["not-a-cidr"])),
        "must be in CIDR notation",
    )
    .await;
    refused(
        &clusters,
        with(json!([
            "10.0.1.0/24",
            "10.0.2.0/24",
            "10.0.3.0/24",
            "10.0.4.0/24",
            "10.0.5.0/24"
        ])),
        "must have at most 4 items",
    )
    .await;
    refused(&clusters, with(json!([])), "should have at least 1 items").await;
    create_ok(
        &clusters,
        cluster(
            "single-host",
            json!({"discovery": {"cidrs": ["10.0.1.7/32"]}}),
        ),
    )
    .await;
}

#[tokio::test]
async fn discovery_interval_is_a_bounded_duration() {
    let (env, ns) = setup("tc-interval").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |interval: &str| {
        cluster(
            "c",
            json!({"discovery": {"cidrs": ["10.0.1.0/24"], "interval": interval}}),
        )
    };
    refused(
        &clusters,
        with("1s"),
        "discovery.interval must be a duration from 10s to 24h",
    )
    .await;
    refused(
        &clusters,
        with("48h"),
        "discovery.interval must be a duration from 10s to 24h",
    )
    .await;
    create_ok(&clusters, with("30s")).await;
}

#[tokio::test]
async fn endpoint_is_required_and_must_be_https() {
    let (env, ns) = setup("tc-endpoint").await;
    let clusters = api(&env, &ns, "TalosCluster");
    refused(
        &clusters,
        cluster("c", json!({"endpoint": null})),
        "spec.endpoint: Required value",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"endpoint": "http://10.0.0.1:6443"})),
        "endpoint must be an https:// URL",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"endpoint": "10.0.0.1:6443"})),
        "endpoint must be an https:// URL",
    )
    .await;
    create_ok(
        &clusters,
        cluster("c", json!({"endpoint": "https://k8s.lab.internal:6443"})),
    )
    .await;
}

#[tokio::test]
async fn subnets_may_not_overlap_each_other_or_discovery() {
    let (env, ns) = setup("tc-overlap").await;
    let clusters = api(&env, &ns, "TalosCluster");
    refused(
        &clusters,
        cluster("c", json!({"network": {"podSubnets": ["10.96.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]}})),
        "network.podSubnets and network.serviceSubnets must not overlap",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"discovery": {"cidrs": ["10.244.3.0/24"]}})),
        "discovery.cidrs must not overlap network.podSubnets or network.serviceSubnets",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"network": {"podSubnets": ["bogus"]}})),
        "each entry of network.podSubnets must be a CIDR",
    )
    .await;
    create_ok(
        &clusters,
        cluster("c", json!({"network": {"podSubnets": ["10.200.0.0/16"], "serviceSubnets": ["10.201.0.0/16"]}})),
    )
    .await;
}

#[tokio::test]
async fn flannel_needs_kube_proxy() {
    let (env, ns) = setup("tc-flannel").await;
    let clusters = api(&env, &ns, "TalosCluster");
    refused(
        &clusters,
        cluster("c", json!({"kubeProxy": "disabled"})),
        "cni.preset flannel needs kubeProxy: enabled",
    )
    .await;
    create_ok(
        &clusters,
        cluster(
            "c",
            json!({"kubeProxy": "disabled", "cni": {"preset": "cilium"}}),
        ),
    )
    .await;
}

#[tokio::test]
async fn cni_preset_is_immutable() {
    let (env, ns) = setup("tc-cni").await;
    let clusters = api(&env, &ns, "TalosCluster");
    create_ok(
        &clusters,
        cluster("c", json!({"cni": {"preset": "cilium"}})),
    )
    .await;
    let err = merge(&clusters, "c", json!({"spec": {"cni": {"preset": "none"}}}))
        .await
        .expect_err("the preset cannot change");
    assert!(err.contains("cni.preset is immutable"), "{err}");
    merge(
        &clusters,
        "c",
        json!({"spec": {"controlPlane": {"count": 5}}}),
    )
    .await
    .expect("other fields still change");
}

#[tokio::test]
async fn counts_versions_and_enums_are_checked() {
    let (env, ns) = setup("tc-fields").await;
    let clusters = api(&env, &ns, "TalosCluster");
    refused(
        &clusters,
        cluster("c", json!({"controlPlane": {"count": 0}})),
        "should be greater than or equal to 1",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"controlPlane": {"count": 11}})),
        "should be less than or equal to 9",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"talosVersion": "v1.12.4"})),
        "spec.talosVersion",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"talosVersion": "latest"})),
        "spec.talosVersion",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"kubernetesVersion": "one"})),
        "spec.kubernetesVersion",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"cni": {"preset": "calico"}})),
        "Unsupported value: \"calico\"",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"kubeProxy": "maybe"})),
        "Unsupported value: \"maybe\"",
    )
    .await;
    refused(
        &clusters,
        cluster(
            "c",
            json!({"install": {"disk": "/dev/sda", "diskSelector": {"match": "true"}}}),
        ),
        "set install.disk or install.diskSelector, not both",
    )
    .await;
    refused(
        &clusters,
        cluster("c", json!({"install": {"disk": "sda"}})),
        "spec.install.disk",
    )
    .await;
}

#[tokio::test]
async fn secrets_ref_never_names_a_secret_ichor_publishes_for_the_cluster() {
    let (env, ns) = setup("tc-secrets-ref").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let naming = |cluster_name: &str, secret: &str| {
        cluster(cluster_name, json!({"secretsRef": {"name": secret}}))
    };
    for secret in ["lab-kubeconfig", "lab-talosconfig", "cp-1-applied-config"] {
        refused(
            &clusters,
            naming("lab", secret),
            "spec.secretsRef.name must not be <cluster>-kubeconfig, <cluster>-talosconfig or end in -applied-config",
        )
        .await;
    }
    // The default bundle name, and names another cluster publishes under (found taken by the
    // manager, never written), are accepted.
    create_ok(&clusters, naming("lab", "lab-secrets")).await;
    create_ok(&clusters, naming("other", "lab-kubeconfig")).await;
    // Changed to such a name later: refused too; the status is written as before.
    let stored = merge(
        &clusters,
        "lab",
        json!({"spec": {"secretsRef": {"name": "lab-talosconfig"}}}),
    )
    .await;
    assert!(
        stored.is_err_and(|m| m.contains("spec.secretsRef.name must not be")),
        "a change to a published name is refused"
    );
    let status = merge_status(
        &clusters,
        "lab",
        json!({"status": {"secretsSecret": "lab-secrets"}}),
    )
    .await;
    assert_eq!(status["status"]["secretsSecret"], "lab-secrets");
}

#[tokio::test]
async fn schematics_hold_only_what_hashes_exactly_and_factories_are_urls() {
    let (env, ns) = setup("tc-schematic").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |schematic: serde_json::Value| cluster("c", json!({"schematic": schematic}));
    refused(
        &clusters,
        with(json!({"systemExtensions": ["siderolabs/gvisor", "siderolabs/gvisor"]})),
        "must not name an extension twice",
    )
    .await;
    refused(
        &clusters,
        with(json!({"systemExtensions": ["Siderolabs/GVisor"]})),
        "should match",
    )
    .await;
    for arg in ["off", "console=tty0 quiet", "9600", "a:", "#x"] {
        refused(
            &clusters,
            with(json!({"extraKernelArgs": [arg]})),
            "each schematic.extraKernelArgs entry must be one argument",
        )
        .await;
    }
    for value in ["yes", "10", "2026-12-06", "null"] {
        refused(
            &clusters,
            with(json!({"meta": [{"key": 10, "value": value}]})),
            "must not read as a YAML bool, number, date or null",
        )
        .await;
    }
    for value in ["two\nlines", " padded"] {
        refused(
            &clusters,
            with(json!({"meta": [{"key": 10, "value": value}]})),
            "must be one line of printable characters",
        )
        .await;
    }
    refused(
        &clusters,
        with(json!({"meta": [{"key": 256, "value": "x"}]})),
        "should be less than or equal to 255",
    )
    .await;
    refused(
        &clusters,
        cluster("f", json!({"imageFactory": {"url": "factory.talos.dev"}})),
        "imageFactory.url must be an http(s):// URL",
    )
    .await;
    refused(
        &clusters,
        cluster(
            "f",
            json!({"imageFactory": {"url": "https://factory.talos.dev/image"}}),
        ),
        "imageFactory.url must be an http(s):// URL",
    )
    .await;
    let created = create_ok(
        &clusters,
        cluster(
            "gpu",
            json!({
                "schematic": {
                    "systemExtensions": ["siderolabs/nvidia-open-gpu-kernel-modules-lts", "siderolabs/intel-ucode"],
                    "extraKernelArgs": ["net.ifnames=0", "console=ttyS0,115200"],
                    "meta": [{"key": 10, "value": "{\"externalIPs\":[\"1.2.3.4\"]}"}],
                    "bootloader": "sd-boot",
                },
                "imageFactory": {"url": "http://127.0.0.1:8080"},
            }),
        ),
    )
    .await;
    assert_eq!(created["spec"]["imageFactory"]["secureBoot"], false);
    assert_eq!(created["spec"]["drain"]["enabled"], true);
    assert_eq!(created["spec"]["drain"]["timeout"], "10m");
    assert_eq!(created["spec"]["drain"]["onTimeout"], "Wait");
    let plain = create_ok(&clusters, cluster("plain", json!({}))).await;
    assert_eq!(
        plain["spec"]["imageFactory"]["url"],
        "https://factory.talos.dev"
    );
    refused(
        &clusters,
        cluster("d", json!({"drain": {"timeout": "5s"}})),
        "drain.timeout must be a duration from 10s to 24h",
    )
    .await;
}

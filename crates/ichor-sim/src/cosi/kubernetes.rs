//! The Kubernetes components of a control plane (talos-facts §14):
//! `StaticPodStatuses.kubernetes.talos.dev`, the kubelet's status of each control-plane static
//! pod ([`crate::kubelet`]), and `Manifests.kubernetes.talos.dev`, the bootstrap manifests
//! Talos renders from the config.
//!
//! Both specs are Go `map[string]any` values: the YAML is the map (a StaticPodStatus's
//! `MarshalYAML` is its pod status, a Manifest's the list of its objects) with go-yaml's key
//! order, the protobuf a `google.protobuf.Struct` (talos-facts §14.1, §14.4).
//!
//! Of the bootstrap manifests, the simulator renders `10-kube-proxy`, `11-core-dns` and
//! `11-core-dns-svc` (talos-facts §14.5); the others are not served.

use std::net::IpAddr;
use std::time::SystemTime;

use ichor_talos::api::resource::definitions::k8s::{
    ManifestSpec, SingleManifest, StaticPodStatusSpec,
};
use prost::Message as _;
use serde_json::{Value, json};

use super::Wanted;
use super::store::Res;
use super::yaml::{Yaml, from_json, marshal};
use crate::Node;
use crate::apply::Minor;
use crate::kubelet::Reported;
use crate::network::Shared;

/// The type of static pod statuses.
pub(crate) const STATIC_POD_STATUS: &str = "StaticPodStatuses.kubernetes.talos.dev";
/// The type of bootstrap manifests.
pub(crate) const MANIFEST: &str = "Manifests.kubernetes.talos.dev";

/// A JSON value as a `google.protobuf.Value` (what `structpb.NewValue` makes of Go's `any`).
fn proto_value(value: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(proto_value).collect(),
        }),
        Value::Object(_) => Kind::StructValue(proto_struct(value)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A JSON object as a `google.protobuf.Struct` (anything else: an empty one).
fn proto_struct(value: &Value) -> prost_types::Struct {
    prost_types::Struct {
        fields: value
            .as_object()
            .map(|map| {
                map.iter()
                    .map(|(k, v)| (k.clone(), proto_value(v)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// `metav1.Time` in JSON: RFC 3339 in UTC, to the second.
fn time(t: SystemTime) -> Value {
    let mut stamp = prost_types::Timestamp::from(t);
    stamp.nanos = 0;
    Value::String(stamp.to_string())
}

/// The image's digest reference, as the CRI reports a pulled image (`repo@sha256:…`).
fn image_id(image: &str) -> String {
    let repository = match image.rfind(':') {
        Some(at) if !image[at..].contains('/') => &image[..at],
        _ => image,
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, image.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{repository}@sha256:{hex}")
}

/// The kubelet's PodStatus of a static pod, as JSON (talos-facts §14.1): running, with its
/// one container, ready or not; the pod on the host network, so its IP is the node's.
fn pod_status(pod: &Reported, host_ip: &str) -> Value {
    let started = time(pod.run.started);
    let transition = time(pod.transition);
    let ready = if pod.ready { "True" } else { "False" };
    let condition = |kind: &str, status: &str, at: &Value| {
        let mut c = json!({
            "type": kind,
            "status": status,
            "lastProbeTime": null,
            "lastTransitionTime": at,
        });
        if status == "False" {
            c["reason"] = json!("ContainersNotReady");
            c["message"] = json!(format!("containers with unready status: [{}]", pod.name));
        }
        c
    };
    json!({
        "phase": "Running",
        "conditions": [
            condition("PodReadyToStartContainers", "True", &started),
            condition("Initialized", "True", &started),
            condition("Ready", ready, &transition),
            condition("ContainersReady", ready, &transition),
            condition("PodScheduled", "True", &started),
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": host_ip,
        "podIPs": [{"ip": host_ip}],
        "startTime": started,
        "containerStatuses": [{
            "name": pod.name,
            "state": {"running": {"startedAt": started}},
            "lastState": {},
            "ready": pod.ready,
            "restartCount": 0,
            "image": pod.run.image,
            "imageID": image_id(&pod.run.image),
            "containerID": format!("containerd://{}", pod.run.container_id),
            "started": true,
        }],
        "qosClass": "Burstable",
    })
}

/// The node's static pod statuses: id `kube-system/<pod>-<nodename>` (talos-facts §14.1).
fn static_pod_statuses(node: &Node, shared: &Shared) -> Vec<Res> {
    let nodename = node.hostname().to_lowercase();
    let host_ip = shared.addr.ip().to_string();
    node.static_pods
        .reported(node.timings.static_pod)
        .iter()
        .map(|pod| {
            let status = pod_status(pod, &host_ip);
            let spec = StaticPodStatusSpec {
                pod_status: Some(proto_struct(&status)),
            };
            Res::new(
                "k8s",
                STATIC_POD_STATUS,
                format!("kube-system/{}-{nodename}", pod.name),
                "k8s.KubeletStaticPodController",
                marshal(&from_json(&status)),
                spec.encode_to_vec(),
            )
        })
        .collect()
}

/// What the bootstrap manifests are rendered from (Talos's `BootstrapManifestsConfig`, the
/// part the simulator renders; talos-facts §14.5).
struct Bootstrap {
    cluster_domain: String,
    dns_ipv4: Option<String>,
    dns_ipv6: Option<String>,
    /// kube-proxy, when it is on.
    proxy: Option<Proxy>,
    /// CoreDNS's image, when it is on.
    coredns: Option<String>,
}

/// kube-proxy as the config asks for it.
struct Proxy {
    image: String,
    /// Its arguments after the binary.
    args: Vec<String>,
    /// Its configuration file (a 1.14 `KubeProxyConfig` document): the file's YAML, and the
    /// hex SHA-256 of it.
    config: Option<(String, String)>,
}

/// The 10th address after a subnet's network address (`k8s.DNSServiceAddrs`).
fn dns_service_addr(cidr: &str) -> Option<IpAddr> {
    let (addr, _) = cidr.split_once('/')?;
    match addr.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) => Some(IpAddr::V4(std::net::Ipv4Addr::from(
            u32::from(v4).checked_add(10)?,
        ))),
        IpAddr::V6(v6) => Some(IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(v6).checked_add(10)?,
        ))),
    }
}

/// A string list, or `default` when absent or empty.
fn strings_or(value: &Value, default: &str) -> Vec<String> {
    let list: Vec<String> = value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    if list.is_empty() {
        vec![default.to_owned()]
    } else {
        list
    }
}

/// A string, or `default` when absent or empty.
fn str_or(value: &Value, default: impl FnOnce() -> String) -> String {
    value
        .as_str()
        .filter(|s| !s.is_empty())
        .map_or_else(default, str::to_owned)
}

impl Bootstrap {
    /// From the config documents: a 1.14 document of a kind first, else its v1alpha1
    /// section (`container.Container`'s `K8s*Config`), else Talos's defaults.
    fn from_documents(documents: &[Value], minor: Minor) -> Self {
        let v1alpha1 = documents
            .iter()
            .find(|d| d["version"] == "v1alpha1" && d.get("kind").is_none());
        let cluster = v1alpha1.map_or(&Value::Null, |d| &d["cluster"]);
        let kind = |k: &str| documents.iter().find(|d| d["kind"] == k);
        let network = kind("KubeNetworkConfig").unwrap_or(&cluster["network"]);
        let cluster_domain = str_or(&network["dnsDomain"], || "cluster.local".to_owned());
        let pod_cidrs = strings_or(&network["podSubnets"], "10.244.0.0/16");
        let dns: Vec<IpAddr> = strings_or(&network["serviceSubnets"], "10.96.0.0/12")
            .iter()
            .filter_map(|c| dns_service_addr(c))
            .collect();
        let default_proxy = || {
            format!(
                "registry.k8s.io/kube-proxy:v{}",
                crate::apply::default_k8s(minor)
            )
        };
        let proxy = match kind("KubeProxyConfig") {
            Some(doc) if doc["enabled"] == false => None,
            Some(doc) => Some(Proxy {
                image: str_or(&doc["image"], default_proxy),
                args: proxy_args(doc, &[], "config"),
                config: Some(proxy_config_file(doc, &pod_cidrs)),
            }),
            None if cluster["proxy"]["disabled"] == true => None,
            None => {
                let proxy = &cluster["proxy"];
                let mode = str_or(&proxy["mode"], || "nftables".to_owned());
                let defaults = [
                    ("cluster-cidr", pod_cidrs.join(",")),
                    ("hostname-override", "$(NODE_NAME)".to_owned()),
                    ("kubeconfig", "/etc/kubernetes/kubeconfig".to_owned()),
                    ("proxy-mode", mode),
                    ("conntrack-max-per-core", "0".to_owned()),
                ];
                Some(Proxy {
                    image: str_or(&proxy["image"], default_proxy),
                    args: proxy_args(proxy, &defaults, "kubeconfig"),
                    config: None,
                })
            }
        };
        let coredns_default = match minor {
            Minor::V13 => "registry.k8s.io/coredns/coredns:v1.14.6",
            Minor::V14 => "registry.k8s.io/coredns/coredns:v1.14.7",
        };
        let (disabled, coredns) = kind("KubeCoreDNSConfig").map_or_else(
            || (cluster["coreDNS"]["disabled"] == true, &cluster["coreDNS"]),
            |d| (d["enabled"] == false, d),
        );
        Self {
            cluster_domain,
            dns_ipv4: dns.iter().find(|a| a.is_ipv4()).map(ToString::to_string),
            dns_ipv6: dns.iter().find(|a| a.is_ipv6()).map(ToString::to_string),
            proxy,
            coredns: (!disabled).then(|| str_or(&coredns["image"], || coredns_default.to_owned())),
        }
    }
}

/// kube-proxy's arguments (`manageProxyConfigArgs`): `defaults` merged with the config's
/// `extraArgs` (a value replaces the default; `denied` may not be overridden, so Talos keeps
/// its own), each `--key=value`, keys sorted. With a configuration file the defaults are
/// `--config` and `--hostname-override`.
fn proxy_args(proxy: &Value, defaults: &[(&str, String)], denied: &str) -> Vec<String> {
    let mut args: std::collections::BTreeMap<String, Vec<String>> = if defaults.is_empty() {
        [
            ("config", "/var/lib/kube-proxy/config.conf".to_owned()),
            ("hostname-override", "$(NODE_NAME)".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), vec![v]))
        .collect()
    } else {
        defaults
            .iter()
            .map(|(k, v)| ((*k).to_owned(), vec![v.clone()]))
            .collect()
    };
    if let Some(extra) = proxy["extraArgs"].as_object() {
        for (key, value) in extra {
            if key == denied {
                continue;
            }
            let values = match value {
                Value::String(s) => vec![s.clone()],
                Value::Array(items) => items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
                _ => continue,
            };
            args.insert(key.clone(), values);
        }
    }
    args.iter()
        .flat_map(|(k, vs)| vs.iter().map(move |v| format!("--{k}={v}")))
        .collect()
}

/// kube-proxy's configuration file from a `KubeProxyConfig` document: its `config`, with the
/// kind, the kubeconfig, and (unless set) the cluster CIDR, the mode and
/// `conntrack.maxPerCore: 0`; written by `sigs.k8s.io/yaml`. Returns (YAML, hex SHA-256).
fn proxy_config_file(doc: &Value, pod_cidrs: &[String]) -> (String, String) {
    let mut config = match &doc["config"] {
        Value::Object(map) => map.clone(),
        _ => serde_json::Map::new(),
    };
    config.insert(
        "apiVersion".into(),
        json!("kubeproxy.config.k8s.io/v1alpha1"),
    );
    config.insert("kind".into(), json!("KubeProxyConfiguration"));
    let client = config
        .entry("clientConnection")
        .or_insert_with(|| json!({}));
    if !client.is_object() {
        *client = json!({});
    }
    client["kubeconfig"] = json!("/etc/kubernetes/kubeconfig");
    config
        .entry("clusterCIDR")
        .or_insert_with(|| json!(pod_cidrs.join(",")));
    config
        .entry("mode")
        .or_insert_with(|| json!(str_or(&doc["mode"], || "nftables".to_owned())));
    let conntrack = config.entry("conntrack").or_insert_with(|| json!({}));
    if !conntrack.is_object() {
        *conntrack = json!({});
    }
    if conntrack.get("maxPerCore").is_none() {
        conntrack["maxPerCore"] = json!(0);
    }
    let yaml = super::yaml::marshal_k8s(&Value::Object(config));
    let digest = ring::digest::digest(&ring::digest::SHA256, yaml.as_bytes());
    let hex = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    (yaml, hex)
}

/// The node affinity of Talos's DaemonSets and Deployments (`k8stemplates/affinity.go`).
fn node_affinity() -> Value {
    json!({
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{
                "matchExpressions": [
                    {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
                ],
            }],
        },
    })
}

/// `10-kube-proxy`: the configuration file's ConfigMap (named after the file's checksum),
/// the DaemonSet, its service account and role binding.
fn kube_proxy(proxy: &Proxy) -> Vec<Value> {
    let labels = json!({"k8s-app": "kube-proxy", "tier": "node"});
    let mut command = vec!["/usr/local/bin/kube-proxy".to_owned()];
    command.extend(proxy.args.iter().cloned());
    let image = &proxy.image;
    let mut mounts = vec![
        json!({"mountPath": "/lib/modules", "name": "lib-modules", "readOnly": true}),
        json!({"mountPath": "/etc/ssl/certs", "name": "ssl-certs-host", "readOnly": true}),
        json!({"mountPath": "/etc/kubernetes", "name": "kubeconfig", "readOnly": true}),
    ];
    let mut volumes = vec![
        json!({"hostPath": {"path": "/usr/lib/modules"}, "name": "lib-modules"}),
        json!({"hostPath": {"path": "/etc/ssl/certs"}, "name": "ssl-certs-host"}),
        json!({"configMap": {"name": "kubeconfig-in-cluster"}, "name": "kubeconfig"}),
    ];
    let mut objects = Vec::new();
    if let Some((file, checksum)) = &proxy.config {
        let name = format!("kube-proxy-config-{}", &checksum[..checksum.len().min(16)]);
        objects.push(json!({
            "apiVersion": "v1",
            "data": {"config.conf": file},
            "kind": "ConfigMap",
            "metadata": {"labels": labels, "name": name, "namespace": "kube-system"},
        }));
        mounts
            .push(json!({"mountPath": "/var/lib/kube-proxy", "name": "config", "readOnly": true}));
        volumes.push(json!({"configMap": {"name": name}, "name": "config"}));
    }
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    objects.extend([
        json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"labels": labels, "name": "kube-proxy", "namespace": "kube-system"},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "affinity": {"nodeAffinity": node_affinity()},
                        "containers": [{
                            "command": command,
                            "env": [
                                {"name": "NODE_NAME", "valueFrom": field("spec.nodeName")},
                                {"name": "POD_IP", "valueFrom": field("status.podIP")},
                            ],
                            "image": image,
                            "name": "kube-proxy",
                            "resources": {"requests": {"cpu": "100m", "memory": "50Mi"}},
                            "securityContext": {"privileged": true},
                            "volumeMounts": mounts,
                        }],
                        "hostNetwork": true,
                        "priorityClassName": "system-cluster-critical",
                        "serviceAccountName": "kube-proxy",
                        "tolerations": [
                            {"effect": "NoSchedule", "operator": "Exists"},
                            {"effect": "NoExecute", "operator": "Exists"},
                        ],
                        "volumes": volumes,
                    },
                },
                "updateStrategy": {"rollingUpdate": {"maxUnavailable": 1}, "type": "RollingUpdate"},
            },
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kube-proxy"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:node-proxier",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system"}],
        }),
    ]);
    objects
}

/// CoreDNS's Corefile for a cluster domain (`CoreDNSConfigMap`).
fn corefile(domain: &str) -> String {
    format!(
        ".:53 {{
    errors
    health {{
        lameduck 5s
    }}
    ready
    log . {{
        class error
    }}
    prometheus :9153

    kubernetes {domain} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    forward . /etc/resolv.conf {{
       max_concurrent 1000
    }}
    cache 30 {{
       disable success {domain}
       disable denial {domain}
    }}
    loop
    reload
    loadbalance
}}
"
    )
}

/// `11-core-dns`: service account, cluster role and binding, config map and Deployment.
fn core_dns(image: &str, domain: &str) -> Vec<Value> {
    let bootstrapping = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
    let http_get = |path: &str, port: u16| json!({"path": path, "port": port, "scheme": "HTTP"});
    vec![
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"labels": bootstrapping, "name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {
                "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
                "labels": bootstrapping,
                "name": "system:coredns",
            },
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        }),
        json!({
            "apiVersion": "v1",
            "data": {"Corefile": corefile(domain)},
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
        }),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"},
                "name": "coredns",
                "namespace": "kube-system",
            },
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                "strategy": {"rollingUpdate": {"maxUnavailable": 1}, "type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": {"k8s-app": "kube-dns"}},
                    "spec": {
                        "affinity": {
                            "nodeAffinity": node_affinity(),
                            "podAntiAffinity": {
                                "preferredDuringSchedulingIgnoredDuringExecution": [{
                                    "podAffinityTerm": {
                                        "labelSelector": {"matchExpressions": [
                                            {"key": "k8s-app", "operator": "In", "values": ["kube-dns"]},
                                        ]},
                                        "topologyKey": "kubernetes.io/hostname",
                                    },
                                    "weight": 100,
                                }],
                            },
                        },
                        "containers": [{
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "env": [{"name": "GOMEMLIMIT", "value": "161MiB"}],
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "livenessProbe": {
                                "failureThreshold": 5,
                                "httpGet": http_get("/health", 8080),
                                "initialDelaySeconds": 60,
                                "successThreshold": 1,
                                "timeoutSeconds": 5,
                            },
                            "name": "coredns",
                            "ports": [
                                {"containerPort": 53, "name": "dns", "protocol": "UDP"},
                                {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"},
                                {"containerPort": 9153, "name": "metrics", "protocol": "TCP"},
                            ],
                            "readinessProbe": {"httpGet": http_get("/ready", 8181)},
                            "resources": {
                                "limits": {"memory": "170Mi"},
                                "requests": {"cpu": "100m", "memory": "70Mi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                                "readOnlyRootFilesystem": true,
                            },
                            "volumeMounts": [{"mountPath": "/etc/coredns", "name": "config-volume", "readOnly": true}],
                        }],
                        "dnsPolicy": "Default",
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "priorityClassName": "system-cluster-critical",
                        "serviceAccountName": "coredns",
                        "tolerations": [
                            {"effect": "NoSchedule", "key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
                            {"effect": "NoSchedule", "key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists"},
                        ],
                        "volumes": [{
                            "configMap": {"items": [{"key": "Corefile", "path": "Corefile"}], "name": "coredns"},
                            "name": "config-volume",
                        }],
                    },
                },
            },
        }),
    ]
}

/// `11-core-dns-svc`: the `kube-dns` Service on the DNS service address(es).
fn core_dns_service(ipv4: Option<&str>, ipv6: Option<&str>) -> Value {
    let ips: Vec<&str> = ipv4.into_iter().chain(ipv6).collect();
    let families: Vec<&str> = ipv4
        .map(|_| "IPv4")
        .into_iter()
        .chain(ipv6.map(|_| "IPv6"))
        .collect();
    let mut spec = json!({
        "clusterIP": ips.first().copied().unwrap_or_default(),
        "ipFamilyPolicy": if ips.len() == 2 { "RequireDualStack" } else { "SingleStack" },
        "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
            {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153},
        ],
        "selector": {"k8s-app": "kube-dns"},
    });
    if !ips.is_empty() {
        spec["clusterIPs"] = json!(ips);
        spec["ipFamilies"] = json!(families);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "annotations": {"prometheus.io/port": "9153", "prometheus.io/scrape": "true"},
            "labels": {
                "k8s-app": "kube-dns",
                "kubernetes.io/cluster-service": "true",
                "kubernetes.io/name": "CoreDNS",
            },
            "name": "kube-dns",
            "namespace": "kube-system",
        },
        "spec": spec,
    })
}

/// One Manifest resource.
fn manifest(id: &str, objects: &[Value]) -> Res {
    let spec = ManifestSpec {
        items: objects
            .iter()
            .map(|o| SingleManifest {
                object: Some(proto_struct(o)),
            })
            .collect(),
    };
    Res::new(
        "controlplane",
        MANIFEST,
        id,
        "k8s.ManifestController",
        marshal(&Yaml::Seq(objects.iter().map(from_json).collect())),
        spec.encode_to_vec(),
    )
}

/// The bootstrap manifests of a control plane's running config.
fn manifests(node: &Node, shared: &Shared) -> Vec<Res> {
    let Some(config) = node.running.as_ref().filter(|c| c.is_control_plane()) else {
        return Vec::new();
    };
    let minor = if shared.is_1_14() {
        Minor::V14
    } else {
        Minor::V13
    };
    let bootstrap = Bootstrap::from_documents(&config.documents, minor);
    let mut out = Vec::new();
    if let Some(proxy) = &bootstrap.proxy {
        out.push(manifest("10-kube-proxy", &kube_proxy(proxy)));
    }
    if let Some(image) = &bootstrap.coredns {
        out.push(manifest(
            "11-core-dns",
            &core_dns(image, &bootstrap.cluster_domain),
        ));
        out.push(manifest(
            "11-core-dns-svc",
            &[core_dns_service(
                bootstrap.dns_ipv4.as_deref(),
                bootstrap.dns_ipv6.as_deref(),
            )],
        ));
    }
    out
}

/// The node's Kubernetes component resources.
pub(crate) fn resources(node: &Node, shared: &Shared, want: &Wanted) -> Vec<Res> {
    let mut out = Vec::new();
    if want.has(STATIC_POD_STATUS) {
        out.extend(static_pod_statuses(node, shared));
    }
    if want.has(MANIFEST) {
        out.extend(manifests(node, shared));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dns_service_address_is_the_tenth_of_the_subnet() {
        assert_eq!(
            dns_service_addr("10.96.0.0/12").map(|a| a.to_string()),
            Some("10.96.0.10".into())
        );
        assert_eq!(
            dns_service_addr("fd00::/108").map(|a| a.to_string()),
            Some("fd00::a".into())
        );
    }

    #[test]
    fn kube_proxy_arguments_are_talos_defaults_merged_with_extra_args() {
        let v1alpha1 = json!({"version": "v1alpha1", "cluster": {"proxy": {
            "extraArgs": {"proxy-mode": "ipvs", "kubeconfig": "/x"},
        }}});
        let proxy = Bootstrap::from_documents(&[v1alpha1], Minor::V14)
            .proxy
            .expect("kube-proxy");
        assert_eq!(proxy.image, "registry.k8s.io/kube-proxy:v1.37.0");
        assert!(proxy.config.is_none());
        assert_eq!(
            proxy.args,
            [
                "--cluster-cidr=10.244.0.0/16",
                "--conntrack-max-per-core=0",
                "--hostname-override=$(NODE_NAME)",
                "--kubeconfig=/etc/kubernetes/kubeconfig",
                "--proxy-mode=ipvs",
            ]
        );
    }

    #[test]
    fn a_kube_proxy_config_document_renders_a_configuration_file() {
        let doc = json!({"kind": "KubeProxyConfig", "config": {},
            "image": "registry.k8s.io/kube-proxy:v1.36.3"});
        let bootstrap = Bootstrap::from_documents(&[doc], Minor::V14);
        let proxy = bootstrap.proxy.expect("kube-proxy");
        assert_eq!(
            proxy.args,
            [
                "--config=/var/lib/kube-proxy/config.conf",
                "--hostname-override=$(NODE_NAME)"
            ]
        );
        let (file, _) = proxy.config.as_ref().expect("a configuration file");
        // Talos's golden file (`k8stemplates/testdata/kube-proxy-configmap.yaml`, v1.14.1).
        assert_eq!(
            file,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nclientConnection:\n  kubeconfig: /etc/kubernetes/kubeconfig\nclusterCIDR: 10.244.0.0/16\nconntrack:\n  maxPerCore: 0\nkind: KubeProxyConfiguration\nmode: nftables\n"
        );
        let objects = kube_proxy(&proxy);
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "ConfigMap",
                "DaemonSet",
                "ServiceAccount",
                "ClusterRoleBinding"
            ]
        );
        assert_eq!(
            objects[0]["metadata"]["name"],
            objects[1]["spec"]["template"]["spec"]["volumes"][3]["configMap"]["name"]
        );
        assert_eq!(bootstrap.dns_ipv4.as_deref(), Some("10.96.0.10"));
        assert_eq!(
            bootstrap.coredns.as_deref(),
            Some("registry.k8s.io/coredns/coredns:v1.14.7")
        );
    }

    #[test]
    fn a_manifest_is_its_objects_with_go_yamls_key_order() {
        let res = manifest(
            "11-core-dns-svc",
            &[core_dns_service(Some("10.96.0.10"), None)],
        );
        assert!(
            res.yaml
                .starts_with("- apiVersion: v1\n  kind: Service\n  metadata:\n"),
            "{}",
            res.yaml
        );
        assert!(
            res.yaml.contains("        prometheus.io/port: \"9153\"\n"),
            "{}",
            res.yaml
        );
        let decoded = ManifestSpec::decode(res.proto.as_slice()).expect("protobuf");
        assert_eq!(decoded.items.len(), 1);
    }
}

//! Packaging: the Helm chart lints and renders with a real `helm` (built from Go modules by
//! `cargo xtask test`, `ICHOR_HELM_BIN`), and what it renders is accepted by a real apiserver
//! with strict field validation; the roles it ships are `config/rbac/` itself; the images are
//! distroless and non-root; the binaries the e2e ran are statically linked.

use std::path::{Path, PathBuf};
use std::process::Command;

use ichor_api::admission;
use ichor_testenv::TestEnv;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;
use kube::api::{
    Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams, ValidationDirective,
};
use kube::discovery::{Discovery, Scope};
use object::Endianness;
use object::elf::{FileHeader64, PT_INTERP};
use object::read::elf::{FileHeader as _, ProgramHeader as _};
use serde_json::Value;

const NAMESPACE: &str = "ichor-chart";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn helm() -> PathBuf {
    std::env::var_os("ICHOR_HELM_BIN").map(PathBuf::from).expect(
        "ICHOR_HELM_BIN is not set: run `cargo xtask test` (it builds helm from tools/helm) or point it at a helm v4 binary",
    )
}

fn helm_run(args: &[&str]) -> String {
    let output = Command::new(helm())
        .current_dir(root())
        .args(args)
        .output()
        .expect("run helm");
    assert!(
        output.status.success(),
        "helm {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn render(extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        "ichor",
        "charts/ichor",
        "--namespace",
        NAMESPACE,
        "--include-crds",
    ];
    args.extend_from_slice(extra);
    let text = helm_run(&args);
    serde_saphyr::from_multiple::<Value>(&text)
        .expect("helm renders YAML")
        .into_iter()
        .filter(|v| v.is_object())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the chart renders no {kind} {name}"))
}

#[test]
fn the_chart_lints_strictly() {
    let out = helm_run(&["lint", "--strict", "charts/ichor"]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[test]
fn the_service_monitor_is_optional() {
    let kinds = |docs: Vec<Value>| -> Vec<String> {
        docs.iter()
            .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert!(!kinds(render(&[])).contains(&"ServiceMonitor".to_owned()));
    assert!(
        kinds(render(&["--set", "metrics.serviceMonitor.enabled=true"]))
            .contains(&"ServiceMonitor".to_owned())
    );
}

#[test]
fn the_chart_ships_the_generated_roles_crds_and_policy_unchanged() {
    let docs = render(&[]);
    // The roles are config/rbac/ (generated from ichor-api), moved to the release namespace.
    let rules = |doc: &Value| doc["rules"].clone();
    assert_eq!(
        rules(find(&docs, "ClusterRole", admission::MANAGER_NAME)),
        serde_json::to_value(admission::manager_cluster_role().rules).expect("rules")
    );
    assert_eq!(
        rules(find(&docs, "Role", admission::WEBHOOK_NAME)),
        serde_json::to_value(admission::webhook_role(NAMESPACE).rules).expect("rules")
    );
    assert_eq!(
        find(&docs, "Role", admission::MANAGER_NAME)["metadata"]["namespace"],
        NAMESPACE
    );
    for crd in ichor_api::crds() {
        let name = crd.metadata.name.clone().expect("name");
        let rendered = find(&docs, "CustomResourceDefinition", &name);
        assert_eq!(
            rendered["spec"],
            serde_json::to_value(&crd.spec).expect("spec"),
            "{name} is the generated CRD"
        );
    }
    let webhook = find(
        &docs,
        "ValidatingWebhookConfiguration",
        admission::WEBHOOK_CONFIGURATION,
    );
    let service = &webhook["webhooks"][0]["clientConfig"]["service"];
    assert_eq!(service["namespace"], NAMESPACE);
    assert_eq!(service["name"], "ichor-webhook");
    assert!(
        webhook["webhooks"][0]["clientConfig"]
            .get("caBundle")
            .is_none(),
        "the webhook injects its CA; the chart never sets one"
    );
    find(
        &docs,
        "ValidatingAdmissionPolicy",
        "ichor-kube-proxy-switch",
    );
    find(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "ichor-kube-proxy-switch",
    );
}

/// Chart values that turn on every optional part of the webhook's admission port: its client
/// CA (a ConfigMap, a volume, a variable) and its admitted sources (an ipBlock and a peer).
const WEBHOOK_ACCESS: &[&str] = &[
    "--set-string",
    "webhook.clientAuth.caBundle=-----BEGIN CERTIFICATE-----",
    "--set-json",
    r#"networkPolicy.webhookSources=["10.0.0.10/32",{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kube-system"}}}]"#,
];

/// The sources the webhook's NetworkPolicy admits to its admission port: `None` when the port
/// is in no rule (no source), `Some([])` for any source.
fn webhook_port_sources(docs: &[Value]) -> Option<Vec<Value>> {
    let policy = find(docs, "NetworkPolicy", admission::WEBHOOK_NAME);
    policy["spec"]["ingress"]
        .as_array()
        .expect("ingress rules")
        .iter()
        .find(|rule| {
            rule["ports"]
                .as_array()
                .is_some_and(|ports| ports.iter().any(|p| p["port"] == "webhook"))
        })
        .map(|rule| rule["from"].as_array().cloned().unwrap_or_default())
}

#[test]
fn the_webhook_port_admits_only_the_apiserver() {
    // Neither a client CA nor sources: no source may call the webhook (it fails closed).
    let closed = render(&[]);
    assert_eq!(webhook_port_sources(&closed), None);
    assert!(
        closed
            .iter()
            .all(|d| d["metadata"]["name"] != "ichor-webhook-client-ca"),
        "no client CA, no ConfigMap"
    );
    // The apiserver's addresses: only they.
    let named = render(&[
        "--set-json",
        r#"networkPolicy.webhookSources=["10.0.0.10/32"]"#,
    ]);
    assert_eq!(
        webhook_port_sources(&named),
        Some(vec![
            serde_json::json!({"ipBlock": {"cidr": "10.0.0.10/32"}})
        ])
    );
    // A client CA: any source may connect, and only the apiserver's certificate is answered.
    let authenticated = render(&["--set-string", "webhook.clientAuth.caBundle=PEM"]);
    assert_eq!(webhook_port_sources(&authenticated), Some(vec![]));
    let deployment = find(&authenticated, "Deployment", admission::WEBHOOK_NAME);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let file = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "ICHOR_WEBHOOK_CLIENT_CA_FILE")
        .expect("the webhook is given its client CA")["value"]
        .as_str()
        .expect("a path")
        .to_owned();
    let mount = container["volumeMounts"][0]["mountPath"]
        .as_str()
        .expect("the client CA is mounted");
    assert_eq!(file, format!("{mount}/ca.crt"));
    assert_eq!(
        find(&authenticated, "ConfigMap", "ichor-webhook-client-ca")["data"]["ca.crt"],
        "PEM\n"
    );
}

#[tokio::test]
async fn the_rendered_chart_is_accepted_by_a_real_apiserver() {
    let docs = render(WEBHOOK_ACCESS);
    let env = TestEnv::private().await.expect("control plane");
    let client = env.client();
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(NAMESPACE.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("namespace");
    let mut params = PatchParams::apply("ichor-chart-test").force();
    params.field_validation = Some(ValidationDirective::Strict);
    // CRDs first (as Helm installs crds/ before the templates), then discovery for the rest.
    let ordered: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .chain(
            docs.iter()
                .filter(|d| d["kind"] != "CustomResourceDefinition"),
        )
        .collect();
    let mut discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    for doc in ordered {
        let object: DynamicObject = serde_json::from_value(doc.clone()).expect("object");
        let types = object.types.clone().expect("apiVersion and kind");
        let gvk = kube::api::GroupVersionKind::try_from(&types).expect("gvk");
        if discovery.resolve_gvk(&gvk).is_none() {
            discovery = Discovery::new(client.clone())
                .run()
                .await
                .expect("discovery");
        }
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("the apiserver does not serve {gvk:?}"));
        let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
            Api::namespaced_with(client.clone(), NAMESPACE, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        api.patch(&object.name_any(), &params, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{} {}: {e}", types.kind, object.name_any()));
    }

    // What landed: hardened Deployments, two webhook replicas with a budget, the empty Secret.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    for name in [admission::MANAGER_NAME, admission::WEBHOOK_NAME] {
        let deployment = deployments.get(name).await.expect("deployment");
        let pod = deployment
            .spec
            .and_then(|s| s.template.spec)
            .expect("pod spec");
        assert_eq!(pod.service_account_name.as_deref(), Some(name));
        let pod_security = pod.security_context.expect("pod securityContext");
        assert_eq!(pod_security.run_as_non_root, Some(true));
        assert_eq!(
            pod_security.seccomp_profile.map(|p| p.type_),
            Some("RuntimeDefault".to_owned())
        );
        let container = &pod.containers[0];
        let security = container.security_context.clone().expect("securityContext");
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert!(container.resources.is_some());
    }
    let webhook = deployments
        .get(admission::WEBHOOK_NAME)
        .await
        .expect("webhook");
    assert_eq!(webhook.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let env_of = webhook
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].env.clone().unwrap_or_default())
        .unwrap_or_default();
    assert!(
        env_of.iter().any(|e| e.name == "POD_IP"
            && e.value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .is_some_and(|f| f.field_path == "status.podIP")),
        "each webhook pod passes its own IP"
    );
    Api::<PodDisruptionBudget>::namespaced(client.clone(), NAMESPACE)
        .get(admission::WEBHOOK_NAME)
        .await
        .expect("budget");
    // Each component admits traffic only on the ports it serves (the webhook's admission port
    // only from the named sources).
    for (name, ports) in [
        (admission::MANAGER_NAME, vec!["metrics"]),
        (admission::WEBHOOK_NAME, vec!["webhook", "metrics"]),
    ] {
        let policy = Api::<NetworkPolicy>::namespaced(client.clone(), NAMESPACE)
            .get(name)
            .await
            .expect("network policy");
        let spec = policy.spec.expect("network policy spec");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
        let allowed: Vec<String> = spec
            .ingress
            .unwrap_or_default()
            .iter()
            .flat_map(|rule| rule.ports.clone().unwrap_or_default())
            .filter_map(|p| match p.port {
                Some(IntOrString::String(named)) => Some(named),
                _ => None,
            })
            .collect();
        assert_eq!(allowed, ports, "{name} admits only its own ports");
    }
    let secret = Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .get(admission::WEBHOOK_CERT_SECRET)
        .await
        .expect("certificate Secret");
    assert!(secret.data.unwrap_or_default().is_empty());
    let role = Api::<Role>::namespaced(client.clone(), NAMESPACE)
        .get(admission::MANAGER_NAME)
        .await
        .expect("role");
    assert_eq!(role.rules, admission::manager_role(NAMESPACE).rules);
    Api::<ClusterRole>::all(client)
        .get(admission::WEBHOOK_NAME)
        .await
        .expect("cluster role");
}

#[test]
fn the_images_are_distroless_and_non_root() {
    for name in [admission::MANAGER_NAME, admission::WEBHOOK_NAME] {
        let path = root().join("crates").join(name).join("Dockerfile");
        let text = std::fs::read_to_string(&path).expect("Dockerfile");
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert_eq!(
            lines.first().copied(),
            Some("FROM gcr.io/distroless/static-debian12:nonroot"),
            "{name}"
        );
        assert!(lines.contains(&"USER 65532:65532"), "{name}");
        assert!(
            lines.contains(&format!("ENTRYPOINT [\"/{name}\"]").as_str()),
            "{name}"
        );
        assert!(
            lines.contains(
                &format!("COPY target/x86_64-unknown-linux-gnu/release/{name} /{name}").as_str()
            ),
            "{name}: the image takes the statically linked build"
        );
    }
}

/// Whether a 64-bit ELF executable asks for a program interpreter (a dynamic loader).
fn has_interpreter(bytes: &[u8]) -> bool {
    let header = FileHeader64::<Endianness>::parse(bytes).expect("a 64-bit ELF file");
    let endian = header.endian().expect("an ELF byte order");
    header
        .program_headers(endian, bytes)
        .expect("the ELF program headers")
        .iter()
        .any(|program| program.p_type(endian) == PT_INTERP)
}

#[test]
fn the_binaries_the_e2e_runs_are_statically_linked() {
    // `cargo xtask test` builds the whole workspace statically linked (docs/adr/0045): the
    // binaries the specs start are found beside this test's binary, and link as the images'.
    for name in ["ichor-manager", "ichor-webhook"] {
        let path = ichor_harness::binary(name).expect("the binary is built");
        let bytes = std::fs::read(&path).expect("binary");
        assert!(
            !has_interpreter(&bytes),
            "{} needs a dynamic loader: it is not statically linked (run `cargo xtask test`, which builds every test and binary with crt-static)",
            path.display()
        );
    }
}

#[test]
fn the_static_check_tells_a_program_that_needs_a_loader() {
    // A 64-bit ELF header with two program headers, the second of them PT_INTERP.
    let mut elf = vec![0u8; 0x40 + 2 * 0x38];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2;
    elf[5] = 1; // little-endian
    elf[6] = 1; // EV_CURRENT
    elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
    elf[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
    elf[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
    elf[0x40..0x44].copy_from_slice(&6u32.to_le_bytes()); // PT_PHDR
    elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
    assert!(!has_interpreter(&elf));
    elf[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
    elf[0x40 + 0x38..0x40 + 0x3c].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
    assert!(has_interpreter(&elf));
}

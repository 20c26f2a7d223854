//! The `cluster` target's plan and manifests: real Talos VMs (KubeVirt) on an outer cluster, all
//! in the namespace `ichor-e2e`. The names are fixed (`talos-1`, `talos-1-iso`, …): one run at
//! a time per outer cluster.
//!
//! What the manifests encode, each learnt the hard way:
//! - every node boots its **own** ISO volume (some CSI drivers refuse a shared ReadOnlyMany);
//! - the serial-console kernel argument is in the **ISO's** schematic only, never in the
//!   installer's, so the installed system boots as Talos ships it;
//! - the NIC uses **bridge** binding on the pod network (no NAT, no port list), so the node's
//!   Talos API is on its pod IP;
//! - the inner cluster's endpoint is a node's own address, never a default, and its pod and
//!   service subnets never overlap the outer cluster's;
//! - the controller pod runs the statically linked binaries copied into a minimal image, and
//!   the inner apiserver reaches the webhook by the pod's IP (an outer ClusterIP means nothing
//!   to it).

use std::net::Ipv4Addr;

use serde_json::{Value, json};

use crate::rails::E2E_NAMESPACE;

/// The Image Factory.
pub const FACTORY: &str = "factory.talos.dev";
/// The label every object of a run carries.
pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "ichor-e2e");
/// The controller pod's name.
pub const CONTROLLER_POD: &str = "ichor-controller";
/// The webhook's port in the controller pod.
pub const WEBHOOK_PORT: u16 = 9443;

/// What a `cluster` run is made of.
#[derive(Debug, Clone)]
pub struct ClusterPlan {
    /// The Talos version, e.g. `v1.14.1`.
    pub talos_version: String,
    /// The Image Factory schematic of the ISO (with `console=ttyS0` among its extra kernel args).
    pub iso_schematic: String,
    /// The schematic of the installer (without the console argument).
    pub installer_schematic: String,
    /// How many VMs.
    pub nodes: usize,
    /// The storage class of the volumes (the outer cluster's default when unset).
    pub storage_class: Option<String>,
    /// The inner cluster's pod subnet.
    pub pod_subnet: String,
    /// The inner cluster's service subnet.
    pub service_subnet: String,
    /// The outer cluster's pod and service subnets (the inner ones must not overlap them).
    pub outer_subnets: Vec<String>,
}

/// A plan that cannot run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// A subnet is not an IPv4 CIDR.
    #[error("{0:?} is not an IPv4 CIDR (a.b.c.d/n)")]
    Cidr(String),
    /// Inner and outer subnets overlap.
    #[error("the inner subnet {inner} overlaps the outer cluster's {outer}: pick another")]
    Overlap {
        /// The inner subnet.
        inner: String,
        /// The outer subnet.
        outer: String,
    },
    /// Missing or odd settings.
    #[error("{0}")]
    Invalid(String),
}

fn cidr(text: &str) -> Result<(u32, u32), PlanError> {
    let bad = || PlanError::Cidr(text.to_owned());
    let (addr, len) = text.split_once('/').ok_or_else(bad)?;
    let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
    let len: u32 = len.parse().map_err(|_| bad())?;
    if len > 32 {
        return Err(bad());
    }
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Ok((u32::from(addr) & mask, mask))
}

/// Whether two IPv4 CIDRs share an address.
pub fn overlaps(a: &str, b: &str) -> Result<bool, PlanError> {
    let (na, ma) = cidr(a)?;
    let (nb, mb) = cidr(b)?;
    let common = ma & mb;
    Ok(na & common == nb & common)
}

impl ClusterPlan {
    /// Checks the plan before anything is created.
    pub fn check(&self) -> Result<(), PlanError> {
        if self.nodes == 0 {
            return Err(PlanError::Invalid(
                "a cluster run needs at least one node".into(),
            ));
        }
        if self.iso_schematic == self.installer_schematic {
            return Err(PlanError::Invalid(
                "the ISO and the installer need different schematics: the serial console argument belongs to the ISO only".into(),
            ));
        }
        for inner in [&self.pod_subnet, &self.service_subnet] {
            for outer in &self.outer_subnets {
                if overlaps(inner, outer)? {
                    return Err(PlanError::Overlap {
                        inner: inner.clone(),
                        outer: outer.clone(),
                    });
                }
            }
        }
        if overlaps(&self.pod_subnet, &self.service_subnet)? {
            return Err(PlanError::Overlap {
                inner: self.pod_subnet.clone(),
                outer: self.service_subnet.clone(),
            });
        }
        Ok(())
    }

    /// The name of node `i` (0-based): `talos-1`, `talos-2`, …
    pub fn node_name(i: usize) -> String {
        format!("talos-{}", i + 1)
    }

    /// The ISO the VMs boot (its schematic carries the serial console argument).
    pub fn iso_url(&self) -> String {
        format!(
            "https://{FACTORY}/image/{}/{}/metal-amd64.iso",
            self.iso_schematic, self.talos_version
        )
    }

    /// The installer image the machine configs name (no console argument).
    pub fn installer_image(&self) -> String {
        format!(
            "{FACTORY}/metal-installer/{}:{}",
            self.installer_schematic, self.talos_version
        )
    }

    fn labels(node: Option<&str>) -> Value {
        let mut labels = json!({PART_OF.0: PART_OF.1});
        if let Some(node) = node {
            labels["ichor.maesh.dev/e2e-node"] = json!(node);
        }
        labels
    }

    fn storage(&self, size: &str) -> Value {
        let mut storage = json!({
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
        });
        if let Some(class) = &self.storage_class {
            storage["storageClassName"] = json!(class);
        }
        storage
    }

    /// Node `i`'s volumes: its own ISO (imported over HTTP) and a blank install disk.
    pub fn data_volumes(&self, i: usize) -> [Value; 2] {
        let node = Self::node_name(i);
        let volume = |name: String, source: Value, size: &str| {
            json!({
                "apiVersion": "cdi.kubevirt.io/v1beta1",
                "kind": "DataVolume",
                "metadata": {"name": name, "namespace": E2E_NAMESPACE, "labels": Self::labels(Some(&node))},
                "spec": {"source": source, "storage": self.storage(size)},
            })
        };
        [
            volume(
                format!("{node}-iso"),
                json!({"http": {"url": self.iso_url()}}),
                "2Gi",
            ),
            volume(format!("{node}-disk"), json!({"blank": {}}), "10Gi"),
        ]
    }

    /// Node `i`'s VirtualMachine: install disk first, its ISO second (detached after install),
    /// bridge binding on the pod network.
    pub fn virtual_machine(&self, i: usize) -> Value {
        let node = Self::node_name(i);
        json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": {"name": node, "namespace": E2E_NAMESPACE, "labels": Self::labels(Some(&node))},
            "spec": {
                "runStrategy": "Always",
                "template": {
                    "metadata": {"labels": Self::labels(Some(&node))},
                    "spec": {
                        "domain": {
                            "cpu": {"cores": 2},
                            "memory": {"guest": "4Gi"},
                            "devices": {
                                "disks": [
                                    {"name": "disk", "bootOrder": 1, "disk": {"bus": "virtio"}},
                                    {"name": "iso", "bootOrder": 2, "cdrom": {"bus": "sata"}},
                                ],
                                "interfaces": [{"name": "default", "bridge": {}}],
                            },
                        },
                        "networks": [{"name": "default", "pod": {}}],
                        "volumes": [
                            {"name": "disk", "dataVolume": {"name": format!("{node}-disk")}},
                            {"name": "iso", "dataVolume": {"name": format!("{node}-iso")}},
                        ],
                    },
                },
            },
        })
    }

    /// The inner cluster's endpoint: the first control plane's own address, never a default.
    pub fn endpoint(node_address: &str) -> Result<String, PlanError> {
        let ip: Ipv4Addr = node_address.parse().map_err(|_| {
            PlanError::Invalid(format!(
                "the endpoint must be a node's own IPv4 address, not {node_address:?}"
            ))
        })?;
        Ok(format!("https://{ip}:6443"))
    }

    /// The controller pod: a minimal image that waits for the statically linked binaries to be
    /// copied in (`/ichor`), then runs the webhook and the manager.
    pub fn controller_pod(image: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": CONTROLLER_POD, "namespace": E2E_NAMESPACE, "labels": Self::labels(None)},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "ichor",
                    "image": image,
                    "command": ["sh", "-c", "while [ ! -x /ichor/start ]; do sleep 1; done; exec /ichor/start"],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "ports": [{"name": "webhook", "containerPort": WEBHOOK_PORT}],
                    "volumeMounts": [{"name": "ichor", "mountPath": "/ichor"}],
                }],
                "volumes": [{"name": "ichor", "emptyDir": {}}],
            },
        })
    }

    /// The webhook URL the inner apiserver calls: the controller pod's IP.
    pub fn webhook_url(pod_ip: &str, path: &str) -> Result<String, PlanError> {
        let ip: Ipv4Addr = pod_ip.parse().map_err(|_| {
            PlanError::Invalid(format!(
                "the webhook URL needs the pod's IPv4 address, not {pod_ip:?}"
            ))
        })?;
        Ok(format!("https://{ip}:{WEBHOOK_PORT}{path}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> ClusterPlan {
        ClusterPlan {
            talos_version: "v1.14.1".into(),
            iso_schematic: "iso-with-console".into(),
            installer_schematic: "plain".into(),
            nodes: 3,
            storage_class: Some("fast".into()),
            pod_subnet: "10.244.0.0/16".into(),
            service_subnet: "10.96.0.0/12".into(),
            outer_subnets: vec!["10.42.0.0/16".into(), "10.43.0.0/16".into()],
        }
    }

    #[test]
    fn each_vm_boots_its_own_iso_and_a_blank_disk_with_bridge_binding() {
        let plan = plan();
        let vm = plan.virtual_machine(1);
        assert_eq!(vm["metadata"]["name"], "talos-2");
        assert_eq!(vm["metadata"]["namespace"], E2E_NAMESPACE);
        let spec = &vm["spec"]["template"]["spec"];
        assert_eq!(
            spec["domain"]["devices"]["interfaces"][0]["bridge"],
            json!({})
        );
        assert!(
            spec["domain"]["devices"]["interfaces"][0]
                .get("ports")
                .is_none()
        );
        assert!(
            spec["domain"]["devices"]["interfaces"][0]
                .get("masquerade")
                .is_none()
        );
        assert_eq!(spec["networks"][0]["pod"], json!({}));
        assert_eq!(spec["volumes"][1]["dataVolume"]["name"], "talos-2-iso");
        let [iso, disk] = plan.data_volumes(1);
        assert_eq!(iso["metadata"]["name"], "talos-2-iso");
        assert_eq!(
            iso["spec"]["storage"]["accessModes"],
            json!(["ReadWriteOnce"])
        );
        assert_eq!(disk["spec"]["source"], json!({"blank": {}}));
        assert_eq!(disk["spec"]["storage"]["storageClassName"], "fast");
        let other = plan.data_volumes(2);
        assert_ne!(other[0]["metadata"]["name"], iso["metadata"]["name"]);
    }

    #[test]
    fn the_console_argument_is_on_the_iso_only() {
        let plan = plan();
        assert!(
            plan.iso_url()
                .contains("/iso-with-console/v1.14.1/metal-amd64.iso")
        );
        assert!(!plan.installer_image().contains("iso-with-console"));
        assert_eq!(
            plan.installer_image(),
            "factory.talos.dev/metal-installer/plain:v1.14.1"
        );
        let same = ClusterPlan {
            installer_schematic: "iso-with-console".into(),
            ..plan
        };
        assert!(same.check().is_err());
    }

    #[test]
    fn inner_subnets_never_overlap_the_outer_ones() {
        assert!(plan().check().is_ok());
        let clash = ClusterPlan {
            pod_subnet: "10.42.128.0/17".into(),
            ..plan()
        };
        assert_eq!(
            clash.check(),
            Err(PlanError::Overlap {
                inner: "10.42.128.0/17".into(),
                outer: "10.42.0.0/16".into()
            })
        );
        assert!(overlaps("10.0.0.0/8", "10.96.0.0/12").expect("cidrs"));
        assert!(!overlaps("10.244.0.0/16", "10.96.0.0/12").expect("cidrs"));
        assert!(overlaps("10.0.0.0/33", "10.0.0.0/8").is_err());
    }

    #[test]
    fn the_endpoint_is_a_node_address_and_the_webhook_is_reached_by_pod_ip() {
        assert_eq!(
            ClusterPlan::endpoint("10.42.1.7").expect("address"),
            "https://10.42.1.7:6443"
        );
        assert!(ClusterPlan::endpoint("").is_err());
        assert!(ClusterPlan::endpoint("kubernetes.default").is_err());
        assert_eq!(
            ClusterPlan::webhook_url("10.42.3.9", "/validate").expect("ip"),
            "https://10.42.3.9:9443/validate"
        );
        assert!(ClusterPlan::webhook_url("ichor-webhook.ichor-system.svc", "/validate").is_err());
        let pod = ClusterPlan::controller_pod("busybox:1.37");
        assert_eq!(pod["metadata"]["namespace"], E2E_NAMESPACE);
        assert_eq!(
            pod["spec"]["containers"][0]["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
            "status.podIP"
        );
    }
}

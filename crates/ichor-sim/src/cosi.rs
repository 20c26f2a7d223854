//! The COSI state service of a simulated node: Get and List of the resources it has, built
//! from the node's state on every call (talos-facts §1.6, §3).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use ichor_talos::api::cosi::resource::state_server::State;
use ichor_talos::api::cosi::resource::{
    GetRequest, GetResponse, ListRequest, ListResponse, Metadata, Resource, Spec, WatchRequest,
    WatchResponse,
};
use ichor_talos::api::resource::definitions::runtime::{
    MachineStatusSpec, MachineStatusStatus, UnattendedInstallStatusSpec, UnmetCondition,
    VersionSpec,
};
use prost::Message as _;
use serde_json::json;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::hardware::{SimResource, hardware_resources, is_sensitive};
use crate::network::{Shared, network};
use crate::{Node, Stage};

/// Serves the node's resources, read-only.
pub(crate) struct Cosi {
    pub(crate) node: Weak<Mutex<Node>>,
    pub(crate) shared: Arc<Shared>,
}

fn to_proto(r: &SimResource) -> Resource {
    Resource {
        metadata: Some(Metadata {
            namespace: r.namespace.into(),
            r#type: r.type_.into(),
            id: r.id.clone(),
            version: "1".into(),
            phase: "running".into(),
            ..Default::default()
        }),
        // Talos fills both encodings (talos-facts §1.6 "Spec encoding"); the simulator fills
        // the protobuf one for the specs proto/ defines.
        spec: Some(Spec {
            proto_spec: r.proto.clone(),
            yaml_spec: serde_saphyr::to_string(&r.spec).unwrap_or_default(),
        }),
    }
}

/// The readiness checks a node has not met (talos-facts §3 "Readiness checks", §8.3): a
/// control plane's etcd service, and `nodeReady`, which needs a bootstrapped cluster with a
/// CNI.
pub(crate) fn unmet_conditions(node: &Node, shared: &Shared) -> Vec<UnmetCondition> {
    let Some(config) = &node.running else {
        return Vec::new();
    };
    let mut unmet = Vec::new();
    let net = network();
    let cluster_id = if config.is_control_plane() {
        let running = shared.etcd_running.load(Ordering::SeqCst);
        if running == 0 {
            unmet.push(UnmetCondition {
                name: "services".into(),
                reason: "service \"etcd\" is not healthy".into(),
            });
        }
        running
    } else {
        net.control_plane_at(&config.endpoint_host, &config.cluster_identity())
            .map_or(0, |cp| cp.shared.etcd_running.load(Ordering::SeqCst))
    };
    match net.cluster(cluster_id).filter(|c| net.has_quorum(c)) {
        None => unmet.push(UnmetCondition {
            name: "nodeReady".into(),
            reason: "node is not registered in Kubernetes yet".into(),
        }),
        Some(c) if !c.cni_present => unmet.push(UnmetCondition {
            name: "nodeReady".into(),
            reason: "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady".into(),
        }),
        Some(_) => {}
    }
    unmet
}

/// Every resource the node has now.
fn resources(node: &Node, shared: &Shared) -> BTreeMap<String, Vec<SimResource>> {
    let mut out = hardware_resources(&node.hardware);
    let mut add = |namespace: &'static str, type_: &'static str, id: &str, spec, proto| {
        out.entry(type_.to_lowercase())
            .or_default()
            .push(SimResource {
                namespace,
                type_,
                id: id.to_owned(),
                spec,
                proto,
            });
    };
    let unmet = unmet_conditions(node, shared);
    let ready = node.stage == Stage::Running && node.running.is_some() && unmet.is_empty();
    let (stage_number, stage_name) = crate::stage_wire(node.stage);
    let status = MachineStatusSpec {
        stage: stage_number,
        status: Some(MachineStatusStatus {
            ready,
            unmet_conditions: unmet.clone(),
        }),
    };
    add(
        "runtime",
        "MachineStatuses.runtime.talos.dev",
        "machine",
        json!({
            "stage": stage_name,
            "status": {
                "ready": ready,
                "unmetConditions": unmet
                    .iter()
                    .map(|u| json!({"name": u.name, "reason": u.reason}))
                    .collect::<Vec<_>>()
            }
        }),
        status.encode_to_vec(),
    );
    let version = VersionSpec {
        version: shared.talos_version(),
        name: "Talos".into(),
    };
    add(
        "runtime",
        "Versions.runtime.talos.dev",
        "version",
        json!({"version": version.version, "name": version.name}),
        version.encode_to_vec(),
    );
    // 1.14's unattended install reports its phase (talos-facts §3, §8.2).
    if let Some((image, phase)) = &node.unattended {
        let (number, name) = phase.wire();
        let spec = UnattendedInstallStatusSpec {
            image: image.clone(),
            phase: number,
            error: String::new(),
        };
        add(
            "runtime",
            "UnattendedInstallStatuses.runtime.talos.dev",
            "unattended-install",
            json!({"image": image, "phase": name}),
            spec.encode_to_vec(),
        );
    }
    out
}

impl Cosi {
    /// The resources of `type_` in `namespace`, or the status Talos answers with.
    async fn of_type(&self, namespace: &str, type_: &str) -> Result<Vec<SimResource>, Status> {
        let key = type_.to_lowercase();
        if is_sensitive(&key) {
            return Err(Status::permission_denied(format!(
                "resource type {type_:?} is sensitive: reading it needs os:admin"
            )));
        }
        let strong = self
            .node
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
        let mut all = {
            let node = strong.lock().await;
            resources(&node, &self.shared)
        };
        let Some(all) = all.remove(&key) else {
            return Err(Status::permission_denied(format!(
                "resource type {type_:?} is not supported"
            )));
        };
        if all.iter().all(|r| r.namespace != namespace) {
            return Err(Status::permission_denied(format!(
                "namespace {namespace:?} is not supported"
            )));
        }
        Ok(all
            .into_iter()
            .filter(|r| r.namespace == namespace)
            .collect())
    }
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl State for Cosi {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let r = request.into_inner();
        let found = self
            .of_type(&r.namespace, &r.r#type)
            .await?
            .into_iter()
            .find(|x| x.id == r.id)
            .ok_or_else(|| {
                Status::not_found(format!("resource {}/{} not found", r.r#type, r.id))
            })?;
        Ok(Response::new(GetResponse {
            resource: Some(to_proto(&found)),
        }))
    }

    type ListStream = Stream<ListResponse>;

    async fn list(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        let r = request.into_inner();
        let items: Vec<Result<ListResponse, Status>> = self
            .of_type(&r.namespace, &r.r#type)
            .await?
            .iter()
            .map(|x| {
                Ok(ListResponse {
                    resource: Some(to_proto(x)),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }

    type WatchStream = Stream<WatchResponse>;

    async fn watch(&self, _: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(crate::not_simulated("Watch"))
    }
}

//! The COSI state service of a simulated node: Get and List of the resources it has
//! (talos-facts §1.6).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use ichor_talos::api::cosi::resource::state_server::State;
use ichor_talos::api::cosi::resource::{
    GetRequest, GetResponse, ListRequest, ListResponse, Metadata, Resource, Spec, WatchRequest,
    WatchResponse,
};
use tonic::{Request, Response, Status};

use crate::hardware::{SimResource, is_sensitive};

/// Serves the node's resources, read-only.
pub(crate) struct Cosi {
    pub(crate) resources: Arc<BTreeMap<String, Vec<SimResource>>>,
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
        // Talos fills both the YAML and the protobuf spec; the simulator fills the YAML spec,
        // which is what Ichor's client reads (talos-facts §1.6 "Spec encoding").
        spec: Some(Spec {
            proto_spec: Vec::new(),
            yaml_spec: serde_saphyr::to_string(&r.spec).unwrap_or_default(),
        }),
    }
}

impl Cosi {
    /// The resources of `type_` in `namespace`, or the status Talos answers with.
    fn of_type(&self, namespace: &str, type_: &str) -> Result<Vec<&SimResource>, Status> {
        let key = type_.to_lowercase();
        if is_sensitive(&key) {
            return Err(Status::permission_denied(format!(
                "resource type {type_:?} is sensitive: reading it needs os:admin"
            )));
        }
        let Some(all) = self.resources.get(&key) else {
            return Err(Status::permission_denied(format!(
                "resource type {type_:?} is not supported"
            )));
        };
        if all.iter().all(|r| r.namespace != namespace) {
            return Err(Status::permission_denied(format!(
                "namespace {namespace:?} is not supported"
            )));
        }
        Ok(all.iter().filter(|r| r.namespace == namespace).collect())
    }
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl State for Cosi {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let r = request.into_inner();
        let found = self
            .of_type(&r.namespace, &r.r#type)?
            .into_iter()
            .find(|x| x.id == r.id)
            .ok_or_else(|| {
                Status::not_found(format!("resource {}/{} not found", r.r#type, r.id))
            })?;
        Ok(Response::new(GetResponse {
            resource: Some(to_proto(found)),
        }))
    }

    type ListStream = Stream<ListResponse>;

    async fn list(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        let r = request.into_inner();
        let items: Vec<Result<ListResponse, Status>> = self
            .of_type(&r.namespace, &r.r#type)?
            .into_iter()
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

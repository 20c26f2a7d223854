//! The COSI state service of a simulated node (`cosi.resource.State`, talos-facts §1.6, §13):
//! Get, List and Watch of the resources it models, with the metadata Talos's in-memory state
//! keeps, both spec encodings, and Talos's access policy.
//!
//! - [`definitions`]: the resource definitions and namespaces it registers;
//! - [`store`]: the state of one boot (versions, times, event history);
//! - [`block`], [`network`], [`node`], [`extensions`], [`kubernetes`]: the resources, computed from the
//!   node's state;
//! - [`yaml`]: the `yaml_spec` encoding; [`query`]: label and id queries.
//!
//! The store is refreshed from the node's state on every call, and polled while a watch is
//! open, so a watch sees a change within one [`crate::Timings::tick`].

mod block;
mod definitions;
mod extensions;
mod kubernetes;
mod network;
mod node;
mod query;
mod store;
mod yaml;

pub(crate) use block::system_layout;
pub(crate) use node::unmet_conditions;

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use ichor_talos::api::cosi::resource::state_server::State;
use ichor_talos::api::cosi::resource::{
    Event as EventProto, EventType, GetRequest, GetResponse, ListRequest, ListResponse, Metadata,
    Resource, Spec, WatchRequest, WatchResponse,
};
use tokio::sync::{Mutex, mpsc, watch};
use tonic::{Request, Response, Status};

use crate::Node;
use crate::authz::{Role, caller_roles};
use crate::network::Shared;
use definitions::Definition;
use query::Query;
use store::{Event, Kind, Store, Stored};

/// Serves the node's resources, read-only.
pub(crate) struct Cosi {
    node: Weak<Mutex<Node>>,
    shared: Arc<Shared>,
    /// Maintenance mode: every caller is `os:reader` (talos-facts §2).
    maintenance: bool,
    store: Arc<Store>,
    /// Closed when this boot's server stops: its watches end.
    stopped: watch::Receiver<()>,
}

impl Cosi {
    /// The service of one boot, and the handle the node ends the boot's state with.
    pub(crate) fn new(
        node: Weak<Mutex<Node>>,
        shared: Arc<Shared>,
        maintenance: bool,
    ) -> (Self, Boot) {
        let (stop, stopped) = watch::channel(());
        let store = Arc::new(Store::default());
        // Everything the node has exists from its boot on (its versions count from there).
        let all: Vec<&'static str> = definitions::DEFINITIONS
            .iter()
            .map(|d| d.resource_type)
            .collect();
        tokio::spawn({
            let (node, shared, store, stopped) = (
                node.clone(),
                Arc::clone(&shared),
                Arc::clone(&store),
                stopped.clone(),
            );
            async move {
                let _ = refresh(&node, &shared, &store, stopped, &all).await;
            }
        });
        (
            Self {
                node,
                shared: Arc::clone(&shared),
                maintenance,
                store: Arc::clone(&store),
                stopped,
            },
            Boot {
                store,
                shared,
                stop,
            },
        )
    }

    /// Talos's COSI authorization (talos-facts §13.3): the method needs os:reader (or
    /// operator, admin); then the type must be registered, a sensitive type needs os:admin,
    /// and the namespace must be registered.
    fn authorize<T>(
        &self,
        request: &Request<T>,
        namespace: &str,
        type_: &str,
    ) -> Result<&'static Definition, Status> {
        let roles = caller_roles(self.maintenance, request.peer_certs().as_ref());
        if !roles
            .iter()
            .any(|r| matches!(r, Role::Reader | Role::Operator | Role::Admin))
        {
            return Err(not_authorized());
        }
        let definition =
            definitions::definition(type_, self.shared.is_1_14()).ok_or_else(|| {
                Status::permission_denied(format!("resource type {type_:?} is not supported"))
            })?;
        if definition.sensitive && !roles.contains(&Role::Admin) {
            return Err(not_authorized());
        }
        if !definitions::namespace_exists(namespace) {
            return Err(Status::permission_denied(format!(
                "namespace {namespace:?} is not supported"
            )));
        }
        Ok(definition)
    }

    /// Brings the store's resources of `type_` up to date with the node.
    async fn refresh(&self, type_: &'static str) -> Result<(), Status> {
        refresh(
            &self.node,
            &self.shared,
            &self.store,
            self.stopped.clone(),
            &[type_],
        )
        .await
    }
}

/// Talos's authorization error (`authz.ErrNotAuthorized`).
fn not_authorized() -> Status {
    Status::permission_denied("not authorized")
}

fn gone() -> Status {
    Status::unavailable("the node is shutting down")
}

/// Which types a refresh computes.
pub(crate) struct Wanted(Vec<&'static str>);

impl Wanted {
    /// Whether `type_` is computed.
    pub(crate) fn has(&self, type_: &str) -> bool {
        self.0.contains(&type_)
    }
}

/// Computes the node's resources of `types` and syncs the store with them: first the ones
/// others record the version of, then those ([`node::SECOND_PASS`]).
async fn refresh(
    node: &Weak<Mutex<Node>>,
    shared: &Shared,
    store: &Store,
    mut stopped: watch::Receiver<()>,
    types: &[&'static str],
) -> Result<(), Status> {
    let strong = node.upgrade().ok_or_else(gone)?;
    let mut guard = tokio::select! {
        guard = strong.lock() => guard,
        _ = stopped.changed() => return Err(gone()),
    };
    // The volume manager catches up with the config and the disks before its resources are
    // read.
    if types.iter().any(|t| block::VOLUME_TYPES.contains(t)) {
        crate::volumes::reconcile(&mut guard);
    }
    let mut first: Vec<&'static str> = types
        .iter()
        .copied()
        .filter(|t| !node::SECOND_PASS.contains(t))
        .collect();
    let second: Vec<&'static str> = types
        .iter()
        .copied()
        .filter(|t| node::SECOND_PASS.contains(t))
        .collect();
    if !second.is_empty() && !first.contains(&node::HOSTNAME_STATUS) {
        first.push(node::HOSTNAME_STATUS);
    }
    sync(&guard, shared, store, first, &second);
    Ok(())
}

/// Computes the node's resources of `first`, then of `second`, and syncs the store with them.
fn sync(
    node: &Node,
    shared: &Shared,
    store: &Store,
    first: Vec<&'static str>,
    second: &[&'static str],
) {
    let want = Wanted(first);
    let mut resources = definitions::resources(&want, shared.is_1_14());
    resources.extend(block::resources(node, &want));
    resources.extend(network::resources(node, &want));
    resources.extend(node::resources(node, shared, &want));
    resources.extend(extensions::resources(node, shared, &want));
    resources.extend(kubernetes::resources(node, shared, &want));
    store.sync(&want.0, resources);
    if !second.is_empty() {
        store.sync(second, node::dependent(node, store));
    }
}

/// The COSI state of one boot, as the node holds it.
#[derive(Debug)]
pub(crate) struct Boot {
    store: Arc<Store>,
    shared: Arc<Shared>,
    /// Dropped when the boot ends: its watches end.
    stop: watch::Sender<()>,
}

impl Boot {
    /// Ends the boot's state: the node's last changes (the stage it goes down in) reach the
    /// open watches, which then end.
    pub(crate) fn end(self, node: &Node) {
        let (first, second): (Vec<&'static str>, Vec<&'static str>) = definitions::DEFINITIONS
            .iter()
            .map(|d| d.resource_type)
            .partition(|t| !node::SECOND_PASS.contains(t));
        sync(node, &self.shared, &self.store, first, &second);
        drop(self.stop);
    }
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

/// A stored resource on the wire.
fn to_proto(stored: &Stored) -> Resource {
    let r = &stored.res;
    Resource {
        metadata: Some(Metadata {
            namespace: r.namespace.clone(),
            r#type: r.type_.to_owned(),
            id: r.id.clone(),
            version: stored.version.to_string(),
            owner: r.owner.to_owned(),
            phase: "running".into(),
            created: Some(timestamp(stored.created)),
            updated: Some(timestamp(stored.updated)),
            finalizers: Vec::new(),
            labels: r.labels.clone().into_iter().collect(),
            annotations: r.annotations.clone().into_iter().collect(),
        }),
        spec: Some(Spec {
            proto_spec: r.proto.clone(),
            yaml_spec: r.yaml.clone(),
        }),
    }
}

/// A tombstone: the metadata of a resource that is not there (version `undefined`, no spec).
fn tombstone(namespace: &str, type_: &str, id: &str) -> Resource {
    let now = timestamp(SystemTime::now());
    Resource {
        metadata: Some(Metadata {
            namespace: namespace.to_owned(),
            r#type: type_.to_owned(),
            id: id.to_owned(),
            version: "undefined".into(),
            phase: "running".into(),
            created: Some(now),
            updated: Some(now),
            ..Default::default()
        }),
        spec: Some(Spec::default()),
    }
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl State for Cosi {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let definition = self.authorize(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().r#type,
        )?;
        let r = request.into_inner();
        self.refresh(definition.resource_type).await?;
        // The state looks the type up as given (only the access policy lowercases it).
        let found = self
            .store
            .get(&r.namespace, &r.r#type, &r.id)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "resource {}({}/{}@undefined) doesn't exist",
                    r.r#type, r.namespace, r.id
                ))
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
        let definition = self.authorize(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().r#type,
        )?;
        let r = request.into_inner();
        let options = r.options.unwrap_or_default();
        let query = Query::new(&options.label_query, options.id_query.as_ref())?;
        self.refresh(definition.resource_type).await?;
        let items: Vec<Result<ListResponse, Status>> = self
            .store
            .list(&r.namespace, &r.r#type)
            .iter()
            .filter(|s| query.matches(&s.res.id, &s.res.labels))
            .map(|s| {
                Ok(ListResponse {
                    resource: Some(to_proto(s)),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }

    type WatchStream = Stream<WatchResponse>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let definition = self.authorize(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().r#type,
        )?;
        let r = request.into_inner();
        let plan = Plan::new(&r)?;
        self.refresh(definition.resource_type).await?;
        let start = plan.start(&self.store, &r)?;
        let (tx, rx) = mpsc::channel(64);
        self.store.watch(definition.resource_type);
        let watcher = Watcher {
            store: Arc::clone(&self.store),
            type_: definition.resource_type,
            request: r,
            plan,
            tx,
        };
        if !self.store.polling.swap(true, Ordering::SeqCst) {
            tokio::spawn(poll(
                self.node.clone(),
                Arc::clone(&self.shared),
                Arc::clone(&self.store),
                self.stopped.clone(),
            ));
        }
        tokio::spawn(watcher.run(start, self.stopped.clone()));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Refreshes the store every tick while watches are open (one poller per store).
async fn poll(
    node: Weak<Mutex<Node>>,
    shared: Arc<Shared>,
    store: Arc<Store>,
    mut stopped: watch::Receiver<()>,
) {
    let tick = match node.upgrade() {
        Some(strong) => strong.lock().await.timings.tick,
        None => return,
    };
    loop {
        let mut types = store.watched();
        if types.is_empty() {
            store.polling.store(false, Ordering::SeqCst);
            // A watch that arrived between the check and the flag starts no poller of its
            // own: take the job back if so.
            types = store.watched();
            if types.is_empty() || store.polling.swap(true, Ordering::SeqCst) {
                return;
            }
        }
        if refresh(&node, &shared, &store, stopped.clone(), &types)
            .await
            .is_err()
        {
            store.polling.store(false, Ordering::SeqCst);
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(tick.max(Duration::from_millis(5))) => {}
            _ = stopped.changed() => {
                store.polling.store(false, Ordering::SeqCst);
                return;
            }
        }
    }
}

/// What a watch request asks for, validated as COSI's server validates it (talos-facts
/// §13.2).
struct Plan {
    /// One resource, or the whole type.
    id: Option<String>,
    query: Query,
    bootstrap: bool,
    bootstrap_bookmark: bool,
    tail: i64,
    bookmark: Option<Vec<u8>>,
    aggregated: bool,
    /// `api_version >= 1`: the client understands BOOTSTRAPPED and ERRORED.
    modern: bool,
}

/// Where a watch starts: the events it sends first, and the history position it reads on
/// from.
struct Start {
    initial: Vec<EventProto>,
    pos: i64,
}

impl Plan {
    fn new(r: &WatchRequest) -> Result<Self, Status> {
        let options = r.options.clone().unwrap_or_default();
        let plan = Self {
            id: r.id.clone(),
            query: Query::new(&options.label_query, options.id_query.as_ref())?,
            bootstrap: options.bootstrap_contents,
            bootstrap_bookmark: options.bootstrap_bookmark,
            tail: i64::from(options.tail_events.max(0)),
            bookmark: options.start_from_bookmark.clone(),
            aggregated: options.aggregated,
            modern: r.api_version >= 1,
        };
        if plan.id.is_some() {
            if plan.bootstrap {
                return Err(Status::unimplemented(
                    "bootstrap contents is not implemented for resource watch",
                ));
            }
            if !options.label_query.is_empty() {
                return Err(Status::unimplemented(
                    "label query is not implemented for resource watch",
                ));
            }
        }
        if plan.tail > 0 && plan.bookmark.is_some() {
            return Err(Status::unknown(
                "cannot use both TailEvents and StartFromBookmark options",
            ));
        }
        if plan.bootstrap && (plan.tail > 0 || plan.bookmark.is_some()) {
            return Err(Status::unknown(
                "cannot use BootstrapContents with TailEvents and StartFromBookmark options",
            ));
        }
        Ok(plan)
    }

    fn start(&self, store: &Store, r: &WatchRequest) -> Result<Start, Status> {
        let (ns, type_) = (r.namespace.as_str(), r.r#type.as_str());
        let invalid = || Status::failed_precondition("invalid watch bookmark");
        let (items, now) = store.snapshot(ns, type_);
        let mut initial = Vec::new();
        let pos = match (&self.id, &self.bookmark) {
            (Some(_), Some(bookmark)) => store
                .after_bookmark(ns, type_, bookmark, 0)
                .ok_or_else(invalid)?,
            (None, Some(bookmark)) => store
                .after_bookmark(ns, type_, bookmark, -1)
                .ok_or_else(invalid)?,
            (Some(id), None) if self.tail > 0 => store.tail_id(ns, type_, id, self.tail),
            (None, None) if self.tail > 0 => store.tail_kind(ns, type_, self.tail),
            (Some(id), None) => {
                // The resource as it is now, or a tombstone when it is not there.
                initial.push(match items.iter().find(|s| s.res.id == *id) {
                    Some(current) => event(EventType::Created, to_proto(current), None, None),
                    None => event(EventType::Destroyed, tombstone(ns, type_, id), None, None),
                });
                now
            }
            (None, None) => {
                if self.bootstrap {
                    for item in items
                        .iter()
                        .filter(|s| self.query.matches(&s.res.id, &s.res.labels))
                    {
                        initial.push(event(EventType::Created, to_proto(item), None, None));
                    }
                    if self.modern {
                        initial.push(event(
                            EventType::Bootstrapped,
                            tombstone(ns, type_, ""),
                            None,
                            Some(store.bookmark(now - 1)),
                        ));
                    }
                }
                if self.bootstrap_bookmark {
                    initial.push(event(
                        EventType::Noop,
                        tombstone(ns, type_, ""),
                        None,
                        Some(store.bookmark(now - 1)),
                    ));
                }
                now
            }
        };
        Ok(Start { initial, pos })
    }

    /// What a history event becomes for this watch, if anything: another resource's events
    /// are skipped, and with a query an update that starts (or stops) matching becomes a
    /// create (or destroy).
    fn map(&self, e: &Event, store: &Store) -> Option<EventProto> {
        let bookmark = Some(store.bookmark(e.pos));
        if let Some(id) = &self.id {
            return (e.resource.res.id == *id).then(|| wire(e, bookmark));
        }
        let matches = |s: &Stored| self.query.matches(&s.res.id, &s.res.labels);
        match e.kind {
            Kind::Created | Kind::Destroyed => matches(&e.resource).then(|| wire(e, bookmark)),
            Kind::Updated => {
                let old = e.old.as_deref().is_some_and(matches);
                match (old, matches(&e.resource)) {
                    (true, true) => Some(wire(e, bookmark)),
                    (true, false) => Some(event(
                        EventType::Destroyed,
                        to_proto(&e.resource),
                        None,
                        bookmark,
                    )),
                    (false, true) => Some(event(
                        EventType::Created,
                        to_proto(&e.resource),
                        None,
                        bookmark,
                    )),
                    (false, false) => None,
                }
            }
        }
    }
}

fn event(
    kind: EventType,
    resource: Resource,
    old: Option<Resource>,
    bookmark: Option<Vec<u8>>,
) -> EventProto {
    EventProto {
        resource: Some(resource),
        event_type: kind as i32,
        old,
        error: None,
        bookmark,
    }
}

fn wire(e: &Event, bookmark: Option<Vec<u8>>) -> EventProto {
    let kind = match e.kind {
        Kind::Created => EventType::Created,
        Kind::Updated => EventType::Updated,
        Kind::Destroyed => EventType::Destroyed,
    };
    event(
        kind,
        to_proto(&e.resource),
        e.old.as_deref().map(to_proto),
        bookmark,
    )
}

/// One open watch.
struct Watcher {
    store: Arc<Store>,
    /// The canonical type, for the poller.
    type_: &'static str,
    request: WatchRequest,
    plan: Plan,
    tx: mpsc::Sender<Result<WatchResponse, Status>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.store.unwatch(self.type_);
    }
}

impl Watcher {
    async fn send(&self, events: Vec<EventProto>) -> bool {
        if events.is_empty() {
            return true;
        }
        if self.plan.aggregated {
            self.tx
                .send(Ok(WatchResponse { event: events }))
                .await
                .is_ok()
        } else {
            for e in events {
                if self
                    .tx
                    .send(Ok(WatchResponse { event: vec![e] }))
                    .await
                    .is_err()
                {
                    return false;
                }
            }
            true
        }
    }

    /// Sends the ready marker (an empty response), the initial events, then the history as
    /// it grows, until the client goes away or the boot ends.
    async fn run(self, start: Start, mut stopped: watch::Receiver<()>) {
        let mut changed = self.store.subscribe();
        if self.tx.send(Ok(WatchResponse::default())).await.is_err() {
            return;
        }
        if !self.send(start.initial).await {
            return;
        }
        let (ns, type_) = (self.request.namespace.clone(), self.request.r#type.clone());
        let mut pos = start.pos;
        let mut ending = false;
        loop {
            changed.borrow_and_update();
            match self.store.since(&ns, &type_, pos) {
                Ok(events) => {
                    if let Some(last) = events.last() {
                        pos = last.pos + 1;
                    }
                    let mapped: Vec<EventProto> = events
                        .iter()
                        .filter_map(|e| self.plan.map(e, &self.store))
                        .collect();
                    if !self.send(mapped).await {
                        return;
                    }
                }
                Err(overrun) => {
                    if self.plan.modern {
                        let error = format!(
                            "buffer overrun: namespace {ns:?} type {type_:?}, write pos {}, pos {}, capacity {}",
                            overrun.write_pos,
                            overrun.pos,
                            store::CAPACITY
                        );
                        let _ = self
                            .tx
                            .send(Ok(WatchResponse {
                                event: vec![EventProto {
                                    resource: None,
                                    event_type: EventType::Errored as i32,
                                    old: None,
                                    error: Some(error),
                                    bookmark: None,
                                }],
                            }))
                            .await;
                    }
                    return;
                }
            }
            if ending {
                return;
            }
            tokio::select! {
                res = changed.changed() => if res.is_err() { return },
                // The boot ends: send what it changed last, then end.
                _ = stopped.changed() => ending = true,
                () = self.tx.closed() => return,
            }
        }
    }
}

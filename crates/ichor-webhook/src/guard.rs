//! Admission decisions on live state: reads the cluster's machines as the manager recorded them
//! (etcd observations with their times; a stale one counts as unhealthy), applies the planner's
//! rules of `ichor-deleteguard`, and reserves an admitted control-plane removal on the
//! TalosCluster with a write guarded by `resourceVersion`, so concurrent deletes are serialized
//! (ADR 7). A delete is decided on the live TalosMachine, and only when the review's
//! `oldObject` is that object at that version (uid and resourceVersion): a review that names
//! another, forged or stale, is refused and reserves nothing (ADR 0051). A TalosOperation that
//! resets or reboots is checked at its creation: a reset's targets as if they were deleted one
//! after another, a reboot's each against the cluster as it is.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{FutureExt as _, StreamExt as _};
use ichor_api::decode::Decoded;
use ichor_api::names::{annotations, reasons};
use ichor_api::operation::{OperationAction, TalosOperation};
use ichor_api::versions::{self, Declared};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{
    Cluster, Disruption, Machine, Refusal, annotation_true, check_cluster_delete,
    check_machine_delete, check_machine_update, check_targets, control_plane_counts,
};
use kube::api::{Api, ListParams, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};

/// How long a reservation whose machine never got a deletion timestamp stays (the delete it
/// was made for failed after admission, e.g. another webhook refused it).
pub(crate) const RESERVATION_TTL: Duration = Duration::from_secs(30);

/// How often a reservation write is retried after a `resourceVersion` conflict.
pub(crate) const ATTEMPTS: usize = 8;

/// The webhook's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Admit.
    Allow,
    /// Refuse, with a condition reason and a message a person can act on.
    Deny {
        /// CamelCase reason.
        reason: String,
        /// What to do about it.
        message: String,
    },
}

impl Decision {
    fn deny(reason: &str, message: impl Into<String>) -> Self {
        Self::Deny {
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

pub use ichor_api::reservation::{Reservation, reservations};

/// Where the guard reads the time: Unix seconds.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock, in Unix seconds.
pub fn system_clock() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The reservations still standing at `now` (Unix seconds): their machine exists with the
/// same uid and is either being deleted or was admitted less than the TTL ago.
fn live_reservations(
    all: Vec<Reservation>,
    machines: &[impl Borrow<TalosMachine>],
    now: u64,
) -> Vec<Reservation> {
    all.into_iter()
        .filter(|r| {
            machines.iter().map(Borrow::borrow).any(|m: &TalosMachine| {
                m.metadata.name.as_deref() == Some(r.machine.as_str())
                    && m.metadata.uid.as_deref() == Some(r.uid.as_str())
                    && (m.metadata.deletion_timestamp.is_some()
                        || now.saturating_sub(r.at) < RESERVATION_TTL.as_secs())
            })
        })
        .collect()
}

/// The machines as the rules see them: a reserved removal is a removal under way, even before
/// the apiserver has set its deletion timestamp.
fn marked(machines: &[impl Borrow<TalosMachine>], standing: &[Reservation]) -> Vec<Machine> {
    machines
        .iter()
        .map(Borrow::borrow)
        .map(|m: &TalosMachine| {
            let mut input = Machine::from(m);
            if standing
                .iter()
                .any(|r| Some(r.uid.as_str()) == m.metadata.uid.as_deref())
            {
                input.deleting = true;
            }
            input
        })
        .collect()
}

/// The live machine that `review` (a delete review's `oldObject`) names, among `listed` (its
/// namespace's machines as read now): the same name, uid, resourceVersion and cluster. Any
/// other review, forged or stale, is refused, so that nothing is reserved for it (ADR 0051).
fn live_target(review: &TalosMachine, listed: &[TalosMachine]) -> Result<TalosMachine, Decision> {
    let meta = &review.metadata;
    let live = listed.iter().find(|m| {
        m.metadata.name.is_some()
            && m.metadata.name == meta.name
            && m.metadata.uid.is_some()
            && m.metadata.uid == meta.uid
            && m.metadata.resource_version.is_some()
            && m.metadata.resource_version == meta.resource_version
            && m.spec.cluster_ref.name == review.spec.cluster_ref.name
    });
    live.cloned().ok_or_else(|| {
        Decision::deny(
            reasons::STALE_REVIEW,
            format!(
                "refused: the TalosMachine {}/{} of this review (uid {}, resourceVersion {}) is not the live one; nothing was reserved. If the machine changed meanwhile, retry the delete",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
                meta.uid.as_deref().unwrap_or("none"),
                meta.resource_version.as_deref().unwrap_or("none"),
            ),
        )
    })
}

/// Decides on admission requests against live state.
#[derive(Clone)]
pub struct Guard {
    client: kube::Client,
    clock: Clock,
    cache: Option<Cache>,
}

/// Watch caches of every TalosCluster and TalosMachine, from which the guard answers the
/// refusals that live state could not turn into admissions (ADR 30). Its watches stop when the
/// last clone is dropped.
#[derive(Clone)]
pub struct Cache {
    clusters: Store<TalosCluster>,
    machines: Store<TalosMachine>,
    _watches: Arc<Watches>,
}

/// The tasks filling a [`Cache`], aborted with it.
struct Watches(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        for watch in &self.0 {
            watch.abort();
        }
    }
}

impl Cache {
    /// Starts watching every TalosCluster and TalosMachine through `client` (in a Tokio
    /// runtime).
    pub fn start(client: &kube::Client) -> Self {
        let (clusters, cluster_writer) = reflector::store();
        let (machines, machine_writer) = reflector::store();
        let cluster_api: Api<TalosCluster> = Api::all(client.clone());
        let machine_api: Api<TalosMachine> = Api::all(client.clone());
        let watches = vec![
            tokio::spawn(
                reflector::reflector(
                    cluster_writer,
                    watcher(cluster_api, watcher::Config::default()),
                )
                .default_backoff()
                .for_each(|_| async {}),
            ),
            tokio::spawn(
                reflector::reflector(
                    machine_writer,
                    watcher(machine_api, watcher::Config::default()),
                )
                .default_backoff()
                .for_each(|_| async {}),
            ),
        ];
        Self {
            clusters,
            machines,
            _watches: Arc::new(Watches(watches)),
        }
    }

    /// Whether both caches hold a full list.
    fn ready(&self) -> bool {
        let ready = |wait: Option<Result<(), _>>| wait.is_some_and(|r| r.is_ok());
        ready(self.clusters.wait_until_ready().now_or_never())
            && ready(self.machines.wait_until_ready().now_or_never())
    }
}

/// What went wrong reading live state or decoding the request.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The Kubernetes API failed.
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
    /// The object in the request is not what its kind says.
    #[error("the request's {0} does not decode: {1}")]
    Decode(&'static str, serde_json::Error),
    /// A field the decision needs is missing.
    #[error("the request has no {0}")]
    Missing(&'static str),
    /// The reservation kept conflicting.
    #[error(
        "the removal could not be reserved on the TalosCluster after {ATTEMPTS} conflicting writes"
    )]
    Contended,
}

/// The request's `what` decoded as the kind `T` (see [`ichor_api::decode`]).
fn decode<T: Decoded>(object: Option<DynamicObject>, what: &'static str) -> Result<T, GuardError> {
    ichor_api::decode::decode(object.ok_or(GuardError::Missing(what))?)
        .map_err(|e| GuardError::Decode(what, e))
}

impl Guard {
    /// A guard reading through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            clock: Arc::new(system_clock),
            cache: None,
        }
    }

    /// The same guard answering from `cache` the refusals live state could not turn into
    /// admissions (ADR 30).
    #[must_use]
    pub fn with_cache(mut self, cache: Cache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The same guard reading the time from `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Decides on one request. Errors mean live state could not be read; the caller refuses
    /// (fail closed).
    pub async fn decide(
        &self,
        request: AdmissionRequest<DynamicObject>,
    ) -> Result<Decision, GuardError> {
        match (request.kind.kind.as_str(), &request.operation) {
            ("TalosMachine", Operation::Delete) => {
                let machine: TalosMachine = decode(request.old_object, "oldObject")?;
                if let Some(decision) = self.settled(&machine) {
                    return Ok(decision);
                }
                self.machine_delete(&machine, request.dry_run).await
            }
            ("TalosMachine", Operation::Update) => {
                let old: TalosMachine = decode(request.old_object, "oldObject")?;
                let new: TalosMachine = decode(request.object, "object")?;
                Ok(
                    match check_machine_update(&Machine::from(&old), &Machine::from(&new)) {
                        Ok(()) => Decision::Allow,
                        Err(refusal) => Decision::deny(refusal.reason(), refusal.message()),
                    },
                )
            }
            ("TalosOperation", Operation::Create) => {
                let operation: TalosOperation = decode(request.object, "object")?;
                let namespace = operation
                    .metadata
                    .namespace
                    .clone()
                    .or(request.namespace)
                    .unwrap_or_default();
                self.operation_create(&operation, &namespace).await
            }
            ("TalosCluster", Operation::Update) => {
                let old: TalosCluster = decode(request.old_object, "oldObject")?;
                let new: TalosCluster = decode(request.object, "object")?;
                self.cluster_update(&old, &new).await
            }
            ("TalosCluster", Operation::Delete) => {
                let cluster: TalosCluster = decode(request.old_object, "oldObject")?;
                Ok(match check_cluster_delete(&Cluster::from(&cluster)) {
                    Ok(()) => Decision::Allow,
                    Err(refusal) => Decision::deny(refusal.reason(), refusal.message()),
                })
            }
            _ => Ok(Decision::Allow),
        }
    }

    /// A TalosCluster update that changes its declared versions: judged by the version rules
    /// (`ichor_api::versions`) against the config contract in force and the oldest Talos its
    /// configured nodes run, read from the cache (live when the cache is not ready).
    async fn cluster_update(
        &self,
        old: &TalosCluster,
        new: &TalosCluster,
    ) -> Result<Decision, GuardError> {
        fn declared(c: &TalosCluster) -> Declared<'_> {
            Declared {
                talos: &c.spec.talos_version,
                kubernetes: &c.spec.kubernetes_version,
            }
        }
        if declared(old) == declared(new) {
            return Ok(Decision::Allow);
        }
        let namespace = old.metadata.namespace.clone().unwrap_or_default();
        let name = old.metadata.name.clone().unwrap_or_default();
        let (cached, listed);
        let machines: Vec<&TalosMachine> = match self.cache.as_ref().filter(|c| c.ready()) {
            Some(cache) => {
                cached = cache.machines.state();
                cached.iter().map(AsRef::as_ref).collect()
            }
            None => {
                listed = Api::<TalosMachine>::namespaced(self.client.clone(), &namespace)
                    .list(&ListParams::default())
                    .await?
                    .items;
                listed.iter().collect()
            }
        };
        let oldest =
            versions::oldest_running(machines.iter().copied(), &namespace, &name).map(|(_, v)| v);
        let Some(contract) = versions::contract_in_force(&old.spec.talos_version, oldest) else {
            // The version before does not read: nothing to hold the change against but the
            // matrix.
            return Ok(match versions::check_declared(declared(new)) {
                Ok(()) => Decision::Allow,
                Err(refusal) => {
                    Decision::deny(reasons::VERSION_CHANGE_REFUSED, refusal.to_string())
                }
            });
        };
        Ok(
            match versions::check_change(
                declared(old),
                declared(new),
                contract,
                oldest.map(versions::Version::series),
            ) {
                Ok(_) => Decision::Allow,
                Err(refusal) => {
                    Decision::deny(reasons::VERSION_CHANGE_REFUSED, refusal.to_string())
                }
            },
        )
    }

    /// The answer to a TalosMachine delete that live state cannot change (ADR 30), if it is
    /// one: a machine that is no etcd voter and needs no annotation is always admitted and
    /// never reserved, whatever the cluster holds; a control plane that needs the allow-delete
    /// annotation and lacks it is refused while its cluster, as cached, is neither being
    /// deleted nor annotated. Every other delete is decided on live state.
    fn settled(&self, target: &TalosMachine) -> Option<Decision> {
        let me = Machine::from(target);
        if !me.is_control_plane_member() && !me.needs_allow_delete() {
            return Some(Decision::Allow);
        }
        if me.deleting || !me.needs_allow_delete() || me.allow_delete {
            return None;
        }
        let cache = self.cache.as_ref().filter(|c| c.ready())?;
        let namespace = target.metadata.namespace.clone().unwrap_or_default();
        let name = &target.spec.cluster_ref.name;
        let cluster = cache
            .clusters
            .get(&ObjectRef::new(name).within(&namespace))?;
        let view = Cluster::from(cluster.as_ref());
        if view.deleting || view.allow_delete {
            return None;
        }
        let machines = cache.machines.state_filter(|m| {
            m.metadata.namespace.as_deref() == Some(namespace.as_str())
                && &m.spec.cluster_ref.name == name
        });
        let now = (self.clock)();
        let standing = live_reservations(reservations(&cluster), &machines, now);
        let view = view.at(i64::try_from(now).unwrap_or(i64::MAX));
        // The rules report what an annotation cannot fix first; those refusals depend on the
        // other machines, so only the missing annotation is answered from the cache.
        match check_machine_delete(&me, &marked(&machines, &standing), &view) {
            Err(refusal @ Refusal::AllowDeleteRequired { .. }) => {
                Some(Decision::deny(refusal.reason(), refusal.message()))
            }
            _ => None,
        }
    }

    /// A TalosMachine delete decided on live state, `review` being the review's `oldObject`:
    /// refused unless it is the live machine at its live version; the decision then reads only
    /// the live machine, and an admitted control-plane removal is reserved on its cluster.
    async fn machine_delete(
        &self,
        review: &TalosMachine,
        dry_run: bool,
    ) -> Result<Decision, GuardError> {
        let namespace = review.metadata.namespace.clone().unwrap_or_default();
        let cluster_name = review.spec.cluster_ref.name.clone();
        let machines_api: Api<TalosMachine> = Api::namespaced(self.client.clone(), &namespace);
        let clusters: Api<TalosCluster> = Api::namespaced(self.client.clone(), &namespace);
        for _ in 0..ATTEMPTS {
            let now = (self.clock)();
            let cluster = clusters.get_opt(&cluster_name).await?;
            let listed = machines_api.list(&ListParams::default()).await?.items;
            let target = match live_target(review, &listed) {
                Ok(live) => live,
                Err(refusal) => return Ok(refusal),
            };
            let target = &target;
            let machines: Vec<TalosMachine> = listed
                .into_iter()
                .filter(|m| m.spec.cluster_ref.name == cluster_name)
                .collect();
            let standing = cluster
                .as_ref()
                .map(|c| live_reservations(reservations(c), &machines, now))
                .unwrap_or_default();
            let target_uid = target.metadata.uid.clone().unwrap_or_default();
            let inputs = marked(&machines, &standing);
            // An orphan (its TalosCluster is gone): nothing manages its cluster any more, so
            // its machines go as in a teardown; the manager releases their finalizers.
            let guard_cluster = cluster
                .as_ref()
                .map_or_else(
                    || {
                        Cluster::new(cluster_name.clone(), 0)
                            .in_namespace(namespace.clone())
                            .being_deleted()
                            .allowing_delete()
                    },
                    Cluster::from,
                )
                .at(i64::try_from(now).unwrap_or(i64::MAX));
            let me = Machine::from(target);
            if let Err(refusal) = check_machine_delete(&me, &inputs, &guard_cluster) {
                return Ok(Decision::deny(refusal.reason(), refusal.message()));
            }
            let counts = control_plane_counts(&me, &inputs);
            let changes_count = me.is_control_plane_member() && counts.before != counts.after;
            let Some(mut cluster) = cluster else {
                return Ok(Decision::Allow);
            };
            if dry_run || !changes_count || guard_cluster.deleting || me.deleting {
                return Ok(Decision::Allow);
            }
            let mut next = standing.clone();
            if !next.iter().any(|r| r.uid == target_uid) {
                next.push(Reservation {
                    machine: target.metadata.name.clone().unwrap_or_default(),
                    uid: target_uid.clone(),
                    at: now,
                });
            }
            let value = ichor_api::reservation::annotation_value(&next);
            cluster
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(annotations::REMOVAL_RESERVATIONS.to_owned(), value);
            // `replace` sends the resourceVersion read above: a concurrent reservation makes
            // this write conflict, and the loop decides again on what that one wrote.
            match clusters
                .replace(&cluster_name, &PostParams::default(), &cluster)
                .await
            {
                Ok(_) => return Ok(Decision::Allow),
                Err(kube::Error::Api(status)) if status.is_conflict() => {}
                Err(error) => return Err(error.into()),
            }
        }
        Err(GuardError::Contended)
    }
}

impl Guard {
    /// A TalosOperation's creation: a reset's targets are checked as deletes one after
    /// another, a reboot's or an upgrade's each as a restart, by the planner's rules at the
    /// door on the machines as recorded. Other actions, and operations whose cluster or targets
    /// do not resolve (the manager reports those), are admitted.
    async fn operation_create(
        &self,
        operation: &TalosOperation,
        namespace: &str,
    ) -> Result<Decision, GuardError> {
        let disruption = match operation.spec.action {
            OperationAction::Reset => Disruption::Reset {
                operation: operation.metadata.name.clone().unwrap_or_default(),
                allow_delete: annotation_true(
                    operation.metadata.annotations.as_ref(),
                    annotations::ALLOW_DELETE,
                ),
            },
            OperationAction::Reboot | OperationAction::Upgrade => Disruption::Restart,
            _ => return Ok(Decision::Allow),
        };
        let cluster_name = &operation.spec.cluster_ref.name;
        let clusters: Api<TalosCluster> = Api::namespaced(self.client.clone(), namespace);
        let Some(cluster) = clusters.get_opt(cluster_name).await? else {
            return Ok(Decision::Allow);
        };
        let machines: Vec<TalosMachine> =
            Api::<TalosMachine>::namespaced(self.client.clone(), namespace)
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|m| &m.spec.cluster_ref.name == cluster_name)
                .collect();
        let Ok(targets) = operation.spec.targets(&machines) else {
            return Ok(Decision::Allow);
        };
        let names: Vec<&str> = targets.iter().map(String::as_str).collect();
        let inputs: Vec<Machine> = machines.iter().map(Machine::from).collect();
        let now = i64::try_from((self.clock)()).unwrap_or(i64::MAX);
        let view = Cluster::from(&cluster).at(now);
        Ok(match check_targets(&names, &inputs, &view, &disruption) {
            Ok(()) => Decision::Allow,
            Err(refusal) => Decision::deny(refusal.reason(), refusal.message()),
        })
    }
}

/// The reason for a refusal because live state could not be read.
pub fn unavailable(error: &GuardError) -> Decision {
    Decision::deny(
        reasons::LIVE_STATE_UNAVAILABLE,
        format!("refused because the webhook cannot check it safely: {error}; retry shortly"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, uid: &str, deleting: bool) -> TalosMachine {
        let spec = serde_json::from_value(serde_json::json!({"clusterRef": {"name": "lab"}}))
            .expect("a spec");
        let mut machine = TalosMachine::new(name, spec);
        machine.metadata.uid = Some(uid.to_owned());
        if deleting {
            machine.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    "2026-12-03T10:00:00Z".parse().expect("timestamp"),
                ));
        }
        machine
    }

    fn reservation(machine: &str, uid: &str, at: u64) -> Reservation {
        Reservation {
            machine: machine.into(),
            uid: uid.into(),
            at,
        }
    }

    #[test]
    fn only_the_live_machine_at_its_version_is_decided_on() {
        let mut live = machine("cp-1", "u1", false);
        live.metadata.resource_version = Some("7".into());
        let listed = [machine("cp-2", "u2", false), live.clone()];
        let found = live_target(&live, &listed).map(|m| m.metadata.uid);
        assert_eq!(found.ok().flatten().as_deref(), Some("u1"));

        let forged = |change: fn(&mut TalosMachine)| {
            let mut review = live.clone();
            change(&mut review);
            review
        };
        for review in [
            forged(|m| m.metadata.uid = Some("u2".into())),
            forged(|m| m.metadata.uid = None),
            forged(|m| m.metadata.resource_version = Some("6".into())),
            forged(|m| m.metadata.resource_version = None),
            forged(|m| m.metadata.name = Some("cp-9".into())),
            forged(|m| m.spec.cluster_ref.name = "other".into()),
        ] {
            match live_target(&review, &listed) {
                Err(Decision::Deny { reason, .. }) => assert_eq!(reason, reasons::STALE_REVIEW),
                other => panic!(
                    "{:?} was taken for the live machine",
                    other.map(|m| m.metadata)
                ),
            }
        }
        assert!(
            live_target(&live, &[]).is_err(),
            "a machine that is gone is not live"
        );
    }

    #[test]
    fn a_reservation_stands_for_its_ttl_or_while_its_machine_is_deleted() {
        let at = 1_000_000;
        let ttl = RESERVATION_TTL.as_secs();
        let machines = [machine("cp-1", "u1", false), machine("cp-2", "u2", true)];
        let all = vec![
            reservation("cp-1", "u1", at),
            reservation("cp-2", "u2", at),
            reservation("cp-3", "u3", at),
            reservation("cp-1", "recreated", at),
        ];
        let live = |now| {
            live_reservations(all.clone(), &machines, now)
                .into_iter()
                .map(|r| r.machine)
                .collect::<Vec<_>>()
        };
        assert_eq!(live(at + ttl - 1), ["cp-1", "cp-2"]);
        assert_eq!(
            live(at + ttl),
            ["cp-2"],
            "expired, but cp-2 is being deleted"
        );
    }
}

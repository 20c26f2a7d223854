//! The cluster lock: one disruptive action per TalosCluster at a time. It is a `Lease` whose
//! holder is the *action* ([`LockHolder`]: `removal/<uid>`, `operation/<name>`, `drift/<uid>`), so
//! whichever manager replica leads carries the action on; a lock whose action vanished is taken
//! over only once its lease expired. The holder and the actions waiting are mirrored into
//! `TalosCluster.status.lock`. While the cluster is `Transitioning`, only the action that
//! completes the transition may take a free lock (ichor-deleteguard decides).

use std::time::Duration;

use ichor_api::cluster::{ClusterLock, LockHolder, LockStatus};
use ichor_api::names::annotations;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{LockDecision, LockView, lock_decision};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, PostParams};

use crate::infra::leader::{LeaseSettings, try_acquire_observed};
use crate::infra::status::{self, Guard};
use crate::rollout_policy::batch::Batch;
use crate::{Context, Error};

/// How long a hold on the cluster lock lasts without renewal.
pub const LOCK_SECONDS: u64 = 60;

/// The cluster lock's Lease name.
pub fn lock_name(cluster: &str) -> String {
    format!("ichor-cluster-lock-{cluster}")
}

/// Whether `cluster` is Transitioning, from its machines (ichor-deleteguard's rule: the
/// declared control-plane count is even, or the approved ones differ from it).
pub fn transitioning(cluster: &TalosCluster, machines: &[TalosMachine]) -> bool {
    let inputs: Vec<ichor_deleteguard::Machine> = machines
        .iter()
        .map(ichor_deleteguard::Machine::from)
        .collect();
    ichor_deleteguard::transitioning(
        usize::try_from(cluster.spec.control_plane.count).unwrap_or(0),
        ichor_deleteguard::approved_control_planes(&inputs),
    )
}

/// What a try for the lock found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The action holds the lock (taken now or carried on).
    Held,
    /// Another action holds it (`None`: one that won a race just now, read on the next try).
    Busy(Option<LockHolder>),
    /// The lock is free but the cluster is transitioning and this action does not complete the
    /// transition.
    Transitioning,
    /// A batch of workers holds the lock, or may take it, and has no room for this one now:
    /// why ([`join`]).
    Full(String),
}

impl Outcome {
    /// Whether the action holds the lock.
    pub fn held(&self) -> bool {
        matches!(self, Self::Held)
    }

    /// Why the action waits, for a condition message.
    pub fn message(&self) -> String {
        match self {
            Self::Held => "holding the cluster lock".into(),
            Self::Busy(Some(holder)) => format!("waiting for the cluster lock, held by {holder}"),
            Self::Busy(None) => "waiting for the cluster lock, just taken by another action".into(),
            Self::Full(why) => format!("waiting for room in the batch of workers rolling out: {why}"),
            Self::Transitioning => "the cluster is Transitioning (control planes approved differ from spec.controlPlane.count, or the count is even); only the action that completes the transition may take the cluster lock".into(),
        }
    }
}

fn settings(namespace: &str, cluster: &str, holder: &LockHolder) -> LeaseSettings {
    LeaseSettings {
        namespace: namespace.to_owned(),
        name: lock_name(cluster),
        identity: holder.to_string(),
        duration: Duration::from_secs(LOCK_SECONDS),
        retry: Duration::from_secs(2),
    }
}

/// The lock as `lock_decision` sees it at `now`: who holds it, and whether that hold expired
/// (not renewed within its duration; a lease without a renewal time is expired). The Lease is
/// in the cluster's namespace, so anyone who may write there may write it: its times are read
/// with checked arithmetic (`ichor_api::time::lease_expired`), and a hold whose end is past the
/// last representable time (a `renewTime` in the year 9999) is held, never expired: the
/// cluster's disruptive actions wait, and say who holds the lock, until the Lease is deleted.
pub fn view(lease: &Lease, now: Timestamp) -> Option<LockView> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone()?;
    let expired = ichor_api::time::lease_expired(spec, now);
    Some(LockView { holder, expired })
}

/// Takes, renews or waits for the lock of `cluster` for `holder`. `transitioning` is the
/// cluster's live state and `completes` whether this action completes the transition.
pub async fn acquire(
    ctx: &Context,
    cluster: &TalosCluster,
    holder: &LockHolder,
    transitioning: bool,
    completes: bool,
) -> Result<Outcome, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &namespace);
    let current = leases.get_opt(&lock_name(&name)).await?;
    let current_view = current.as_ref().and_then(|l| view(l, ctx.clock.now()));
    let outcome = match lock_decision(
        current_view.as_ref(),
        &holder.to_string(),
        transitioning,
        completes,
    ) {
        LockDecision::Take | LockDecision::Keep => {
            // The Lease just read is the one written over: one read per attempt.
            let settings = settings(&namespace, &name, holder);
            if try_acquire_observed(&ctx.client, &settings, current).await? {
                Outcome::Held
            } else {
                // Lost a race for a free lock: read who won on the next try.
                Outcome::Busy(None)
            }
        }
        LockDecision::Busy { holder } => Outcome::Busy(holder.parse().ok()),
        LockDecision::RefusedWhileTransitioning => Outcome::Transitioning,
    };
    mirror(ctx, cluster, holder, &outcome).await;
    Ok(outcome)
}

/// Takes, keeps or waits for a place for `holder` in the batch of workers holding the lock
/// of `cluster` (ADR 0077): the lock is free (or expired) and the cluster not transitioning,
/// or a batch holds it, and [`Batch::join`] finds room for `batch`'s worker beside its
/// members as the Lease stores them. The Lease is written with the `resourceVersion` read, so
/// two workers joining at once cannot both take the last room; members whose machine is gone
/// are dropped.
/// A member keeps its place without a `batch` (its policy changed meanwhile to one worker at
/// a time): it ends its step, and no other joins by it.
pub async fn join(
    ctx: &Context,
    cluster: &TalosCluster,
    holder: &LockHolder,
    transitioning: bool,
    batch: Option<&Batch>,
) -> Result<Outcome, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = lock_name(&cluster.name_any());
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &namespace);
    let current = leases.get_opt(&name).await?;
    let now = ctx.clock.now();
    let id = batch_id(cluster);
    let members = match current.as_ref().and_then(|l| view(l, now)) {
        Some(v) if !v.expired && v.holder == id.to_string() => members(current.as_ref()),
        Some(v) if !v.expired => {
            let outcome = Outcome::Busy(v.holder.parse().ok());
            mirror(ctx, cluster, holder, &outcome).await;
            return Ok(outcome);
        }
        _ if transitioning => {
            mirror(ctx, cluster, holder, &Outcome::Transitioning).await;
            return Ok(Outcome::Transitioning);
        }
        _ => Vec::new(),
    };
    let me = holder.to_string();
    let mut kept: Vec<String> = members
        .into_iter()
        .filter(|m| batch.is_none_or(|b| !b.names_of([m.as_str()]).is_empty()))
        .collect();
    if !kept.contains(&me) {
        let Some(batch) = batch else {
            let outcome = Outcome::Full(
                "a batch of workers holds the cluster lock, and this step goes alone (a control plane, or a worker whose policy lets one at a time be down): it waits for the batch to end".into(),
            );
            mirror(ctx, cluster, holder, &outcome).await;
            return Ok(outcome);
        };
        let names = batch.names_of(kept.iter().map(String::as_str));
        if let Err(why) = batch.join(&names) {
            let outcome = Outcome::Full(why);
            mirror(ctx, cluster, holder, &outcome).await;
            return Ok(outcome);
        }
        kept.push(me);
    }
    let outcome = if write_batch(&leases, &namespace, &name, &id, current, &kept, now).await? {
        Outcome::Held
    } else {
        Outcome::Busy(None)
    };
    mirror_batch(ctx, cluster, holder, &outcome, &kept).await;
    Ok(outcome)
}

/// Takes the lock for `machine`'s rollout step (`holder`: its drift or its upgrade): in a
/// batch of workers when the policy governing it lets more than one be down (ADR 0077), else
/// alone, as every other action. A member of the batch holding the lock keeps its place
/// either way.
pub async fn acquire_step(
    ctx: &Context,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    machines: &[TalosMachine],
    holder: &LockHolder,
) -> Result<Outcome, Error> {
    let moving = transitioning(cluster, machines);
    let classes = ctx.layers.classes();
    let governing = crate::rollout_policy::governing(cluster, machine, &classes);
    // Boxed: each is called from deep in a machine's reconcile, whose future would otherwise
    // hold theirs (a debug build's worker stack overflowed).
    if let Some(batch) = Batch::of(machine, machines, governing.policy) {
        return Box::pin(join(ctx, cluster, holder, moving, Some(&batch))).await;
    }
    let outcome = Box::pin(acquire(ctx, cluster, holder, moving, false)).await?;
    if matches!(outcome, Outcome::Busy(Some(LockHolder::Batch(_)))) {
        return Box::pin(join(ctx, cluster, holder, moving, None)).await;
    }
    Ok(outcome)
}

/// The names of the machines whose steps hold the lock of `cluster` now: a batch's members,
/// or the one drift or upgrade holding it alone (`names` maps a machine's UID to its name).
pub async fn in_flight(
    ctx: &Context,
    cluster: &TalosCluster,
    names: impl Fn(&str) -> Option<String>,
) -> Result<Vec<String>, Error> {
    let leases: Api<Lease> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let lease = leases.get_opt(&lock_name(&cluster.name_any())).await?;
    // An expired hold holds nothing: the next step takes the lock over.
    let Some(held) = lease
        .as_ref()
        .and_then(|l| view(l, ctx.clock.now()))
        .filter(|v| !v.expired)
    else {
        return Ok(Vec::new());
    };
    let steps = match held.holder.parse::<LockHolder>() {
        Ok(LockHolder::Batch(_)) => members(lease.as_ref()),
        Ok(LockHolder::Drift(_) | LockHolder::Upgrade(_)) => vec![held.holder],
        _ => Vec::new(),
    };
    Ok(steps
        .iter()
        .filter_map(|s| s.split_once('/').and_then(|(_, uid)| names(uid)))
        .collect())
}

/// The holder a batch of `cluster`'s workers holds its lock as.
pub fn batch_id(cluster: &TalosCluster) -> LockHolder {
    LockHolder::Batch(cluster.uid().unwrap_or_default())
}

/// The members a batch's Lease lists ([`annotations::LOCK_BATCH`]); a word that names no
/// step is left out.
fn members(lease: Option<&Lease>) -> Vec<String> {
    lease
        .and_then(|l| l.metadata.annotations.as_ref())
        .and_then(|a| a.get(annotations::LOCK_BATCH))
        .map(|text| {
            text.split(',')
                .filter(|m| m.parse::<LockHolder>().is_ok())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Writes the lock's Lease held by the batch `id` with `members`, renewed at `now`, over
/// `current` (created when there is none); `false` when another write came first.
async fn write_batch(
    leases: &Api<Lease>,
    namespace: &str,
    name: &str,
    id: &LockHolder,
    current: Option<Lease>,
    members: &[String],
    now: Timestamp,
) -> Result<bool, Error> {
    let held_before = current
        .as_ref()
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.holder_identity.as_deref())
        == Some(id.to_string().as_str());
    let mut lease = current.clone().unwrap_or_else(|| Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        spec: None,
    });
    let mut spec = lease.spec.take().unwrap_or_default();
    if !held_before {
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.holder_identity = Some(id.to_string());
    spec.lease_duration_seconds = Some(i32::try_from(LOCK_SECONDS).unwrap_or(i32::MAX));
    spec.renew_time = Some(MicroTime(now));
    lease.spec = Some(spec);
    lease
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(annotations::LOCK_BATCH.to_owned(), members.join(","));
    let written = if current.is_some() {
        leases.replace(name, &PostParams::default(), &lease).await
    } else {
        leases.create(&PostParams::default(), &lease).await
    };
    match written {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What [`leave_batch`] found.
enum Left {
    /// `holder` was a member of the batch and left it.
    Batch,
    /// `holder` was no member of a batch: the Lease as read (none: there is no lock), for the
    /// exclusive release to decide on without reading it again.
    NotMember(Option<Box<Lease>>),
}

/// Takes `holder` out of the batch holding the lock, if it is a member; the Lease is deleted
/// with its last member. Retried on a conflicting write: a member left behind would hold its
/// room until the whole batch's Lease expires.
async fn leave_batch(leases: &Api<Lease>, name: &str, holder: &LockHolder) -> Result<Left, Error> {
    let me = holder.to_string();
    let mut conflict = None;
    for _ in 0..LEAVE_ATTEMPTS {
        let Some(mut lease) = leases.get_opt(name).await? else {
            return Ok(Left::NotMember(None));
        };
        let is_batch = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .and_then(|h| h.parse::<LockHolder>().ok())
            .is_some_and(|h| matches!(h, LockHolder::Batch(_)));
        let members = members(Some(&lease));
        if !is_batch || !members.contains(&me) {
            return Ok(Left::NotMember(Some(Box::new(lease))));
        }
        let rest: Vec<String> = members.into_iter().filter(|m| *m != me).collect();
        let written = if rest.is_empty() {
            let version = lease.metadata.resource_version.clone();
            let params = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    resource_version: version,
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            leases.delete(name, &params).await.map(|_| ())
        } else {
            lease
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(annotations::LOCK_BATCH.to_owned(), rest.join(","));
            leases
                .replace(name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        };
        match written {
            Ok(()) => return Ok(Left::Batch),
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(Left::NotMember(None)),
            Err(kube::Error::Api(s)) if s.is_conflict() => conflict = Some(kube::Error::Api(s)),
            Err(e) => return Err(e.into()),
        }
    }
    // Retried with backoff: the step's next look leaves again.
    Err(conflict.map_or_else(
        || Error::Invariant(format!("{holder} did not leave the batch holding {name}")),
        Error::from,
    ))
}

/// How many times a member tries to leave a batch whose Lease others write meanwhile.
const LEAVE_ATTEMPTS: usize = 8;

/// Runs `work` while `holder`'s hold on the cluster lock is renewed, so a long step cannot
/// outlive the Lease ([`crate::infra::leader::renewed_while`]).
pub async fn renewed_while<F: std::future::Future>(
    ctx: &Context,
    cluster: &TalosCluster,
    holder: &LockHolder,
    work: F,
) -> F::Output {
    let settings = settings(
        &cluster.namespace().unwrap_or_default(),
        &cluster.name_any(),
        holder,
    );
    crate::infra::leader::renewed_while(&ctx.client, settings, work).await
}

/// Releases the lock if `holder` holds it, and clears it from status.
pub async fn release(
    ctx: &Context,
    cluster: &TalosCluster,
    holder: &LockHolder,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = lock_name(&cluster.name_any());
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &namespace);
    // Boxed, as `acquire_step`'s calls: released from deep in a machine's reconcile.
    let left = Box::pin(leave_batch(&leases, &name, holder)).await?;
    let left_batch = matches!(left, Left::Batch);
    if let Left::NotMember(Some(lease)) = left {
        release_own(&leases, &name, holder, *lease).await?;
    }
    // The mirror: out of the waiting and the batch; no holder once its own hold, or the
    // batch's last member, is gone.
    update_mirror(ctx, cluster, |lock| {
        let mut next = lock.clone();
        next.waiting.retain(|w| w != holder);
        next.batch.retain(|m| m != holder);
        let batch_ended = left_batch
            && matches!(next.holder, Some(LockHolder::Batch(_)))
            && next.batch.is_empty();
        if next.holder.as_ref() == Some(holder) || batch_ended {
            next.holder = None;
            next.since = None;
        }
        next
    })
    .await;
    Ok(())
}

/// Deletes the Lease `name` if `holder` holds it alone, as `lease` (read last) says: with
/// `lease`'s version as a precondition, so a Lease another holder took meanwhile is never
/// deleted; on a conflict it is read again and looked at afresh.
async fn release_own(
    leases: &Api<Lease>,
    name: &str,
    holder: &LockHolder,
    mut lease: Lease,
) -> Result<(), Error> {
    let me = holder.to_string();
    let mut conflict = None;
    for _ in 0..LEAVE_ATTEMPTS {
        let holds = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(me.as_str());
        if !holds {
            return Ok(());
        }
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match leases.delete(name, &params).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                conflict = Some(kube::Error::Api(s));
                let Some(fresh) = leases.get_opt(name).await? else {
                    return Ok(());
                };
                lease = fresh;
            }
            Err(e) => return Err(e.into()),
        }
    }
    // Retried with backoff: the step's next look releases again.
    Err(conflict.map_or_else(
        || Error::Invariant(format!("{holder} did not release {name}")),
        Error::from,
    ))
}

/// Whether some action other than `me` holds the lock right now (drift waits for it).
pub async fn held_by_other(
    ctx: &Context,
    cluster: &TalosCluster,
    me: &LockHolder,
) -> Result<bool, Error> {
    let leases: Api<Lease> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    Ok(leases
        .get_opt(&lock_name(&cluster.name_any()))
        .await?
        .as_ref()
        .and_then(|l| view(l, ctx.clock.now()))
        .is_some_and(|v| !v.expired && v.holder != me.to_string()))
}

/// Mirrors the outcome into `status.lock` (best effort: the Lease is the truth).
async fn mirror(ctx: &Context, cluster: &TalosCluster, holder: &LockHolder, outcome: &Outcome) {
    let now = ctx.now();
    update_mirror(ctx, cluster, |lock| {
        let mut next = lock.clone();
        match outcome {
            Outcome::Held => {
                if next.holder.as_ref() != Some(holder) {
                    next.holder = Some(holder.clone());
                    next.since = Some(now.clone());
                }
                next.waiting.retain(|w| w != holder);
            }
            Outcome::Busy(other) => {
                if let Some(other) = other
                    && next.holder.as_ref() != Some(other)
                {
                    next.holder = Some(other.clone());
                    next.since = None;
                }
                if !next.waiting.contains(holder) {
                    next.waiting.push(holder.clone());
                }
            }
            Outcome::Transitioning | Outcome::Full(_) => {
                if !next.waiting.contains(holder) {
                    next.waiting.push(holder.clone());
                }
            }
        }
        next
    })
    .await;
}

/// Mirrors a batch's `outcome` for `holder` into `status.lock`: the batch as its holder,
/// `holder` among its members (at most the status's limit) and out of the waiting, and no
/// member the Lease as written (`members`) no longer lists.
async fn mirror_batch(
    ctx: &Context,
    cluster: &TalosCluster,
    holder: &LockHolder,
    outcome: &Outcome,
    members: &[String],
) {
    if !outcome.held() {
        return mirror(ctx, cluster, holder, outcome).await;
    }
    let (id, now) = (batch_id(cluster), ctx.now());
    update_mirror(ctx, cluster, |lock| {
        let mut next = lock.clone();
        if next.holder.as_ref() != Some(&id) {
            next.holder = Some(id.clone());
            next.since = Some(now.clone());
        }
        // Only this member is added: a snapshot of the others may be older than a release
        // written meanwhile, and would bring back a member that left. Those gone from the
        // Lease as written here are dropped; one that joined since adds itself again.
        next.batch.retain(|m| members.contains(&m.to_string()));
        if !next.batch.contains(holder) && next.batch.len() < MIRRORED_MEMBERS {
            next.batch.push(holder.clone());
        }
        next.waiting.retain(|w| w != holder);
        next
    })
    .await;
}

/// Rewrites `status.lock` of `cluster` as `change` makes it from the mirror as stored, on a
/// fresh read each time a concurrent write came first (a batch's members and the waiting
/// write it at once), a few times; best effort beyond that, as the Lease is the truth, and
/// the next step of the lock writes it again.
async fn update_mirror(
    ctx: &Context,
    cluster: &TalosCluster,
    change: impl Fn(&LockStatus) -> LockStatus,
) {
    let clusters: Api<TalosCluster> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    for _ in 0..MIRROR_ATTEMPTS {
        let Ok(Some(fresh)) = clusters.get_opt(&cluster.name_any()).await else {
            return;
        };
        let lock = fresh
            .status
            .as_ref()
            .and_then(|s| s.lock.mirror.clone())
            .unwrap_or_default();
        let next = change(&lock);
        if next == lock {
            return;
        }
        let mut status = fresh.status.clone().unwrap_or_default();
        status.lock.mirror = Some(next);
        match status::apply::<ClusterLock, _>(&clusters, &fresh, &status, Guard::Version).await {
            Ok(()) => return,
            Err(kube::Error::Api(s)) if s.is_conflict() => {}
            Err(error) => {
                tracing::debug!(%error, "lock status not mirrored this time");
                return;
            }
        }
    }
    tracing::debug!("lock status not mirrored this time: concurrent writes");
}

/// How many times a change of the lock's mirror is tried on a fresh read.
const MIRROR_ATTEMPTS: usize = 4;

/// The most members `status.lock.batch` lists (its schema's limit).
const MIRRORED_MEMBERS: usize = 1000;

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    fn lease(renewed: Option<&str>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("operation/reboot-all".into()),
                renew_time: renewed.map(|t| MicroTime(at(t))),
                lease_duration_seconds: Some(60),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn lease_of(renewed: Timestamp, seconds: i32) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("operation/reboot-all".into()),
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(seconds),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A Lease written by hand with a `renewTime` in the year 9999 panicked the worker that
    /// read it (`renewTime + leaseDuration` overflowed), and the TalosOperation controller
    /// stopped for every namespace.
    #[test]
    fn a_hold_renewed_in_the_year_9999_is_held_not_a_panic() {
        let now = at("2026-12-03T10:00:00Z");
        for seconds in [60, i32::MAX] {
            for renewed in [Timestamp::MAX, at("9999-12-30T21:59:30Z")] {
                let seen = view(&lease_of(renewed, seconds), now).expect("held");
                assert!(!seen.expired, "{renewed} + {seconds}s");
            }
        }
        let seen = view(&lease_of(now, i32::MAX), at("2090-01-01T00:00:00Z")).expect("held");
        assert!(!seen.expired, "i32::MAX seconds is about 68 years");
    }

    #[test]
    fn a_hold_with_a_negative_duration_expires_at_its_renewal() {
        let renewed = at("2026-12-03T10:00:00Z");
        for seconds in [-1, i32::MIN] {
            let held = lease_of(renewed, seconds);
            assert!(!view(&held, renewed).expect("held").expired);
            assert!(
                view(&held, at("2026-12-03T10:00:01Z"))
                    .expect("held")
                    .expired
            );
        }
        let seen = view(&lease_of(Timestamp::MIN, -5), renewed).expect("held");
        assert!(seen.expired);
    }

    #[test]
    fn a_hold_expires_once_its_duration_passed_without_renewal() {
        let held = lease(Some("2026-12-03T10:00:00Z"));
        let seen = view(&held, at("2026-12-03T10:00:59Z")).expect("held");
        assert_eq!(seen.holder, "operation/reboot-all");
        assert!(!seen.expired);
        assert!(
            view(&held, at("2026-12-03T10:01:01Z"))
                .expect("held")
                .expired
        );
        assert!(
            view(&lease(None), at("2026-12-03T10:00:00Z"))
                .expect("held")
                .expired,
            "never renewed"
        );
    }
}

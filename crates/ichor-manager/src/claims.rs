//! A machine belongs to one TalosMachine (ADR 0054): before its first apply, a TalosMachine
//! takes the cluster-scoped `TalosMachineClaim` named by the SMBIOS UUID the node reports over
//! the pinned connection, by *create*, so exactly one TalosMachine of the management cluster
//! holds it; releasing the machine deletes it. A namespace's `TalosNamespacePolicy` (opt-in)
//! confines the addresses its machines are configured at.
//!
//! [`decide`] is the pure rule; [`take`], [`hold`], [`release`] and [`address_refused`] act on
//! the API.
//! What they tell a machine that lost never names an object of another namespace.

use ichor_api::claim::{ClaimHolder, TalosMachineClaimSpec, claim_name};
use ichor_api::names::{labels, reasons};
use ichor_api::{TalosMachine, TalosMachineClaim, TalosNamespacePolicy};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};

use crate::Stop;

/// What a TalosMachine does about the claim on a node's UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it: create it.
    Take,
    /// This machine holds it.
    Held,
    /// Its holder no longer exists (a crash between a release's steps, a finalizer removed by
    /// hand): delete that claim (this uid only) and take it.
    TakeOver {
        /// The stale claim's uid, the precondition of its delete.
        stale: String,
    },
    /// Another live TalosMachine holds it for the same certificate.
    ClaimedElsewhere,
    /// Another live TalosMachine holds it for another certificate: one UUID seen with two
    /// fingerprints is a conflict, not a claim.
    Conflict,
}

/// What to do about the claim `existing` (if any) for a machine `ours` that pins
/// `fingerprint`; `holder_alive` says whether the claim's holder (same uid) still exists.
pub fn decide(
    existing: Option<&TalosMachineClaim>,
    ours: &ClaimHolder,
    fingerprint: &str,
    holder_alive: bool,
) -> Decision {
    let Some(claim) = existing else {
        return Decision::Take;
    };
    if claim.spec.machine.uid == ours.uid {
        return Decision::Held;
    }
    if !holder_alive {
        return Decision::TakeOver {
            stale: claim.uid().unwrap_or_default(),
        };
    }
    if claim.spec.fingerprint == fingerprint {
        Decision::ClaimedElsewhere
    } else {
        Decision::Conflict
    }
}

/// The holder record of `machine`.
pub fn holder(machine: &TalosMachine) -> ClaimHolder {
    ClaimHolder {
        namespace: machine.namespace().unwrap_or_default(),
        name: machine.name_any(),
        uid: machine.uid().unwrap_or_default(),
    }
}

/// The longest piece of a node-reported UUID repeated in a message.
const SHOWN: usize = 64;

/// `uuid` as a message shows it: at most [`SHOWN`] characters, quoted and escaped (a node's
/// value is untrusted text).
fn shown(uuid: &str) -> String {
    let short: String = uuid.chars().take(SHOWN).collect();
    format!("{short:?}")
}

/// Finds held, or else takes ([`take`]), the claim on the node `uuid` for `machine`: for a
/// machine that likely holds it already (discovery took it when it created the machine), so
/// that the common case costs one read, not a create refused and then a read.
pub async fn hold(
    client: &kube::Client,
    machine: &TalosMachine,
    uuid: &str,
    fingerprint: &str,
    address: &str,
) -> Result<Result<(), Stop>, kube::Error> {
    if let Some(name) = claim_name(uuid) {
        let ours = holder(machine);
        let held = Api::<TalosMachineClaim>::all(client.clone())
            .get_opt(&name)
            .await?
            .is_some_and(|claim| decide(Some(&claim), &ours, fingerprint, true) == Decision::Held);
        if held {
            return Ok(Ok(()));
        }
    }
    take(client, machine, uuid, fingerprint, address).await
}

/// Takes (or finds held) the claim on the node at `address` reporting `uuid` for `machine`,
/// which pins `fingerprint`; `Err(refusal)` when it cannot be ours. A create race is settled by
/// the apiserver: exactly one creator succeeds, every other reads the winner's claim.
pub async fn take(
    client: &kube::Client,
    machine: &TalosMachine,
    uuid: &str,
    fingerprint: &str,
    address: &str,
) -> Result<Result<(), Stop>, kube::Error> {
    let Some(name) = claim_name(uuid) else {
        return Ok(Err(Stop {
            reason: reasons::UUID_UNUSABLE,
            message: format!(
                "the node at {address} reports SMBIOS UUID {} which cannot name a claim: nothing is applied (fix the UUID in firmware)",
                shown(uuid)
            ),
        }));
    };
    let ours = holder(machine);
    let claims: Api<TalosMachineClaim> = Api::all(client.clone());
    let mut wanted = TalosMachineClaim::new(
        &name,
        TalosMachineClaimSpec {
            machine: ours.clone(),
            fingerprint: fingerprint.to_owned(),
            address: address.to_owned(),
        },
    );
    wanted.metadata = ObjectMeta {
        name: Some(name.clone()),
        labels: Some(
            [
                (labels::CLAIMED_BY.to_owned(), ours.uid.clone()),
                (
                    labels::MANAGED_BY.to_owned(),
                    labels::MANAGED_BY_VALUE.to_owned(),
                ),
            ]
            .into(),
        ),
        ..ObjectMeta::default()
    };
    // Each round either ends, or saw the claim deleted under it (a release, a takeover):
    // a few rounds settle any race; past them the machine looks again later.
    for _ in 0..3 {
        match claims.create(&PostParams::default(), &wanted).await {
            Ok(_) => return Ok(Ok(())),
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(error) => return Err(error),
        }
        let Some(existing) = claims.get_opt(&name).await? else {
            continue;
        };
        let alive = existing.spec.machine.uid == ours.uid
            || holder_alive(client, &existing.spec.machine).await?;
        match decide(Some(&existing), &ours, fingerprint, alive) {
            Decision::Held => return Ok(Ok(())),
            Decision::Take => {}
            Decision::TakeOver { stale } => delete_exactly(&claims, &name, &stale).await?,
            Decision::ClaimedElsewhere => return Ok(Err(claimed_elsewhere(uuid, address))),
            Decision::Conflict => return Ok(Err(conflict(uuid, address))),
        }
    }
    Ok(Err(claimed_elsewhere(uuid, address)))
}

/// The refusal of a machine whose node another TalosMachine holds.
fn claimed_elsewhere(uuid: &str, address: &str) -> Stop {
    Stop {
        reason: reasons::CLAIMED_ELSEWHERE,
        message: format!(
            "the node at {address} reports SMBIOS UUID {}, which another TalosMachine of the management cluster has claimed: nothing is applied to it; it can be claimed here once that machine is released (deleted or rejected)",
            shown(uuid)
        ),
    }
}

/// The refusal of a machine whose node's UUID is claimed with another certificate.
fn conflict(uuid: &str, address: &str) -> Stop {
    Stop {
        reason: reasons::UUID_CONFLICT,
        message: format!(
            "the node at {address} reports SMBIOS UUID {}, already claimed for a node presenting another certificate: one UUID with two certificates is a conflict (machines sharing a UUID need it fixed in firmware); nothing is applied",
            shown(uuid)
        ),
    }
}

/// Whether the TalosMachine `holder` names still exists (same uid).
async fn holder_alive(client: &kube::Client, holder: &ClaimHolder) -> Result<bool, kube::Error> {
    if holder.namespace.is_empty() || holder.name.is_empty() {
        return Ok(false);
    }
    let machines: Api<TalosMachine> = Api::namespaced(client.clone(), &holder.namespace);
    Ok(machines
        .get_opt(&holder.name)
        .await?
        .is_some_and(|m| m.uid().as_deref() == Some(holder.uid.as_str())))
}

/// Deletes the claim `name` only if its uid is `uid`: gone already, or another claim since,
/// is fine.
async fn delete_exactly(
    claims: &Api<TalosMachineClaim>,
    name: &str,
    uid: &str,
) -> Result<(), kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match claims.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(()),
        Err(error) => Err(error),
    }
}

/// Releases every claim `machine` holds (found by its uid's label, deleted only if its holder
/// uid is the machine's); how many.
pub async fn release(client: &kube::Client, machine: &TalosMachine) -> Result<usize, kube::Error> {
    let Some(uid) = machine.uid() else {
        return Ok(0);
    };
    let claims: Api<TalosMachineClaim> = Api::all(client.clone());
    let held = claims
        .list(&ListParams::default().labels(&format!("{}={uid}", labels::CLAIMED_BY)))
        .await?;
    let mut released = 0;
    for claim in held.items.iter().filter(|c| c.spec.machine.uid == uid) {
        delete_exactly(&claims, &claim.name_any(), &claim.uid().unwrap_or_default()).await?;
        released += 1;
    }
    Ok(released)
}

/// Releases the claims of each machine `deleted` sends (the machine watch's deletes), until
/// the watch ends. A machine whose removal already released them costs one list; a failure is
/// logged, and its claim is taken over by the next machine that needs it.
pub async fn release_deleted(
    client: kube::Client,
    mut deleted: tokio::sync::mpsc::UnboundedReceiver<TalosMachine>,
) {
    while let Some(machine) = deleted.recv().await {
        if let Err(error) = release(&client, &machine).await {
            tracing::warn!(
                machine = %machine.name_any(),
                namespace = %machine.namespace().unwrap_or_default(),
                %error,
                "a deleted machine's claim was not released; the next machine that needs it takes it over"
            );
        }
    }
}

/// The namespace's address policy as stored, if an administrator wrote one.
pub async fn policy(
    client: &kube::Client,
    namespace: &str,
) -> Result<Option<TalosNamespacePolicy>, kube::Error> {
    Api::<TalosNamespacePolicy>::all(client.clone())
        .get_opt(namespace)
        .await
}

/// Where a check reads a namespace's policy from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The manager's watch of every policy (`Context::policies`): a look at a machine already
    /// configured.
    Cached,
    /// The apiserver: before anything first reaches a node, where the rule must see the policy
    /// as stored.
    AsStored,
}

/// Why `address` may not be configured from `namespace` (its policy's ranges), if it may not,
/// with the policy read as `read` says.
pub async fn address_refused(
    ctx: &crate::Context,
    namespace: &str,
    address: &str,
    read: Read,
) -> Result<Option<Stop>, crate::Error> {
    let policy = match read {
        Read::AsStored => policy(&ctx.client, namespace)
            .await?
            .map(std::sync::Arc::new),
        Read::Cached => crate::context::cached_policy(ctx, namespace).await?,
    };
    Ok(policy.and_then(|p| refused_address(&p, namespace, address)))
}

/// The refusal of `address` under `policy` (of `namespace`), if it is outside its ranges.
pub fn refused_address(
    policy: &TalosNamespacePolicy,
    namespace: &str,
    address: &str,
) -> Option<Stop> {
    (!policy.spec.allows_address(address)).then(|| Stop {
        reason: reasons::ADDRESS_NOT_ALLOWED,
        message: format!(
            "address {address} is outside the ranges TalosNamespacePolicy {namespace} allows this namespace ({}): nothing is applied there",
            policy.spec.address_ranges.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use ichor_api::claim::TalosNamespacePolicySpec;

    use super::*;

    fn ours() -> ClaimHolder {
        ClaimHolder {
            namespace: "team-a".into(),
            name: "m-1".into(),
            uid: "uid-a".into(),
        }
    }

    fn claim(uid: &str, fingerprint: &str) -> TalosMachineClaim {
        let mut claim = TalosMachineClaim::new(
            "uuid-1",
            TalosMachineClaimSpec {
                machine: ClaimHolder {
                    namespace: "team-b".into(),
                    name: "m-9".into(),
                    uid: uid.into(),
                },
                fingerprint: fingerprint.into(),
                address: "10.0.0.1".into(),
            },
        );
        claim.metadata.uid = Some("claim-uid".into());
        claim
    }

    #[test]
    fn an_unclaimed_uuid_is_taken() {
        assert_eq!(decide(None, &ours(), "f", true), Decision::Take);
    }

    #[test]
    fn our_own_claim_is_held_whatever_the_certificate_now() {
        let mine = claim("uid-a", "old");
        assert_eq!(decide(Some(&mine), &ours(), "new", true), Decision::Held);
    }

    #[test]
    fn a_live_holders_claim_is_never_taken() {
        let theirs = claim("uid-b", "f");
        assert_eq!(
            decide(Some(&theirs), &ours(), "f", true),
            Decision::ClaimedElsewhere
        );
    }

    #[test]
    fn one_uuid_with_two_certificates_is_a_conflict_not_a_claim() {
        let theirs = claim("uid-b", "f1");
        assert_eq!(
            decide(Some(&theirs), &ours(), "f2", true),
            Decision::Conflict
        );
    }

    #[test]
    fn a_claim_whose_holder_is_gone_is_taken_over_by_its_uid() {
        let stale = claim("uid-b", "f1");
        assert_eq!(
            decide(Some(&stale), &ours(), "f2", false),
            Decision::TakeOver {
                stale: "claim-uid".into()
            }
        );
    }

    #[test]
    fn refusals_name_no_object_of_another_namespace() {
        for refusal in [
            claimed_elsewhere("uuid-1", "10.0.0.1"),
            conflict("uuid-1", "10.0.0.1"),
        ] {
            for other in ["team-b", "m-9", "uid-b"] {
                assert!(!refusal.message.contains(other), "{}", refusal.message);
            }
        }
    }

    #[test]
    fn an_address_outside_the_namespace_ranges_is_refused() {
        let policy = TalosNamespacePolicy::new(
            "team-a",
            TalosNamespacePolicySpec {
                address_ranges: vec!["10.0.1.0/24".into()],
            },
        );
        assert_eq!(refused_address(&policy, "team-a", "10.0.1.9"), None);
        let refused = refused_address(&policy, "team-a", "10.0.2.9").expect("refused");
        assert_eq!(refused.reason, reasons::ADDRESS_NOT_ALLOWED);
        assert!(
            refused.message.contains("10.0.1.0/24"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_node_reported_uuid_is_shown_short_and_escaped() {
        let long = format!("{}\n", "x".repeat(100));
        let shown = shown(&long);
        assert!(shown.len() <= SHOWN + 2, "{shown}");
        assert!(!shown.contains('\n'));
    }
}

//! The seeded random sequence: approvals, deletes and reboots in a random order, each step
//! waited until the cluster settles, etcd quorum watched throughout (`cargo xtask e2e --soak N`
//! runs it on fresh seeds).

use std::time::Duration;

use ichor_api::common::ConditionStatus;
use ichor_api::names::{conditions, reasons};
use ichor_api::operation::OperationAction;
use ichor_api::operation::OperationPhase;
use ichor_api::{TalosMachine, TalosOperation};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_testenv::nets::DAY2;
use ichor_testenv::wait::try_eventually;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};

use crate::support::cluster::{CLUSTER, Monitor, etcd_members, ready_target, state_summary};

/// Whether the cluster has settled after an action: no operation in flight, every machine
/// Ready, pending approval, or being removed and waiting with a reason.
async fn settled(target: &SimTarget) -> bool {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    let operations: Api<ichor_api::operation::TalosOperation> =
        Api::namespaced(target.client(), target.namespace());
    let Ok(list) = machines.list(&ListParams::default()).await else {
        return false;
    };
    let Ok(ops) = operations.list(&ListParams::default()).await else {
        return false;
    };
    let ops_done = ops.items.iter().all(|o| {
        matches!(
            o.status.as_ref().map(|s| s.run.phase),
            Some(OperationPhase::Succeeded | OperationPhase::Failed | OperationPhase::Waiting)
        )
    });
    // A removal waiting for a replacement is settled only while there is none: with more
    // approved control planes than declared (3), it must go on.
    let approved_control_planes = list
        .items
        .iter()
        .filter(|m| {
            m.spec.approval_state == ichor_api::machine::ApprovalState::Approved
                && m.spec.role == Some(ichor_api::common::Role::ControlPlane)
        })
        .count();
    let machines_done = list.items.iter().all(|m| {
        let status = m.status.clone().unwrap_or_default();
        let condition = |t: &str| status.conditions.iter().find(|c| c.type_ == t).cloned();
        if m.metadata.deletion_timestamp.is_some() {
            return approved_control_planes <= 3
                && condition(conditions::REMOVAL_APPROVED).is_some_and(|c| {
                    c.reason == reasons::AWAITING_REPLACEMENT || c.reason == reasons::QUORUM_AT_RISK
                });
        }
        match m.spec.approval_state {
            ichor_api::machine::ApprovalState::Approved => {
                condition(conditions::READY).is_some_and(|c| c.status == ConditionStatus::True)
            }
            _ => true,
        }
    });
    ops_done && machines_done
}

/// Five seeds in every e2e run, so CI soaks the sequence a little each time;
/// `ICHOR_TEST_SEED=<n>` replays one, and `cargo xtask e2e --soak N` runs N others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_random_sequence_keeps_quorum_end_to_end() {
    for seed in ichor_testenv::rng::seeds_from(20_261_202, 5) {
        random_sequence(seed).await;
    }
}

/// One seeded random sequence on a target of its own.
async fn random_sequence(seed: u64) {
    eprintln!(
        "seed {seed} (replay: {}={seed})",
        ichor_testenv::rng::SEED_ENV
    );
    let target = ready_target(SimOptions::new(5, DAY2.net(5), "v1.14.1"), 3, 3, 0).await;
    let monitor = Monitor::start(target.nodes().to_vec());
    let mut rng = ichor_testenv::rng::TestRng::new(seed);
    let mut trace = vec![format!(
        "seed {seed} (replay: {}={seed})",
        ichor_testenv::rng::SEED_ENV
    )];
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    for step in 0..5 {
        let list = machines
            .list(&ListParams::default())
            .await
            .expect("machines")
            .items;
        let pending: Vec<&TalosMachine> = list
            .iter()
            .filter(|m| {
                m.spec.approval_state == ichor_api::machine::ApprovalState::Pending
                    && m.metadata.deletion_timestamp.is_none()
            })
            .collect();
        let live: Vec<&TalosMachine> = list
            .iter()
            .filter(|m| {
                m.spec.approval_state == ichor_api::machine::ApprovalState::Approved
                    && m.metadata.deletion_timestamp.is_none()
            })
            .collect();
        let choice = rng.below(3);
        // What shows that the manager has picked the step up, so `settled` is not judged on
        // the state from before it.
        enum PickedUp {
            /// Nothing changed (a refused deletion).
            Nothing,
            /// The machine `name`, approved, has left the Pending phase.
            Approved(String),
            /// The machine `name` (with this uid) is being removed, or gone.
            Removing(String, String),
            /// The operation `name` has a status.
            Operation(String),
        }
        let picked_up = match choice {
            0 if !pending.is_empty() => {
                let m = pending[rng.below(pending.len())];
                let cp = rng.below(3) > 0;
                let address = m.spec.endpoints[0].clone();
                trace.push(format!("step {step}: approve {address} cp={cp}"));
                specs::approve(&target, &address, cp, &format!("r-{step}"))
                    .await
                    .expect("approve");
                PickedUp::Approved(m.name_any())
            }
            1 | 0 if !live.is_empty() => {
                let m = live[rng.below(live.len())];
                let address = m.spec.endpoints[0].clone();
                let outcome = specs::delete_machine(&target, &address).await;
                trace.push(format!(
                    "step {step}: delete {} ({address}): {}",
                    m.spec.hostname.clone().unwrap_or_default(),
                    match &outcome {
                        Ok(_) => "admitted".to_owned(),
                        Err(e) => format!("refused: {e}"),
                    }
                ));
                match outcome {
                    Ok(name) => PickedUp::Removing(name, m.uid().unwrap_or_default()),
                    Err(_) => PickedUp::Nothing,
                }
            }
            _ => {
                trace.push(format!("step {step}: reboot every configured machine"));
                let name = format!("reboot-{step}");
                specs::create_operation(
                    &target,
                    TalosOperation::test(&name, OperationAction::Reboot)
                        .cluster(CLUSTER)
                        .all(),
                )
                .await
                .expect("operation");
                PickedUp::Operation(name)
            }
        };
        let operations: Api<TalosOperation> = Api::namespaced(target.client(), target.namespace());
        let picked = try_eventually(
            "the manager picked the step up",
            Duration::from_secs(60),
            || async {
                match &picked_up {
                    PickedUp::Nothing => Ok(()),
                    PickedUp::Approved(name) => {
                        let phase = machines
                            .get(name)
                            .await
                            .map_err(|e| e.to_string())?
                            .status
                            .unwrap_or_default()
                            .lifecycle
                            .phase;
                        if phase == ichor_api::machine::MachinePhase::Pending {
                            Err(format!("{name} still {phase:?}"))
                        } else {
                            Ok(())
                        }
                    }
                    PickedUp::Removing(name, uid) => {
                        match machines.get_opt(name).await.map_err(|e| e.to_string())? {
                            Some(m) if m.uid().as_ref() == Some(uid) => {
                                let phase = m.status.unwrap_or_default().lifecycle.phase;
                                if phase == ichor_api::machine::MachinePhase::Removing {
                                    Ok(())
                                } else {
                                    Err(format!("{name} still {phase:?}"))
                                }
                            }
                            // Gone (a machine found again since is another object).
                            _ => Ok(()),
                        }
                    }
                    PickedUp::Operation(name) => {
                        let operation = operations.get(name).await.map_err(|e| e.to_string())?;
                        operation
                            .status
                            .map(drop)
                            .ok_or_else(|| format!("{name} has no status yet"))
                    }
                }
            },
        )
        .await;
        if let Err(error) = picked {
            panic!("{error}\n{}\n{}", trace.join("\n"), state_summary(&target));
        }
        if let Err(error) =
            try_eventually("settled", Duration::from_secs(150), || settled(&target)).await
        {
            panic!("{error}\n{}\n{}", trace.join("\n"), state_summary(&target));
        }
    }
    let seen = monitor.finish().await;
    let (alive, voters) = seen.worst.expect("the monitor saw etcd");
    assert!(alive * 2 > voters, "{}", trace.join("\n"));
    // etcd holds exactly the configured control planes (those waiting for removal included).
    let control_planes: Vec<String> = machines
        .list(&ListParams::default())
        .await
        .expect("machines")
        .items
        .into_iter()
        .filter(|m| {
            m.spec.role == Some(ichor_api::common::Role::ControlPlane)
                && m.status
                    .as_ref()
                    .is_some_and(|s| s.applied.config_hash.is_some())
        })
        .filter_map(|m| m.status.and_then(|s| s.inventory.address))
        .collect();
    let members = etcd_members(&target, &control_planes[0]).await;
    assert_eq!(
        members.len(),
        control_planes.len(),
        "{members:?} vs {control_planes:?}\n{}",
        trace.join("\n")
    );
    println!("{}", trace.join("\n"));
    target.down().await;
}

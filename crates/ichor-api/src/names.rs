//! The one home of every name Ichor writes into Kubernetes objects: annotation and label keys,
//! finalizers, field managers, condition types, condition and Event reasons, Event actions.
//!
//! Every other crate uses these constants; no literal spells one of them twice.

/// Annotation keys.
pub mod annotations {
    /// `"true"` allows deleting an approved control-plane TalosMachine, or a TalosCluster.
    pub const ALLOW_DELETE: &str = "ichor.maesh.dev/allow-delete";
    /// `"true"` allows switching `spec.kubeProxy` on an existing TalosCluster.
    pub const CONFIRM_KUBE_PROXY_SWITCH: &str = "ichor.maesh.dev/confirm-kube-proxy-switch";
    /// `"true"` allows removing an unreachable control plane from etcd through a healthy peer,
    /// skipping its graceful leave and its reset (both recorded); and, while the workload
    /// cluster's API does not answer, skipping the cordon and drain and deleting the Node once
    /// it answers again (all recorded).
    pub const FORCE_REMOVE: &str = "ichor.maesh.dev/force-remove";
    /// `"true"` lets a removal continue past a drain that cannot finish (PodDisruptionBudgets).
    pub const SKIP_DRAIN: &str = "ichor.maesh.dev/skip-drain";
    /// On a TalosCluster: control-plane removals the webhook admitted and the controller has
    /// not finished, as JSON (`[{"machine","uid","at"}]`). Written with the cluster's
    /// `resourceVersion`, so two deletes admitted at once cannot both count the same members.
    pub const REMOVAL_RESERVATIONS: &str = "ichor.maesh.dev/removal-reservations";
    /// On the cluster lock's Lease while a batch of workers holds it (`batch/<cluster uid>`):
    /// its members' steps (`drift/<uid>`, `upgrade/<uid>`), comma-separated. Written with the
    /// Lease's `resourceVersion`, so two workers joining at once cannot both take the last
    /// room (`spec.rollout.maxUnavailable`).
    pub const LOCK_BATCH: &str = "ichor.maesh.dev/lock-batch";
    /// On a TalosMachine: recorded by an adoption. Its applied config is the node's live one,
    /// and its drift is held until the cluster opts in ([`ROLL_OUT_RENDERED`]).
    pub const ADOPTED: &str = "ichor.maesh.dev/adopted";
    /// `"true"` on an adopted TalosCluster: roll out what Ichor renders to the adopted
    /// machines whose live config differs from it (under the planner's rules, one at a time).
    pub const ROLL_OUT_RENDERED: &str = "ichor.maesh.dev/roll-out-rendered-config";
    /// The value every boolean annotation above must have to take effect.
    pub const TRUE: &str = "true";
    /// Test-only: on an object, the name of a controller ([`super::controllers`]) whose
    /// reconcile of it panics, in a manager built with its `testing` feature (the tests'
    /// build). The release build has no such code and ignores it.
    #[cfg(feature = "testing")]
    pub const TEST_PANIC_IN: &str = "ichor.maesh.dev/test-panic-in";
}

/// The manager's controllers, as its metrics, its `/healthz` and the `ReconcilePanicked`
/// condition name them.
pub mod controllers {
    /// TalosCluster: discovery, secrets, bootstrap, status, teardown.
    pub const CLUSTER: &str = "cluster";
    /// TalosMachine: the lifecycle from maintenance mode to Ready, drift, removal.
    pub const MACHINE: &str = "machine";
    /// TalosStorage: what its volumes select and what the nodes report of them.
    pub const STORAGE: &str = "storage";
    /// TalosCluster `spec.backup`: scheduled etcd backups.
    pub const BACKUP: &str = "backup";
    /// TalosOperation: day-2 actions.
    pub const OPERATION: &str = "operation";
}

/// Label keys.
pub mod labels {
    /// The TalosCluster a TalosMachine (or a published Secret) belongs to.
    pub const CLUSTER: &str = "ichor.maesh.dev/cluster";
    /// The role of a TalosMachine (`controlplane` or `worker`).
    pub const ROLE: &str = "ichor.maesh.dev/role";
    /// The TalosMachineClass that approved a TalosMachine (its patches render into the
    /// machine's config, between the cluster's and the machine's).
    pub const CLASS: &str = "ichor.maesh.dev/class";
    /// The SMBIOS UUID a TalosMachine was discovered with.
    pub const MACHINE_UUID: &str = "ichor.maesh.dev/machine-uuid";
    /// The uid of the TalosMachine holding a TalosMachineClaim (how its release finds it).
    pub const CLAIMED_BY: &str = "ichor.maesh.dev/claimed-by";
    /// The TalosMachine a Secret belongs to (its applied-config Secret).
    pub const MACHINE: &str = "ichor.maesh.dev/machine";
    /// On a Secret Ichor created to publish something (a talosconfig, a kubeconfig, an
    /// applied config), value `"true"`: with a controller reference to the object it was
    /// published for, what Ichor may write again; any other Secret is never written (ADR 0053).
    pub const PUBLISHED: &str = "ichor.maesh.dev/published";
    /// Marks objects created and owned by Ichor.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// The value of [`MANAGED_BY`] on Ichor's objects.
    pub const MANAGED_BY_VALUE: &str = "ichor";
}

/// Secrets Ichor writes: names and keys.
pub mod secrets {
    /// The key of a bundle Secret holding `talosctl gen secrets` YAML.
    pub const BUNDLE_KEY: &str = "secrets.yaml";
    /// The key of a published talosconfig.
    pub const TALOSCONFIG_KEY: &str = "talosconfig";
    /// The key of a published admin kubeconfig.
    pub const KUBECONFIG_KEY: &str = "kubeconfig";
    /// A TalosMachine's applied-config Secret is named `<machine>` followed by this suffix.
    pub const APPLIED_CONFIG_SUFFIX: &str = "-applied-config";
    /// The key of the exact config YAML last applied to a machine, in its applied-config Secret.
    pub const APPLIED_CONFIG_KEY: &str = "config.yaml";
    /// The key of an object store's access key id, in the Secret `store.credentialsSecretRef`
    /// names.
    pub const ACCESS_KEY_ID_KEY: &str = "accessKeyId";
    /// The key of an object store's secret access key, beside [`ACCESS_KEY_ID_KEY`].
    pub const SECRET_ACCESS_KEY_KEY: &str = "secretAccessKey";
    /// The optional key of CA certificates (PEM) to trust for an object store's endpoint.
    pub const STORE_CA_KEY: &str = "ca.crt";
    /// The key of the age X25519 identity (`AGE-SECRET-KEY-1…`) that opens encrypted backups:
    /// read by a restore only (backups are encrypted to `spec.backup.encryption.recipient`).
    pub const AGE_KEY: &str = "age.key";
}

/// Finalizers.
pub mod finalizers {
    /// Held on every approved TalosMachine until its removal sequence has finished.
    pub const MACHINE_REMOVAL: &str = "ichor.maesh.dev/machine-removal";
    /// Held on a TalosCluster until all its machines are removed.
    pub const CLUSTER_REMOVAL: &str = "ichor.maesh.dev/cluster-removal";
}

/// Field managers for server-side apply.
pub mod field_managers {
    /// The controller.
    pub const MANAGER: &str = "ichor-manager";
    /// The admission webhook (removal reservations, its certificate Secret).
    pub const WEBHOOK: &str = "ichor-webhook";

    // One field manager per group of status fields: every status field has exactly one, and a
    // writer applies its whole group, so no writer sends, strips or clobbers another's fields
    // (ADR 0020).

    /// TalosCluster status: conditions, counts, bootstrap record, bundle identity, Secrets.
    pub const CLUSTER_STATUS: &str = "ichor-manager/cluster";
    /// TalosCluster `status.lock`: the cluster lock's mirror.
    pub const CLUSTER_LOCK: &str = "ichor-manager/lock";
    /// TalosCluster `status.tombstones`: nodes force-removed while unreachable.
    pub const CLUSTER_TOMBSTONES: &str = "ichor-manager/tombstones";
    /// TalosCluster `status.pendingNodeDeletes`: Nodes of force-removed machines, deleted once
    /// the workload API answers.
    pub const CLUSTER_NODE_DELETES: &str = "ichor-manager/node-deletes";
    /// TalosCluster `status.driftHalt`: where a drift rollout stopped.
    pub const CLUSTER_DRIFT: &str = "ichor-manager/drift";
    /// TalosMachine lifecycle: phase, its conditions, node name, etcd member id.
    pub const MACHINE_LIFECYCLE: &str = "ichor-manager/lifecycle";
    /// TalosMachine `status.appliedConfigHash`: recorded once a config is on the node.
    pub const MACHINE_APPLIED: &str = "ichor-manager/applied";
    /// TalosMachine `status.driftReboot`: the intent of a drift apply with a reboot.
    pub const MACHINE_DRIFT: &str = "ichor-manager/drift-reboot";
    /// TalosMachine inventory: address, fingerprint seen, Talos version, hardware.
    pub const MACHINE_INVENTORY: &str = "ichor-manager/inventory";
    /// TalosMachine `status.etcd`: the etcd member as last observed on the node.
    pub const MACHINE_ETCD: &str = "ichor-manager/etcd";
    /// TalosMachine `status.removal` and `RemovalApproved`: the removal sequence.
    pub const MACHINE_REMOVAL: &str = "ichor-manager/removal";
    /// TalosMachine `status.upgrade` and `UpToDate`: the node's Talos upgrade in flight.
    pub const MACHINE_UPGRADE: &str = "ichor-manager/upgrade";
    /// TalosMachine `status.drain`: the drain before a disruption in flight.
    pub const MACHINE_DRAIN: &str = "ichor-manager/drain";
    /// TalosMachine `ClassMatched`: what the machine classes of its cluster make of it.
    pub const MACHINE_CLASS: &str = "ichor-manager/class";
    /// The manager's writes of a machine's `status.bmc` and `BmcReachable`.
    pub const MACHINE_BMC: &str = "ichor-manager/bmc";
    /// TalosMachineClass status.
    pub const CLASS_STATUS: &str = "ichor-manager/class-status";
    /// TalosStorage status.
    pub const STORAGE_STATUS: &str = "ichor-manager/storage";
    /// TalosOperation status, but for the backup's key.
    pub const OPERATION_STATUS: &str = "ichor-manager/operation";
    /// TalosOperation `status.backupKey`: the object an `etcdSnapshot` backed up to.
    pub const OPERATION_BACKUP: &str = "ichor-manager/operation-backup";
    /// TalosCluster `status.backup` and `BackedUp`: the backup controller.
    pub const BACKUP_STATUS: &str = "ichor-manager/backup";
    /// TalosCluster `status.restore` and `Restored`: the restore before bootstrap.
    pub const RESTORE_STATUS: &str = "ichor-manager/restore";
    /// `ReconcilePanicked`, on every kind: written where a panicking reconcile is caught.
    pub const RECONCILE_PANIC: &str = "ichor-manager/panic";
}

/// Condition types.
pub mod conditions {
    /// The object is fully reconciled and serving.
    pub const READY: &str = "Ready";
    /// The cluster's etcd has been bootstrapped (once, on one control plane).
    pub const BOOTSTRAPPED: &str = "Bootstrapped";
    /// The secrets bundle exists and is valid.
    pub const SECRETS_READY: &str = "SecretsReady";
    /// The cluster is between shapes (e.g. an even control-plane count, approved ≠ declared).
    pub const TRANSITIONING: &str = "Transitioning";
    /// The machine's configuration was applied.
    pub const CONFIG_APPLIED: &str = "ConfigApplied";
    /// Talos was installed to disk.
    pub const INSTALLED: &str = "Installed";
    /// The machine's removal passed the safety checks.
    pub const REMOVAL_APPROVED: &str = "RemovalApproved";
    /// The machine presents a certificate fingerprint other than its pin.
    pub const FINGERPRINT_CHANGED: &str = "FingerprintChanged";
    /// On a TalosMachine whose Node is drained before a disruption: false while pods still
    /// wait to be evicted (and why), true once drained; removed when the machine is back.
    pub const DRAINED: &str = "Drained";
    /// A day-2 operation finished successfully.
    pub const SUCCEEDED: &str = "Succeeded";
    /// Every machine of the cluster runs the config rendered for it (no drift rollout pending
    /// or stopped).
    pub const CONFIG_ROLLED_OUT: &str = "ConfigRolledOut";
    /// Every configured node of the cluster runs the declared Talos version (and schematic) and
    /// Kubernetes version: false while a rollout goes on, or stopped, and where.
    pub const VERSION_ROLLED_OUT: &str = "VersionRolledOut";
    /// On a pending TalosMachine: whether a TalosMachineClass approves it, and if not why
    /// (two classes match, a class is full, the control planes are all there).
    pub const CLASS_MATCHED: &str = "ClassMatched";
    /// On a TalosCluster with `spec.backup`: whether the last backup reached the store, and if
    /// not why.
    pub const BACKED_UP: &str = "BackedUp";
    /// On a TalosCluster with `spec.restoreFrom`: whether its etcd was restored from the
    /// backup, and if not why (every refusal comes before any bootstrap).
    pub const RESTORED: &str = "Restored";
    /// On a TalosCluster with `spec.adopt`: whether its nodes were adopted, and if not why.
    pub const ADOPTED: &str = "Adopted";
    /// On a TalosCluster: whether its talosconfig and kubeconfig Secrets are published, and
    /// if not which Secret of someone else's holds the name (ADR 0053).
    pub const CREDENTIALS_PUBLISHED: &str = "CredentialsPublished";
    /// On a TalosCluster: false while a node answering its credentials at a tombstoned address
    /// cannot be told to be the force-removed machine (another SMBIOS UUID, or none recorded),
    /// so it is not reset (ADR 0052); absent otherwise.
    pub const NODE_IDENTITY_VERIFIED: &str = "NodeIdentityVerified";
    /// On a configured TalosMachine: whether its node runs the cluster's declared Talos
    /// version (and, with a factory installer, the declared schematic), and if not where its
    /// upgrade is.
    pub const UP_TO_DATE: &str = "UpToDate";
    /// On any object: true while a controller's reconciles of it panic (a bug in Ichor),
    /// retried with a growing backoff; removed once that controller reconciles it again.
    pub const RECONCILE_PANICKED: &str = "ReconcilePanicked";
    /// Whether the machine's BMC (`spec.bmc`) answered its last read with its system.
    pub const BMC_REACHABLE: &str = "BmcReachable";
}

/// Condition reasons (CamelCase), one per cause a person can act on.
pub mod reasons {
    /// The control-plane count is even: one more or one less keeps etcd's fault tolerance.
    pub const EVEN_CONTROL_PLANE_COUNT: &str = "EvenControlPlaneCount";
    /// Approved control planes differ from `spec.controlPlane.count`.
    pub const CONTROL_PLANE_COUNT_MISMATCH: &str = "ControlPlaneCountMismatch";
    /// The certificate seen differs from the pinned fingerprint.
    pub const FINGERPRINT_MISMATCH: &str = "FingerprintMismatch";
    /// Another TalosMachine of the management cluster holds the claim on the node's SMBIOS
    /// UUID: nothing is applied (ADR 0054).
    pub const CLAIMED_ELSEWHERE: &str = "ClaimedElsewhere";
    /// The node's SMBIOS UUID is claimed with another certificate's fingerprint (two machines
    /// sharing a UUID, or one that rebooted): a conflict, not a claim (ADR 0054).
    pub const UUID_CONFLICT: &str = "UuidConflict";
    /// The node reports an SMBIOS UUID that cannot name a claim: nothing is applied.
    pub const UUID_UNUSABLE: &str = "UuidUnusable";
    /// The address (a machine's, or a discovery CIDR) is outside the ranges its namespace's
    /// TalosNamespacePolicy allows: nothing is applied there, nothing swept (ADR 0054).
    pub const ADDRESS_NOT_ALLOWED: &str = "AddressNotAllowed";
    /// The secrets bundle Secret is missing or invalid.
    pub const SECRETS_BUNDLE_UNAVAILABLE: &str = "SecretsBundleUnavailable";
    /// The secrets bundle is gone although machines were configured with it: it is never
    /// regenerated; restore the Secret.
    pub const SECRETS_BUNDLE_LOST: &str = "SecretsBundleLost";
    /// The bundle Secret holds another bundle (another OS CA) than the cluster was built with.
    pub const SECRETS_BUNDLE_MISMATCH: &str = "SecretsBundleMismatch";
    /// No bundle Secret exists, yet a Talos node at the cluster's endpoint or a machine's
    /// address answers in configured mode: no bundle is generated (ADR 0053).
    pub const SECRETS_BUNDLE_NOT_GENERATED: &str = "SecretsBundleNotGenerated";
    /// A Secret Ichor did not create holds a name Ichor publishes under: left as it is, and
    /// nothing is published there until the name is free (ADR 0053).
    pub const SECRET_NAME_TAKEN: &str = "SecretNameTaken";
    /// The talosconfig and (once bootstrapped) the kubeconfig are published.
    pub const PUBLISHED: &str = "Published";
    /// The node runs an older Talos than the cluster's version contract.
    pub const TALOS_VERSION_TOO_OLD: &str = "TalosVersionTooOld";
    /// The rendered config references hardware the machine does not have.
    pub const HARDWARE_MISMATCH: &str = "HardwareMismatch";
    /// A config patch could not be applied.
    pub const INVALID_PATCH: &str = "InvalidPatch";
    /// The machine is waiting for approval.
    pub const AWAITING_APPROVAL: &str = "AwaitingApproval";
    /// The machine was rejected and is never touched.
    pub const REJECTED: &str = "Rejected";
    /// The removal would take etcd below quorum.
    pub const QUORUM_AT_RISK: &str = "QuorumAtRisk";
    /// The delete needs the `ichor.maesh.dev/allow-delete: "true"` annotation.
    pub const ALLOW_DELETE_REQUIRED: &str = "AllowDeleteRequired";
    /// The TalosCluster was deleted without the `ichor.maesh.dev/allow-delete: "true"`
    /// annotation (admission did not check it): its teardown waits, no node is touched, until
    /// the annotation is added (ADR 0052).
    pub const DELETED_WITHOUT_ALLOW_DELETE: &str = "DeletedWithoutAllowDelete";
    /// The machine is its cluster's last control plane: delete the TalosCluster instead.
    pub const LAST_CONTROL_PLANE: &str = "LastControlPlane";
    /// The machine's address is the host of the cluster's `spec.endpoint`: every node reaches
    /// Kubernetes (and a worker its certificate) through it, so it cannot be removed or reset.
    pub const CLUSTER_ENDPOINT_NODE: &str = "ClusterEndpointNode";
    /// `spec.approvalState` or `spec.role` changed on a machine whose config was applied.
    pub const IMMUTABLE_ONCE_APPLIED: &str = "ImmutableOnceApplied";
    /// The webhook could not read the live state it needs, so it refused (fail closed).
    pub const LIVE_STATE_UNAVAILABLE: &str = "LiveStateUnavailable";
    /// A change of `spec.talosVersion` or `spec.kubernetesVersion` breaks a version rule (a
    /// Kubernetes minor downgrade or skip, a Talos below the config contract in force or past
    /// what its installer accepts, a pair outside Talos's support matrix): refused at the door,
    /// the message naming the field (ADR 0068).
    pub const VERSION_CHANGE_REFUSED: &str = "VersionChangeRefused";
    /// A TalosOperation `upgrade` or `upgradeKubernetes` created before versions were declared:
    /// it fails without touching a node; declare the version in the TalosCluster's spec
    /// instead (ADR 0068).
    pub const VERSIONS_DECLARED: &str = "VersionsDeclared";
    /// The admission review could not be read.
    pub const INVALID_REVIEW: &str = "InvalidReview";
    /// The webhook requires a client certificate (ADR 0051) and the caller presented none.
    pub const CLIENT_CERTIFICATE_REQUIRED: &str = "ClientCertificateRequired";
    /// A delete review's object is not the live one (another uid or resourceVersion): the
    /// webhook reserves nothing for it (ADR 0051).
    pub const STALE_REVIEW: &str = "StaleReview";
    /// The removal waits for a replacement control plane (declared count).
    pub const AWAITING_REPLACEMENT: &str = "AwaitingReplacement";
    /// The cluster lock is held by another action.
    pub const WAITING_FOR_LOCK: &str = "WaitingForLock";
    /// The node did not answer.
    pub const NODE_UNREACHABLE: &str = "NodeUnreachable";
    /// Everything is as declared.
    pub const RECONCILED: &str = "Reconciled";
    /// A PodDisruptionBudget refuses an eviction; the drain retries (until its timeout before a
    /// reboot, an upgrade, a drift reboot or a reset; a removal's is skipped with the
    /// skip-drain annotation).
    pub const DRAIN_BLOCKED: &str = "DrainBlocked";
    /// The Image Factory (`spec.imageFactory.url`) did not take the declared schematic (it
    /// refused it, or did not answer): no installer built from it is used yet; retried.
    pub const SCHEMATIC_NOT_REGISTERED: &str = "SchematicNotRegistered";
    /// The Image Factory names the declared schematic with another ID than Ichor computed: the
    /// installer would not be the declared one, so it is never used (ADR 0067).
    pub const SCHEMATIC_ID_MISMATCH: &str = "SchematicIdMismatch";
    /// The node runs the declared Talos version and schematic.
    pub const RUNS_DECLARED: &str = "RunsDeclared";
    /// The node's upgrade waits for its turn (control planes first, then workers, by name;
    /// one node at a time, every other one healthy) or for the cluster lock.
    pub const UPGRADE_QUEUED: &str = "UpgradeQueued";
    /// The node is being upgraded: its installer pulled and installed, then a reboot.
    pub const UPGRADING: &str = "Upgrading";
    /// The upgrade failed on this node (the installer could not be pulled or installed, or
    /// the node did not come back): the rollout stops here until the declared version or
    /// schematic changes.
    pub const UPGRADE_FAILED: &str = "UpgradeFailed";
    /// Evicted pods are still leaving the Node.
    pub const DRAINING: &str = "Draining";
    /// The drain's timeout (`spec.drain.timeout`) ran out: the message names the pods and the
    /// PodDisruptionBudgets that block; nothing is forced unless `spec.drain.onTimeout` is
    /// `Force`, and the disruption waits.
    pub const DRAIN_TIMED_OUT: &str = "DrainTimedOut";
    /// Every evictable pod left the Node.
    pub const DRAINED: &str = "Drained";
    /// The machine is back after its disruption: the Node Ichor cordoned for it is schedulable
    /// again, and the drain record is cleared.
    pub const UNCORDONED: &str = "Uncordoned";
    /// `EtcdLeaveCluster` failed: the removal stopped (fail closed).
    pub const ETCD_LEAVE_FAILED: &str = "EtcdLeaveFailed";
    /// No healthy peer confirms yet that the member left etcd.
    pub const ETCD_LEAVE_UNVERIFIED: &str = "EtcdLeaveUnverified";
    /// The node refused its reset.
    pub const RESET_FAILED: &str = "ResetFailed";
    /// The cluster is Transitioning and this action does not complete the transition.
    pub const CLUSTER_TRANSITIONING: &str = "ClusterTransitioning";
    /// A TalosOperation's target machines could not be resolved (none, or not configured).
    pub const NO_TARGETS: &str = "NoTargets";
    /// A node did not come back healthy after a disruptive action.
    pub const NODE_NOT_HEALTHY: &str = "NodeNotHealthy";
    /// etcd is not healthy (a member is down or a learner): the next control plane waits.
    pub const ETCD_UNHEALTHY: &str = "EtcdUnhealthy";
    /// After an upgrade the node runs the version it ran before (Talos rolled it back): an
    /// operation fails; a declared rollout stops at that machine until the declared version
    /// or schematic changes.
    pub const UPGRADE_ROLLED_BACK: &str = "UpgradeRolledBack";
    /// A node refused a disruptive action.
    pub const ACTION_FAILED: &str = "ActionFailed";
    /// A day-2 operation finished on every node.
    pub const COMPLETED: &str = "Completed";
    /// Drift was not applied live this time (the node busy or unreachable, the config
    /// refused); it is retried.
    pub const DRIFT_NOT_APPLIED: &str = "DriftNotApplied";
    /// Drift that cannot be applied live waits for the cluster lock to reboot the node.
    pub const NEEDS_REBOOT: &str = "NeedsReboot";
    /// Drift waits for its turn: another machine goes first, or must be healthy again first.
    pub const DRIFT_QUEUED: &str = "DriftQueued";
    /// `spec.rollout.suspend` is true: no node starts its change (one in flight finishes).
    pub const ROLLOUT_SUSPENDED: &str = "RolloutSuspended";
    /// A step that reboots or upgrades (or a live change the policy holds) waits for the next
    /// maintenance window of `spec.rollout`.
    pub const OUTSIDE_MAINTENANCE_WINDOW: &str = "OutsideMaintenanceWindow";
    /// A maintenance window of `spec.rollout` does not read (its schedule, duration or time
    /// zone); every step a window holds waits.
    pub const ROLLOUT_POLICY_INVALID: &str = "RolloutPolicyInvalid";
    /// A health gate of `spec.rollout` fails (or cannot be read): the next node waits.
    pub const HEALTH_GATE_FAILING: &str = "HealthGateFailing";
    /// A control plane's step waits for the fresh etcd backup `spec.rollout.freshBackup`
    /// asks for (being taken, or another backup of the cluster running).
    pub const WAITING_FOR_FRESH_BACKUP: &str = "WaitingForFreshBackup";
    /// The fresh etcd backup a control plane's step asked for failed; the step waits and the
    /// backup is tried again.
    pub const FRESH_BACKUP_FAILED: &str = "FreshBackupFailed";
    /// Every reason a step waits for by the rollout policy (`spec.rollout`, ADRs 0074, 0075).
    pub const POLICY_HOLDS: [&str; 6] = [
        ROLLOUT_SUSPENDED,
        OUTSIDE_MAINTENANCE_WINDOW,
        ROLLOUT_POLICY_INVALID,
        HEALTH_GATE_FAILING,
        WAITING_FOR_FRESH_BACKUP,
        FRESH_BACKUP_FAILED,
    ];
    /// The drift rollout stopped at a machine that refused its config; fix the patch.
    pub const DRIFT_HALTED: &str = "DriftHalted";
    /// Drift is being rolled out, one machine at a time.
    pub const DRIFT_ROLLING_OUT: &str = "DriftRollingOut";
    /// Every configured node runs the declared Talos version and schematic.
    pub const VERSION_CURRENT: &str = "VersionCurrent";
    /// Nodes are being upgraded to the declared Talos version or schematic, one at a time.
    pub const VERSION_ROLLING_OUT: &str = "VersionRollingOut";
    /// A Kubernetes rollout's last step, the bootstrap manifests synced to the workload cluster
    /// server-side, failed (ADR 0070); retried, the message says why.
    pub const MANIFESTS_NOT_SYNCED: &str = "ManifestsNotSynced";
    /// The bootstrap manifests were synced to the workload cluster: a Kubernetes rollout ended.
    pub const MANIFESTS_SYNCED: &str = "ManifestsSynced";
    /// Every machine runs the config rendered for it.
    pub const CONFIG_CURRENT: &str = "ConfigCurrent";
    /// The TalosCluster is being deleted: its machines are removed, workers first.
    pub const TEARING_DOWN: &str = "TearingDown";
    /// A control plane's removal in a teardown waits until the configured workers are gone.
    pub const TEARDOWN_WORKERS_FIRST: &str = "TeardownWorkersFirst";
    /// The secrets bundle is present and valid.
    pub const BUNDLE_VALID: &str = "BundleValid";
    /// No configured control plane answers yet, so none can bootstrap etcd.
    pub const WAITING_FOR_CONTROL_PLANE: &str = "WaitingForControlPlane";
    /// The machine recorded to bootstrap etcd does not answer; no other one is bootstrapped.
    pub const WAITING_FOR_RECORDED_MACHINE: &str = "WaitingForRecordedMachine";
    /// etcd already runs on a control plane: nothing to bootstrap.
    pub const ETCD_RUNNING: &str = "EtcdRunning";
    /// A published kubeconfig or talosconfig was renewed before it expires (an Event).
    pub const CREDENTIALS_RENEWED: &str = "CredentialsRenewed";
    /// A published kubeconfig or talosconfig was minted anew because what it points at changed
    /// (endpoint, nodes, CA) (an Event).
    pub const CREDENTIALS_REMINTED: &str = "CredentialsReminted";
    /// A control plane was recorded to bootstrap etcd (an Event).
    pub const BOOTSTRAP_CHOSEN: &str = "BootstrapChosen";
    /// etcd was bootstrapped.
    pub const BOOTSTRAPPED: &str = "Bootstrapped";
    /// The bootstrap call has not succeeded yet; it is retried.
    pub const BOOTSTRAP_PENDING: &str = "BootstrapPending";
    /// A force-removed node answered again and was reset (an Event).
    pub const TOMBSTONE_RESET: &str = "TombstoneReset";
    /// The node answering at a machine's (or a tombstone's) address reports another SMBIOS
    /// UUID than the one recorded: it is another machine, and nothing destructive is sent to
    /// it (ADR 0052).
    pub const NODE_IDENTITY_MISMATCH: &str = "NodeIdentityMismatch";
    /// No SMBIOS UUID is recorded for the machine (or the tombstone) a destructive step is
    /// meant for, so the node answering at its address cannot be told to be it: nothing
    /// destructive is sent (ADR 0052).
    pub const NODE_IDENTITY_UNRECORDED: &str = "NodeIdentityUnrecorded";
    /// Every approved machine of the cluster is Ready.
    pub const ALL_MACHINES_READY: &str = "AllMachinesReady";
    /// Some approved machine of the cluster is not Ready yet.
    pub const MACHINES_NOT_READY: &str = "MachinesNotReady";
    /// The node's mutual-TLS API does not answer yet (installing, rebooting, or a worker
    /// waiting for its certificate from trustd).
    pub const WAITING_FOR_NODE_API: &str = "WaitingForNodeAPI";
    /// The node answers but is not in stage `running` yet.
    pub const BOOTING: &str = "Booting";
    /// The worker runs.
    pub const RUNNING: &str = "Running";
    /// The control plane runs as an etcd voter.
    pub const ETCD_VOTER: &str = "EtcdVoter";
    /// The control plane joined etcd as a learner and waits for promotion.
    pub const ETCD_LEARNER: &str = "EtcdLearner";
    /// The control plane runs; etcd waits for the bootstrap or for joining.
    pub const WAITING_FOR_ETCD: &str = "WaitingForEtcd";
    /// Discovery recorded a machine found in maintenance mode (an Event).
    pub const DISCOVERED: &str = "Discovered";
    /// The machine presents its pinned certificate.
    pub const FINGERPRINT_MATCHES: &str = "FingerprintMatches";
    /// The TalosCluster named by `spec.clusterRef` does not exist.
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    /// A TalosMachineClass approved the machine (a condition reason and an Event).
    pub const APPROVED_BY_CLASS: &str = "ApprovedByClass";
    /// More than one TalosMachineClass matches the machine: it stays pending.
    pub const CLASS_AMBIGUOUS: &str = "ClassAmbiguous";
    /// The matching class has approved `spec.maxMachines` machines: it stays pending.
    pub const CLASS_FULL: &str = "ClassFull";
    /// The cluster has `spec.controlPlane.count` control planes (not counting those being
    /// removed): a control-plane class approves no more, and the machine stays pending.
    pub const CONTROL_PLANES_FULL: &str = "ControlPlanesFull";
    /// The class matches and approves pending machines of its cluster.
    pub const CLASS_ACTIVE: &str = "ClassActive";
    /// Every volume of a TalosStorage is ready on every machine it selects.
    pub const VOLUMES_READY: &str = "VolumesReady";
    /// Some volume is not ready yet, or a selected machine is not configured yet.
    pub const VOLUMES_PENDING: &str = "VolumesPending";
    /// Talos reports a volume failed (e.g. no disk matched its selector).
    pub const VOLUME_FAILED: &str = "VolumeFailed";
    /// Two TalosStorages give one machine volumes of the same name: neither renders there.
    pub const VOLUME_CONFLICT: &str = "VolumeConflict";
    /// An approved machine has no `spec.role`.
    pub const ROLE_REQUIRED: &str = "RoleRequired";
    /// The config is being applied over the pinned maintenance connection.
    pub const APPLYING: &str = "Applying";
    /// The node refused the first config.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// The config was applied.
    pub const APPLIED: &str = "Applied";
    /// Talos reports the install done (1.14: phase `installed`; 1.13: booted past the install).
    pub const INSTALLED: &str = "Installed";
    /// A config was applied to a machine (an Event).
    pub const CONFIG_APPLIED: &str = "ConfigApplied";
    /// Drift was applied, live or with a reboot (an Event).
    pub const DRIFT_APPLIED: &str = "DriftApplied";
    /// Drift is staged and the node reboots into it under the cluster lock (an Event).
    pub const REBOOT_FOR_DRIFT: &str = "RebootForDrift";
    /// The machine became Ready (an Event).
    pub const READY: &str = "Ready";
    /// A TalosOperation reset the machine back to maintenance mode (an Event).
    pub const RESET: &str = "Reset";
    /// A TalosOperation took the lock and started (an Event).
    pub const STARTED: &str = "Started";
    /// A removal step was done (an Event).
    pub const REMOVAL: &str = "Removal";
    /// An unreachable node's reset was skipped by force removal (an Event).
    pub const RESET_SKIPPED: &str = "ResetSkipped";
    /// The workload cluster's API does not answer (or its kubeconfig Secret is missing), so a
    /// removal cannot cordon, drain or delete the Node: it waits, or skips those steps with the
    /// force-remove annotation.
    pub const WORKLOAD_API_UNREACHABLE: &str = "WorkloadAPIUnreachable";
    /// A removal skipped a cordon or drain the workload API could not answer (force removal; an
    /// Event).
    pub const NODE_STEP_SKIPPED: &str = "NodeStepSkipped";
    /// A backup reached the store.
    pub const BACKUP_SUCCEEDED: &str = "BackupSucceeded";
    /// No backup has run yet; the first is due at `status.backup.nextRun`.
    pub const BACKUP_SCHEDULED: &str = "BackupScheduled";
    /// `spec.backup` (or `spec.restoreFrom`) names a Secret or key that is missing or unusable,
    /// or a schedule that does not parse.
    pub const BACKUP_SETTINGS_INVALID: &str = "BackupSettingsInvalid";
    /// The object store refused the credentials.
    pub const STORE_CREDENTIALS_REFUSED: &str = "StoreCredentialsRefused";
    /// The bucket does not exist (Ichor never creates one).
    pub const STORE_BUCKET_MISSING: &str = "StoreBucketMissing";
    /// The object store could not be reached.
    pub const STORE_UNREACHABLE: &str = "StoreUnreachable";
    /// The store's endpoint is plain `http://` and the backup (or restore) is not encrypted,
    /// nor `store.allowPlainHttp` set: nothing is sent, and nothing stored is touched.
    pub const STORE_PLAIN_HTTP_REFUSED: &str = "StorePlainHttpRefused";
    /// The object store refused to store the backup: it is full, or failing.
    pub const STORE_WRITE_REFUSED: &str = "StoreWriteRefused";
    /// No control plane could give a snapshot (none healthy, or all being removed).
    pub const NO_SNAPSHOT_SOURCE: &str = "NoSnapshotSource";
    /// The snapshot stream failed or did not check out (size, SHA-256 trailer).
    pub const SNAPSHOT_FAILED: &str = "SnapshotFailed";
    /// An `etcdSnapshot` operation on a cluster without `spec.backup`.
    pub const BACKUP_NOT_CONFIGURED: &str = "BackupNotConfigured";
    /// The backup to restore from does not exist.
    pub const RESTORE_OBJECT_MISSING: &str = "RestoreObjectMissing";
    /// The backup's SHA-256 or size differs from what was recorded with it.
    pub const RESTORE_CHECKSUM_MISMATCH: &str = "RestoreChecksumMismatch";
    /// The backup cannot be decrypted with the identity given (or none was given).
    pub const RESTORE_KEY_WRONG: &str = "RestoreKeyWrong";
    /// The backup was taken with another secrets bundle than `spec.secretsRef` holds.
    pub const RESTORE_BUNDLE_MISMATCH: &str = "RestoreBundleMismatch";
    /// A restore into a cluster whose etcd is already bootstrapped.
    pub const RESTORE_REFUSED_BOOTSTRAPPED: &str = "RestoreRefusedBootstrapped";
    /// The backup was checked and is being restored into the first control plane.
    pub const RESTORING: &str = "Restoring";
    /// The first control plane bootstrapped from the backup.
    pub const RESTORE_COMPLETED: &str = "RestoreCompleted";
    /// The running cluster's nodes were adopted: recorded as approved, configured machines,
    /// nothing applied.
    pub const ADOPTED: &str = "Adopted";
    /// An endpoint to adopt did not answer as a configured Talos node with the bundle's
    /// credentials, or the nodes are not one cluster with a control plane: nothing recorded.
    pub const ADOPTION_REFUSED: &str = "AdoptionRefused";
    /// The nodes to adopt trust another OS CA than the bundle's (both fingerprints shown).
    pub const ADOPTION_BUNDLE_MISMATCH: &str = "AdoptionBundleMismatch";
    /// A spec field contradicts what the nodes to adopt run (each field named).
    pub const ADOPTION_CONTRADICTS_SPEC: &str = "AdoptionContradictsSpec";
    /// An adopted machine's live config differs from what Ichor renders; held until the
    /// cluster opts in with the roll-out-rendered-config annotation.
    pub const DRIFT_HELD_ADOPTED: &str = "DriftHeldAdopted";
    /// A removal handed its Node delete to the TalosCluster, to run once the workload API
    /// answers again (force removal; an Event).
    pub const NODE_DELETE_DEFERRED: &str = "NodeDeleteDeferred";
    /// A Node whose delete was handed to the TalosCluster was deleted (an Event).
    pub const DEFERRED_NODE_DELETED: &str = "DeferredNodeDeleted";
    /// A Node whose delete was handed to the TalosCluster was kept: it was registered after the
    /// removal, or another machine claims it now (an Event).
    pub const DEFERRED_NODE_KEPT: &str = "DeferredNodeKept";
    /// The Kubernetes API failed (retried with backoff).
    pub const KUBERNETES_API: &str = "KubernetesAPI";
    /// A node's Talos API failed or refused a call.
    pub const TALOS_API: &str = "TalosAPI";
    /// A spec field holds a value Ichor cannot use.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A duration field (`spec.discovery.interval`, `spec.backup.retention.maxAge`) does not
    /// read as a duration Ichor can use (an Event; the default or no age limit applies).
    pub const INVALID_DURATION: &str = "InvalidDuration";
    /// An invariant of the controller broke: a bug to report.
    pub const INTERNAL_ERROR: &str = "InternalError";
    /// A reconcile of the object panicked (a bug to report): caught, and retried with a
    /// growing backoff; the manager and its other objects go on.
    pub const RECONCILE_PANICKED: &str = "ReconcilePanicked";
    /// The config was applied; Talos is installing to disk.
    pub const INSTALLING: &str = "Installing";
    /// Talos 1.14's unattended install waits (e.g. no disk matched the selector).
    pub const INSTALL_PENDING: &str = "InstallPending";
    /// The install failed: 1.14 reported phase `failed` (Talos retries it), or 1.13's install
    /// sequence failed and the node went back to maintenance mode with a new certificate.
    pub const INSTALL_FAILED: &str = "InstallFailed";
    /// The install has run longer than the manager's install stall limit.
    pub const INSTALL_STALLED: &str = "InstallStalled";
    /// The machine's BMC answered with its system: `status.bmc` holds what it reported.
    pub const BMC_OBSERVED: &str = "BmcObserved";
    /// The Secret `spec.bmc.credentialsSecretRef` names, or its key `username` or `password`,
    /// is absent (its values are never shown).
    pub const BMC_CREDENTIALS_MISSING: &str = "BmcCredentialsMissing";
    /// The Secret or key `spec.bmc.caSecretRef` names is absent.
    pub const BMC_CA_MISSING: &str = "BmcCaMissing";
    /// The BMC lists no system `spec.bmc.systemId` names, none whose UUID is the node's, or
    /// (the node's UUID not known yet) more than one.
    pub const BMC_SYSTEM_NOT_FOUND: &str = "BmcSystemNotFound";
    /// The BMC's system (named by `spec.bmc.systemId`) reports another UUID than the node's
    /// SMBIOS UUID: it is another machine's.
    pub const BMC_UUID_MISMATCH: &str = "BmcUuidMismatch";
    /// The BMC endpoint cannot be used (the Redfish client's `BmcEndpointInvalid`: a CA bundle
    /// with no certificate, an address that does not parse).
    pub const BMC_ENDPOINT_INVALID: &str = "BmcEndpointInvalid";
    /// The BMC refused the credentials (401 or 403).
    pub const BMC_UNAUTHORIZED: &str = "BmcUnauthorized";
    /// The BMC did not answer within the client's time limits.
    pub const BMC_UNREACHABLE: &str = "BmcUnreachable";
    /// The BMC's certificate is not signed by the CA of `spec.bmc.caSecretRef`, or not for
    /// its address.
    pub const BMC_CERTIFICATE_UNTRUSTED: &str = "BmcCertificateUntrusted";
    /// A resource the BMC linked to answered 404.
    pub const BMC_RESOURCE_NOT_FOUND: &str = "BmcResourceNotFound";
    /// The BMC refused a request (a 4xx other than 401, 403 and 404), with its messages.
    pub const BMC_REFUSED: &str = "BmcRefused";
    /// The BMC failed a request (5xx), with its messages.
    pub const BMC_SERVER_ERROR: &str = "BmcServerError";
    /// The BMC answered, but not as Redfish defines (the message names the field).
    pub const BMC_PROTOCOL_ERROR: &str = "BmcProtocolError";
    /// The BMC's answer was larger than the client's limit.
    pub const BMC_ANSWER_TOO_LARGE: &str = "BmcAnswerTooLarge";
    /// The BMC does not offer what was asked.
    pub const BMC_UNSUPPORTED: &str = "BmcUnsupported";
    /// Every reason of the Redfish client's errors (`ichor_redfish::Error::reason`), as it
    /// spells them.
    pub const BMC_CLIENT: [&str; 10] = [
        BMC_ENDPOINT_INVALID,
        BMC_UNAUTHORIZED,
        BMC_UNREACHABLE,
        BMC_CERTIFICATE_UNTRUSTED,
        BMC_RESOURCE_NOT_FOUND,
        BMC_REFUSED,
        BMC_SERVER_ERROR,
        BMC_PROTOCOL_ERROR,
        BMC_ANSWER_TOO_LARGE,
        BMC_UNSUPPORTED,
    ];
}

/// Event actions: what the controller was doing when it published an Event.
pub mod actions {
    /// Reconciling an object towards its spec.
    pub const RECONCILE: &str = "Reconcile";
    /// Sweeping for machines in maintenance mode.
    pub const DISCOVER: &str = "Discover";
    /// Reading a machine's BMC.
    pub const READ_BMC: &str = "ReadBmc";
    /// Applying a config to a node.
    pub const APPLY: &str = "Apply";
    /// Bootstrapping etcd.
    pub const BOOTSTRAP: &str = "Bootstrap";
    /// Resetting a node.
    pub const RESET: &str = "Reset";
    /// Deleting objects (a cluster's teardown).
    pub const DELETE: &str = "Delete";
    /// Removing a machine (its finalizer's work).
    pub const REMOVE: &str = "Remove";
    /// Running a TalosOperation.
    pub const OPERATE: &str = "Operate";
    /// Publishing a cluster's kubeconfig or talosconfig.
    pub const PUBLISH: &str = "Publish";
    /// Upgrading a node's Talos (its version or its installer's schematic).
    pub const UPGRADE: &str = "Upgrade";
    /// Backing etcd up to object storage.
    pub const BACKUP: &str = "Backup";
    /// Restoring etcd from a backup.
    pub const RESTORE: &str = "Restore";
}

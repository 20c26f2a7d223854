//! The services a simulated node runs, as machined's service runner records them
//! (talos-facts §10.7): each with its state, its last events (message, state, time) and its
//! health (unknown until a health check runs, then healthy or not since a time), each
//! transition also published as a `ServiceStateEvent`; the `ServiceList` reply built from
//! them; and the node's observer, which follows etcd's health and publishes the machine status
//! whenever it changes (machined's machine-status publisher, §10.4).

use std::collections::BTreeMap;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use ichor_talos::api::machine::machine_status_event::machine_status::UnmetCondition;
use ichor_talos::api::machine::machine_status_event::{MachineStage, MachineStatus};
use ichor_talos::api::machine::service_state_event::Action;
use ichor_talos::api::machine::{
    MachineStatusEvent, ServiceEvent, ServiceEvents, ServiceHealth, ServiceInfo, ServiceList,
    ServiceListResponse, ServiceStateEvent,
};
use tokio::sync::Mutex;
use tonic::Status;

use crate::events::Payload;
use crate::{Node, Stage};

/// How many events a service keeps (machined's `MaxEventsToKeep`).
const MAX_EVENTS: usize = 64;

/// How a service runs, which decides the message of its Running event.
#[derive(Debug, Clone, Copy)]
enum Runner {
    /// In machined itself.
    Goroutine,
    /// A process machined starts, with these arguments.
    Process(&'static str),
    /// A container task in the system containerd.
    Task,
    /// sandboxd's own runner.
    Sandbox,
}

/// What machined knows of a service by its id: how it runs, what it waits for, and whether
/// it has a health check.
fn kind(id: &str) -> (Runner, Option<&'static str>, bool) {
    match id {
        "machined" => (Runner::Goroutine, None, true),
        "udevd" => (
            Runner::Process(r#"["/sbin/systemd-udevd" "--resolve-names=never"]"#),
            None,
            true,
        ),
        "containerd" => (
            Runner::Process(
                r#"["/bin/containerd" "--address" "/system/run/containerd/containerd.sock" "--state" "/system/run/containerd" "--root" "/system/var/lib/containerd"]"#,
            ),
            None,
            true,
        ),
        "cri" => (
            Runner::Process(
                r#"["/bin/containerd" "--address" "/run/containerd/containerd.sock" "--config" "/etc/cri/containerd.toml"]"#,
            ),
            None,
            true,
        ),
        "dashboard" => (
            Runner::Process(r#"["/sbin/dashboard"]"#),
            Some("machined"),
            false,
        ),
        "auditd" => (Runner::Goroutine, None, true),
        "syslogd" => (Runner::Goroutine, Some("machined"), true),
        "sandboxd" => (Runner::Sandbox, None, false),
        "apid" | "trustd" => (Runner::Task, Some("containerd"), true),
        "etcd" | "kubelet" => (Runner::Task, Some("cri"), true),
        _ => (Runner::Goroutine, None, false),
    }
}

/// machined's name for a service state.
fn state_name(action: Action) -> &'static str {
    match action {
        Action::Initialized => "Initialized",
        Action::Preparing => "Preparing",
        Action::Waiting => "Waiting",
        Action::Running => "Running",
        Action::Stopping => "Stopping",
        Action::Finished => "Finished",
        Action::Failed => "Failed",
        Action::Skipped => "Skipped",
        Action::Starting => "Starting",
    }
}

/// The timestamp of Go's zero `time.Time`, which a health never checked reports.
fn zero_time() -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: -62_135_596_800,
        nanos: 0,
    }
}

/// A service's health: unknown until checked.
#[derive(Debug, Clone, Default)]
struct Health {
    healthy: Option<bool>,
    last_message: String,
    last_change: Option<SystemTime>,
}

impl Health {
    fn to_proto(&self) -> ServiceHealth {
        ServiceHealth {
            unknown: self.healthy.is_none(),
            healthy: self.healthy == Some(true),
            last_message: self.last_message.clone(),
            last_change: Some(
                self.last_change
                    .map_or_else(zero_time, prost_types::Timestamp::from),
            ),
        }
    }
}

/// One service of this boot.
#[derive(Debug, Clone)]
struct Record {
    state: Action,
    events: Vec<ServiceEvent>,
    health: Health,
}

/// The services of one boot, by id (listed sorted by id, as machined lists them).
#[derive(Debug, Default)]
pub(crate) struct Services {
    records: BTreeMap<String, Record>,
    /// The next process id handed out.
    next_pid: u32,
}

impl Node {
    /// Records a transition of service `id` and publishes it (machined's `UpdateState`; a
    /// Running event carries the health as it is then).
    fn service_event(&mut self, id: &str, state: Action, message: String) {
        let now = SystemTime::now();
        let record = self
            .services
            .records
            .entry(id.to_owned())
            .or_insert_with(|| Record {
                state: Action::Initialized,
                events: Vec::new(),
                health: Health::default(),
            });
        record.state = state;
        record.events.push(ServiceEvent {
            msg: message.clone(),
            state: state_name(state).into(),
            ts: Some(now.into()),
        });
        if record.events.len() > MAX_EVENTS {
            record.events.remove(0);
        }
        let health = if state == Action::Running {
            record.health.to_proto()
        } else {
            Health::default().to_proto()
        };
        self.emit(
            "",
            Payload::Service(ServiceStateEvent {
                service: id.into(),
                action: state as i32,
                message,
                health: Some(health),
            }),
        );
    }

    /// A health check result of a running service (machined's `healthUpdate`): recorded and
    /// published when it changes.
    fn health_event(&mut self, id: &str, healthy: bool, failure: &str) {
        let Some(record) = self.services.records.get_mut(id) else {
            return;
        };
        if record.state != Action::Running || record.health.healthy == Some(healthy) {
            return;
        }
        record.health = Health {
            healthy: Some(healthy),
            last_message: if healthy {
                String::new()
            } else {
                failure.to_owned()
            },
            last_change: Some(SystemTime::now()),
        };
        let message = if healthy {
            "Health check successful".to_owned()
        } else {
            format!("Health check failed: {failure}")
        };
        record.events.push(ServiceEvent {
            msg: message.clone(),
            state: "Running".into(),
            ts: record.health.last_change.map(Into::into),
        });
        if record.events.len() > MAX_EVENTS {
            record.events.remove(0);
        }
        let health = record.health.to_proto();
        self.emit(
            "",
            Payload::Service(ServiceStateEvent {
                service: id.into(),
                action: Action::Running as i32,
                message,
                health: Some(health),
            }),
        );
    }

    /// A service starts up to its pre-start step: Starting, Waiting for what it depends on,
    /// Preparing (machined's `Run` before the runner).
    fn prepare_service(&mut self, id: &str) {
        let (_, depends, _) = kind(id);
        self.service_event(id, Action::Starting, "Starting service".into());
        if let Some(dependency) = depends {
            self.service_event(
                id,
                Action::Waiting,
                format!("Waiting for service {dependency:?} to be \"up\""),
            );
        }
        self.service_event(id, Action::Preparing, "Running pre state".into());
    }

    /// A prepared service gets its runner and runs; a health-checked one then passes its
    /// first check.
    fn run_service(&mut self, id: &str) {
        let (runner, _, checked) = kind(id);
        self.service_event(id, Action::Preparing, "Creating service runner".into());
        self.services.next_pid += 1 + self.services.next_pid % 7;
        let pid = 1000 + self.services.next_pid;
        let message = match runner {
            Runner::Goroutine => "Service started as goroutine".to_owned(),
            Runner::Process(args) => format!("Process Process({args}) started with PID {pid}"),
            Runner::Task => format!("Started task {id} (PID {pid}) for container {id}"),
            Runner::Sandbox => format!("sandboxd started with PID {pid}"),
        };
        self.service_event(id, Action::Running, message);
        if checked {
            self.health_event(id, true, "");
        }
    }

    /// The service is unloaded and loaded again, then started (machined's `Unload`, `Load`
    /// and `Start`, as `BootstrapEtcd` does to etcd): a new runner with no events yet, up to
    /// its pre-start step.
    pub(crate) fn reload_service(&mut self, id: &str) {
        self.services.records.remove(id);
        self.prepare_service(id);
    }

    /// The service's run ends with `error` (machined's `Start` records it with the first
    /// letter capitalized); it stays failed.
    pub(crate) fn fail_service(&mut self, id: &str, error: &str) {
        let mut chars = error.chars();
        let message = chars
            .next()
            .map(|first| first.to_uppercase().chain(chars).collect())
            .unwrap_or_default();
        self.service_event(id, Action::Failed, message);
    }

    /// Whether service `id` runs in this boot.
    pub(crate) fn service_running(&self, id: &str) -> bool {
        self.services
            .records
            .get(id)
            .is_some_and(|r| r.state == Action::Running)
    }

    /// A service starts and runs.
    pub(crate) fn start_service(&mut self, id: &str) {
        self.prepare_service(id);
        self.run_service(id);
    }

    /// The services a configured node starts on boot: CRI (inside sandboxd with workload
    /// isolation on 1.14), the kubelet, and on control planes trustd and etcd — etcd waits in
    /// its pre-start step until the node has a member (a bootstrap or a join).
    pub(crate) fn start_configured_services(&mut self) {
        let Some(config) = self.running.clone().or_else(|| self.persisted.clone()) else {
            return;
        };
        if self.shared.is_1_14() && workload_isolation(&config.documents) {
            self.start_service("sandboxd");
        }
        self.start_service("cri");
        if config.is_control_plane() {
            self.start_service("trustd");
            if config.has_etcd_ca {
                self.prepare_service("etcd");
            }
        }
        self.start_service("kubelet");
    }

    /// Follows the etcd member: the service runs once the node's member does, and its health
    /// check fails while the member is gone or stopped, or unhealthy (`Fault::EtcdUnhealthy`:
    /// Talos's check, `Etcd.HealthFunc`, is a read through the local client, which times out).
    fn observe_etcd(&mut self) {
        let Some(state) = self.services.records.get("etcd").map(|r| r.state) else {
            return;
        };
        let member = self.etcd.filter(|data| {
            !self.etcd_stopped && self.shared.etcd_running.load(Ordering::SeqCst) == data.cluster
        });
        match (state, member) {
            (Action::Preparing, Some(_)) => self.run_service("etcd"),
            (Action::Running, Some(_)) if self.shared.etcd_unhealthy.load(Ordering::SeqCst) => {
                self.health_event("etcd", false, "context deadline exceeded");
            }
            (Action::Running, Some(_)) => self.health_event("etcd", true, ""),
            (Action::Running, None) => self.health_event(
                "etcd",
                false,
                "etcdserver: the member has been permanently removed from the cluster",
            ),
            _ => {}
        }
    }

    /// The machine status now (stage, readiness and unmet conditions, talos-facts §3), and
    /// published as a `MachineStatusEvent` when it differs from the last one published.
    pub(crate) fn publish_status(&mut self) {
        let unmet = crate::cosi::unmet_conditions(self, &self.shared);
        let ready = self.stage == Stage::Running && self.running.is_some() && unmet.is_empty();
        let (stage, _) = crate::stage_wire(self.stage);
        let status = MachineStatusEvent {
            stage: MachineStage::try_from(stage).unwrap_or(MachineStage::Unknown) as i32,
            status: Some(MachineStatus {
                ready,
                unmet_conditions: unmet
                    .into_iter()
                    .map(|c| UnmetCondition {
                        name: c.name,
                        reason: c.reason,
                    })
                    .collect(),
            }),
        };
        if self.last_status.as_ref() == Some(&status) {
            return;
        }
        self.last_status = Some(status.clone());
        self.events.publish("", Payload::MachineStatus(status));
    }
}

/// Whether the config enables workload isolation (a `SecurityProfileConfig` document with
/// `workloadIsolation: true`), which puts CRI inside sandboxd on 1.14 (talos-facts §10.7).
fn workload_isolation(documents: &[serde_json::Value]) -> bool {
    documents.iter().any(|d| {
        d["kind"] == "SecurityProfileConfig" && d["workloadIsolation"].as_bool() == Some(true)
    })
}

/// The node's observer for this boot: follows etcd and publishes the machine status on
/// change, every tick until the boot ends (its task is aborted with the others).
pub(crate) async fn observe(node: Weak<Mutex<Node>>, timings: crate::Timings) {
    loop {
        tokio::time::sleep(timings.tick).await;
        let Some(strong) = node.upgrade() else { return };
        let mut guard = strong.lock().await;
        guard.observe_etcd();
        guard.observe_static_pods();
        guard.publish_status();
    }
}

/// `ServiceList` (talos-facts §1.2, §10.7): every service of this boot, sorted by id.
pub(crate) async fn list(node: &Weak<Mutex<Node>>) -> Result<ServiceListResponse, Status> {
    let strong = node
        .upgrade()
        .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
    let mut node = strong.lock().await;
    // The simulator's health checks are instant: etcd's is current when read.
    node.observe_etcd();
    let services = node
        .services
        .records
        .iter()
        .map(|(id, record)| ServiceInfo {
            id: id.clone(),
            state: state_name(record.state).into(),
            events: Some(ServiceEvents {
                events: record.events.clone(),
            }),
            health: Some(record.health.to_proto()),
        })
        .collect();
    Ok(ServiceListResponse {
        messages: vec![ServiceList {
            metadata: None,
            services,
        }],
    })
}

//! Leader election on a `coordination.k8s.io` Lease: each replica has its own identity (its pod
//! name); only the holder runs the controllers. A leader that cannot renew in time stops.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub duration: Duration,
    /// How often the holder renews (and others retry).
    pub retry: Duration,
}

fn expired(lease: &Lease, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else { return true };
    let (Some(renewed), Some(seconds)) = (&spec.renew_time, spec.lease_duration_seconds) else {
        return true;
    };
    let until = renewed.0 + std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    until < now
}

/// Tries once to take or renew the lease; returns whether this replica holds it.
pub async fn try_acquire(
    client: &kube::Client,
    settings: &LeaseSettings,
) -> Result<bool, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let now = Timestamp::now();
    let seconds = i32::try_from(settings.duration.as_secs()).unwrap_or(i32::MAX);
    match leases.get_opt(&settings.name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(settings.name.clone()),
                    namespace: Some(settings.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(settings.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(error) => Err(error),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            let holder = spec.holder_identity.clone();
            let mine = holder.as_deref() == Some(settings.identity.as_str());
            if !mine && !expired(&lease, now) {
                return Ok(false);
            }
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if !mine {
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.holder_identity = Some(settings.identity.clone());
            spec.lease_duration_seconds = Some(seconds);
            spec.renew_time = Some(MicroTime(now));
            // The resourceVersion read above makes a concurrent taker's write conflict.
            match leases
                .replace(&settings.name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(error) => Err(error),
            }
        }
    }
}

/// Waits until this replica holds the lease.
pub async fn acquire(client: &kube::Client, settings: &LeaseSettings) {
    loop {
        match try_acquire(client, settings).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "leader election failed; retrying"),
        }
        tokio::time::sleep(settings.retry).await;
    }
}

/// Renews the lease until a renewal fails to land within the lease duration; then returns
/// (the caller stops leading).
pub async fn hold(client: &kube::Client, settings: &LeaseSettings) {
    let mut last = std::time::Instant::now();
    loop {
        tokio::time::sleep(settings.retry).await;
        match try_acquire(client, settings).await {
            Ok(true) => last = std::time::Instant::now(),
            Ok(false) => {
                tracing::error!("the lease was taken by another replica");
                return;
            }
            Err(error) => tracing::warn!(%error, "lease renewal failed"),
        }
        if last.elapsed() >= settings.duration {
            tracing::error!("the lease could not be renewed in time");
            return;
        }
    }
}

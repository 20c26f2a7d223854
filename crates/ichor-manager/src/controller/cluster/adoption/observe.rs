//! What adoption reads: each endpoint probed for its configured-mode certificate, reached with
//! the bundle's credentials, and its live config, version and hardware UUID read; and whether
//! the namespace's address ranges allow the endpoints. Nothing is written, to a node or to
//! the API.

use ichor_api::TalosCluster;
use ichor_api::cluster::AdoptSpec;
use ichor_talos::TalosClient;
use ichor_talos::discovery::ProbeOutcome;
use kube::ResourceExt as _;

use super::plan::{LiveFacts, Observed, Refusal, Unread};
use crate::{Context, Error};

/// What one node answered.
pub(super) struct Seen {
    /// What adoption judges.
    pub(super) observed: Observed,
    /// Its configured-mode certificate's fingerprint (empty when it did not answer the probe).
    pub(super) fingerprint: String,
    /// Its SMBIOS UUID (empty when it was not read).
    pub(super) uuid: String,
}

/// The first of `spec`'s endpoints outside the address ranges the cluster's namespace is
/// confined to (a namespace so confined adopts, and so claims, only nodes inside them).
pub(super) async fn refused_address(
    ctx: &Context,
    cluster: &TalosCluster,
    spec: &AdoptSpec,
) -> Result<Option<Refusal>, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let Some(policy) = crate::claims::policy(&ctx.client, &namespace).await? else {
        return Ok(None);
    };
    Ok(spec
        .endpoints
        .iter()
        .find_map(|address| crate::claims::refused_address(&policy, &namespace, address))
        .map(|refused| Refusal::AddressNotAllowed(refused.message)))
}

/// What each of `spec`'s endpoints answered, in their order.
pub(super) async fn see_all(
    ctx: &Context,
    spec: &AdoptSpec,
    credentials: &ichor_talos::Credentials,
) -> Vec<Seen> {
    let mut seen = Vec::new();
    for address in &spec.endpoints {
        seen.push(see(ctx, address, credentials).await);
    }
    seen
}

/// The certificate fingerprint of a configured Talos node at `address`, or why it is not one.
async fn configured_fingerprint(ctx: &Context, address: &str) -> Result<String, Unread> {
    let Ok(ip) = address.parse::<std::net::Ipv4Addr>() else {
        return Err(Unread::NotIpv4);
    };
    // One probe, with patience: a sweep's short timeout is for many silent addresses.
    let sweep = ichor_talos::discovery::SweepConfig {
        timeout: ctx
            .settings
            .sweep
            .timeout
            .max(std::time::Duration::from_secs(5)),
        ..ctx.settings.sweep
    };
    match ichor_talos::discovery::probe(ip, sweep).await {
        Some(ProbeOutcome::Configured { fingerprint }) => Ok(fingerprint),
        Some(ProbeOutcome::Maintenance(_)) => Err(Unread::InMaintenance),
        Some(_) | None => Err(Unread::Silent),
    }
}

/// Probes `address` and reads what adoption needs, or says why it cannot.
async fn see(ctx: &Context, address: &str, credentials: &ichor_talos::Credentials) -> Seen {
    let failed = |why: Unread| Seen {
        observed: Observed {
            address: address.to_owned(),
            answer: Err(why),
            untrusted: None,
        },
        fingerprint: String::new(),
        uuid: String::new(),
    };
    // A node that answered the probe but refuses the bundle's credentials (or whose
    // certificate the bundle's CA does not verify) belongs to another CA.
    let untrusted = |why: Unread, fingerprint: &str| Seen {
        observed: Observed {
            address: address.to_owned(),
            answer: Err(why),
            untrusted: Some(fingerprint.to_owned()),
        },
        fingerprint: fingerprint.to_owned(),
        uuid: String::new(),
    };
    let fingerprint = match configured_fingerprint(ctx, address).await {
        Ok(fingerprint) => fingerprint,
        Err(why) => return failed(why),
    };
    let endpoint = format!("{address}:{}", ctx.settings.sweep.port);
    let client = match TalosClient::connect(&endpoint, credentials).await {
        Ok(client) => client,
        Err(err) => return untrusted(Unread::Failed(err.to_string()), &fingerprint),
    };
    let failed_call = |err: ichor_talos::TalosError| Unread::Failed(err.to_string());
    let read = async {
        let config = client.live_config().await.map_err(failed_call)?;
        let facts = LiveFacts::read(&config)?;
        let version = client.version().await.map_err(failed_call)?;
        let uuid = client.inventory().await.map_err(failed_call)?.uuid;
        Ok::<_, Unread>((facts, version, uuid))
    };
    match read.await {
        Ok((facts, version, uuid)) => Seen {
            observed: Observed {
                address: address.to_owned(),
                answer: Ok((facts, version)),
                untrusted: None,
            },
            fingerprint,
            uuid,
        },
        Err(why) if tls_refused(&why.to_string()) => untrusted(why, &fingerprint),
        Err(why) => failed(Unread::Unreadable(Box::new(why))),
    }
}

/// Whether a failure reads as a TLS refusal: a certificate one side does not trust.
fn tls_refused(why: &str) -> bool {
    let lower = why.to_ascii_lowercase();
    [
        "certificate",
        "tls",
        "handshake",
        "unknown ca",
        "unknownissuer",
    ]
    .iter()
    .any(|sign| lower.contains(sign))
}

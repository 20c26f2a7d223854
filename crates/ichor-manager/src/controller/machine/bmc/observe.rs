//! What the BMC look reads: the credentials Secret and the CA of `spec.bmc` (through the API,
//! at each look), and the BMC's systems, each call within the Redfish client's own limits.
//! Nothing here writes, and no value read from a Secret leaves this module but inside the
//! client's `Credentials` and `Trust`, which never print it.

use ichor_api::TalosMachine;
use ichor_api::bmc::{BmcSpec, keys};
use ichor_api::names::reasons;
use ichor_redfish::{Bmc, Credentials, Endpoint, System, Trust};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::Api;

use super::plan::{self, Read};
use crate::{Context, Stop};

/// The most systems of one BMC read to find the machine's.
const MAX_SYSTEMS: usize = 16;

/// How long one look's read of a BMC may take in all: its calls each have the client's own
/// limits, and a BMC that answers each call slowly still holds its read's task no longer.
const READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Reads the BMC `spec` names for `machine` within [`READ_LIMIT`]: its settings first
/// (credentials, CA), then its systems, and picks the machine's (`plan::choose_system`).
pub(super) async fn read(ctx: &Context, machine: &TalosMachine, spec: &BmcSpec) -> Read {
    tokio::time::timeout(READ_LIMIT, read_unbounded(ctx, machine, spec))
        .await
        .unwrap_or_else(|_| {
            Err(Stop::new(
                reasons::BMC_UNREACHABLE,
                format!(
                    "the BMC at {} did not finish answering within {} s",
                    spec.address,
                    READ_LIMIT.as_secs()
                ),
            ))
        })
}

/// [`read`], unbounded but by each call's own limits.
async fn read_unbounded(ctx: &Context, machine: &TalosMachine, spec: &BmcSpec) -> Read {
    let namespace = machine.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let credentials = read_credentials(&secrets, spec).await?;
    let trust = read_trust(&secrets, spec).await?;
    let endpoint = Endpoint::new(spec.address.as_str(), credentials, trust);
    let bmc = Bmc::new(endpoint).map_err(|e| plan::failed(&e))?;
    let systems = read_systems(&bmc).await.map_err(|e| plan::failed(&e))?;
    let node_uuid = machine
        .status
        .as_ref()
        .and_then(|s| s.inventory.hardware.as_ref())
        .map(|h| h.uuid.as_str())
        .filter(|uuid| !uuid.is_empty());
    plan::choose_system(&systems, spec.system_id.as_deref(), node_uuid).cloned()
}

/// Each system the BMC lists (at most [`MAX_SYSTEMS`]), as read.
async fn read_systems(bmc: &Bmc) -> Result<Vec<System>, ichor_redfish::Error> {
    let mut systems = Vec::new();
    for member in bmc.systems().await?.iter().take(MAX_SYSTEMS) {
        systems.push(bmc.system(member).await?);
    }
    Ok(systems)
}

/// The Secret `name`, or why it cannot be read.
async fn read_secret(secrets: &Api<Secret>, name: &str, what: &str) -> Result<Secret, Stop> {
    match secrets.get_opt(name).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(missing(what, &format!("Secret {name} does not exist"))),
        Err(error) => Err(Stop::new(
            reasons::KUBERNETES_API,
            format!("reading Secret {name} ({what}) failed: {error}"),
        )),
    }
}

/// Key `key` of `secret` as text, if it is there and not empty.
fn value(secret: &Secret, key: &str) -> Option<String> {
    let data = secret.data.as_ref()?.get(key)?;
    let text = String::from_utf8(data.0.clone()).ok()?;
    (!text.is_empty()).then_some(text)
}

/// The stop for a missing Secret or key: the reason names what it was for.
fn missing(what: &str, detail: &str) -> Stop {
    let reason = if what == CA {
        reasons::BMC_CA_MISSING
    } else {
        reasons::BMC_CREDENTIALS_MISSING
    };
    Stop::new(reason, format!("{what}: {detail}"))
}

/// What `spec.bmc.credentialsSecretRef` is for, in messages.
const CREDENTIALS: &str = "the BMC's credentials (spec.bmc.credentialsSecretRef)";
/// What `spec.bmc.caSecretRef` is for, in messages.
const CA: &str = "the BMC's CA bundle (spec.bmc.caSecretRef)";

/// The user name and password of `spec.credentialsSecretRef`.
async fn read_credentials(secrets: &Api<Secret>, spec: &BmcSpec) -> Result<Credentials, Stop> {
    let name = &spec.credentials_secret_ref.name;
    let secret = read_secret(secrets, name, CREDENTIALS).await?;
    let key = |key: &str| {
        value(&secret, key).ok_or_else(|| {
            missing(
                CREDENTIALS,
                &format!("Secret {name} has no (or an empty) key {key}"),
            )
        })
    };
    Ok(Credentials::new(key(keys::USERNAME)?, key(keys::PASSWORD)?))
}

/// The trust `spec` asks for: its CA bundle, or the explicit opt-in to skip verification.
async fn read_trust(secrets: &Api<Secret>, spec: &BmcSpec) -> Result<Trust, Stop> {
    let Some(reference) = &spec.ca_secret_ref else {
        // The schema allows no spec with neither; one written before it is refused here.
        return if spec.insecure_skip_verify == Some(true) {
            Ok(Trust::InsecureSkipVerify)
        } else {
            Err(Stop::new(
                reasons::INVALID_SPEC,
                "spec.bmc needs exactly one of caSecretRef and insecureSkipVerify: true",
            ))
        };
    };
    let secret = read_secret(secrets, &reference.name, CA).await?;
    value(&secret, &reference.key)
        .map(Trust::CaBundle)
        .ok_or_else(|| {
            missing(
                CA,
                &format!(
                    "Secret {} has no (or an empty) key {}",
                    reference.name, reference.key
                ),
            )
        })
}

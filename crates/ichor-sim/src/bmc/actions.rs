//! What the BMC's writes do: the system's boot override (`PATCH`), its power actions
//! (`#ComputerSystem.Reset`) and the virtual CD (`#VirtualMedia.InsertMedia`, `EjectMedia`).
//! Each request is checked whole before anything changes: a refusal lists every property or
//! parameter at fault and changes nothing.

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use serde_json::{Map, Value};
use tokio::sync::Mutex;

use super::errors::{Message, error};
use super::firmware::{Enabled, Media, Named, Settings, Target};
use super::http::{etag, if_match, json_response, tagged};
use super::resources::{self as res, RESET_TYPES, SystemView};
use super::{Service, swap_uuid};
use crate::Node;
use crate::factory::IsoRefusal;

/// How long a `GracefulRestart` waits for the machine to power itself off before giving up
/// (the power button has no effect without a running OS).
const GRACEFUL_RESTART_WAIT: Duration = Duration::from_secs(30);

/// What the system resource shows, read from the node now.
pub(crate) async fn system_view(service: &Service) -> Option<SystemView> {
    let node = service.node.upgrade()?;
    let node = node.lock().await;
    Some(view_of(service, &node))
}

fn view_of(service: &Service, node: &Node) -> SystemView {
    let uuid = if service.swapped_uuid {
        swap_uuid(&node.hardware.uuid)
    } else {
        node.hardware.uuid.clone()
    };
    SystemView {
        uuid,
        powered: node.powered,
        settings: service.firmware.lock().clone(),
    }
}

/// `PATCH` of the system: only `Boot`'s override may change. `If-Match` must name the current
/// ETag when given. Answers 200 with the system as it is now.
pub(crate) async fn patch_system(
    service: &Service,
    headers: &HeaderMap,
    patch: &Map<String, Value>,
) -> Response {
    let Some(node) = service.node.upgrade() else {
        return gone();
    };
    let node = node.lock().await;
    let before = res::system(&view_of(service, &node));
    let bytes = serde_json::to_vec(&before).unwrap_or_default();
    if !if_match(headers, &etag(&bytes)) {
        return error(
            StatusCode::PRECONDITION_FAILED,
            &[Message::precondition_failed()],
        );
    }
    let current = service.firmware.lock().clone();
    let settings = match patched(&current, patch, &before) {
        Ok(settings) => settings,
        Err(messages) => return error(StatusCode::BAD_REQUEST, &messages),
    };
    *service.firmware.lock() = settings;
    let (after, tag) = tagged(&res::system(&view_of(service, &node)));
    let mut response = json_response(StatusCode::OK, &after);
    if let Ok(tag) = HeaderValue::from_str(&tag) {
        response.headers_mut().insert(header::ETAG, tag);
    }
    response
}

/// Whether a property name is an annotation (`@odata.etag`, `X@Redfish.AllowableValues`).
fn annotation(name: &str) -> bool {
    name.contains('@')
}

/// The settings `patch` asks for, or the messages saying why not (`shown` is the system as it
/// stands: a property it has is read-only, one it has not is unknown).
fn patched(
    current: &Settings,
    patch: &Map<String, Value>,
    shown: &Value,
) -> Result<Settings, Vec<Message>> {
    if patch.keys().all(|k| annotation(k)) {
        return Err(vec![Message::no_operation()]);
    }
    let mut settings = current.clone();
    let mut refusals = Vec::new();
    for (name, value) in patch.iter().filter(|(k, _)| !annotation(k)) {
        if name == "Boot" {
            patch_boot(&mut settings, value, &mut refusals);
        } else if shown.get(name).is_some() {
            refusals.push(Message::property_not_writable(name).about(&format!("#/{name}")));
        } else {
            refusals.push(Message::property_unknown(name).about(&format!("#/{name}")));
        }
    }
    if refusals.is_empty() {
        Ok(settings)
    } else {
        Err(refusals)
    }
}

fn patch_boot(settings: &mut Settings, boot: &Value, refusals: &mut Vec<Message>) {
    let Some(boot) = boot.as_object() else {
        refusals.push(Message::property_type(&boot.to_string(), "Boot").about("#/Boot"));
        return;
    };
    for (name, value) in boot.iter().filter(|(k, _)| !annotation(k)) {
        let pointer = format!("#/Boot/{name}");
        let text = value.as_str();
        let shown = || text.map_or_else(|| value.to_string(), str::to_owned);
        match name.as_str() {
            "BootSourceOverrideTarget" => match text.map(Target::named) {
                Some(Some(target)) => settings.target = target,
                Some(None) => refusals
                    .push(Message::property_value_not_in_list(&shown(), name).about(&pointer)),
                None => refusals.push(Message::property_type(&shown(), name).about(&pointer)),
            },
            "BootSourceOverrideEnabled" => match text.map(Enabled::named) {
                Some(Some(enabled)) => settings.enabled = enabled,
                Some(None) => refusals
                    .push(Message::property_value_not_in_list(&shown(), name).about(&pointer)),
                None => refusals.push(Message::property_type(&shown(), name).about(&pointer)),
            },
            "BootSourceOverrideMode" => match text {
                Some("UEFI") => {}
                Some(_) => refusals
                    .push(Message::property_value_not_in_list(&shown(), name).about(&pointer)),
                None => refusals.push(Message::property_type(&shown(), name).about(&pointer)),
            },
            _ => refusals.push(Message::property_unknown(name).about(&pointer)),
        }
    }
}

/// The machine is gone (its node stopped).
fn gone() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        &[Message::general(
            "the simulated machine behind this BMC has stopped",
        )],
    )
}

/// Refuses parameters other than `known` for `action`.
fn unknown_parameters(
    action: &str,
    parameters: &Map<String, Value>,
    known: &[&str],
) -> Vec<Message> {
    parameters
        .keys()
        .filter(|k| !annotation(k) && !known.contains(&k.as_str()))
        .map(|k| Message::parameter_unknown(action, k).about(&format!("#/{k}")))
        .collect()
}

/// `#ComputerSystem.Reset`: 204 once the machine is set going (module doc of `bmc`).
pub(crate) async fn reset(service: &Service, parameters: &Map<String, Value>) -> Response {
    const ACTION: &str = "ComputerSystem.Reset";
    let mut refusals = unknown_parameters(ACTION, parameters, &["ResetType"]);
    let kind = match parameters.get("ResetType") {
        None => {
            refusals.push(Message::parameter_missing(ACTION, "ResetType").about("#/ResetType"));
            None
        }
        Some(Value::String(kind)) if RESET_TYPES.contains(&kind.as_str()) => Some(kind.clone()),
        Some(Value::String(kind)) => {
            refusals.push(
                Message::parameter_value_not_in_list(kind, "ResetType", ACTION)
                    .about("#/ResetType"),
            );
            None
        }
        Some(other) => {
            refusals.push(
                Message::parameter_type(&other.to_string(), "ResetType", ACTION)
                    .about("#/ResetType"),
            );
            None
        }
    };
    let Some(kind) = kind.filter(|_| refusals.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, &refusals);
    };
    let Some(node) = service.node.upgrade() else {
        return gone();
    };
    power(&node, &kind).await;
    StatusCode::NO_CONTENT.into_response()
}

/// Acts on the machine's power as `kind` says.
async fn power(node: &Arc<Mutex<Node>>, kind: &str) {
    let weak = Arc::downgrade(node);
    match kind {
        "On" => {
            let mut node = node.lock().await;
            if !node.powered {
                power_on(&mut node, weak).await;
            }
        }
        "ForceOff" => {
            let mut node = node.lock().await;
            node.shut_down().await;
            node.powered = false;
        }
        "GracefulShutdown" => press_power_button(node).await,
        "GracefulRestart" => {
            press_power_button(node).await;
            tokio::spawn(on_once_off(weak));
        }
        _ => {
            // ForceRestart, PowerCycle: off at once, on after the reboot's down time.
            let mut node = node.lock().await;
            node.shut_down().await;
            node.powered = true;
            crate::sequences::boot_after(weak, node.timings.reboot);
        }
    }
}

/// Powers the machine on: a boot through its firmware.
async fn power_on(node: &mut Node, this: Weak<Mutex<Node>>) {
    node.powered = true;
    if let Err(error) = node.boot(this).await {
        tracing::warn!(%error, "simulated node failed to boot");
    }
}

/// The ACPI power button: machined, if it runs, shuts the machine down (talos-facts §15.3).
async fn press_power_button(node: &Arc<Mutex<Node>>) {
    let running = {
        let node = node.lock().await;
        node.powered && !node.halted && !node.bricked
    };
    if running {
        crate::sequences::power_button(Arc::downgrade(node));
    }
}

/// Powers the machine on again once it has powered itself off (a graceful restart).
async fn on_once_off(this: Weak<Mutex<Node>>) {
    let deadline = tokio::time::Instant::now() + GRACEFUL_RESTART_WAIT;
    while tokio::time::Instant::now() < deadline {
        let Some(strong) = this.upgrade() else { return };
        let tick = {
            let mut node = strong.lock().await;
            if !node.powered {
                power_on(&mut node, this.clone()).await;
                return;
            }
            node.timings.tick
        };
        tokio::time::sleep(tick).await;
    }
}

/// `#VirtualMedia.InsertMedia`: an Image Factory ISO of the node's factory (module doc of
/// `bmc`), inserted (unless `Inserted` is false) and write-protected (unless
/// `WriteProtected` is false). 204.
pub(crate) fn insert(service: &Service, parameters: &Map<String, Value>) -> Response {
    const ACTION: &str = "VirtualMedia.InsertMedia";
    let known = [
        "Image",
        "Inserted",
        "WriteProtected",
        "TransferMethod",
        "TransferProtocolType",
        "UserName",
        "Password",
    ];
    let mut refusals = unknown_parameters(ACTION, parameters, &known);
    let flag = |name: &str, refusals: &mut Vec<Message>| match parameters.get(name) {
        None => true,
        Some(Value::Bool(on)) => *on,
        Some(other) => {
            refusals.push(
                Message::parameter_type(&other.to_string(), name, ACTION)
                    .about(&format!("#/{name}")),
            );
            true
        }
    };
    let inserted = flag("Inserted", &mut refusals);
    let write_protected = flag("WriteProtected", &mut refusals);
    check_transfer(parameters, &mut refusals);
    let url = match parameters.get("Image") {
        Some(Value::String(url)) => Some(url.clone()),
        None => {
            refusals.push(Message::parameter_missing(ACTION, "Image").about("#/Image"));
            None
        }
        Some(other) => {
            refusals.push(
                Message::parameter_type(&other.to_string(), "Image", ACTION).about("#/Image"),
            );
            None
        }
    };
    let Some(url) = url.filter(|_| refusals.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, &refusals);
    };
    let iso = match service.factory.iso(&url) {
        Ok(iso) => iso,
        Err(refusal) => return download_failed(&url, refusal),
    };
    if !(iso.version.starts_with("v1.13.") || iso.version.starts_with("v1.14.")) {
        return error(
            StatusCode::BAD_REQUEST,
            &[
                Message::parameter_value("Image", ACTION).about("#/Image"),
                Message::general(&format!(
                    "ichor-sim models Talos v1.13 and v1.14; an ISO of {} cannot boot here",
                    iso.version
                )),
            ],
        );
    }
    service.firmware.lock().media = Some(Media {
        url,
        iso,
        inserted,
        write_protected,
    });
    StatusCode::NO_CONTENT.into_response()
}

/// `TransferMethod` (`Stream` only: the BMC reads the image as it boots) and
/// `TransferProtocolType` (`HTTP` or `HTTPS`), and credentials given together (as sushy-tools
/// asks).
fn check_transfer(parameters: &Map<String, Value>, refusals: &mut Vec<Message>) {
    const ACTION: &str = "VirtualMedia.InsertMedia";
    for (name, allowed) in [
        ("TransferMethod", &["Stream"][..]),
        ("TransferProtocolType", &["HTTP", "HTTPS"][..]),
    ] {
        match parameters.get(name) {
            None => {}
            Some(Value::String(value)) if allowed.contains(&value.as_str()) => {}
            Some(Value::String(value)) => refusals.push(
                Message::parameter_value_not_in_list(value, name, ACTION)
                    .about(&format!("#/{name}")),
            ),
            Some(other) => refusals.push(
                Message::parameter_type(&other.to_string(), name, ACTION)
                    .about(&format!("#/{name}")),
            ),
        }
    }
    let given = |name: &str| {
        parameters
            .get(name)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    if given("UserName") != given("Password") {
        let missing = if given("UserName") {
            "Password"
        } else {
            "UserName"
        };
        refusals.push(Message::parameter_missing(ACTION, missing).about(&format!("#/{missing}")));
    }
}

/// The image could not be downloaded: the factory's refusal is a 400 (as sushy-tools answers
/// an HTTP error from the media's server), an unreachable server a 500.
fn download_failed(url: &str, refusal: IsoRefusal) -> Response {
    match refusal {
        IsoRefusal::Unreachable => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &[Message::could_not_connect(url)],
        ),
        IsoRefusal::NotFound(answer) => error(
            StatusCode::BAD_REQUEST,
            &[
                Message::parameter_value("Image", "VirtualMedia.InsertMedia").about("#/Image"),
                Message::general(&format!(
                    "Cannot download virtual media: got error 404 from the server: {answer}"
                )),
            ],
        ),
        IsoRefusal::Invalid(answer) => error(
            StatusCode::BAD_REQUEST,
            &[
                Message::unknown_format(url),
                Message::general(&format!("Cannot download virtual media: {answer}")),
            ],
        ),
    }
}

/// `#VirtualMedia.EjectMedia`: the drive is empty. 204, whether or not it held an image.
pub(crate) fn eject(service: &Service, parameters: &Map<String, Value>) -> Response {
    let refusals = unknown_parameters("VirtualMedia.EjectMedia", parameters, &[]);
    if !refusals.is_empty() {
        return error(StatusCode::BAD_REQUEST, &refusals);
    }
    service.firmware.lock().media = None;
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shown() -> Value {
        json!({"Id": "system", "PowerState": "On", "Boot": {}})
    }

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn the_boot_override_changes_and_nothing_else() {
        let patch = object(
            json!({"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once"}}),
        );
        let settings = patched(&Settings::default(), &patch, &shown()).unwrap();
        assert_eq!(
            (settings.enabled, settings.target),
            (Enabled::Once, Target::Cd)
        );
    }

    #[test]
    fn every_bad_property_is_named_and_nothing_changes() {
        let patch = object(json!({
            "PowerState": "Off",
            "BogusProp": 1,
            "Boot": {"BootSourceOverrideTarget": "Floppy", "BootSourceOverrideEnabled": "Once"},
        }));
        let refused = patched(&Settings::default(), &patch, &shown()).unwrap_err();
        let ids: Vec<String> = refused
            .iter()
            .map(|m| m.to_json()["MessageId"].as_str().unwrap().to_owned())
            .collect();
        assert!(
            ids.contains(&"Base.1.22.PropertyNotWritable".to_owned()),
            "{ids:?}"
        );
        assert!(
            ids.contains(&"Base.1.22.PropertyUnknown".to_owned()),
            "{ids:?}"
        );
        assert!(
            ids.contains(&"Base.1.22.PropertyValueNotInList".to_owned()),
            "{ids:?}"
        );
    }

    #[test]
    fn annotations_alone_are_no_operation() {
        let patch = object(json!({"@odata.id": "/redfish/v1/Systems/system/"}));
        let refused = patched(&Settings::default(), &patch, &shown()).unwrap_err();
        assert_eq!(refused[0].to_json()["MessageId"], "Base.1.22.NoOperation");
    }
}

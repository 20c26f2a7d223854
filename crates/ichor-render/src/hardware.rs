//! Checking a rendered config against a machine's recorded hardware before it is applied: the
//! install disk (a path, a 1.13 selector, or the 1.14 CEL `diskSelector.match`) must match a
//! disk the machine has, and every link the config names must exist.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use cel::objects::Value as Cel;
use cel::{Context, Program};
use ichor_api::machine::{DiskInfo, HardwareInventory};
use serde_json::Value;

use crate::render::Rendered;

/// A way the config does not fit the machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HardwareMismatch {
    /// No disk matches the install disk or selector.
    #[error("no disk matches the install {selector}; the machine has: {disks}")]
    NoInstallDisk {
        /// The disk path or selector, as rendered.
        selector: String,
        /// The machine's disks, e.g. `/dev/sr0 (cd), /dev/vda 100 GB`.
        disks: String,
    },
    /// The 1.14 disk selector is not a valid CEL expression over `disk`.
    #[error("install diskSelector.match {expression:?} is invalid: {reason}")]
    InvalidSelector {
        /// The expression.
        expression: String,
        /// Why.
        reason: String,
    },
    /// A link named by the config does not exist.
    #[error(
        "the config names link {link} ({source_path}), which the machine does not have; it has: {links}"
    )]
    MissingLink {
        /// The link name.
        link: String,
        /// Where the config names it.
        source_path: String,
        /// The machine's links.
        links: String,
    },
}

const KB: u64 = 1000;
const KIB: u64 = 1024;

fn describe(disks: &[DiskInfo]) -> String {
    if disks.is_empty() {
        return "no disks".into();
    }
    disks
        .iter()
        .map(|d| {
            if d.cdrom {
                format!("{} (cd)", d.dev_path)
            } else {
                format!("{} {} GB", d.dev_path, d.size / (KB * KB * KB))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks `rendered` against `inventory`, returning every mismatch found.
///
/// ```
/// use std::collections::BTreeMap;
///
/// use ichor_api::common::{InstallSpec, Role};
/// use ichor_api::machine::{DiskInfo, HardwareInventory};
/// use ichor_render::hardware::{HardwareMismatch, check};
/// use ichor_render::{Contract, RenderInput, SecretsBundle, render};
///
/// let cluster = serde_json::from_value(serde_json::json!({
///     "talosVersion": "v1.14.1",
///     "kubernetesVersion": "1.36.3",
///     "endpoint": "https://10.0.0.10:6443",
///     "controlPlane": {"count": 1},
/// }))?;
/// let bundle = SecretsBundle::generate(Contract::V1_14)?;
/// let install = InstallSpec {
///     disk: Some("/dev/nvme0n1".into()),
///     ..Default::default()
/// };
/// let none = BTreeMap::new();
/// let rendered = render(&RenderInput {
///     cluster_name: "lab",
///     cluster: &cluster,
///     role: Role::ControlPlane,
///     hostname: None,
///     install: Some(&install),
///     schematic: None,
///     oldest_running: None,
///     kubernetes: None,
///     cert_sans: &[],
///     node_labels: &none,
///     node_taints: &none,
///     patches: &[],
///     bundle: &bundle,
/// })?;
/// // The machine, as discovery recorded it, has only /dev/sda.
/// let inventory = HardwareInventory {
///     disks: vec![DiskInfo {
///         name: "sda".into(),
///         dev_path: "/dev/sda".into(),
///         size: 500_000_000_000,
///         ..Default::default()
///     }],
///     ..Default::default()
/// };
/// let problems = check(&rendered, &inventory).expect_err("no /dev/nvme0n1 on this machine");
/// assert!(matches!(problems[..], [HardwareMismatch::NoInstallDisk { .. }]));
/// assert!(problems[0].to_string().contains("/dev/sda 500 GB"), "{}", problems[0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check(
    rendered: &Rendered,
    inventory: &HardwareInventory,
) -> Result<(), Vec<HardwareMismatch>> {
    let mut problems = Vec::new();
    if let Err(p) = check_install_disk(rendered, &inventory.disks) {
        problems.push(p);
    }
    problems.extend(check_links(rendered, inventory));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

fn installable(disks: &[DiskInfo]) -> impl Iterator<Item = &DiskInfo> {
    disks.iter().filter(|d| !d.cdrom && !d.readonly)
}

fn check_install_disk(rendered: &Rendered, disks: &[DiskInfo]) -> Result<(), HardwareMismatch> {
    let no_disk = |selector: String| HardwareMismatch::NoInstallDisk {
        selector,
        disks: describe(disks),
    };
    for document in &rendered.documents {
        if let Some(expression) = document["provisioning"]["diskSelector"]["match"].as_str()
            && document["kind"] == "UnattendedInstallConfig"
        {
            let program =
                Program::compile(expression).map_err(|e| HardwareMismatch::InvalidSelector {
                    expression: expression.into(),
                    reason: e.to_string(),
                })?;
            for disk in installable(disks) {
                match evaluate(&program, disk) {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(reason) => {
                        return Err(HardwareMismatch::InvalidSelector {
                            expression: expression.into(),
                            reason,
                        });
                    }
                }
            }
            return Err(no_disk(format!("disk selector {expression:?}")));
        }
        let install = &document["machine"]["install"];
        if let Some(path) = install["disk"].as_str() {
            return if installable(disks).any(|d| d.dev_path == path) {
                Ok(())
            } else {
                Err(no_disk(format!("disk {path}")))
            };
        }
        if let Some(selector) = install["diskSelector"].as_object() {
            return if installable(disks).any(|d| legacy_selector_matches(selector, d)) {
                Ok(())
            } else {
                Err(no_disk(format!(
                    "disk selector {}",
                    Value::Object(selector.clone())
                )))
            };
        }
    }
    Ok(())
}

/// Evaluates a Talos 1.14 disk selector for one disk: `disk` with the fields of
/// `block.DiskSpec` (talos-facts §3), `system_disk`, the size units as unsigned integers, and
/// `glob(pattern, text)` (Talos's `DiskLocator` environment, talos-facts §8.5).
fn evaluate(program: &Program, disk: &DiskInfo) -> Result<bool, String> {
    let mut fields: HashMap<String, Cel> = HashMap::new();
    let text = |v: &Option<String>| Cel::from(v.clone().unwrap_or_default());
    fields.insert("dev_path".into(), Cel::from(disk.dev_path.clone()));
    fields.insert("size".into(), Cel::UInt(disk.size));
    fields.insert("model".into(), text(&disk.model));
    fields.insert("serial".into(), text(&disk.serial));
    fields.insert("wwid".into(), text(&disk.wwid));
    fields.insert("transport".into(), text(&disk.transport));
    fields.insert("rotational".into(), Cel::Bool(disk.rotational));
    fields.insert("readonly".into(), Cel::Bool(disk.readonly));
    fields.insert("cdrom".into(), Cel::Bool(disk.cdrom));
    let mut context = Context::default();
    context.add_function("glob", |pattern: Arc<String>, text: Arc<String>| {
        ichor_api::glob::matches(&pattern, &text)
    });
    context.add_variable_from_value("disk", fields);
    context.add_variable_from_value("system_disk", Cel::Bool(false));
    for (name, value) in [
        ("kB", KB),
        ("MB", KB.pow(2)),
        ("GB", KB.pow(3)),
        ("TB", KB.pow(4)),
        ("KiB", KIB),
        ("MiB", KIB.pow(2)),
        ("GiB", KIB.pow(3)),
        ("TiB", KIB.pow(4)),
    ] {
        context.add_variable_from_value(name, Cel::UInt(value));
    }
    match program.execute(&context) {
        Ok(Cel::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("it evaluates to {other:?}, not a boolean")),
        Err(e) => Err(e.to_string()),
    }
}

/// A 1.13 `machine.install.diskSelector`: every field given must match. Talos matches `model`,
/// `serial` and `wwid` (and fields the inventory lacks) with its glob (talos-facts §8.5).
fn legacy_selector_matches(selector: &serde_json::Map<String, Value>, disk: &DiskInfo) -> bool {
    let glob = |pattern: &str, field: &Option<String>| {
        ichor_api::glob::matches(pattern, field.as_deref().unwrap_or_default())
    };
    selector.iter().all(|(key, want)| {
        let want = want.as_str().unwrap_or_default();
        match key.as_str() {
            "size" => size_matches(want, disk.size),
            "model" => glob(want, &disk.model),
            "serial" => glob(want, &disk.serial),
            "wwid" => glob(want, &disk.wwid),
            "type" => match want {
                "nvme" => disk.transport.as_deref() == Some("nvme"),
                "hdd" => disk.rotational,
                "ssd" => !disk.rotational && disk.transport.as_deref() != Some("nvme"),
                "sd" => disk.transport.as_deref() == Some("mmc"),
                _ => false,
            },
            // Not recorded in the inventory: cannot be checked, so it does not exclude a disk.
            _ => true,
        }
    })
}

/// `>= 100GB`, `<= 2TB`, `> 1GiB`, `100GB` (exact) against a size in bytes.
fn size_matches(expr: &str, size: u64) -> bool {
    let expr = expr.trim();
    let (op, rest) = ["<=", ">=", "<", ">", "=="]
        .iter()
        .find_map(|op| expr.strip_prefix(op).map(|r| (*op, r.trim())))
        .unwrap_or(("==", expr));
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let unit = rest[digits.len()..].trim();
    let Ok(number) = digits.parse::<u64>() else {
        return false;
    };
    let factor = match unit {
        "" | "B" => 1,
        "kB" | "KB" => KB,
        "MB" => KB.pow(2),
        "GB" => KB.pow(3),
        "TB" => KB.pow(4),
        "KiB" => KIB,
        "MiB" => KIB.pow(2),
        "GiB" => KIB.pow(3),
        "TiB" => KIB.pow(4),
        _ => return false,
    };
    let bytes = number.saturating_mul(factor);
    match op {
        "<=" => size <= bytes,
        ">=" => size >= bytes,
        "<" => size < bytes,
        ">" => size > bytes,
        _ => size == bytes,
    }
}

/// Links the config names, with where it names them, minus the links it creates itself.
fn check_links(rendered: &Rendered, inventory: &HardwareInventory) -> Vec<HardwareMismatch> {
    let mut named: Vec<(String, String)> = Vec::new();
    let mut created: BTreeSet<String> = BTreeSet::new();
    for document in &rendered.documents {
        let kind = document["kind"].as_str().unwrap_or_default();
        let name = document["name"].as_str().unwrap_or_default().to_owned();
        match kind {
            "LinkConfig" | "DHCPv4Config" | "DHCPv6Config" => {
                named.push((name, format!("{kind} {}", document["name"])))
            }
            "Layer2VIPConfig" => {
                if let Some(link) = document["link"].as_str() {
                    named.push((link.into(), format!("{kind} {}.link", document["name"])));
                }
            }
            "VLANConfig" => {
                created.insert(name);
                if let Some(parent) = document["parent"].as_str() {
                    named.push((parent.into(), format!("{kind} {}.parent", document["name"])));
                }
            }
            "BondConfig" | "BridgeConfig" => {
                created.insert(name);
                for link in document["links"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                {
                    named.push((link.into(), format!("{kind} {}.links", document["name"])));
                }
            }
            _ => {}
        }
        for (i, iface) in document["machine"]["network"]["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(link) = iface["interface"].as_str() {
                let is_virtual = iface.get("bond").is_some()
                    || iface.get("bridge").is_some()
                    || iface["dummy"].as_bool() == Some(true);
                if is_virtual {
                    created.insert(link.into());
                } else {
                    named.push((
                        link.into(),
                        format!("machine.network.interfaces[{i}].interface"),
                    ));
                }
            }
            for member in iface["bond"]["interfaces"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                named.push((
                    member.into(),
                    format!("machine.network.interfaces[{i}].bond.interfaces"),
                ));
            }
        }
    }
    let have: BTreeSet<&str> = inventory.links.iter().map(|l| l.name.as_str()).collect();
    let links = if have.is_empty() {
        "no links".to_owned()
    } else {
        have.iter().copied().collect::<Vec<_>>().join(", ")
    };
    named
        .into_iter()
        .filter(|(link, _)| !have.contains(link.as_str()) && !created.contains(link))
        .map(|(link, source_path)| HardwareMismatch::MissingLink {
            link,
            source_path,
            links: links.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(fields: Value) -> serde_json::Map<String, Value> {
        fields.as_object().cloned().expect("an object")
    }

    fn disk_of(model: &str) -> DiskInfo {
        DiskInfo {
            name: "sda".into(),
            dev_path: "/dev/sda".into(),
            size: 500_000_000_000,
            model: Some(model.into()),
            serial: Some("S4EVNF0M123456".into()),
            wwid: Some("naa.5002538e40a1b2c3".into()),
            ..Default::default()
        }
    }

    /// The old matcher sliced the model by byte: a model with a multi-byte character at the
    /// cut panicked the reconcile.
    #[test]
    fn a_non_ascii_model_is_matched_not_a_panic() {
        let disk = disk_of("ø");
        assert!(!legacy_selector_matches(
            &selector(serde_json::json!({"model": "*a"})),
            &disk
        ));
        let disk = disk_of("Sømething SSD");
        assert!(legacy_selector_matches(
            &selector(serde_json::json!({"model": "S*SSD"})),
            &disk
        ));
        assert!(!legacy_selector_matches(
            &selector(serde_json::json!({"model": "*ø"})),
            &disk
        ));
    }

    /// The old matcher tried every split of the text for every star: 24 stars against a model
    /// that does not match took longer than 15 s. Now it is linear (the steps are counted in
    /// `ichor_api::glob`); this answers at once.
    #[test]
    fn many_stars_against_a_long_model_answer_at_once() {
        let pattern = "*a".repeat(24) + "b";
        let disk = disk_of(&"a".repeat(128));
        assert!(!legacy_selector_matches(
            &selector(serde_json::json!({"model": pattern})),
            &disk
        ));
        let (_, steps) = ichor_api::glob::matches_counting(&pattern, &"a".repeat(128));
        assert!(steps <= 2 * (pattern.len() as u64 + 128), "{steps} steps");
    }

    #[test]
    fn serial_and_wwid_match_as_talos_globs_them() {
        let disk = disk_of("Samsung SSD 990 PRO");
        for (fields, want) in [
            (serde_json::json!({"serial": "S4EVNF0M123456"}), true),
            (serde_json::json!({"serial": "S4EVNF*"}), true),
            (serde_json::json!({"serial": "S4EVNF"}), false),
            (serde_json::json!({"wwid": "naa.5002538e*"}), true),
            (
                serde_json::json!({"model": "Samsung SSD 9*", "serial": "X*"}),
                false,
            ),
        ] {
            assert_eq!(
                legacy_selector_matches(&selector(fields.clone()), &disk),
                want,
                "{fields}"
            );
        }
    }

    #[test]
    fn a_1_14_selector_may_call_glob() {
        let disk = disk_of("Sømething SSD");
        let program = Program::compile(r#"glob("S*SSD", disk.model) && !glob("*a", disk.model)"#)
            .expect("compiles");
        assert_eq!(evaluate(&program, &disk), Ok(true));
        let program = Program::compile(&format!("glob({:?}, disk.model)", "*a".repeat(24) + "b"))
            .expect("compiles");
        assert_eq!(evaluate(&program, &disk_of(&"a".repeat(128))), Ok(false));
    }
}

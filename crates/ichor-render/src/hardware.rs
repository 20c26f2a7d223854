//! Checking a rendered config against a machine's recorded hardware before it is applied: the
//! install disk (a path, a 1.13 selector, or the 1.14 CEL `diskSelector.match`) must match a
//! disk the machine has, and every link the config names must exist.

use std::collections::{BTreeSet, HashMap};

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
/// `block.DiskSpec` (talos-facts §3), `system_disk`, and the size units as unsigned integers.
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

/// A 1.13 `machine.install.diskSelector`: every field given must match.
fn legacy_selector_matches(selector: &serde_json::Map<String, Value>, disk: &DiskInfo) -> bool {
    selector.iter().all(|(key, want)| {
        let want = want.as_str().unwrap_or_default();
        match key.as_str() {
            "size" => size_matches(want, disk.size),
            "model" => glob(want, disk.model.as_deref().unwrap_or_default()),
            "serial" => disk.serial.as_deref() == Some(want),
            "wwid" => disk.wwid.as_deref() == Some(want),
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

fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((prefix, rest)) => {
            text.starts_with(prefix)
                && (0..=text.len() - prefix.len()).any(|i| glob(rest, &text[prefix.len() + i..]))
        }
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

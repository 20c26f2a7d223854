//! Install disks against the simulated hardware (talos-facts §11.5): the legacy
//! `machine.install.diskSelector` as the CEL expression Talos builds from it, and matching
//! any selector against the machine's disks in the order Talos lists them.

use super::cel::DiskFields;
use super::yaml::Node;
use crate::hardware::SimDisk;

/// The machine's disks as `block.DiskSpec` sees them, ordered by id (device name) as a
/// COSI list returns them.
pub(crate) fn disk_fields(disks: &[SimDisk]) -> Vec<DiskFields> {
    let mut sorted: Vec<&SimDisk> = disks.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted
        .into_iter()
        .map(|d| DiskFields {
            dev_path: format!("/dev/{}", d.name),
            size: d.size,
            pretty_size: pretty_size(d.size),
            cdrom: d.cdrom,
            model: d.model.clone(),
            serial: d.serial.clone(),
            transport: d.transport.clone(),
            ..Default::default()
        })
        .collect()
}

/// go-humanize `Bytes`: SI units, one decimal below ten.
fn pretty_size(size: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if size < 10 {
        return format!("{size} B");
    }
    #[allow(clippy::cast_precision_loss)]
    let value = size as f64;
    let exponent = value.log(1000.0).floor().min(6.0);
    let scaled = value / 1000f64.powf(exponent);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let unit = UNITS[exponent as usize];
    let rounded = (scaled * 10.0 + 0.5).floor() / 10.0;
    if rounded < 10.0 {
        format!("{rounded:.1} {unit}")
    } else {
        format!("{rounded:.0} {unit}")
    }
}

/// go-humanize `ParseBytes`.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let digits = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.' || *c == ','))
        .map_or(s.len(), |(i, _)| i);
    let number = s[..digits].replace(',', "");
    let value: f64 = number.parse().map_err(|_| {
        format!(
            "strconv.ParseFloat: parsing {}: invalid syntax",
            super::gofmt::quote(&number)
        )
    })?;
    let extra = s[digits..].trim().to_lowercase();
    let multiplier: f64 = match extra.as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "ki" | "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mi" | "mib" => 1024f64.powi(2),
        "g" | "gb" => 1e9,
        "gi" | "gib" => 1024f64.powi(3),
        "t" | "tb" => 1e12,
        "ti" | "tib" => 1024f64.powi(4),
        "p" | "pb" => 1e15,
        "pi" | "pib" => 1024f64.powi(5),
        "e" | "eb" => 1e18,
        "ei" | "eib" => 1024f64.powi(6),
        _ => return Err(format!("unhandled size name: {extra}")),
    };
    let bytes = value * multiplier;
    #[allow(clippy::cast_precision_loss)]
    if bytes >= u64::MAX as f64 {
        return Err(format!("too large: {s}"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// `InstallDiskSizeMatcher`'s decoding of `diskSelector.size`: operator and bytes.
pub(crate) fn parse_size_condition(text: &str) -> Result<(String, u64), String> {
    let condition = text.trim();
    let op = [">=", "<=", "==", ">", "<"]
        .iter()
        .find(|op| condition.starts_with(**op))
        .map_or("", |op| *op);
    let rest = &condition[op.len()..];
    let size =
        parse_bytes(rest.trim()).map_err(|e| format!("failed to parse disk size {rest}: {e}"))?;
    Ok((op.to_owned(), size))
}

/// A legacy install disk selector: the CEL text Talos builds (its `String()`) and what it
/// matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LegacySelector {
    pub(crate) expression: String,
    size: Option<(String, u64)>,
    globs: Vec<(&'static str, String)>,
    kind: Option<String>,
}

/// `InstallConfig.DiskMatchExpression`: `None` without a selector; the error is Talos's.
pub(crate) fn legacy_selector(install: &Node) -> Result<Option<LegacySelector>, String> {
    let Some(selector) = install.get("diskSelector") else {
        return Ok(None);
    };
    let mut parts = Vec::new();
    let mut size = None;
    if let Some(text) = selector.get("size") {
        let (op, bytes) = parse_size_condition(&text.text())?;
        let op = if op.is_empty() { "==".to_owned() } else { op };
        parts.push(format!("disk.size {op} {bytes}u"));
        size = Some((op, bytes));
    }
    let mut globs = Vec::new();
    for (key, field) in [("uuid", "uuid"), ("wwid", "wwid"), ("model", "model")] {
        let value = selector.str_at(&[key]);
        if !value.is_empty() {
            parts.push(format!(
                "glob({}, disk.{field})",
                super::gofmt::quote(&value)
            ));
            globs.push((field, value));
        }
    }
    if !selector.str_at(&["name"]).is_empty() {
        return Err("selector on name is not supported".into());
    }
    for (key, field) in [("serial", "serial"), ("modalias", "modalias")] {
        let value = selector.str_at(&[key]);
        if !value.is_empty() {
            parts.push(format!(
                "glob({}, disk.{field})",
                super::gofmt::quote(&value)
            ));
            globs.push((field, value));
        }
    }
    parts.push("disk.transport != \"\"".into());
    let kind = selector.str_at(&["type"]);
    match kind.as_str() {
        "" => {}
        "nvme" => parts.push("disk.transport == \"nvme\"".into()),
        "sd" => parts.push("disk.transport == \"mmc\"".into()),
        "hdd" => parts.push("disk.rotational".into()),
        "ssd" => parts.push("!disk.rotational".into()),
        other => {
            return Err(format!(
                "unsupported disk type {}",
                super::gofmt::quote(other)
            ));
        }
    }
    let bus_path = selector.str_at(&["busPath"]);
    if !bus_path.is_empty() {
        parts.push(format!(
            "glob({}, disk.bus_path)",
            super::gofmt::quote(&bus_path)
        ));
        globs.push(("bus_path", bus_path));
    }
    parts.push("!disk.readonly".into());
    parts.push("!disk.cdrom".into());
    Ok(Some(LegacySelector {
        expression: parts.join(" && "),
        size,
        globs,
        kind: (!kind.is_empty()).then_some(kind),
    }))
}

impl LegacySelector {
    /// Whether `disk` matches.
    pub(crate) fn matches(&self, disk: &DiskFields) -> bool {
        let size_ok = self
            .size
            .as_ref()
            .is_none_or(|(op, bytes)| match op.as_str() {
                ">=" => disk.size >= *bytes,
                "<=" => disk.size <= *bytes,
                ">" => disk.size > *bytes,
                "<" => disk.size < *bytes,
                _ => disk.size == *bytes,
            });
        let globs_ok = self.globs.iter().all(|(field, pattern)| {
            let value = match *field {
                "uuid" => &disk.uuid,
                "wwid" => &disk.wwid,
                "model" => &disk.model,
                "serial" => &disk.serial,
                "modalias" => &disk.modalias,
                _ => &disk.bus_path,
            };
            super::glob::glob(pattern, value)
        });
        let kind_ok = match self.kind.as_deref() {
            Some("nvme") => disk.transport == "nvme",
            Some("sd") => disk.transport == "mmc",
            Some("hdd") => disk.rotational,
            Some("ssd") => !disk.rotational,
            _ => true,
        };
        size_ok
            && globs_ok
            && kind_ok
            && !disk.transport.is_empty()
            && !disk.readonly
            && !disk.cdrom
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_humanize_parses_them() {
        assert_eq!(
            parse_size_condition(">= 100GB").unwrap(),
            (">=".into(), 100_000_000_000)
        );
        assert_eq!(
            parse_size_condition("> 10TB").unwrap(),
            (">".into(), 10_000_000_000_000)
        );
        assert_eq!(
            parse_size_condition("big").unwrap_err(),
            "failed to parse disk size big: strconv.ParseFloat: parsing \"\": invalid syntax"
        );
        assert_eq!(pretty_size(100_000_000_000), "100 GB");
        assert_eq!(pretty_size(104_857_600), "105 MB");
    }
}

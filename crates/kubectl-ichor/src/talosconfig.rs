//! `talosconfig CLUSTER [-o FILE] [--force]`: writes the `os:admin` talosconfig the manager
//! publishes (the Secret named in the TalosCluster's `status.talosconfigSecret`) to a file only
//! its owner can read, refusing to overwrite one unless told to. Its contents are never printed.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use ichor_api::names::secrets as secret_names;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::Value;

use crate::Error;
use crate::connect::Connection;
use crate::render::get_cluster;

/// Writes `contents` to `path` with mode 0600: a new file, or (with `force`) over an existing
/// one, whose mode is set to 0600 before anything is written into it.
pub fn write_private(path: &Path, contents: &[u8], force: bool) -> Result<(), Error> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(0o600);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let shown = path.display();
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::File(format!(
                "{shown} already exists: pass --force to overwrite it, or -o another file"
            ))
        } else {
            Error::File(format!("cannot write {shown}: {e}"))
        }
    })?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| file.write_all(contents))
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::File(format!("cannot write {shown}: {e}")))
}

/// A one-line summary of a talosconfig: its context and endpoints (never its keys).
pub fn summary(text: &str) -> Option<String> {
    let value: Value = serde_saphyr::from_str(text).ok()?;
    let context = value.get("context")?.as_str()?.to_owned();
    let endpoints: Vec<String> = value["contexts"][&context]["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Some(format!(
        "context {context}, endpoints {}",
        if endpoints.is_empty() {
            "(none yet)".to_owned()
        } else {
            endpoints.join(", ")
        }
    ))
}

/// Writes the talosconfig of TalosCluster `name` to `output`.
pub async fn talosconfig(
    conn: &Connection,
    name: &str,
    output: &Path,
    force: bool,
) -> Result<String, Error> {
    let cluster = get_cluster(conn, name, "").await?;
    let secret_name = cluster
        .status
        .as_ref()
        .and_then(|s| s.core.talosconfig_secret.clone())
        .ok_or_else(|| {
            Error::Object(format!(
                "TalosCluster {name} has not published a talosconfig yet (status.talosconfigSecret is empty): the manager publishes it once the secrets bundle exists; see kubectl ichor describe cluster {name}"
            ))
        })?;
    let secret = Api::<Secret>::namespaced(conn.client.clone(), &conn.namespace)
        .get_opt(&secret_name)
        .await
        .map_err(|e| Error::kube(format!("cannot read Secret {secret_name}"), &e))?
        .ok_or_else(|| {
            Error::Object(format!(
                "Secret {secret_name} (status.talosconfigSecret of TalosCluster {name}) not found in namespace {}: the manager publishes it again on its next reconcile",
                conn.namespace
            ))
        })?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(secret_names::TALOSCONFIG_KEY))
        .ok_or_else(|| {
            Error::Object(format!(
                "Secret {secret_name} has no key {}",
                secret_names::TALOSCONFIG_KEY
            ))
        })?;
    write_private(output, &bytes.0, force)?;
    let about = summary(&String::from_utf8_lossy(&bytes.0))
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    Ok(format!(
        "wrote the talosconfig of TalosCluster {name}{about} to {} (mode 0600)\nuse it with: talosctl --talosconfig {} version\n",
        output.display(),
        output.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_private_file_and_refuses_to_overwrite_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("talosconfig");
        write_private(&path, b"first", false).expect("write");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let err = write_private(&path, b"second", false).expect_err("refused");
        assert!(
            err.to_string().contains("already exists: pass --force"),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).expect("read"), b"first");
        write_private(&path, b"third", true).expect("forced");
        assert_eq!(std::fs::read(&path).expect("read"), b"third");
    }

    #[test]
    fn forcing_over_a_readable_file_makes_it_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("talosconfig");
        std::fs::write(&path, "old").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_private(&path, b"new", true).expect("forced");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_missing_folder_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("no/such/folder/talosconfig");
        let err = write_private(&path, b"x", false).expect_err("refused");
        assert!(err.to_string().starts_with("cannot write "), "{err}");
    }

    #[test]
    fn the_summary_names_the_context_and_endpoints_only() {
        let text = "context: lab\ncontexts:\n  lab:\n    endpoints:\n    - 10.0.0.1\n    - 10.0.0.2\n    ca: Q0E=\n    crt: Q1JU\n    key: S0VZ\n";
        assert_eq!(
            summary(text).as_deref(),
            Some("context lab, endpoints 10.0.0.1, 10.0.0.2")
        );
        assert_eq!(summary("not: [a talosconfig"), None);
    }
}

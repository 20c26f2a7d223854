//! What a control plane does with an uploaded snapshot when Bootstrap recovers etcd from it
//! (`docs/etcd-recovery.md`): siderolabs/talos v1.14.0-rc.1
//! `internal/app/machined/pkg/system/services/etcd.go` `Etcd.recoverFromSnapshot`, which runs
//! etcdutl v3.7.1's `snapshot.v3Manager` `Status` then `Restore`
//! (`etcdutl/snapshot/v3_snapshot.go`), and deletes the upload once restored.
//!
//! The errors are Talos's and etcd's, wrapped as the etcd service's pre-start step returns
//! them; the caller turns them into the service's failure.

use std::sync::Arc;

use super::keyspace::{KeyValue, Keyspace};
use super::read::Db;

/// Where Talos keeps an uploaded snapshot (`constants.EtcdRecoverySnapshotPath`).
pub(crate) const SNAPSHOT_PATH: &str = "/var/lib/etcd.snapshot";

/// Why a recovery failed: the error `recoverFromSnapshot` returns, and whether the data
/// directory was written before it (etcdutl's `copyAndVerifyDB` creates `member/snap` and
/// copies the database there before it checks the hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The error, e.g. `error verifying snapshot: stat /var/lib/etcd.snapshot: no such file or
    /// directory`.
    pub(crate) error: String,
    /// The data directory is no longer empty.
    pub(crate) data_dir_written: bool,
}

/// Recovers from the upload, if any: etcdutl's status check, then its restore (the hash check
/// unless skipped). Restored, the new cluster's keyspace is the snapshot's.
pub(crate) fn recover(
    upload: Option<&Arc<Vec<u8>>>,
    skip_hash_check: bool,
) -> Result<Keyspace, Failure> {
    let file = upload.ok_or_else(|| Failure {
        error: format!("error verifying snapshot: stat {SNAPSHOT_PATH}: no such file or directory"),
        data_dir_written: false,
    })?;
    verdict(file, skip_hash_check)?;
    Keyspace::restored(Arc::clone(file)).map_err(|error| Failure {
        error: format!("error recovering from the snapshot: {error}"),
        data_dir_written: true,
    })
}

/// What recovering from `file` fails with, if anything: etcdutl's status check (nothing
/// written yet), then the restore's hash check (after the data directory was written).
pub(crate) fn verdict(file: &[u8], skip_hash_check: bool) -> Result<(), Failure> {
    status(file).map_err(|error| Failure {
        error: format!("error verifying snapshot: {error}"),
        data_dir_written: false,
    })?;
    verify_hash(file, skip_hash_check).map_err(|error| Failure {
        error: format!("error recovering from the snapshot: {error}"),
        data_dir_written: true,
    })
}

/// etcdutl's `Status`: bbolt opens the file read-only, its consistency check passes, every
/// top-level entry is a bucket, and every entry of `key` is a revision with an
/// `mvccpb.KeyValue`.
pub(crate) fn status(file: &[u8]) -> Result<(), String> {
    let db = Db::open(file)?;
    let errors = db.check();
    if !errors.is_empty() {
        return Err(format!(
            "snapshot file integrity check failed. {} errors found.\n{}",
            errors.len(),
            errors.join("\n")
        ));
    }
    for (flags, name, value) in db.top()? {
        let bucket = (flags & super::bolt::LEAF_BUCKET != 0)
            .then(|| Db::bucket_of(value))
            .flatten()
            .ok_or_else(|| format!("nil bucket: {}", go_quote(name)))?;
        if name != b"key" {
            continue;
        }
        db.entries(bucket, &mut |(_, k, v)| {
            let fail = |error: String| {
                format!(
                    "error during bucket key iteration, name: {} err: {error}",
                    go_quote(name)
                )
            };
            revision(k).map_err(|error| {
                fail(format!(
                    "cannot parse revision key: {} err: {error}",
                    go_quote(k)
                ))
            })?;
            KeyValue::parse(v).map_err(|()| {
                fail(format!(
                    "cannot unmarshal value, key: {} value: {} err: {PROTO_INVALID}",
                    go_quote(k),
                    go_quote(v)
                ))
            })?;
            Ok(())
        })?;
    }
    Ok(())
}

/// Go's protobuf error for malformed wire data. (Its "proto: " prefix is written with a
/// non-breaking space in some builds, on purpose; here always with a plain one.)
const PROTO_INVALID: &str = "proto: cannot parse invalid wire-format data";

/// etcd's `mvcc.BytesToBucketKey`: 17 bytes (18 with a mark), `_` at 8, no negative revision;
/// its panics, as the message etcdutl recovers.
fn revision(key: &[u8]) -> Result<(), String> {
    if key.len() != 17 && key.len() != 18 {
        return Err(format!("invalid revision length: {}", key.len()));
    }
    if key[8] != b'_' {
        return Err(format!(
            "invalid separator in bucket key: {}",
            go_quote_rune(char::from(key[8]))
        ));
    }
    let main = i64::from_be_bytes(key[..8].try_into().unwrap_or_default());
    let sub = i64::from_be_bytes(key[9..17].try_into().unwrap_or_default());
    if main < 0 || sub < 0 {
        return Err(format!("negative revision: main={main} sub={sub}"));
    }
    Ok(())
}

/// The hash check of etcdutl's `copyAndVerifyDB`: a size 32 more than a multiple of 512 has a
/// SHA-256 trailer, which must be that of the rest unless the check is skipped; without one
/// the check must be skipped.
pub(crate) fn verify_hash(file: &[u8], skip_hash_check: bool) -> Result<(), String> {
    let has_hash = file.len() % 512 == 32;
    if !has_hash && !skip_hash_check {
        return Err("snapshot missing hash but --skip-hash-check=false".into());
    }
    if has_hash && !skip_hash_check {
        let (db, sha) = file.split_at(file.len() - 32);
        let computed = ring::digest::digest(&ring::digest::SHA256, db);
        if computed.as_ref() != sha {
            return Err(format!(
                "expected sha256 {}, got {}",
                go_bytes(sha),
                go_bytes(computed.as_ref())
            ));
        }
    }
    Ok(())
}

/// A byte slice as Go's `%v` prints it: `[1 2 3]`.
fn go_bytes(bytes: &[u8]) -> String {
    let parts: Vec<String> = bytes.iter().map(u8::to_string).collect();
    format!("[{}]", parts.join(" "))
}

/// Bytes as Go's `%q` prints them (`strconv.Quote`): printable runes as they are, Go's
/// escapes for the rest, `\x` for bytes that are not UTF-8. Printability is Rust's idea of
/// it (not a control or whitespace character), close to Go's tables.
pub(crate) fn go_quote(bytes: &[u8]) -> String {
    let mut out = String::from("\"");
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            escape(&mut out, c, '"');
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('"');
    out
}

/// A character as Go's `%q` prints an integer (`strconv.QuoteRune`).
fn go_quote_rune(c: char) -> String {
    let mut out = String::from("'");
    escape(&mut out, c, '\'');
    out.push('\'');
    out
}

/// `strconv.appendEscapedRune`.
fn escape(out: &mut String, c: char, quote: char) {
    if c == quote || c == '\\' {
        out.push('\\');
        out.push(c);
        return;
    }
    if c == ' ' || !(c.is_control() || c.is_whitespace()) {
        out.push(c);
        return;
    }
    match c {
        '\u{7}' => out.push_str("\\a"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{b}' => out.push_str("\\v"),
        c if u32::from(c) < 0x20 || c == '\u{7f}' => {
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
        }
        c if u32::from(c) < 0x10000 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
        c => out.push_str(&format!("\\U{:08x}", u32::from(c))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_quoting() {
        assert_eq!(go_quote(b"key"), "\"key\"");
        assert_eq!(
            go_quote(b"a\"b\\c\n\x00\x7f"),
            "\"a\\\"b\\\\c\\n\\x00\\x7f\""
        );
        assert_eq!(go_quote(&[0xff, b'a']), "\"\\xffa\"");
        assert_eq!(go_quote("é\u{a0}".as_bytes()), "\"é\\u00a0\"");
        assert_eq!(go_quote_rune('x'), "'x'");
        assert_eq!(go_quote_rune('\0'), "'\\x00'");
        assert_eq!(go_bytes(&[1, 22, 255]), "[1 22 255]");
    }

    #[test]
    fn revisions_are_checked_as_etcd_parses_them() {
        let mut key = 5u64.to_be_bytes().to_vec();
        key.push(b'_');
        key.extend_from_slice(&0u64.to_be_bytes());
        assert_eq!(revision(&key), Ok(()));
        key.push(b't');
        assert_eq!(revision(&key), Ok(()));
        assert_eq!(revision(b"abc"), Err("invalid revision length: 3".into()));
        key[8] = b'-';
        assert_eq!(
            revision(&key),
            Err("invalid separator in bucket key: '-'".into())
        );
    }

    #[test]
    fn the_hash_check_is_etcdutls() {
        let db = vec![7u8; 1024];
        let mut file = db.clone();
        file.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, &db).as_ref());
        assert_eq!(verify_hash(&file, false), Ok(()));
        assert_eq!(
            verify_hash(&db, false),
            Err("snapshot missing hash but --skip-hash-check=false".into())
        );
        assert_eq!(verify_hash(&db, true), Ok(()));
        let last = file.len() - 1;
        file[last] ^= 1;
        let error = verify_hash(&file, false).expect_err("mismatch");
        assert!(error.starts_with("expected sha256 ["), "{error}");
        assert!(error.contains("], got ["), "{error}");
        assert_eq!(verify_hash(&file, true), Ok(()));
    }
}
